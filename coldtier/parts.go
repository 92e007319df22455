package coldtier

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	coldstore "github.com/ursula-go/ursula/coldtier/store"
	"github.com/ursula-go/ursula/streamcore"
)

// Snapshot upload in parts (the protocol's "Upload in Parts"). Parts are
// staged as objects of the cold store under {cluster}/__parts/, keyed by the stream
// incarnation they were staged for; nothing about them is replicated, so a part staged on
// one leader is visible to the next through the shared store. A commit lists the
// incarnation's parts, copies the named ones in order into one snapshot object while it
// computes the digest (reading a few pieces ahead), then proposes an ordinary publish that
// carries only the object's key, exactly like a large single-request publish.
//
// The leader counts each stream's staged bytes and parts in memory to bound them; it
// lists the stream's parts at its first part, after every commit and discard, and at a
// refused part when its last listing is over a minute old. The counts are approximate
// around concurrent uploads (a part finishing during a listing may count twice until the
// next listing), which errs on the side of refusing.

// Bounds of the parts protocol.
const (
	DefaultMaxSnapshotBytes = 1 << 30 // Ursula-Max-Snapshot-Bytes
	DefaultMaxStagedParts   = 8192    // Ursula-Max-Staged-Parts
	DefaultMaxStagedBytes   = 2 << 30 // Ursula-Max-Staged-Bytes

	partsDirName   = "__parts/"
	commitsPerNode = 2           // commits copying at once on one node
	partsRelistAge = time.Minute // a refused part relists when the last listing is older
	oldPartsMargin = time.Minute // parts of earlier incarnations younger than this stay
	assemblePiece  = 8 << 20     // bytes per ranged read while assembling
	assembleAhead  = 4           // ranged reads in flight while assembling
	commitTimeout  = 30 * time.Minute
)

// partsLedger is the node's bookkeeping of staged parts and running commits.
type partsLedger struct {
	mu        sync.Mutex
	streams   map[string]*stagedParts // by stream key
	commits   int                     // commits copying now (node-wide)
	committed atomic.Uint64           // snapshots published from parts
	staged    atomic.Uint64           // parts staged
}

// stagedParts counts one stream's staged, unused parts (every incarnation).
type stagedParts struct {
	count         int
	bytes         int64
	inflight      int
	inflightBytes int64
	listed        time.Time       // last listing; zero: never listed here
	busy          map[uint64]bool // incarnations with a commit or discard running
}

func (p *partsLedger) get(key string) *stagedParts {
	if p.streams == nil {
		p.streams = map[string]*stagedParts{}
	}
	sp := p.streams[key]
	if sp == nil {
		sp = &stagedParts{busy: map[uint64]bool{}}
		p.streams[key] = sp
	}
	return sp
}

// forget drops an idle entry (no parts known, nothing running).
func (p *partsLedger) forget(key string) {
	if sp := p.streams[key]; sp != nil && sp.count == 0 && sp.inflight == 0 && len(sp.busy) == 0 {
		delete(p.streams, key)
	}
}

// stagedBytes sums the staged bytes the ledger knows of (metrics).
func (p *partsLedger) stagedBytes() int64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	var n int64
	for _, sp := range p.streams {
		n += sp.bytes
	}
	return n
}

// relistAll makes every stream list its parts again at its next part (after the
// collector reclaimed some).
func (p *partsLedger) relistAll() {
	p.mu.Lock()
	for _, sp := range p.streams {
		sp.listed = time.Time{}
	}
	p.mu.Unlock()
}

// begin marks a commit or discard of (key, inc) as running; false when one already is.
func (p *partsLedger) begin(key string, inc uint64) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	sp := p.get(key)
	if sp.busy[inc] {
		return false
	}
	sp.busy[inc] = true
	return true
}

func (p *partsLedger) end(key string, inc uint64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.get(key).busy, inc)
	p.forget(key)
}

func (p *partsLedger) takeCommit() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.commits >= commitsPerNode {
		return false
	}
	p.commits++
	return true
}

func (p *partsLedger) releaseCommit() {
	p.mu.Lock()
	p.commits--
	p.mu.Unlock()
}

func (c *Tier) partsPrefix(key string) string { return c.root + partsDirName + streamPath(key) }

func (c *Tier) partsDir(key string, inc uint64) string {
	return c.partsPrefix(key) + strconv.FormatUint(inc, 10) + "/"
}

func (c *Tier) isPart(objectKey string) bool {
	return strings.HasPrefix(objectKey, c.root+partsDirName)
}

// MaxSnapshotBytes is the largest snapshot a commit of parts may assemble.
func (c *Tier) MaxSnapshotBytes() int64 {
	if c.opts.MaxSnapshotBytes > 0 {
		return c.opts.MaxSnapshotBytes
	}
	return DefaultMaxSnapshotBytes
}

func (c *Tier) maxStaged() (int, int64) {
	n, b := DefaultMaxStagedParts, int64(DefaultMaxStagedBytes)
	if c.opts.MaxStagedParts > 0 {
		n = c.opts.MaxStagedParts
	}
	if c.opts.MaxStagedBytes > 0 {
		b = c.opts.MaxStagedBytes
	}
	return n, b
}

// stagedPart is one listed part object.
type stagedPart struct {
	inc  uint64
	id   string
	info coldstore.ObjectInfo
}

// listParts lists the staged parts of every incarnation of a stream.
func (c *Tier) listParts(ctx context.Context, key string) ([]stagedPart, error) {
	pre := c.partsPrefix(key)
	var out []stagedPart
	err := c.store.List(ctx, pre, func(o coldstore.ObjectInfo) bool {
		incText, id, ok := strings.Cut(strings.TrimPrefix(o.Key, pre), "/")
		inc, err := strconv.ParseUint(incText, 10, 64)
		if ok && err == nil && id != "" && !strings.Contains(id, "/") {
			out = append(out, stagedPart{inc: inc, id: id, info: o})
		}
		return true
	})
	return out, err
}

// relist counts a stream's parts anew. With dropOld it first deletes the parts of
// earlier incarnations staged more than oldPartsMargin before now (a part's or a
// discard's listing; a commit's listing only counts).
func (c *Tier) relist(ctx context.Context, key string, cur uint64, now time.Time, dropOld bool) ([]stagedPart, error) {
	parts, err := c.listParts(ctx, key)
	if err != nil {
		return nil, err
	}
	kept := parts[:0]
	for _, p := range parts {
		if dropOld && p.inc < cur && p.info.ModTime.Before(now.Add(-oldPartsMargin)) && !c.pinned(p.info.Key) &&
			c.store.Delete(ctx, p.info.Key) == nil {
			continue
		}
		kept = append(kept, p)
	}
	c.setCounts(key, kept, now)
	return kept, nil
}

func (c *Tier) setCounts(key string, parts []stagedPart, now time.Time) {
	var n int64
	for _, p := range parts {
		n += p.info.Size
	}
	c.parts.mu.Lock()
	sp := c.parts.get(key)
	sp.count, sp.bytes, sp.listed = len(parts), n, now
	c.parts.forget(key)
	c.parts.mu.Unlock()
}

// AdmitPart reserves room for one part of reserve bytes, or answers the 429 of the bound
// it would cross (decided from the request's head, before the body is read).
func (c *Tier) AdmitPart(ctx context.Context, key string, inc uint64, reserve int64) *streamcore.Error {
	maxParts, maxBytes := c.maxStaged()
	over := func(sp *stagedParts) (string, int64) {
		if sp.count+sp.inflight+1 > maxParts {
			return streamcore.HdrMaxStagedParts, int64(maxParts)
		}
		if sp.bytes+sp.inflightBytes+reserve > maxBytes {
			return streamcore.HdrMaxStagedBytes, maxBytes
		}
		return "", 0
	}
	listedNow := false
	for {
		c.parts.mu.Lock()
		sp := c.parts.get(key)
		hdr, bound := over(sp)
		// The first part here, or a refusal on a count over a minute old: list, decide again.
		if !listedNow && (sp.listed.IsZero() || hdr != "" && time.Since(sp.listed) > partsRelistAge) {
			c.parts.mu.Unlock()
			c.relist(ctx, key, inc, time.Now(), true)
			listedNow = true
			continue
		}
		defer c.parts.mu.Unlock()
		if hdr != "" {
			return streamcore.Errorf(http.StatusTooManyRequests, streamcore.CodeStagedPartsLimit,
				"the stream holds %d staged parts (%d bytes) that no commit used; commit or discard them (DELETE .../snapshot/parts) before staging more", sp.count, sp.bytes).
				With(hdr, strconv.FormatInt(bound, 10)).With(streamcore.HdrIncarnation, strconv.FormatUint(inc, 10))
		}
		sp.inflight++
		sp.inflightBytes += reserve
		return nil
	}
}

// PartDone releases a reservation of AdmitPart; size >= 0 counts a part that was stored.
func (c *Tier) PartDone(key string, reserve, size int64) {
	c.parts.mu.Lock()
	defer c.parts.mu.Unlock()
	sp := c.parts.get(key)
	sp.inflight--
	sp.inflightBytes -= reserve
	if size >= 0 {
		sp.count++
		sp.bytes += size
	}
	c.parts.forget(key)
}

// StorePart stores body as a new part of incarnation inc of the stream at key (room
// reserved by AdmitPart) and returns its id.
func (c *Tier) StorePart(key string, inc uint64, body []byte) (string, *streamcore.Error) {
	var rnd [16]byte
	rand.Read(rnd[:])
	id := hex.EncodeToString(rnd[:])
	ctx, cancel := context.WithTimeout(c.ctx, 2*time.Minute)
	defer cancel()
	if err := c.store.Put(ctx, c.partsDir(key, inc)+id, bytes.NewReader(body), int64(len(body))); err != nil {
		return "", coldStoreFailed(err)
	}
	c.parts.staged.Add(1)
	return id, nil
}

func partsBusy(code, format string, args ...any) *streamcore.Error {
	return streamcore.Errorf(http.StatusServiceUnavailable, code, format, args...).With(streamcore.HdrRetryAfter, "1")
}

// DiscardParts deletes every part of incarnation inc of the stream at key, and those of
// earlier incarnations staged over a minute ago.
func (c *Tier) DiscardParts(key string, inc uint64) *streamcore.Error {
	if !c.parts.begin(key, inc) {
		return partsBusy(streamcore.CodeCommitInProgress, "a commit or discard of this stream's parts is running; retry when it ends")
	}
	defer c.parts.end(key, inc)
	ctx, cancel := context.WithTimeout(c.ctx, 5*time.Minute)
	defer cancel()
	now := time.Now()
	parts, err := c.listParts(ctx, key)
	if err != nil {
		return coldStoreFailed(err)
	}
	var failed error
	kept := parts[:0]
	for _, p := range parts {
		drop := p.inc == inc || p.inc < inc && p.info.ModTime.Before(now.Add(-oldPartsMargin))
		if !drop || c.pinned(p.info.Key) {
			kept = append(kept, p)
			continue
		}
		if err := c.store.Delete(ctx, p.info.Key); err != nil {
			failed = err
			kept = append(kept, p)
		}
	}
	c.setCounts(key, kept, now)
	if failed != nil {
		return coldStoreFailed(failed)
	}
	return nil
}

// ProposeFunc proposes a command and maps the engine's refusals to the protocol's
// answers (the server's mapping: redirects, 503s).
type ProposeFunc func(ctx context.Context, c *streamcore.Command) (streamcore.Result, *streamcore.Error)

// Committed is the outcome of a commit of parts.
type Committed struct {
	Result streamcore.Result
	Err    *streamcore.Error
}

// CommitParts starts the commit of the parts ids of incarnation inc of the stream at key
// as the snapshot at off, or refuses it at once (503: a commit or discard of the stream
// runs, or the node assembles enough snapshots already). The node owns the commit from
// then on: it runs on the tier's context, not the request's, and its outcome arrives on
// the channel.
func (c *Tier) CommitParts(key string, inc, ifInc, off uint64, ct, digest string, ids []string, propose ProposeFunc) (<-chan Committed, *streamcore.Error) {
	if !c.parts.begin(key, inc) {
		return nil, partsBusy(streamcore.CodeCommitInProgress, "a commit or discard of this stream's parts is running; retry when it ends")
	}
	if !c.parts.takeCommit() {
		c.parts.end(key, inc)
		return nil, partsBusy(streamcore.CodeCommitsBusy, "this node is assembling %d snapshots already; retry shortly", commitsPerNode)
	}
	done := make(chan Committed, 1)
	go func() {
		res, e := c.commitParts(key, inc, ifInc, off, ct, digest, ids, propose)
		// Free the stream's slot before the outcome is told: a client that sends its next
		// commit on the answer must not find this one still running.
		c.parts.releaseCommit()
		c.parts.end(key, inc)
		done <- Committed{res, e}
	}()
	return done, nil
}

// commitParts resolves, assembles and publishes; it runs on the node's context, not the
// request's. Parts are deleted once the answer is final for the key, and after a digest
// mismatch (its copy used them up); a refusal that copied nothing keeps them.
func (c *Tier) commitParts(key string, inc, ifInc, off uint64, ct, digest string, ids []string, propose ProposeFunc) (streamcore.Result, *streamcore.Error) {
	ctx, cancel := context.WithTimeout(c.ctx, commitTimeout)
	defer cancel()
	listed, err := c.listParts(ctx, key)
	if err != nil {
		return streamcore.Result{}, coldStoreFailed(err)
	}
	byID := map[string]coldstore.ObjectInfo{}
	for _, p := range listed {
		if p.inc == inc {
			byID[p.id] = p.info
		}
	}
	c.setCounts(key, listed, time.Now())
	parts := make([]coldstore.ObjectInfo, len(ids))
	var total int64
	for i, id := range ids {
		o, ok := byID[id]
		if !ok {
			return streamcore.Result{}, unknownPart(id)
		}
		parts[i] = o
		total += o.Size
	}
	if limit := c.MaxSnapshotBytes(); total > limit {
		return streamcore.Result{}, streamcore.Errorf(http.StatusRequestEntityTooLarge, streamcore.CodeSnapshotTooLarge,
			"the assembled snapshot would be %d bytes, more than %d", total, limit).With(streamcore.HdrMaxSnapshotBytes, strconv.FormatInt(limit, 10))
	}
	keys := make([]string, len(parts))
	for i, p := range parts {
		keys[i] = p.Key
	}
	c.Pin(keys...)
	defer c.Unpin(keys...)
	dst := c.snapshotKey(key, inc, off)
	c.Pin(dst)
	got, err := c.assemble(ctx, dst, parts, total, ct)
	if err != nil {
		c.store.Delete(ctx, dst)
		c.Unpin(dst)
		return streamcore.Result{}, coldStoreFailed(err)
	}
	dropParts := func() {
		for _, k := range keys {
			c.store.Delete(ctx, k)
		}
		c.relist(ctx, key, inc, time.Now(), false)
	}
	if got != digest {
		c.store.Delete(ctx, dst)
		c.Unpin(dst)
		dropParts()
		return streamcore.Result{}, streamcore.Errorf(http.StatusBadRequest, streamcore.CodeSnapshotDigest,
			"the assembled snapshot's digest is %s, not the Stream-Snapshot-Digest %s; its parts are discarded", got, digest)
	}
	// Always conditional on the incarnation whose parts were copied: a stream recreated
	// meanwhile is not published to.
	publish := &streamcore.Command{Op: streamcore.OpPublishSnapshot, Key: key, Now: clockMs(), IfIncarnation: inc,
		Offset: off, SnapshotType: ct, SnapshotDigest: digest, SnapshotColdKey: dst, SnapshotSize: uint64(total)}
	c.CheckBoundary(key, publish)
	res, e := propose(ctx, publish)
	c.UnstageSnapshot(dst, res, e)
	final := e == nil || e.Status == http.StatusBadRequest || e.Status == http.StatusNotFound || e.Status == http.StatusConflict ||
		e.Status == http.StatusGone || e.Status == http.StatusPreconditionFailed
	if final {
		dropParts()
	}
	if e == nil && res.Err != nil && res.Err.Status == http.StatusPreconditionFailed && ifInc == 0 {
		return streamcore.Result{}, unknownPart(ids[0]) // the stream was recreated during the copy
	}
	if e == nil && res.Err == nil {
		c.parts.committed.Add(1)
	}
	return res, e
}

func unknownPart(id string) *streamcore.Error {
	return streamcore.Errorf(http.StatusBadRequest, streamcore.CodeUnknownPart,
		"part %q is not staged for this stream's current incarnation (unknown, discarded, or staged for another stream)", id)
}

// errAssembleStopped ends the reader of an assembly whose write stopped early.
var errAssembleStopped = errors.New("the snapshot object write stopped")

// assemble writes the parts, in order, as the object dst and returns the digest of the
// whole. The store reads a pipe fed by ranged reads of the parts, assembleAhead pieces in
// flight, so memory stays bounded whatever the snapshot's size.
func (c *Tier) assemble(ctx context.Context, dst string, parts []coldstore.ObjectInfo, total int64, ct string) (string, error) {
	h := streamcore.NewSnapshotDigest(ct)
	pr, pw := io.Pipe()
	readErr := make(chan error, 1)
	go func() {
		err := c.readParts(ctx, parts, io.MultiWriter(h, pw))
		pw.CloseWithError(err)
		readErr <- err
	}()
	err := c.store.Put(ctx, dst, pr, total)
	pr.CloseWithError(errAssembleStopped)
	if rerr := <-readErr; err == nil && rerr != nil {
		err = rerr
	}
	if err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// readParts copies the parts to w in order, reading ahead.
func (c *Tier) readParts(ctx context.Context, parts []coldstore.ObjectInfo, w io.Writer) error {
	type piece struct {
		key    string
		off, n int64
	}
	var pieces []piece
	for _, p := range parts {
		for off := int64(0); off < p.Size; off += assemblePiece {
			pieces = append(pieces, piece{p.Key, off, min(assemblePiece, p.Size-off)})
		}
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	type fetched struct {
		b   []byte
		err error
	}
	results := make([]chan fetched, len(pieces))
	for i := range results {
		results[i] = make(chan fetched, 1)
	}
	slots := make(chan struct{}, assembleAhead)
	go func() {
		for i, p := range pieces {
			select {
			case slots <- struct{}{}:
			case <-ctx.Done():
				return
			}
			go func() {
				b, err := coldstore.ReadAll(ctx, c.store, p.key, p.off, p.n)
				if err == nil && int64(len(b)) != p.n {
					err = fmt.Errorf("part %s is shorter than listed", p.key)
				}
				results[i] <- fetched{b, err}
			}()
		}
	}()
	for i := range pieces {
		var f fetched
		select {
		case f = <-results[i]:
		case <-ctx.Done():
			return ctx.Err()
		}
		<-slots
		if f.err != nil {
			return f.err
		}
		if _, err := w.Write(f.b); err != nil {
			return err
		}
	}
	return nil
}

// StreamDeleted drops, in the background, the staged parts of a stream whose incarnation
// inc was just deleted. Without a tier it does nothing.
func (c *Tier) StreamDeleted(key string, inc uint64) {
	if c == nil || inc == 0 {
		return
	}
	go c.dropStreamParts(key, inc, time.Now())
}

// dropStreamParts runs after a delete of the stream: the parts of the incarnations up to
// the deleted one go at any age, later ones staged over a minute before the delete.
func (c *Tier) dropStreamParts(key string, inc uint64, at time.Time) {
	ctx, cancel := context.WithTimeout(c.ctx, 5*time.Minute)
	defer cancel()
	parts, err := c.listParts(ctx, key)
	if err != nil {
		return
	}
	kept := parts[:0]
	for _, p := range parts {
		drop := p.inc <= inc || p.info.ModTime.Before(at.Add(-oldPartsMargin))
		if drop && !c.pinned(p.info.Key) && c.store.Delete(ctx, p.info.Key) == nil {
			continue
		}
		kept = append(kept, p)
	}
	c.setCounts(key, kept, time.Now())
}
