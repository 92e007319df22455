package replicator

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ursula-go/ursula/client"
	"github.com/ursula-go/ursula/replicator/internal/sidecar"
	"github.com/ursula-go/ursula/streamcore"
)

// ProducerIDFor is the Producer-Id every owner of one incarnation of a stream uses, so a
// newer claim (a higher epoch) fences every older owner with 403. Naming the incarnation
// keeps the producer keys of a deleted and recreated stream apart from the old ones.
func ProducerIDFor(incarnation string) string { return "sqlite-ursula-vfs/" + incarnation }

// Options configure a replica. Zero values take the URSULA_VFS_* environment variables,
// then the defaults.
type Options struct {
	Client        *client.Client
	RetryBudget   time.Duration // URSULA_VFS_RETRY_MS, default 30 s
	AttemptLimit  time.Duration // per append attempt, default 10 s
	MaxFrameBytes int           // URSULA_VFS_MAX_FRAME_BYTES, default 32 MiB
	// SnapshotMinBytes is the smallest log between snapshots (URSULA_VFS_SNAPSHOT_MIN_BYTES,
	// default 8 MiB): a snapshot is due when the log since the latest one exceeds
	// max(database size, SnapshotMinBytes).
	SnapshotMinBytes int
	// SnapshotPartBytes is the largest snapshot body sent in one request; a larger body
	// is uploaded in parts of this size where the server accepts parts. 0: the server's
	// Ursula-Max-Request-Bytes (32 MiB). Tests lower it to exercise several parts.
	SnapshotPartBytes int
	Log               io.Writer // logfmt events; default stderr

	tokenFile string // URSULA_VFS_TOKEN_FILE, re-read on every 401
	tokenSeen uint64 // tokenVersion last applied

	// Set by this package's tests only; zero takes the default.
	statsCap          int              // measurements kept per kind between drains (defaultStatsCap)
	outagePullForward time.Duration    // see defaultOutagePullForward
	now               func() time.Time // the clock of the idle re-claim (time.Now)
	beforeCycle       func()           // called at the start of each snapshot attempt (panics injected)
}

// reloadToken reads the token file again. An empty, missing or unreadable file keeps the
// last token (a half-written rotation must not log everyone out).
func (o *Options) reloadToken() {
	if tok := tokenOverride.Load(); tok != nil {
		o.Client.SetToken(*tok)
		return
	}
	if o.tokenFile == "" {
		return
	}
	b, err := os.ReadFile(o.tokenFile)
	if tok := string(bytes.TrimSpace(b)); err == nil && tok != "" {
		o.Client.SetToken(tok)
		return
	}
	fmt.Fprintf(o.Log, "sqlite-ursula-vfs level=warn event=token_file_unreadable file=%q\n", o.tokenFile)
}

// tokenOverride is the process-wide token of SetToken; it takes precedence over
// URSULA_VFS_TOKEN_FILE until SetToken("") clears it.
var (
	tokenOverride atomic.Pointer[string]
	tokenVersion  atomic.Uint64
)

// SetToken sets the bearer token every replica of this process sends from its next
// request on, over URSULA_VFS_TOKEN_FILE; "" clears it (back to the token file).
func SetToken(token string) {
	if token == "" {
		tokenOverride.Store(nil)
	} else {
		tokenOverride.Store(&token)
	}
	tokenVersion.Add(1)
}

// syncToken applies a SetToken made since the last look (one atomic load per request).
func (o *Options) syncToken() {
	if v := tokenVersion.Load(); v != o.tokenSeen {
		o.tokenSeen = v
		if tokenOverride.Load() == nil && o.tokenFile == "" {
			o.Client.SetToken("")
		}
		o.reloadToken()
	}
}

// defaults fills the zero options for a replica of streamURL (which its events name).
func (o *Options) defaults(streamURL string) error {
	if o.SnapshotMinBytes == 0 {
		o.SnapshotMinBytes = envInt("URSULA_VFS_SNAPSHOT_MIN_BYTES", 8<<20)
	}
	if o.RetryBudget == 0 {
		o.RetryBudget = envDuration("URSULA_VFS_RETRY_MS", 30*time.Second)
	}
	if o.AttemptLimit == 0 {
		o.AttemptLimit = 10 * time.Second
	}
	if o.Log == nil {
		o.Log = os.Stderr
	}
	if o.MaxFrameBytes == 0 {
		var adjusted string
		if o.MaxFrameBytes, adjusted = maxFrameFromEnv(); adjusted != "" {
			writeEvent(o.Log, streamURL, "setting_adjusted", "%s", adjusted)
		}
	}
	if o.statsCap == 0 {
		o.statsCap = defaultStatsCap
	}
	if o.now == nil {
		o.now = time.Now
	}
	if o.outagePullForward == 0 {
		o.outagePullForward = defaultOutagePullForward
	}
	if o.Client == nil {
		c, err := NewClient(streamURL, o.Log)
		if err != nil {
			return err
		}
		o.Client = c
		o.tokenFile = os.Getenv("URSULA_VFS_TOKEN_FILE")
		o.reloadToken()
	}
	return nil
}

func envInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return def
}

func envDuration(name string, def time.Duration) time.Duration {
	if v := envInt(name, 0); v > 0 {
		return time.Duration(v) * time.Millisecond
	}
	return def
}

// CheckURL refuses stream URLs that cannot name a stream (checklist-vfs B). A URL may name
// several nodes of one cluster (http://n1:4437,n2:4437,n3:4437/bucket/stream); a malformed
// node list is refused here too.
func CheckURL(raw string) error {
	nu, multi, err := client.ParseNodeURL(raw)
	if err != nil {
		return newError(KindInvalidURL, ActionFix, nil, "%s", err.Error())
	}
	if multi {
		// The rest of the URL is checked as the URL of the first node.
		raw = nu.At(0)
	}
	u, err := url.Parse(raw)
	switch {
	case err != nil:
		return newError(KindInvalidURL, ActionFix, err, "stream URL %q does not parse", raw)
	case u.Scheme != "http" && u.Scheme != "https":
		return newError(KindInvalidURL, ActionFix, nil, "stream URL must start with http:// or https://")
	case u.Host == "":
		return newError(KindInvalidURL, ActionFix, nil, "stream URL has no host")
	case u.RawQuery != "" || u.ForceQuery:
		return newError(KindInvalidURL, ActionFix, nil, "stream URL must not have a query string")
	case u.Fragment != "":
		return newError(KindInvalidURL, ActionFix, nil, "stream URL must not have a fragment")
	case u.Path == "" || u.Path == "/":
		return newError(KindInvalidURL, ActionFix, nil, "stream URL has no stream path")
	}
	return nil
}

// urlRefusal is the *client.URLError in err, if any: a node list of mixed clusters or a
// redirect outside the list.
func urlRefusal(err error) *client.URLError {
	var ue *client.URLError
	if errors.As(err, &ue) {
		return ue
	}
	return nil
}

// Replica is the owner side of one database's stream: it claimed the stream and turns
// every commit into one acknowledged record.
type Replica struct {
	url         string
	path        string
	opts        Options
	incarnation string
	savedAt     time.Time // last sidecar write
	attachMode  string    // "resumed" or "rebuilt"
	attachMs    int64
	clearText   bool        // a token sent to url crosses a network unencrypted (tokenInClear)
	tokenWarned atomic.Bool // token_in_clear was logged

	mu       sync.Mutex
	epoch    uint64
	seq      uint64 // last producer seq used (the claim is 0)
	tail     uint64 // offset the local file reflects
	pageSize uint32
	fenced   bool
	poisoned bool
	lastErr  *Error
	// payment is the reason of the 402 refusals under way ("" when none): it stays
	// through other refusals (a too_large commit says nothing about payment) until a
	// commit succeeds or the replica is poisoned.
	payment   string
	installed uint64 // snapshot offset the last attach installed (0: none)
	// stopped is the poison or fence that stopped this replica. It is atomic so that
	// Usable need not wait for r.mu: a commit holds that for its whole round trip
	// (retries included), and the reads of other connections check Usable at every
	// statement and every page read.
	stopped atomic.Pointer[Error]
	// refused is a commit that failed on a refusal that proved nothing (no vouched
	// not-applied marker): a proxy may have answered after the stream applied it. The
	// next commit first learns whether it did (checkRefused).
	refused *refusedCommit
	// lastWrite is when this owner last wrote the stream (claim or acknowledged commit),
	// by opts.now: the server forgets an idle producer (producerIdle), so the next
	// commit after that claims the stream again first.
	lastWrite time.Time
	damaged   string // why the local files lost a write the stream holds (Poison)
	commits   uint64
	retries   uint64 // append attempts beyond the first, over acknowledged commits
	logBytes  uint64 // bytes appended by this replica
	dbBytes   uint64 // database size after the last commit (snapshot_due_bytes)

	snap *snapshotter // snapshot + retention goroutine (snapshot.go); nil until attached

	stats statsBuf // measurements until DrainStats (stats.go)
}

// Attach makes the local database file at path reflect the stream at url and claims the
// stream. The local files are a cache: when the sidecar <path>-ursula says they were
// written on this boot, for this stream and incarnation, to this very file, Attach folds
// the local WAL into the file and replays only the records after the sidecar's offset;
// anything doubtful discards them and rebuilds from the latest snapshot plus the tail.
//
// Refusals that change nothing: a file with data but no sidecar (unreplicated_file), a
// sidecar naming another stream URL (other_stream), and a missing stream while the file
// holds data (not_found: a stream is never replaced). A missing stream with an empty or
// absent file is created.
func Attach(ctx context.Context, streamURL, path string, opts Options) (*Replica, error) {
	attachStart := time.Now()
	if err := CheckURL(streamURL); err != nil {
		return nil, err
	}
	if err := opts.defaults(streamURL); err != nil {
		return nil, err
	}
	sc, scErr := sidecar.Read(path)
	hasData := fileHasData(path)
	switch {
	case sc == nil && scErr == nil && hasData:
		return nil, newError(KindUnreplicated, ActionFix, nil,
			"%s holds data but was never attached (no sidecar %s); it is left as it is. To replicate its rows, copy them into a database opened with vfs.Open at another path (for example with ATTACH and INSERT ... SELECT)",
			path, SidecarPath(path))
	case sc != nil && !client.SameStream(sc.URL, streamURL):
		return nil, newError(KindOtherStream, ActionFix, nil,
			"%s is the local copy of %s, not %s; use another path, or spell the URL exactly as before", path, sc.URL, streamURL)
	}
	c := opts.Client
	r := &Replica{url: streamURL, path: path, opts: opts, stats: statsBuf{cap: opts.statsCap}, clearText: tokenInClear(streamURL)}
	r.warnTokenInClear()
	var info *client.StreamInfo
	err := r.attachRetry(ctx, "HEAD of the stream", func() (err error) {
		info, err = c.Head(ctx, streamURL)
		return err
	})
	if err != nil {
		var ce *client.Error
		if !errors.As(err, &ce) || ce.Status != http.StatusNotFound {
			return nil, classifyRead(err, "HEAD of the stream")
		}
		if hasData {
			return nil, newError(KindNotFound, ActionFix, nil, "the stream does not exist but %s holds data; refusing to replace either (delete the file to start over from an empty stream)", path)
		}
		if _, err := c.Create(ctx, streamURL, client.CreateOptions{ContentType: "application/octet-stream"}); err != nil {
			return nil, classifyRead(err, "creating the stream")
		}
		if info, err = c.Head(ctx, streamURL); err != nil {
			return nil, classifyRead(err, "HEAD of the new stream")
		}
	}
	r.incarnation = info.Incarnation
	img, why := resume(ctx, r, sc, scErr, info)
	if img == nil {
		if sc != nil || scErr != nil || hasData {
			r.logf("local_files_discarded", "file=%q reason=%q", path, why)
		}
		r.logf("attach_rebuilding", "file=%q reason=%q", path, why)
		err = r.attachRetry(ctx, "rebuilding from the stream", func() (err error) {
			img, err = Restore(ctx, c, streamURL, path, 0, opts.MaxFrameBytes, nil)
			return err
		})
		if err != nil {
			return nil, err
		}
	}
	r.attachMs = time.Since(attachStart).Milliseconds()
	r.attachMode = "resumed"
	if why != "" {
		r.attachMode = "rebuilt"
	}
	r.tail, r.pageSize, r.epoch, r.installed = img.Tail, img.PageSize, img.Epoch, img.SnapshotOffset
	// The sidecar goes down before the claim: a file the rebuild replayed pages into
	// must stay recognisable as this stream's cache should the claim fail, so the next
	// attach resumes it instead of refusing it as an unreplicated file.
	if err := r.SaveState(); err != nil {
		return nil, newError(KindLocalSetup, ActionFix, err, "writing the sidecar %s", SidecarPath(path))
	}
	err = r.claim(ctx, img.Epoch+1)
	for late := 0; err != nil && late < 3 && streamMoved(err); late++ {
		// Records landed between our read of the tail and the claim. When they are the
		// late commits of the owner this claim fences, catch up over them and claim again.
		ok, lerr := r.lateCommits(ctx, img)
		if lerr != nil {
			err = lerr
		}
		if !ok {
			break // the claim's own fence error stands, or the catch-up's
		}
		if err = r.SaveState(); err != nil {
			return nil, newError(KindLocalSetup, ActionFix, err, "writing the sidecar %s", SidecarPath(path))
		}
		err = r.claim(ctx, img.Epoch+1)
	}
	if err != nil {
		if sc == nil && !fileHasData(path) {
			// Nothing was written into a new file: leave no sidecar behind either.
			if rerr := os.Remove(SidecarPath(path)); rerr != nil && !errors.Is(rerr, os.ErrNotExist) {
				r.logAt("error", "attach_restore_failed", "file=%q reason=%q", path, rerr.Error())
			}
		}
		return nil, err
	}
	if err := r.SaveState(); err != nil {
		return nil, newError(KindLocalSetup, ActionFix, err, "writing the sidecar %s", SidecarPath(path))
	}
	r.startSnapshots(img, info)
	return r, nil
}

// resume brings the local files up to the stream's tail when the sidecar allows it, and
// says why not otherwise (nil image).
func resume(ctx context.Context, r *Replica, sc *sidecar.File, scErr error, info *client.StreamInfo) (*Image, string) {
	tail, _ := streamcore.ParseOffset(info.NextOffset)
	retained, _ := streamcore.ParseOffset(info.RetainedOffset)
	switch {
	case scErr != nil:
		return nil, scErr.Error()
	case sc == nil:
		return nil, "no sidecar"
	case sc.Damaged != "":
		return nil, "the local files lost a write: " + sc.Damaged
	case sc.BootID == "" || sc.BootID != sidecar.BootID():
		return nil, "written on another boot"
	case sc.Incarnation != info.Incarnation:
		return nil, "the stream was recreated (new incarnation)"
	case sc.Inode != sidecar.Inode(r.path):
		return nil, "the database file was replaced"
	case sc.Offset > tail:
		return nil, fmt.Sprintf("the sidecar offset %d is past the stream tail %d", sc.Offset, tail)
	case sc.Offset < retained:
		return nil, fmt.Sprintf("the sidecar offset %d is below retention %d", sc.Offset, retained)
	}
	if _, err := foldWAL(r.path); err != nil {
		return nil, "folding the local WAL: " + err.Error()
	}
	f, err := os.OpenFile(r.path, os.O_RDWR, 0)
	if err != nil {
		return nil, err.Error()
	}
	defer f.Close()
	img := &Image{Epoch: sc.Epoch}
	var hdr [100]byte
	if n, _ := f.ReadAt(hdr[:], 0); n == len(hdr) {
		img.PageSize = uint32(binary.BigEndian.Uint16(hdr[16:]))
		if img.PageSize == 1 {
			img.PageSize = 65536
		}
		img.DBPages = binary.BigEndian.Uint32(hdr[28:])
	}
	if err := replay(ctx, r.opts.Client, r.url, f, img, sc.Offset, tail, r.opts.MaxFrameBytes, nil); err != nil {
		return nil, "replaying the tail: " + err.Error()
	}
	if img.PageSize != 0 {
		if err := f.Truncate(int64(img.DBPages) * int64(img.PageSize)); err != nil {
			return nil, err.Error()
		}
	}
	r.logf("resumed", "file=%q from=%d to=%d commits=%d", r.path, sc.Offset, tail, img.Commits)
	return img, ""
}

// streamMoved reports whether a claim was refused, provably not applied, because the
// stream's tail was no longer the one the attach caught up to (a Stream-Seq conflict).
func streamMoved(err error) bool {
	var ce *client.Error
	return errors.As(err, &ce) && ce.Status == http.StatusConflict && ce.Code == streamcore.CodeStreamSeqConflict
}

// lateCommits catches the local files up over records that landed after the attach read
// the tail. It takes them only when they are commits, under the epoch the coming claim
// fences: attempts of the previous owner still in flight when it gave up on an unknown
// outcome may land late, and the owner's commits acknowledged before the claim are kept
// (checklist T12). A claim among them is another owner attaching: false, and the caller
// reports the fence.
func (r *Replica) lateCommits(ctx context.Context, img *Image) (bool, error) {
	info, err := r.opts.Client.Head(ctx, r.url)
	if err != nil || info.Incarnation != r.incarnation {
		return false, nil
	}
	tail, _ := streamcore.ParseOffset(info.NextOffset)
	if tail <= r.tail {
		return false, nil
	}
	f, err := os.OpenFile(r.path, os.O_RDWR, 0)
	if err != nil {
		return false, newError(KindLocalSetup, ActionFix, err, "opening %s", r.path)
	}
	defer f.Close()
	from, epoch, commits := r.tail, img.Epoch, img.Commits
	img.Tail = r.tail
	if err := catchUp(ctx, r.opts.Client, r.url, f, img, tail, r.opts.MaxFrameBytes); err != nil {
		return false, err
	}
	if img.Epoch != epoch {
		return false, nil // a claim landed: another owner
	}
	if img.PageSize != 0 {
		if err := f.Truncate(int64(img.DBPages) * int64(img.PageSize)); err != nil {
			return false, newError(KindLocalSetup, ActionFix, err, "truncating %s", r.path)
		}
	}
	r.mu.Lock()
	r.tail, r.pageSize = img.Tail, img.PageSize
	r.mu.Unlock()
	r.logf("attach_caught_up", "file=%q from=%d to=%d commits=%d reason=%q", r.path, from, img.Tail, img.Commits-commits, "commits of the fenced epoch landed while attaching")
	return true, nil
}

// fileHasData reports whether the database at path holds anything (file or WAL).
func fileHasData(path string) bool {
	for _, p := range []string{path, path + "-wal"} {
		if st, err := os.Stat(p); err == nil && st.Size() > 0 {
			return true
		}
	}
	return false
}

// SaveState records in the sidecar the offset the local files reflect. Commits are
// serialized and each one's WAL write-back finishes before the next starts, so r.tail is
// always reflected locally once the commit that produced it returned.
func (r *Replica) SaveState() error {
	r.mu.Lock()
	sc := &sidecar.File{URL: r.url, Incarnation: r.incarnation, Offset: r.tail, Epoch: r.epoch}
	sc.Damaged = r.damaged
	r.mu.Unlock()
	sc.BootID, sc.Inode = sidecar.BootID(), sidecar.Inode(r.path)
	return sidecar.Write(r.path, sc)
}

// claim appends a claim record at epoch and verifies it by reading it back: a 2xx alone
// proves nothing about who owns the stream.
func (r *Replica) claim(ctx context.Context, epoch uint64) error {
	var cl Claim
	cl.Epoch, cl.UnixNano = epoch, time.Now().UnixNano()
	rand.Read(cl.Nonce[:])
	body := encodeClaim(cl)
	wr, err := r.opts.Client.Append(ctx, r.url, body, client.AppendOptions{
		ContentType:   "application/octet-stream",
		Producer:      &client.ProducerKey{ID: ProducerIDFor(r.incarnation), Epoch: epoch, Seq: 0},
		Digest:        true,
		IfIncarnation: r.incarnation,
		StreamSeq:     streamcore.FormatOffset(r.tail),
	})
	if err != nil {
		var ce *client.Error
		if errors.As(err, &ce) && (ce.Fenced() || ce.Status == http.StatusConflict) {
			return newError(KindFenced, ActionReattach, err, "another owner claimed the stream while attaching")
		}
		// A 403 without Producer-Epoch and without both not-applied headers may come from a
		// layer that answered after the stream applied the claim (checklist-vfs J84, X216):
		// it proves nothing, and it is not a fence.
		unprovenForbidden := ce != nil && ce.Status == http.StatusForbidden && classifyCommit(err, 0).unproven
		if v := classifyCommit(err, 0); v.step == stepRetryUnknown || unprovenForbidden {
			// The claim may have landed, fencing the previous owner: nothing here can say.
			return newError(KindOutcomeUnknown, ActionReattach, err, "claiming the stream: %s; the claim may have fenced the previous owner, attach again", v.reason)
		}
		return classifyRead(err, "claiming the stream")
	}
	start, _ := streamcore.ParseOffset(wr.Offset)
	end, _ := streamcore.ParseOffset(wr.NextOffset)
	rr, err := r.opts.Client.Read(ctx, r.url, client.ReadOptions{Offset: wr.Offset, MaxBytes: int(end - start)})
	if err != nil {
		return newError(KindOutcomeUnknown, ActionReattach, err, "the claim was acknowledged but reading it back failed; it may have fenced the previous owner, attach again")
	}
	recs, _, derr := DecodeRecords(rr.Data, start, r.opts.MaxFrameBytes)
	if derr != nil || len(recs) != 1 || recs[0].Claim == nil || recs[0].Claim.Nonce != cl.Nonce {
		return newError(KindFenced, ActionReattach, derr, "the claim read back from offset %d is not ours", start)
	}
	if start != r.tail {
		// Records landed between our rebuild and our claim: another writer is active.
		return newError(KindFenced, ActionReattach, nil, "the stream moved from %d to %d while attaching", r.tail, start)
	}
	r.epoch, r.seq, r.tail = epoch, 0, end
	r.lastWrite = r.opts.now()
	r.logBytes += end - start
	r.logf("claimed", "epoch=%d offset=%d", epoch, end)
	return nil
}

// producerIdle is how long the server keeps an idle producer's state: after it, a
// commit under the old claim would be a new producer's first append, not checked
// against the claim's epoch.
const producerIdle = 7 * 24 * time.Hour

// reclaim claims the stream again with the next epoch before a commit after a long idle
// time. The claim carries Stream-Seq and must land at this owner's tail, so it succeeds
// only if nobody wrote meanwhile; anything else means another writer: fenced.
func (r *Replica) reclaim(ctx context.Context, idle time.Duration) error {
	r.logf("reclaiming", "file=%q idle_ms=%d epoch=%d", r.path, idle.Milliseconds(), r.epoch+1)
	err := r.claim(ctx, r.epoch+1)
	if err == nil {
		return nil
	}
	e, ok := AsError(err)
	if !ok {
		e = newError(KindOutcomeUnknown, ActionReattach, err, "claiming the stream again after %v idle", idle.Round(time.Hour))
	}
	if e.Kind == KindFenced {
		r.fenced = true
		return r.fail(newError(KindFenced, ActionStop, err, "another writer wrote the stream during the %v this owner was idle: %s", idle.Round(time.Hour), e.Message), true)
	}
	// Nothing of the commit went out; the next commit claims again.
	return r.fail(newError(e.Kind, ActionRetry, err, "claiming the stream again after %v idle failed: %s", idle.Round(time.Hour), e.Message), false)
}

// Commit appends one commit record and returns once the server acknowledged it. The
// outcome rules (docs/architecture.md, the commit trace): not applied fails alone and the database stays
// usable; unknown is retried with the same producer seq within the retry budget, then
// the replica is poisoned; a 403 fence stops it for good.
//
// Every attempt carries the frame's Producer-Digest and the stream's incarnation, so the
// server answers a repeat only for this very frame and refuses any other write under the
// same producer key with 403 key-conflict. An acknowledgement counts only when its
// receipt spans this frame at the offset it was sent for. A refusal that proves nothing
// (no vouched not-applied marker: a proxy may have answered after the stream applied the
// write) is checked against the stream before the commit fails or the next one starts.
func (r *Replica) Commit(ctx context.Context, cm *Commit) error {
	commitStart := time.Now()
	r.mu.Lock()
	defer r.mu.Unlock()
	if err := r.Usable(); err != nil {
		return err
	}
	if r.refused != nil {
		if err := r.settleRefused(ctx); err != nil {
			return err
		}
	}
	if idle := r.opts.now().Sub(r.lastWrite); idle >= producerIdle {
		if err := r.reclaim(ctx, idle); err != nil {
			return err
		}
	}
	if cm.UnixNano == 0 {
		cm.UnixNano = commitStart.UnixNano()
	}
	body, err := encodeCommit(cm)
	if err != nil {
		return newError(KindUnsupported, ActionFix, err, "encoding the commit")
	}
	if len(body) > r.opts.MaxFrameBytes {
		return r.fail(newError(KindTooLarge, ActionFix, nil, "commit frame of %d bytes is over the %d byte limit (URSULA_VFS_MAX_FRAME_BYTES)", len(body), r.opts.MaxFrameBytes), false)
	}
	if time.Since(r.savedAt) > time.Second {
		// r.tail is reflected locally (the previous commit's write-back is done), so a
		// crash resumes from here at worst.
		r.savedAt = time.Now()
		sc := &sidecar.File{URL: r.url, Incarnation: r.incarnation, Offset: r.tail, Epoch: r.epoch, BootID: sidecar.BootID(), Inode: sidecar.Inode(r.path)}
		if err := sidecar.Write(r.path, sc); err != nil {
			r.logf("sidecar_failed", "err=%q", err.Error())
		}
	}
	sent := &sentCommit{seq: r.seq + 1, start: r.tail, body: body}
	opts := client.AppendOptions{
		ContentType:   "application/octet-stream",
		Producer:      &client.ProducerKey{ID: ProducerIDFor(r.incarnation), Epoch: r.epoch, Seq: sent.seq},
		Digest:        true,
		IfIncarnation: r.incarnation,
		StreamSeq:     streamcore.FormatOffset(sent.start),
	}
	deadline := time.Now().Add(r.opts.RetryBudget)
	backoff := 50 * time.Millisecond
	var unknown error // the first attempt whose outcome is unknown: later refusals prove nothing
	var unproven bool // some attempt was refused without proof that it applied nothing
	for attempt := 1; ; attempt++ {
		r.opts.syncToken()
		r.warnTokenInClear()
		actx, cancel := context.WithTimeout(ctx, min(r.opts.AttemptLimit, time.Until(deadline)))
		appendStart := time.Now()
		wr, err := r.opts.Client.Append(actx, r.url, body, opts)
		appendMs := msSince(appendStart)
		cancel()
		if err == nil {
			if perr := r.proveReceipt(ctx, wr, sent); perr != nil {
				r.poisoned = true
				return r.fail(perr, true)
			}
			r.acked(cm, sent, CommitMeasurement{StartMs: commitStart.UnixMilli(), Ms: msSince(commitStart), AppendMs: appendMs,
				Attempts: attempt, Retries: attempt - 1})
			return nil
		}
		v := classifyCommit(err, sent.seq)
		unproven = unproven || v.unproven
		switch v.step {
		case stepFence:
			r.fenced = true
			return r.fail(newError(KindFenced, ActionStop, err, "%s", v.reason), true)
		case stepPoison:
			r.poisoned = true
			return r.fail(newError(v.kind, ActionReattach, err, "%s", v.reason), true)
		case stepFix:
			r.poisoned = true
			return r.fail(newError(v.kind, ActionFix, err, "%s", v.reason), true)
		case stepFailAlone:
			if unknown != nil {
				break // an earlier attempt may have applied it: keep trying
			}
			if unproven {
				return r.failUnproven(ctx, cm, sent, newError(v.kind, ActionRetry, err, "%s", v.reason), attempt, commitStart)
			}
			return r.fail(newError(v.kind, ActionRetry, err, "%s; nothing of the commit reached the stream and the database stays usable", v.reason), false)
		case stepRetryUnknown:
			if unknown == nil {
				unknown = err
			}
		}
		wait := backoff
		var ce *client.Error
		if errors.As(err, &ce) && ce.RetryAfter > 0 {
			wait = max(wait, ce.RetryAfter)
		}
		if ctx.Err() != nil || time.Until(deadline) <= wait {
			r.logf("append_gave_up", "attempt=%d seq=%d elapsed_ms=%d reason=%q", attempt, sent.seq, r.opts.RetryBudget.Milliseconds(), err.Error())
			if unknown != nil {
				r.poisoned = true
				return r.fail(newError(KindOutcomeUnknown, ActionReattach, err, "commit outcome unknown after %d attempts within %v (first unknown: %v)", attempt, r.opts.RetryBudget, unknown), true)
			}
			if unproven {
				return r.failUnproven(ctx, cm, sent, newError(v.kind, ActionRetry, err, "%s after %d attempts within %v", v.reason, attempt, r.opts.RetryBudget), attempt, commitStart)
			}
			return r.fail(newError(v.kind, ActionRetry, err, "%s after %d attempts within %v; nothing of the commit reached the stream and the database stays usable", v.reason, attempt, r.opts.RetryBudget), false)
		}
		r.retries++
		r.stats.retry()
		r.logf("append_retry", "attempt=%d seq=%d reason=%q", attempt, sent.seq, err.Error())
		if v.kind == KindUnauthorized {
			r.opts.reloadToken()
		}
		select {
		case <-time.After(wait):
		case <-ctx.Done():
		}
		backoff = min(2*backoff, 2*time.Second)
	}
}

// sentCommit is one commit frame as sent: its producer seq, the offset it was sent for
// (its Stream-Seq) and its bytes.
type sentCommit struct {
	seq   uint64
	start uint64
	body  []byte
}

func (s *sentCommit) end() uint64 { return s.start + uint64(len(s.body)) }

// refusedCommit is a commit that failed on a refusal that proved nothing, and that the
// stream did not hold (or could not be read) when it failed. It may still arrive: a
// proxy may hold it. The next commit reuses its producer seq with another digest, so the
// server keeps at most one of the two.
type refusedCommit = sentCommit

// acked records an acknowledged commit.
func (r *Replica) acked(cm *Commit, sent *sentCommit, m CommitMeasurement) {
	r.seq, r.tail = sent.seq, sent.end()
	r.lastWrite = r.opts.now()
	r.commits++
	r.logBytes += uint64(len(sent.body))
	if r.lastErr != nil && !r.poisoned && !r.fenced {
		r.logf("writes_resumed", "after=%s", r.lastErr.Kind)
	}
	r.lastErr, r.payment = nil, ""
	r.dbBytes = uint64(cm.DBPages) * uint64(cm.PageSize)
	r.snap.poke() // never blocks: the snapshot goroutine decides
	m.Bytes, m.Pages, m.Offset = len(sent.body), len(cm.Pages), streamcore.FormatOffset(sent.start)
	r.stats.commit(m)
}

// proveReceipt checks that a 2xx answer acknowledges this very frame. The request's
// Producer-Digest makes the server answer a repeat only for the same bytes; the receipt
// must then span exactly this frame at the offset it was sent for. A repeat whose
// receipt the server evicted is proved by reading the stream there.
func (r *Replica) proveReceipt(ctx context.Context, wr *client.WriteResult, sent *sentCommit) *Error {
	if wr.NextOffset == "" {
		held, err := r.streamHolds(ctx, sent)
		switch {
		case err != nil:
			return newError(KindOutcomeUnknown, ActionReattach, err, "the commit was answered as a repeat whose receipt was evicted, and reading the stream to check it failed; re-attach to learn what the stream holds")
		case !held:
			return newError(KindOutcomeUnknown, ActionReattach, nil, "the commit was answered as a repeat whose receipt was evicted, but the stream does not hold it at offset %d; re-attach to learn what the stream holds", sent.start)
		}
		return nil
	}
	start, err1 := streamcore.ParseOffset(wr.Offset)
	end, err2 := streamcore.ParseOffset(wr.NextOffset)
	if err1 != nil || err2 != nil || start != sent.start || end != sent.end() {
		return newError(KindOutcomeUnknown, ActionReattach, nil,
			"the commit at producer seq %d was acknowledged with a receipt for [%s, %s), not the [%d, %d) its frame spans: the answer is not this commit's; re-attach to learn what the stream holds",
			sent.seq, wr.Offset, wr.NextOffset, sent.start, sent.end())
	}
	return nil
}

// failUnproven ends a commit whose refusals proved nothing. If the stream holds the frame
// where it was sent, a layer refused it after the stream applied it: the commit is
// acknowledged after all, so the local file takes it too. Otherwise it fails alone and
// the next commit checks again first.
func (r *Replica) failUnproven(ctx context.Context, cm *Commit, sent *sentCommit, e *Error, attempt int, commitStart time.Time) error {
	held, err := r.streamHolds(ctx, sent)
	switch {
	case err == nil && held:
		r.logf("refused_commit_applied", "seq=%d offset=%d refusal=%q", sent.seq, sent.start, e.Message)
		r.acked(cm, sent, CommitMeasurement{StartMs: commitStart.UnixMilli(), Ms: msSince(commitStart), Attempts: attempt, Retries: attempt - 1})
		return nil
	case err == nil:
		e.Message += "; the stream does not hold the commit and the database stays usable"
	default:
		e.Message += "; whether the stream holds the commit could not be read (" + err.Error() + "), and the next commit checks first"
	}
	r.refused = sent
	return r.fail(e, false)
}

// settleRefused learns, before a commit reuses the producer seq a refused commit left
// free, whether the stream holds the refused one. Held: the local file lacks a commit
// the stream has, so the replica is poisoned (attaching again replays it). Not held: the
// commit goes on; should the refused one still arrive, the server refuses whichever of
// the two comes second (key-conflict), and that poisons too. Unreadable: this commit is
// refused without being sent.
func (r *Replica) settleRefused(ctx context.Context) error {
	rc := r.refused
	held, err := r.streamHolds(ctx, rc)
	switch {
	case err != nil:
		r.logf("refused_commit_unchecked", "seq=%d offset=%d reason=%q", rc.seq, rc.start, err.Error())
		return r.fail(newError(KindRefusedUnchecked, ActionRetry, err,
			"a commit at producer seq %d was refused without proof that the stream did not apply it, and the stream could not be read to check; commits are refused until the check succeeds", rc.seq), false)
	case held:
		r.poisoned = true
		return r.fail(newError(KindLocalState, ActionReattach, nil,
			"a commit refused as never applied may have been applied after all: the stream holds it at offset %d (producer seq %d); attach again to replay it", rc.start, rc.seq), true)
	}
	r.refused = nil
	return nil
}

// streamHolds reports whether the stream holds sent's frame at the offset it was sent for.
func (r *Replica) streamHolds(ctx context.Context, sent *sentCommit) (bool, error) {
	r.opts.syncToken()
	ctx, cancel := context.WithTimeout(ctx, r.opts.AttemptLimit)
	defer cancel()
	got := make([]byte, 0, len(sent.body))
	for off := sent.start; len(got) < len(sent.body); {
		rr, err := r.opts.Client.Read(ctx, r.url, client.ReadOptions{
			Offset: streamcore.FormatOffset(off), MaxBytes: len(sent.body) - len(got), IfIncarnation: r.incarnation,
		})
		if err != nil {
			var ce *client.Error
			if errors.As(err, &ce) && (ce.Status == http.StatusNotFound || ce.Status == http.StatusPreconditionFailed) {
				return false, nil // the write named its incarnation: it cannot be in another one
			}
			return false, err
		}
		if len(rr.Data) == 0 {
			break // the tail
		}
		got = append(got, rr.Data...)
		off += uint64(len(rr.Data))
	}
	return len(got) >= len(sent.body) && bytes.Equal(got[:len(sent.body)], sent.body), nil
}

type commitStep int

const (
	stepRetryRefused commitStep = iota // refused; retry within the budget
	stepRetryUnknown                   // outcome unknown; retry with the same seq
	stepFailAlone                      // refused; fail now, the file stays usable
	stepPoison                         // the local file may disagree with the stream: reattach
	stepFix                            // a setup problem (a redirect): poison, action fix
	stepFence                          // another owner or another incarnation: stop
)

type commitVerdict struct {
	step   commitStep
	kind   Kind
	reason string
	// unproven: a refusal without the vouched not-applied marker. Any layer can answer
	// it, also after the stream applied the write, so it is checked against the stream.
	unproven bool
}

// classifyCommit sorts one append attempt's failure. Only a refusal carrying both
// x-ursula-not-applied and x-ursula-not-applied-checked, or an attempt of which nothing
// went out, proves that nothing was applied; other refusals are checked against the
// stream; a redirect or an unmarked 5xx leaves the outcome unknown.
func classifyCommit(err error, seq uint64) commitVerdict {
	var ce *client.Error
	if !errors.As(err, &ce) {
		return commitVerdict{step: stepRetryUnknown, kind: KindOutcomeUnknown, reason: err.Error()}
	}
	marked := ce.NotApplied != "" && ce.Header.Get(streamcore.HdrNotAppliedChecked) != ""
	reason := refusalText(ce)
	verdict := func(step commitStep, kind Kind, format string, args ...any) commitVerdict {
		return commitVerdict{step: step, kind: kind, reason: fmt.Sprintf(format, args...), unproven: !marked}
	}
	if ue := urlRefusal(err); ue != nil {
		return commitVerdict{step: stepFix, kind: KindInvalidURL, reason: ue.Error()}
	}
	switch st := ce.Status; {
	case st == 0 && ce.Outcome == client.NotApplied:
		return commitVerdict{step: stepRetryRefused, kind: KindUnreachable, reason: "never sent: " + reason}
	case st == 0:
		return commitVerdict{step: stepRetryUnknown, kind: KindOutcomeUnknown, reason: "no answer: " + reason}
	case st == http.StatusForbidden && client.OutcomeToken(ce.ProducerOutcome) == "key-conflict":
		return commitVerdict{step: stepPoison, kind: KindLocalState, reason: fmt.Sprintf(
			"a commit refused as never applied may have been applied after all: the stream holds another write under producer seq %d; attach again to replay it", seq)}
	case ce.Fenced():
		return commitVerdict{step: stepFence, kind: KindFenced, reason: fmt.Sprintf("a newer owner (epoch %d) claimed the stream", ce.ProducerEpoch)}
	case st == http.StatusPreconditionFailed:
		return commitVerdict{step: stepFence, kind: KindFenced, reason: "the stream was deleted and recreated (new incarnation)"}
	case st == http.StatusConflict && ce.ProducerExpectedSeq < 0 && !ce.StreamClosed && (ce.StreamLastSeq != "" || ce.Code == streamcore.CodeStreamSeqConflict):
		return commitVerdict{step: stepFence, kind: KindFenced, reason: "another writer appended to the stream (Stream-Seq conflict)"}
	case st == http.StatusTemporaryRedirect:
		return commitVerdict{step: stepRetryUnknown, kind: KindOutcomeUnknown, reason: "307 redirect (resent to the same URL, or over a node list to the leader it names)"}
	case st >= 300 && st < 400:
		return commitVerdict{step: stepFix, kind: KindInvalidURL, reason: fmt.Sprintf("the stream URL answered %d redirecting to %q; redirects are not followed, use the URL that answers directly", st, ce.Location)}
	case st == http.StatusPaymentRequired:
		return verdict(stepFailAlone, KindPaymentRequired, "402 Payment Required: %s", reason)
	case st == http.StatusUnauthorized:
		return verdict(stepRetryRefused, KindUnauthorized, "401 Unauthorized: %s", reason)
	case st == http.StatusTooManyRequests:
		return verdict(stepRetryRefused, KindRateLimited, "429 Too Many Requests: %s", reason)
	case st == http.StatusForbidden:
		return verdict(stepFailAlone, KindForbidden, "403 Forbidden: %s", reason)
	case st == http.StatusRequestEntityTooLarge:
		return verdict(stepFailAlone, KindTooLarge, "413: %s", reason)
	case marked && st < 500:
		return verdict(stepFailAlone, KindNotApplied, "%d: %s", st, reason)
	case marked:
		return verdict(stepRetryRefused, KindNotApplied, "%d: %s", st, reason)
	case st == http.StatusNotFound:
		return commitVerdict{step: stepFence, kind: KindFenced, reason: "the stream was deleted"}
	case st >= 500:
		return commitVerdict{step: stepRetryUnknown, kind: KindOutcomeUnknown, reason: fmt.Sprintf("%d without the not-applied headers: %s", st, reason)}
	case st >= 400:
		return verdict(stepFailAlone, KindNotApplied, "%d without the not-applied headers: %s", st, reason)
	}
	return commitVerdict{step: stepPoison, kind: KindOutcomeUnknown, reason: fmt.Sprintf("%d without the not-applied headers proves nothing: %s", ce.Status, reason)}
}

// refusalText is what the refusing layer said: its error code and message, or the
// not-applied marker when the body said nothing, cut to 256 bytes plus "...".
func refusalText(ce *client.Error) string {
	reason := ce.Message
	if reason == "" && ce.NotApplied != "" {
		reason = ce.NotApplied
	}
	if ce.Code != "" {
		reason = ce.Code + ": " + reason
	}
	if len(reason) > 256 {
		reason = reason[:256] + "..."
	}
	return reason
}

// fail records a failed commit; a sticky one (poison, fence) refuses every later read
// and write until the file is attached again.
func (r *Replica) fail(e *Error, sticky bool) error {
	prev := r.lastErr
	r.lastErr = e
	if sticky && r.stopped.Load() == nil {
		r.payment = ""
		r.stopped.Store(e)
		r.logf("poisoned", "file=%q stream=%q fenced=%t kind=%s action=%s reason=%q", r.path, r.url, r.fenced, e.Kind, e.Action, e.Message)
		return e
	}
	// Refusals of one kind in a row are one episode: logged when it starts, so a client
	// retrying a refused commit in a loop does not flood the log.
	if prev == nil || prev.Kind != e.Kind {
		r.logf("writes_refused", "file=%q kind=%s reason=%q", r.path, e.Kind, e.Message)
	}
	if e.Kind == KindPaymentRequired {
		starts := r.payment == ""
		r.payment = e.Message
		var ce *client.Error
		if errors.As(e.Err, &ce) {
			r.payment = refusalText(ce)
		}
		if starts {
			r.logf("payment_required", "file=%q refused=commit reason=%q", r.path, r.payment)
		}
	}
	return e
}

// Poison marks the replica unusable until re-attached: the local file may no longer
// reflect what the stream holds.
func (r *Replica) Poison(reason string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.poisoned, r.damaged = true, reason
	r.fail(newError(KindLocalDamage, ActionReattach, nil, "%s", reason), true)
	// The local files no longer reflect r.tail: a crash before the detach must not
	// resume from them either.
	sc := &sidecar.File{URL: r.url, Incarnation: r.incarnation, Offset: r.tail, Epoch: r.epoch, BootID: sidecar.BootID(), Inode: sidecar.Inode(r.path), Damaged: reason}
	if err := sidecar.Write(r.path, sc); err != nil {
		r.logf("sidecar_failed", "err=%q", err.Error())
	}
}

// Usable reports the error reads and writes must fail with (fenced or poisoned), if any.
func (r *Replica) Usable() error {
	if e := r.stopped.Load(); e != nil {
		c := *e
		return &c
	}
	return nil
}

// LastError is the error of the last failed commit (nil after a success).
func (r *Replica) LastError() *Error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.lastErr
}

// Status is a replica's state as status(file) reports it.
type Status struct {
	URL        string `json:"url"`
	AttachMode string `json:"attach_mode"` // how the last attach got the local file: resumed, rebuilt
	Offset     uint64 `json:"offset"`
	Epoch      uint64 `json:"epoch"`
	Commits    uint64 `json:"commits"`
	LogBytes   uint64 `json:"log_bytes"` // log since the latest snapshot (the whole log when none)
	Poisoned   bool   `json:"poisoned"`
	Fenced     bool   `json:"fenced"`
	Reason     string `json:"reason"` // why poisoned or fenced

	AppendRetries uint64 `json:"append_retries"` // attempts beyond the first (unknown outcomes, 429, 503, 307, 401)
	AttachMs      int64  `json:"attach_ms"`
	WritesRefused bool   `json:"writes_refused"` // the last commit was refused (nothing written, file usable)
	RefusedKind   Kind   `json:"refused_kind,omitempty"`
	RefusedReason string `json:"refused_reason,omitempty"`
	// PaymentRequired: commits are being refused with 402 in front of the stream (the
	// reason is the refusing layer's text); cleared by the next successful commit.
	PaymentRequired bool   `json:"payment_required"`
	PaymentReason   string `json:"payment_reason"`

	// Local is the offset the local file reflects; Installed the offset of the snapshot
	// the last attach installed, "-1" when it installed none (it resumed the local files
	// or replayed the whole log).
	Local     string `json:"local"`
	Installed string `json:"installed"`

	// Snapshots (snapshot.go). Offsets are strings, "-1" = none (checklist Q152).
	Snapshot         string `json:"snapshot"`           // latest snapshot offset known
	Retained         string `json:"retained"`           // retention offset known
	SnapshotDueBytes uint64 `json:"snapshot_due_bytes"` // max(database size, SnapshotMinBytes)
	SnapshotAgeMs    *int64 `json:"snapshot_age_ms"`    // since this owner last published; null: none
	SnapshotFailures int    `json:"snapshot_failures"`  // failed attempts in a row
	SnapshotError    string `json:"snapshot_error"`     // reason of the last failure; "" after a success
	SnapshotBytes    *int64 `json:"snapshot_bytes"`     // compressed size of the latest body built; null: none since attach
	Error            *struct {
		Kind    Kind   `json:"kind"`
		Action  Action `json:"action"`
		Message string `json:"message"`
	} `json:"error"` // null while writes go through
}

// Status returns the replica's state.
func (r *Replica) Status() Status {
	r.mu.Lock()
	defer r.mu.Unlock()
	st := Status{URL: r.url, AttachMode: r.attachMode, Offset: r.tail, Epoch: r.epoch, Commits: r.commits, LogBytes: r.logBytes, Poisoned: r.poisoned, Fenced: r.fenced}
	r.snapshotStatus(&st)
	st.AppendRetries, st.AttachMs = r.retries, r.attachMs
	st.PaymentRequired, st.PaymentReason = r.payment != "", r.payment
	st.Local, st.Installed = streamcore.FormatOffset(r.tail), "-1"
	if r.installed != 0 {
		st.Installed = streamcore.FormatOffset(r.installed)
	}
	if e := r.stopped.Load(); e != nil {
		st.Reason = e.Message
	} else if e := r.lastErr; e != nil {
		st.WritesRefused, st.RefusedKind, st.RefusedReason = true, e.Kind, e.Message
	}
	if e := r.lastErr; e != nil {
		st.Error = &struct {
			Kind    Kind   `json:"kind"`
			Action  Action `json:"action"`
			Message string `json:"message"`
		}{e.Kind, e.Action, e.Message}
	}
	return st
}

// logf writes one logfmt event line at the level the event has (eventLevel).
func (r *Replica) logf(event, format string, args ...any) {
	r.logAt(eventLevel(event), event, format, args...)
}
