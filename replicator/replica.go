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
	"time"

	"github.com/ursula-go/ursula/streamcore"
)

// ProducerID is the one Producer-Id every owner of a database uses, so a newer claim
// (a higher epoch) fences every older owner with 403.
const ProducerID = "ursula-sqlite"

// Options configure a replica. Zero values take the URSULA_VFS_* environment variables,
// then the defaults.
type Options struct {
	Client        *streamcore.Client
	RetryBudget   time.Duration // URSULA_VFS_RETRY_MS, default 30 s
	AttemptLimit  time.Duration // per append attempt, default 10 s
	MaxFrameBytes int           // URSULA_VFS_MAX_FRAME_BYTES, default 32 MiB
	Log           io.Writer     // logfmt events; default stderr
}

func (o *Options) defaults() error {
	if o.RetryBudget == 0 {
		o.RetryBudget = envDuration("URSULA_VFS_RETRY_MS", 30*time.Second)
	}
	if o.AttemptLimit == 0 {
		o.AttemptLimit = 10 * time.Second
	}
	if o.MaxFrameBytes == 0 {
		o.MaxFrameBytes = envInt("URSULA_VFS_MAX_FRAME_BYTES", streamcore.MaxRequestBytes)
	}
	if o.Log == nil {
		o.Log = os.Stderr
	}
	if o.Client == nil {
		tr := streamcore.NewTransport()
		if ms := envInt("URSULA_VFS_IDLE_MS", 0); ms > 0 {
			tr.IdleConnTimeout = time.Duration(ms) * time.Millisecond
		}
		c, err := streamcore.NewClient("", streamcore.WithHTTPClient(&http.Client{Transport: tr}))
		if err != nil {
			return err
		}
		if p := os.Getenv("URSULA_VFS_TOKEN_FILE"); p != "" {
			b, err := os.ReadFile(p)
			if err != nil {
				return newError(KindInvalidURL, ActionFix, err, "URSULA_VFS_TOKEN_FILE")
			}
			c.SetToken(string(bytes.TrimSpace(b)))
		}
		o.Client = c
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

// CheckURL refuses stream URLs that cannot name a stream (checklist-vfs B).
func CheckURL(raw string) error {
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

// Replica is the owner side of one database's stream: it claimed the stream and turns
// every commit into one acknowledged record.
type Replica struct {
	url         string
	path        string
	opts        Options
	incarnation string
	savedAt     time.Time // last sidecar write
	attachMode  string    // "resumed" or "rebuilt"

	mu       sync.Mutex
	epoch    uint64
	seq      uint64 // last producer seq used (the claim is 0)
	tail     uint64 // offset the local file reflects
	pageSize uint32
	fenced   bool
	poisoned bool
	lastErr  *Error
	commits  uint64
	logBytes uint64 // bytes appended by this replica
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
	if err := CheckURL(streamURL); err != nil {
		return nil, err
	}
	if err := opts.defaults(); err != nil {
		return nil, err
	}
	sc, scErr := ReadSidecar(path)
	hasData := fileHasData(path)
	switch {
	case sc == nil && scErr == nil && hasData:
		return nil, newError(KindUnreplicated, ActionFix, nil,
			"%s holds data but was never attached (no sidecar %s); it is left as it is. To replicate its rows, copy them into a database opened with vfs.Open at another path (for example with ATTACH and INSERT ... SELECT)",
			path, SidecarPath(path))
	case sc != nil && sc.URL != streamURL:
		return nil, newError(KindOtherStream, ActionFix, nil,
			"%s is the local copy of %s, not %s; use another path, or spell the URL exactly as before", path, sc.URL, streamURL)
	}
	c := opts.Client
	info, err := c.Head(ctx, streamURL)
	if err != nil {
		var ce *streamcore.ClientError
		if !errors.As(err, &ce) || ce.Status != http.StatusNotFound {
			return nil, classifyRead(err, "HEAD of the stream")
		}
		if hasData {
			return nil, newError(KindNotFound, ActionFix, nil, "the stream does not exist but %s holds data; refusing to replace either (delete the file to start over from an empty stream)", path)
		}
		if _, err := c.Create(ctx, streamURL, streamcore.CreateOptions{ContentType: "application/octet-stream"}); err != nil {
			return nil, classifyRead(err, "creating the stream")
		}
		if info, err = c.Head(ctx, streamURL); err != nil {
			return nil, classifyRead(err, "HEAD of the new stream")
		}
	}
	r := &Replica{url: streamURL, path: path, opts: opts, incarnation: info.Incarnation}
	img, why := resume(ctx, r, sc, scErr, info)
	if img == nil {
		if sc != nil || scErr != nil || hasData {
			r.logf("local_files_discarded", "file=%q reason=%q", path, why)
		}
		img, err = Restore(ctx, c, streamURL, path, 0, opts.MaxFrameBytes, nil)
		if err != nil {
			return nil, err
		}
	}
	r.attachMode = "resumed"
	if why != "" {
		r.attachMode = "rebuilt"
	}
	r.tail, r.pageSize = img.Tail, img.PageSize
	if err := r.claim(ctx, img.Epoch+1); err != nil {
		return nil, err
	}
	if err := r.SaveState(); err != nil {
		return nil, newError(KindLocalSetup, ActionFix, err, "writing the sidecar %s", SidecarPath(path))
	}
	return r, nil
}

// resume brings the local files up to the stream's tail when the sidecar allows it, and
// says why not otherwise (nil image).
func resume(ctx context.Context, r *Replica, sc *Sidecar, scErr error, info *streamcore.StreamInfo) (*Image, string) {
	tail, _ := streamcore.ParseOffset(info.NextOffset)
	retained, _ := streamcore.ParseOffset(info.RetainedOffset)
	switch {
	case scErr != nil:
		return nil, scErr.Error()
	case sc == nil:
		return nil, "no sidecar"
	case sc.BootID == "" || sc.BootID != BootID():
		return nil, "written on another boot"
	case sc.Incarnation != info.Incarnation:
		return nil, "the stream was recreated (new incarnation)"
	case sc.Inode != inode(r.path):
		return nil, "the database file was replaced"
	case sc.Offset > tail:
		return nil, fmt.Sprintf("the sidecar offset %d is past the stream tail %d", sc.Offset, tail)
	case sc.Offset < retained:
		return nil, fmt.Sprintf("the sidecar offset %d is below retention %d", sc.Offset, retained)
	}
	if _, err := FoldWAL(r.path); err != nil {
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
	sc := &Sidecar{URL: r.url, Incarnation: r.incarnation, Offset: r.tail, Epoch: r.epoch}
	r.mu.Unlock()
	sc.BootID, sc.Inode = BootID(), inode(r.path)
	return WriteSidecar(r.path, sc)
}

// claim appends a claim record at epoch and verifies it by reading it back: a 2xx alone
// proves nothing about who owns the stream.
func (r *Replica) claim(ctx context.Context, epoch uint64) error {
	var cl Claim
	cl.Epoch = epoch
	rand.Read(cl.Nonce[:])
	body := EncodeClaim(cl)
	wr, err := r.opts.Client.Append(ctx, r.url, body, streamcore.AppendOptions{
		ContentType: "application/octet-stream",
		Producer:    &streamcore.ProducerKey{ID: ProducerID, Epoch: epoch, Seq: 0},
		StreamSeq:   streamcore.FormatOffset(r.tail),
	})
	if err != nil {
		var ce *streamcore.ClientError
		if errors.As(err, &ce) && (ce.Status == http.StatusForbidden || ce.Status == http.StatusConflict) {
			return newError(KindFenced, ActionReattach, err, "another owner claimed the stream while attaching")
		}
		return classifyRead(err, "claiming the stream")
	}
	start, _ := streamcore.ParseOffset(wr.Offset)
	end, _ := streamcore.ParseOffset(wr.NextOffset)
	rr, err := r.opts.Client.Read(ctx, r.url, streamcore.ReadOptions{Offset: wr.Offset, MaxBytes: int(end - start)})
	if err != nil {
		return classifyRead(err, "reading the claim back")
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
	r.logBytes += end - start
	r.logf("claimed", "epoch=%d offset=%d", epoch, end)
	return nil
}

// Commit appends one commit record and returns once the server acknowledged it. The
// outcome rules (DESIGN.md section 4): not applied fails alone and the database stays
// usable; unknown is retried with the same producer seq within the retry budget, then
// the replica is poisoned; a 403 fence stops it for good.
func (r *Replica) Commit(ctx context.Context, cm *Commit) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if err := r.usable(); err != nil {
		return err
	}
	body, err := EncodeCommit(cm)
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
		sc := &Sidecar{URL: r.url, Incarnation: r.incarnation, Offset: r.tail, Epoch: r.epoch, BootID: BootID(), Inode: inode(r.path)}
		if err := WriteSidecar(r.path, sc); err != nil {
			r.logf("sidecar_failed", "err=%q", err.Error())
		}
	}
	seq := r.seq + 1
	opts := streamcore.AppendOptions{
		ContentType: "application/octet-stream",
		Producer:    &streamcore.ProducerKey{ID: ProducerID, Epoch: r.epoch, Seq: seq},
		StreamSeq:   streamcore.FormatOffset(r.tail),
	}
	deadline := time.Now().Add(r.opts.RetryBudget)
	backoff := 50 * time.Millisecond
	for attempt := 1; ; attempt++ {
		actx, cancel := context.WithTimeout(ctx, min(r.opts.AttemptLimit, time.Until(deadline)))
		wr, err := r.opts.Client.Append(actx, r.url, body, opts)
		cancel()
		if err == nil {
			if wr.NextOffset == "" {
				// A duplicate whose receipt was evicted: applied, but where is unknown.
				return r.fail(newError(KindPoisoned, ActionReattach, nil, "commit applied but its receipt was evicted; re-attach to learn the stream position"), true)
			}
			end, _ := streamcore.ParseOffset(wr.NextOffset)
			start, _ := streamcore.ParseOffset(wr.Offset)
			r.seq, r.tail = seq, end
			r.commits++
			r.logBytes += end - start
			r.lastErr = nil
			return nil
		}
		var ce *streamcore.ClientError
		errors.As(err, &ce)
		switch {
		case ce != nil && ce.Fenced():
			r.fenced = true
			return r.fail(newError(KindFenced, ActionStop, err, "a newer owner (epoch %d) claimed the stream", ce.ProducerEpoch), true)
		case ce != nil && ce.Status == http.StatusConflict:
			r.fenced = true
			return r.fail(newError(KindFenced, ActionStop, err, "the stream moved under this owner (%s)", ce.Code), true)
		case streamcore.OutcomeOf(err) == streamcore.NotApplied:
			return r.fail(newError(KindNotApplied, ActionRetry, err, "the server refused the commit; nothing was written"), false)
		}
		if ctx.Err() != nil || time.Now().After(deadline) {
			r.poisoned = true
			return r.fail(newError(KindPoisoned, ActionReattach, err, "commit outcome unknown after %d attempts within %v", attempt, r.opts.RetryBudget), true)
		}
		r.logf("append_retry", "attempt=%d seq=%d err=%q", attempt, seq, err.Error())
		select {
		case <-time.After(backoff):
		case <-ctx.Done():
		}
		backoff = min(2*backoff, 2*time.Second)
	}
}

func (r *Replica) usable() error {
	switch {
	case r.fenced:
		return newError(KindFenced, ActionStop, nil, "this owner was fenced by a newer claim")
	case r.poisoned:
		return newError(KindPoisoned, ActionReattach, nil, "an earlier commit's outcome is unknown; re-attach")
	}
	return nil
}

func (r *Replica) fail(e *Error, sticky bool) error {
	r.lastErr = e
	event := "commit_refused"
	switch e.Kind {
	case KindFenced:
		event = "fenced"
	case KindPoisoned:
		event = "poisoned"
	}
	r.logf(event, "kind=%s action=%s msg=%q", e.Kind, e.Action, e.Message)
	return e
}

// Poison marks the replica unusable until re-attached: the local file may no longer
// reflect what the stream holds.
func (r *Replica) Poison(reason string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.poisoned = true
	r.fail(newError(KindPoisoned, ActionReattach, nil, "%s", reason), true)
}

// Usable reports the error reads and writes must fail with (fenced or poisoned), if any.
func (r *Replica) Usable() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.usable()
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
	LogBytes   uint64 `json:"log_bytes"`
	Poisoned   bool   `json:"poisoned"`
	Fenced     bool   `json:"fenced"`
	Error      *struct {
		Kind    Kind   `json:"kind"`
		Action  Action `json:"action"`
		Message string `json:"message"`
	} `json:"error,omitempty"`
}

// Status returns the replica's state.
func (r *Replica) Status() Status {
	r.mu.Lock()
	defer r.mu.Unlock()
	st := Status{URL: r.url, AttachMode: r.attachMode, Offset: r.tail, Epoch: r.epoch, Commits: r.commits, LogBytes: r.logBytes, Poisoned: r.poisoned, Fenced: r.fenced}
	if e := r.lastErr; e != nil {
		st.Error = &struct {
			Kind    Kind   `json:"kind"`
			Action  Action `json:"action"`
			Message string `json:"message"`
		}{e.Kind, e.Action, e.Message}
	}
	return st
}

// logf writes one logfmt event line.
func (r *Replica) logf(event, format string, args ...any) {
	fmt.Fprintf(r.opts.Log, "sqlite-ursula-vfs level=info event=%s url=%q %s\n", event, r.url, fmt.Sprintf(format, args...))
}
