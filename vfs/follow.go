package vfs

import (
	"cmp"
	"context"
	"database/sql"
	sqldriver "database/sql/driver"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/ncruces/go-sqlite3"
	"github.com/ncruces/go-sqlite3/driver"

	"github.com/ursula-go/ursula/client"
	"github.com/ursula-go/ursula/replicator"
	"github.com/ursula-go/ursula/sqlitewal"
	"github.com/ursula-go/ursula/streamcore"
)

// A follower is a read-only replica that applies the stream's new commits to its local
// file while the application reads it.
//
// The follower's file is in the rollback-journal mode (file-format bytes 18 and 19 of page
// 1 are 1), not WAL: the pages of a commit are written straight into the file, under
// SQLite's own locks, by a background applier:
//
//   - a private read-write connection runs BEGIN EXCLUSIVE, which in rollback mode takes
//     the PENDING lock (no new reader starts) and waits until every reader has ended;
//   - the applier writes the page images of every whole record it has read, truncates the
//     file to the last commit's size and bumps the file change counter (offset 24) and
//     version-valid-for (offset 92), so other connections drop their page caches;
//   - the no-op transaction is rolled back (it wrote nothing through SQLite).
//
// A rebuild (behind retention, a new incarnation, or Open finding an earlier follower's
// file) copies the stream's database into the same file under the same lock, and shifts
// the schema cookie (offset 40) past every value the file held: an unrelated database may
// have the cookie a reader cached, and SQLite would keep using the cached schema.
//
// Since everything goes through SQLite's file locks, other processes may read the file
// too (sqlite3 CLI, Python), and see the same consistent states.
//
// A reader therefore sees either all of a batch of commits or none of it, and a read
// transaction keeps its snapshot: the applier waits for it. So that a long read
// transaction does not also stall every new reader behind the PENDING lock, the applier
// gives up the lock after applierBusy and tries again applierPause later.
//
// User connections open the file with mode=ro through the plain OS VFS of
// ncruces/go-sqlite3: the ursula VFS exists to intercept WAL commits of an owner, which a
// follower never makes, and its locks and reads are the OS VFS's anyway.

const (
	applierBusy   = 200 * time.Millisecond // how long one BEGIN EXCLUSIVE waits for readers
	applierPause  = 20 * time.Millisecond  // pause before trying again, letting readers in
	followPoll    = 30 * time.Second       // long-poll timeout
	followBackoff = 5 * time.Second        // longest pause after a failed read
	readerBusyMs  = 10000                  // busy timeout of user connections
)

// FollowerStatus is the state of a follower: Status(path) plus what only a follower has.
type FollowerStatus struct {
	replicator.Status
	Following   bool      // the applier is running (false once it stopped; Error says why)
	UpToDate    bool      // the last read reached the stream's tail and all of it is applied
	LastApplied time.Time // when the last commit was applied (zero: none since Open)
	Rebuilds    int       // whole-file rebuilds from the latest snapshot since Open
}

type follower struct {
	url, path string
	client    *client.Client
	maxFrame  int
	readBytes int // how much one read asks for
	lock      *sqlitewal.FileLock
	file      *os.File      // the database file; written only under the EXCLUSIVE lock
	conn      *sqlite3.Conn // private read-write connection that takes the EXCLUSIVE lock
	ctx       context.Context
	cancel    context.CancelFunc
	done      chan struct{}
	closeOnce sync.Once

	started bool // the applier runs (set once, before the DB is returned)

	// Owned by the applier goroutine (by openFollower before it starts).
	inc         string // stream incarnation the file comes from
	pageSize    uint32 // 0 until the stream has a commit
	dbPages     uint32 // database size the file holds, in pages
	lastCounter uint32 // file change counter last stamped
	cookieDelta uint32 // added to the stream's schema cookie since a rebuild (see stamp)
	lastCookie  uint32 // schema cookie the file last held

	mu          sync.Mutex
	tail        uint64
	epoch       uint64
	commits     uint64
	following   bool
	upToDate    bool
	lastApplied time.Time
	rebuilds    int
	lastErr     error
}

var (
	followersMu sync.Mutex
	followers   = map[string]*follower{} // by absolute database path
)

func lookupFollower(path string) *follower {
	followersMu.Lock()
	defer followersMu.Unlock()
	return followers[path]
}

// FollowStatus reports the state of a database this process follows (Options.Follow).
func FollowStatus(path string) (FollowerStatus, error) {
	abs, err := filepath.Abs(path)
	if err != nil {
		return FollowerStatus{}, err
	}
	f := lookupFollower(abs)
	if f == nil {
		return FollowerStatus{}, &Error{Kind: replicator.KindNotFound, Action: replicator.ActionFix,
			Message: fmt.Sprintf("%s is not followed in this process", path)}
	}
	return f.followStatus(), nil
}

func (f *follower) followStatus() FollowerStatus {
	f.mu.Lock()
	defer f.mu.Unlock()
	st := FollowerStatus{
		Status:    replicator.Status{URL: f.url, Offset: f.tail, Epoch: f.epoch, Commits: f.commits},
		Following: f.following, UpToDate: f.upToDate, LastApplied: f.lastApplied, Rebuilds: f.rebuilds,
	}
	if f.lastErr != nil {
		e, ok := asError(f.lastErr)
		if !ok {
			e = &Error{Kind: replicator.KindUnavailable, Action: replicator.ActionRetry, Message: f.lastErr.Error()}
		}
		st.Error = &struct {
			Kind    replicator.Kind   `json:"kind"`
			Action  replicator.Action `json:"action"`
			Message string            `json:"message"`
		}{e.Kind, e.Action, e.Error()}
	}
	return st
}

func (f *follower) status() replicator.Status { return f.followStatus().Status }

// openFollower rebuilds path from the stream and returns it read-only, following the
// stream until the *sql.DB is closed.
func openFollower(streamURL string, opts Options) (_ *sql.DB, err error) {
	if err := replicator.CheckURL(streamURL); err != nil {
		return nil, err
	}
	path, err := localPath(streamURL, opts.Path)
	if err != nil {
		return nil, err
	}
	c := opts.Client
	if c == nil {
		if c, err = client.New(""); err != nil {
			return nil, err
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	f := &follower{url: streamURL, path: path, client: c, maxFrame: streamcore.MaxRequestBytes, readBytes: cmp.Or(opts.followReadBytes, streamcore.MaxReadBytes),
		ctx: ctx, cancel: cancel, done: make(chan struct{}), following: true}
	followersMu.Lock()
	if followers[path] != nil {
		followersMu.Unlock()
		cancel()
		return nil, &Error{Kind: replicator.KindInUse, Action: replicator.ActionFix,
			Message: fmt.Sprintf("%s is already followed in this process", path)}
	}
	followers[path] = f
	followersMu.Unlock()
	defer func() {
		if err != nil {
			cancel()
			followersMu.Lock()
			delete(followers, path)
			followersMu.Unlock()
		}
	}()
	// Ask first, so that a missing stream leaves nothing behind locally.
	info, err := c.Head(ctx, streamURL)
	if err != nil {
		return nil, classifyFollowRead(err, "HEAD of the stream")
	}
	lockPath := sqlitewal.LockPath(path)
	_, statErr := os.Stat(lockPath)
	lk, err := sqlitewal.LockFile(lockPath)
	if err != nil {
		return nil, err
	}
	f.lock, f.inc = lk, info.Incarnation
	defer func() {
		if err != nil {
			if f.conn != nil {
				f.conn.Close()
			}
			if f.file != nil {
				f.file.Close()
			}
			lk.Release()
			if os.IsNotExist(statErr) {
				os.Remove(lockPath)
			}
		}
	}()
	if isFollowerFile(path) {
		// The file of an earlier follower: other processes may be reading it, so rebuild
		// it in place under SQLite's lock rather than replace it (they would keep the old
		// inode and never see another commit).
		if err := f.openFile(); err != nil {
			return nil, err
		}
		if f.lastCounter, err = f.readU32(24); err != nil {
			return nil, err
		}
		if f.lastCookie, err = f.readU32(40); err != nil {
			return nil, err
		}
		if _, err := f.rebuild(nil); err != nil {
			return nil, err
		}
	} else {
		img, err := replicator.Restore(ctx, c, streamURL, path, 0, f.maxFrame, nil)
		if err != nil {
			return nil, err
		}
		os.Remove(path + "-journal") // a stale journal would look hot to readers
		f.tail, f.epoch, f.pageSize, f.dbPages = img.Tail, img.Epoch, img.PageSize, img.DBPages
		if err := f.openFile(); err != nil {
			return nil, err
		}
		if img.DBPages > 0 {
			if err := f.stamp(img.DBPages, false); err != nil {
				return nil, err
			}
		}
	}
	dsn := "file:" + (&url.URL{Path: path}).EscapedPath() + fmt.Sprintf("?mode=ro&_pragma=busy_timeout(%d)", readerBusyMs)
	inner, err := (&driver.SQLite{}).OpenConnector(dsn)
	if err != nil {
		return nil, err
	}
	sdb := sql.OpenDB(&followConnector{Connector: inner, f: f})
	if err := sdb.Ping(); err != nil {
		sdb.Close() // no applier yet: closes the connections only
		return nil, err
	}
	f.started = true
	go f.run()
	return sdb, nil
}

// openFile opens the file for the applier: directly, and through the private
// connection that takes SQLite's locks.
func (f *follower) openFile() (err error) {
	if f.file, err = os.OpenFile(f.path, os.O_RDWR, 0); err != nil {
		return err
	}
	if f.conn, err = sqlite3.OpenFlags(f.path, sqlite3.OPEN_READWRITE); err != nil {
		return err
	}
	return f.conn.BusyTimeout(applierBusy)
}

// isFollowerFile reports a database file in rollback mode with neither a journal nor a
// WAL beside it: what a follower leaves (an owner's file is in WAL mode).
func isFollowerFile(path string) bool {
	b := make([]byte, 100)
	fl, err := os.Open(path)
	if err != nil {
		return false
	}
	defer fl.Close()
	if _, err := io.ReadFull(fl, b); err != nil || string(b[:16]) != "SQLite format 3\x00" || b[18] != 1 || b[19] != 1 {
		return false
	}
	for _, side := range []string{"-journal", "-wal"} {
		if _, err := os.Lstat(path + side); !os.IsNotExist(err) {
			return false
		}
	}
	return true
}

// followConnector is the connector of a follower's *sql.DB: closing the DB stops the
// applier (database/sql closes a connector that is an io.Closer).
type followConnector struct {
	sqldriver.Connector
	f *follower
}

func (c *followConnector) Close() error {
	if !c.f.started {
		return nil // Open failed before the applier started; it cleans up itself
	}
	return c.f.close()
}

func (f *follower) close() error {
	var err error
	f.closeOnce.Do(func() {
		f.cancel()
		<-f.done
		err = f.conn.Close()
		f.file.Close()
		f.lock.Release()
		followersMu.Lock()
		delete(followers, f.path)
		followersMu.Unlock()
	})
	return err
}

// run is the applier: it long-polls the stream from the file's tail and applies every
// batch of whole records it reads, until the DB is closed or following cannot go on.
func (f *follower) run() {
	defer close(f.done)
	var (
		pending []byte        // bytes of a record cut by the read window
		pos     = f.tail      // stream offset of pending[0]
		next    = f.tail      // offset to read next
		wait    time.Duration // pause after a failure
	)
	for f.ctx.Err() == nil {
		if wait > 0 {
			select {
			case <-f.ctx.Done():
				return
			case <-time.After(wait):
			}
		}
		rr, err := f.client.Read(f.ctx, f.url, client.ReadOptions{
			Offset: streamcore.FormatOffset(next), LongPoll: true, Timeout: followPoll,
			MaxBytes: f.readBytes, IfIncarnation: f.inc})
		if f.ctx.Err() != nil {
			return
		}
		if err == nil && rr.Incarnation != "" && f.inc != "" && rr.Incarnation != f.inc {
			err = &client.Error{Op: "read", Status: http.StatusPreconditionFailed, Message: "stream was recreated"}
		}
		if err != nil {
			var ce *client.Error
			errors.As(err, &ce)
			switch {
			case ce != nil && ce.Status == http.StatusNotFound:
				f.stop(&Error{Kind: replicator.KindNotFound, Action: replicator.ActionFix, Err: err,
					Message: "the followed stream disappeared; the file keeps its last state"})
				return
			case ce != nil && (ce.Status == http.StatusGone || ce.Status == http.StatusPreconditionFailed ||
				ce.Status == http.StatusRequestedRangeNotSatisfiable):
				// Behind retention, or a new incarnation: rebuild from the latest snapshot.
				if gone, rerr := f.rebuild(ce); rerr != nil {
					if gone {
						f.stop(rerr)
						return
					}
					if f.ctx.Err() != nil {
						return
					}
					// A failed rebuild is retried (a snapshot racing retention, the server
					// away), except for damage, which more tries do not mend.
					if e, ok := asError(rerr); ok && (e.Kind == replicator.KindDamaged || e.Kind == replicator.KindLocalDamage) {
						f.stop(rerr)
						return
					}
					f.setErr(rerr)
					wait = nextWait(wait)
					continue
				}
				pending, pos, next, wait = pending[:0], f.tail, f.tail, 0
			default:
				f.setErr(classifyFollowRead(err, "stream read"))
				wait = nextWait(wait)
				if ce != nil && ce.RetryAfter > wait {
					wait = min(ce.RetryAfter, followBackoff)
				}
			}
			continue
		}
		wait = 0
		if len(rr.Data) > 0 {
			f.mu.Lock()
			f.upToDate = false // until these bytes are applied
			f.mu.Unlock()
		}
		next += uint64(len(rr.Data))
		pending = append(pending, rr.Data...)
		recs, used, derr := replicator.DecodeRecords(pending, pos, f.maxFrame)
		if err := f.applyBatch(recs); err != nil {
			if f.ctx.Err() != nil {
				return
			}
			f.stop(err)
			return
		}
		if derr != nil {
			f.stop(&Error{Kind: replicator.KindDamaged, Action: replicator.ActionStop, Err: derr, Message: "stream record"})
			return
		}
		pending = append(pending[:0], pending[used:]...)
		pos += uint64(used)
		f.mu.Lock()
		f.upToDate = rr.UpToDate && len(pending) == 0
		f.lastErr = nil
		f.mu.Unlock()
		if rr.Closed && rr.UpToDate && len(rr.Data) == 0 {
			f.stop(nil) // a closed stream gets no more commits
			return
		}
	}
}

func nextWait(w time.Duration) time.Duration {
	if w == 0 {
		return 50 * time.Millisecond
	}
	return min(2*w, followBackoff)
}

func (f *follower) setErr(err error) {
	f.mu.Lock()
	f.lastErr = err
	f.upToDate = false
	f.mu.Unlock()
}

// stop ends following; the file stays readable in its last state.
func (f *follower) stop(err error) {
	if err != nil {
		slog.Warn("ursula: follower stopped", "path", f.path, "url", f.url, "err", err)
	}
	f.mu.Lock()
	f.following, f.upToDate, f.lastErr = false, false, err
	f.mu.Unlock()
}

// applyBatch applies whole records atomically with respect to readers.
func (f *follower) applyBatch(recs []replicator.Record) error {
	if len(recs) == 0 {
		return nil
	}
	epoch := uint64(0)
	var commits []*replicator.Commit
	for _, r := range recs {
		switch r.Kind {
		case replicator.KindClaim:
			epoch = max(epoch, r.Claim.Epoch)
		case replicator.KindCommit:
			if f.pageSize != 0 && r.Commit.PageSize != f.pageSize {
				return &Error{Kind: replicator.KindDamaged, Action: replicator.ActionStop,
					Message: fmt.Sprintf("record at %d changes the page size from %d to %d", r.Offset, f.pageSize, r.Commit.PageSize)}
			}
			f.pageSize = r.Commit.PageSize
			commits = append(commits, r.Commit)
		}
	}
	if len(commits) > 0 {
		err := f.exclusive(func() error {
			ps := int64(f.pageSize)
			page1 := false
			for _, c := range commits {
				page1 = page1 || c.Pages[0].No == 1
				if c.DBPages < f.dbPages {
					// A commit sets the database size: truncate what is past it now, as a
					// replay does, so a later commit that grows the file again never
					// leaves stale pages in it.
					if err := f.file.Truncate(int64(c.DBPages) * ps); err != nil {
						return err
					}
				}
				f.dbPages = c.DBPages
				for _, p := range c.Pages {
					if _, err := f.file.WriteAt(p.Data, int64(p.No-1)*ps); err != nil {
						return err
					}
				}
			}
			last := commits[len(commits)-1]
			if err := f.file.Truncate(int64(last.DBPages) * ps); err != nil {
				return err
			}
			return f.stamp(last.DBPages, page1)
		})
		if err != nil {
			return err
		}
	}
	f.mu.Lock()
	f.tail = recs[len(recs)-1].End
	f.epoch = max(f.epoch, epoch)
	f.commits += uint64(len(commits))
	if len(commits) > 0 {
		f.lastApplied = time.Now()
	}
	f.mu.Unlock()
	return nil
}

// exclusive runs fn while the private connection holds SQLite's EXCLUSIVE lock on the
// file: no reader is inside a transaction and none can start one.
func (f *follower) exclusive(fn func() error) error {
	for {
		err := f.conn.Exec(`BEGIN EXCLUSIVE`)
		if err == nil {
			break
		}
		if !errors.Is(err, sqlite3.BUSY) {
			return fmt.Errorf("ursula: follower lock: %w", err)
		}
		// A reader holds a long read transaction: let the queued readers in, then retry.
		select {
		case <-f.ctx.Done():
			return f.ctx.Err()
		case <-time.After(applierPause):
		}
	}
	if err := fn(); err != nil {
		// The file may be half written: keep the lock, so readers fail (busy) rather than
		// read it, until the DB is closed and opened again (which rebuilds it).
		return &Error{Kind: replicator.KindLocalDamage, Action: replicator.ActionReattach, Err: err,
			Message: "writing the follower's file failed; readers are locked out until it is reopened"}
	}
	if err := f.conn.Exec(`ROLLBACK`); err != nil {
		return fmt.Errorf("ursula: follower unlock: %w", err)
	}
	return nil
}

// stamp makes page 1 say rollback mode, dbPages pages, and a new file change counter,
// valid for this version, so every connection drops its page cache on its next read.
// page1 says the stream's page 1 was just written: its schema cookie gets cookieDelta.
func (f *follower) stamp(dbPages uint32, page1 bool) error {
	// The change counter readers cached is the one stamped last; the stream's page 1 (WAL
	// mode need not count) or a rebuilt file may hold anything, so count on from both.
	counter, err := f.readU32(24)
	if err != nil {
		return err
	}
	counter = max(counter, f.lastCounter) + 1
	if counter == f.lastCounter {
		counter++ // wrapped
	}
	cookie, err := f.readU32(40)
	if err != nil {
		return err
	}
	if page1 {
		// SQLite reloads a connection's schema only when the cookie differs from the one
		// it cached; after a rebuild the stream's cookies are shifted so they never repeat
		// one this file held with another schema.
		cookie += f.cookieDelta
	}
	for _, w := range []struct {
		off int64
		v   []byte
	}{
		{18, []byte{1, 1}}, // file format write/read version 1: rollback journal, not WAL
		{24, binary.BigEndian.AppendUint32(nil, counter)},
		{28, binary.BigEndian.AppendUint32(nil, dbPages)},
		{40, binary.BigEndian.AppendUint32(nil, cookie)},
		{92, binary.BigEndian.AppendUint32(nil, counter)},
	} {
		if _, err := f.file.WriteAt(w.v, w.off); err != nil {
			return err
		}
	}
	f.lastCounter, f.lastCookie = counter, cookie
	return nil
}

func (f *follower) readU32(off int64) (uint32, error) {
	var b [4]byte
	if _, err := f.file.ReadAt(b[:], off); err != nil {
		return 0, err
	}
	return binary.BigEndian.Uint32(b[:]), nil
}

// rebuild replaces the whole file with the stream's current state, from its latest
// snapshot, under the EXCLUSIVE lock (the file keeps its inode: readers hold it open).
// cause is the read refusal that made it necessary; nil when Open reuses a file.
func (f *follower) rebuild(cause *client.Error) (gone bool, _ error) {
	info, err := f.client.Head(f.ctx, f.url)
	if err != nil {
		var ce *client.Error
		if errors.As(err, &ce) && (ce.Status == http.StatusNotFound || ce.Status == http.StatusGone) {
			return true, &Error{Kind: replicator.KindNotFound, Action: replicator.ActionFix, Err: err,
				Message: "the followed stream disappeared; the file keeps its last state"}
		}
		return false, classifyFollowRead(err, "HEAD of the stream")
	}
	tmp := f.path + "-ursula-follow"
	defer os.Remove(tmp)
	img, err := replicator.Restore(f.ctx, f.client, f.url, tmp, 0, f.maxFrame, nil)
	if err != nil {
		return false, err
	}
	src, err := os.Open(tmp)
	if err != nil {
		return false, err
	}
	defer src.Close()
	err = f.exclusive(func() error {
		if img.DBPages == 0 {
			// A stream with no commit yet: an empty database. Its first page 1 will
			// carry a cookie past any this file held.
			f.cookieDelta = f.lastCookie + 1
			return f.file.Truncate(0)
		}
		if _, err := io.Copy(io.NewOffsetWriter(f.file, 0), src); err != nil {
			return err
		}
		if err := f.file.Truncate(int64(img.DBPages) * int64(img.PageSize)); err != nil {
			return err
		}
		// A rebuild may bring an unrelated database (a new incarnation) whose schema
		// cookie equals the one readers cached: move the cookie past it for good.
		cookie, err := f.readU32(40)
		if err != nil {
			return err
		}
		f.cookieDelta = f.lastCookie + 1 - cookie
		return f.stamp(img.DBPages, true)
	})
	if err != nil {
		return false, err
	}
	f.inc, f.pageSize, f.dbPages = info.Incarnation, img.PageSize, img.DBPages
	f.mu.Lock()
	f.tail, f.epoch = img.Tail, img.Epoch
	if cause != nil {
		f.rebuilds, f.lastApplied = f.rebuilds+1, time.Now()
	}
	f.mu.Unlock()
	if cause != nil {
		slog.Warn("ursula: follower rebuilt the file from the stream's latest snapshot",
			"path", f.path, "url", f.url, "offset", img.Tail, "cause", cause.Error())
	}
	return false, nil
}

// classifyFollowRead turns a client error of a read into a typed error.
func classifyFollowRead(err error, what string) error {
	var ce *client.Error
	errors.As(err, &ce)
	switch {
	case ce != nil && (ce.Status == http.StatusNotFound || ce.Status == http.StatusGone):
		return &Error{Kind: replicator.KindNotFound, Action: replicator.ActionFix, Err: err,
			Message: what + ": the stream does not exist"}
	case ce != nil && ce.Status >= 400 && ce.Status < 500 && ce.Status != http.StatusTooManyRequests:
		return &Error{Kind: replicator.KindNotApplied, Action: replicator.ActionFix, Err: err, Message: what + " refused"}
	}
	return &Error{Kind: replicator.KindUnavailable, Action: replicator.ActionRetry, Err: err, Message: what + " failed"}
}
