package sqlitewal

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/ursula-go/ursula/client"
	"github.com/ursula-go/ursula/replicator"
	"github.com/ursula-go/ursula/streamcore"
)

// Database is one attached database file of this process, shared by every adapter and
// connection that opens it. The adapters find it by the file's absolute path.
type Database struct {
	path     string
	url      string
	pageSize uint32
	replica  *replicator.Replica // nil for read-only databases
	lock     *FileLock
	refs     int
	roOffset uint64 // read-only: the offset the rebuild reached
	// lastAck is the commit frame header the latest acknowledged commit wrote to the WAL,
	// and where; the next commit checks the file still holds it (a lost write-back).
	lastAck atomic.Pointer[ackedFrame]
}

// Errors the WAL interception returns besides the replicator's; ResultCode maps them to
// SQLite's I/O error codes.
var (
	errIORead  = errors.New("reading the WAL back failed")
	errIOWrite = errors.New("writing the WAL failed")
)

// AttachOptions configure Attach.
type AttachOptions struct {
	ReadOnly bool           // rebuild the file from the stream, claim nothing
	Client   *client.Client // nil: the URSULA_VFS_* defaults
	// AttemptLimit bounds one commit attempt (0: 10 s). Tests shorten it to reach the
	// limit without waiting 10 s.
	AttemptLimit time.Duration
}

var (
	registryMu sync.Mutex
	registry   = map[string]*Database{} // by absolute database path
)

// Lookup returns the attached database at the absolute path, or nil.
func Lookup(path string) *Database {
	registryMu.Lock()
	defer registryMu.Unlock()
	return registry[path]
}

// Attach attaches the database file at the absolute path to the stream at url, once per
// process: a second Attach of the same path and URL shares the first (call Detach once
// per Attach); another URL is other_stream. Another process holding the file is in_use
// (the lock file <path>-ursula.lock).
func Attach(path, streamURL string, opts AttachOptions) (*Database, error) {
	if err := replicator.CheckURL(streamURL); err != nil {
		return nil, err
	}
	registryMu.Lock()
	defer registryMu.Unlock()
	if db := registry[path]; db != nil {
		if !client.SameStream(db.url, streamURL) {
			return nil, &replicator.Error{Kind: replicator.KindOtherStream, Action: replicator.ActionFix,
				Message: fmt.Sprintf("%s is attached to %s in this process, not %s", path, db.url, streamURL)}
		}
		if (db.replica == nil) != opts.ReadOnly {
			return nil, &replicator.Error{Kind: replicator.KindInUse, Action: replicator.ActionFix,
				Message: fmt.Sprintf("%s is already attached in this process with another mode (read-only vs owner)", path)}
		}
		db.refs++
		return db, nil
	}
	lk, err := LockFile(LockPath(path))
	if err != nil {
		return nil, err
	}
	db := &Database{path: path, url: streamURL, pageSize: 4096, lock: lk, refs: 1}
	if opts.ReadOnly {
		c := opts.Client
		if c == nil {
			var err error
			if c, err = replicator.NewClient(streamURL, nil); err != nil {
				lk.Release()
				return nil, err
			}
		}
		img, err := replicator.Restore(context.Background(), c, streamURL, path, 0, streamcore.MaxRequestBytes, nil)
		if err != nil {
			lk.Release()
			return nil, err
		}
		db.roOffset = img.Tail
	} else {
		r, err := replicator.Attach(context.Background(), streamURL, path, replicator.Options{Client: opts.Client, AttemptLimit: opts.AttemptLimit})
		if err != nil {
			lk.Release()
			return nil, err
		}
		db.replica = r
	}
	registry[path] = db
	return db, nil
}

// Detach releases one Attach; the last one records the local state in the sidecar and
// lets other processes have the file.
func (db *Database) Detach() {
	registryMu.Lock()
	defer registryMu.Unlock()
	if db.refs--; db.refs > 0 {
		return
	}
	delete(registry, db.path)
	if db.replica != nil {
		db.replica.SaveState()
		if c, ok := any(db.replica).(interface{ Close() error }); ok {
			c.Close()
		}
	}
	db.lock.Release()
}

// Path is the database file's absolute path; URL the stream it is attached to.
func (db *Database) Path() string { return db.path }
func (db *Database) URL() string  { return db.url }

// Replica is the owner side of the stream (nil when attached read-only).
func (db *Database) Replica() *replicator.Replica { return db.replica }

// ReadOnly reports whether the database was attached read-only (no replica).
func (db *Database) ReadOnly() bool { return db.replica == nil }

// Offset is the stream offset the local file reflects: the replica's tail for an owner,
// the offset the rebuild reached for a read-only attach. (Used by the C extension.)
func (db *Database) Offset() uint64 {
	if db.replica == nil {
		return db.roOffset
	}
	return db.replica.Status().Offset
}

// Usable is the error reads and writes of a fenced or poisoned database fail with.
func (db *Database) Usable() error {
	if db.replica == nil {
		return nil
	}
	return db.replica.Usable()
}

// LockPath is the lock file that keeps a database file to one process: <path>-ursula.lock.
func LockPath(dbPath string) string { return dbPath + "-ursula.lock" }

// FileLock is an exclusive flock held while a database is attached or followed, so a
// second process on the same file gets in_use instead of writing beside the first.
type FileLock struct{ f *os.File }

// LockFile takes the exclusive lock on the lock file at path (see LockPath), creating
// it; a lock another process holds is an in_use error.
func LockFile(path string) (*FileLock, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, &replicator.Error{Kind: replicator.KindLocalSetup, Action: replicator.ActionFix, Err: err,
			Message: fmt.Sprintf("cannot create the lock file %s", path)}
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		return nil, &replicator.Error{Kind: replicator.KindInUse, Action: replicator.ActionFix, Err: err,
			Message: fmt.Sprintf("%s is attached by another process", strings.TrimSuffix(path, "-ursula.lock"))}
	}
	return &FileLock{f: f}, nil
}

// Release gives the lock up (a nil lock is a no-op).
func (l *FileLock) Release() {
	if l != nil && l.f != nil {
		syscall.Flock(int(l.f.Fd()), syscall.LOCK_UN)
		l.f.Close()
	}
}
