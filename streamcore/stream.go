package streamcore

import (
	"net/http"
	"strconv"
	"strings"
)

// Stream is the state of one stream incarnation.
type Stream struct {
	Key            string
	ContentType    string // normalised
	TTL            int64  // seconds; -1 = none
	ExpiresAt      string // as sent; "" = none
	ExpiresAtMs    int64
	Closed         bool
	Incarnation    uint64
	CreatedMs      int64
	RenewedMs      int64 // last sliding-TTL renewal
	Retained       uint64
	Data           Buffer
	Appends        []uint64 // start offset of every append record (fork sub-offsets)
	StreamSeq      string
	Producers      map[string]*Producer
	Receipts       ReceiptWindow
	EpochFloor     uint64
	HasEpochFloor  bool
	Snapshot       *Snapshot
	Fork           *ForkSpec // set when created as a fork (config identity for repeats)
	ForkRefs       int       // live forks that read through this stream's bytes
	SoftDeleted    bool      // deleted while forks still reference it
	closedByRecord bool      // close came with the final append (receipt flag)
	// Chunks are the cold objects holding the bytes below the hot buffer, in offset
	// order and contiguous: they cover [Chunks[0].Start, Data.Base()). Retention drops
	// the chunks wholly below it. A fork shares its source's chunks below the fork point.
	Chunks []ColdChunk
	// PreviousIncarnation and InheritedOffset report the last history rewrite (a restore
	// from backup): the token the stream had before it and the tail it kept then. Zero
	// when the stream has not been through a rewrite since it was created.
	PreviousIncarnation uint64
	InheritedOffset     uint64
}

// ColdChunk is one cold object holding the stream bytes [Start, End).
type ColdChunk struct {
	Key        string
	Start, End uint64
}

// ColdChunksFor returns the chunks that hold bytes of [from, to) (a sub-slice; do not modify).
func (s *Stream) ColdChunksFor(from, to uint64) []ColdChunk {
	cs := s.Chunks
	i, hi := 0, len(cs)
	for i < hi { // first chunk with End > from
		m := (i + hi) / 2
		if cs[m].End <= from {
			i = m + 1
		} else {
			hi = m
		}
	}
	j := i
	for j < len(cs) && cs[j].Start < to {
		j++
	}
	return cs[i:j:j]
}

// Snapshot is the latest published snapshot of a stream.
type Snapshot struct {
	Offset      uint64
	ContentType string
	Digest      string
	Body        []byte
	// ColdKey, when set, names the object holding the body (Body is then nil) and Size
	// is its length.
	ColdKey string
	Size    uint64
}

// BodySize is the length of the snapshot body wherever it is stored.
func (sn *Snapshot) BodySize() uint64 {
	if sn.ColdKey != "" {
		return sn.Size
	}
	return uint64(len(sn.Body))
}

// Tail is the offset just past the last stored byte.
func (s *Stream) Tail() uint64 { return s.Data.End() }

// IsJSON reports whether the stream follows the JSON message rule.
func (s *Stream) IsJSON() bool { return IsJSON(s.ContentType) }

// ExpiryMs is the instant the stream expires at (0 = never).
func (s *Stream) ExpiryMs() int64 {
	if s.ExpiresAtMs != 0 {
		return s.ExpiresAtMs
	}
	if s.TTL >= 0 {
		return s.RenewedMs + s.TTL*1000
	}
	return 0
}

// Expired reports whether the stream counts as missing at now.
func (s *Stream) Expired(now int64) bool {
	e := s.ExpiryMs()
	return e != 0 && now >= e
}

// IsBoundary reports whether off is a JSON message boundary (checklist 6.9). Offsets at or
// below the retained offset cannot be checked byte-wise; the retained offset itself always
// is one (retention only moves to boundaries).
func (s *Stream) IsBoundary(off uint64) bool {
	if off == 0 || off == s.Retained || off == s.Tail() {
		return off == 0 || off == s.Retained || s.heldByteIs(off-1, '\n')
	}
	if off <= s.Data.Base() {
		return false
	}
	return s.Data.ByteAt(off-1) == '\n'
}

// Header is one response header.
type Header struct{ Name, Value string }

// Result is the protocol answer of a command: a status, the headers the answer carries and,
// for a refusal, the error (whose own headers are part of the answer).
type Result struct {
	Status  int
	Headers []Header
	Err     *Error
	Created bool // a new incarnation was created (the server adds Location)
	Changed bool // readers of Key may have new bytes or a new state
	// Purged lists the streams a bucket purge removed (OpPurgeBucket only).
	Purged []PurgedStream
	// Deleted is the incarnation a delete removed (OpDelete only; not an answer header),
	// read in the apply itself, so a node that proposed the delete before it applied its
	// predecessors' entries still learns which incarnation went.
	Deleted uint64
}

func (r *Result) set(name, value string) { r.Headers = append(r.Headers, Header{name, value}) }

// Get returns the value of a header of the answer ("" if absent).
func (r *Result) Get(name string) string {
	for _, h := range r.Headers {
		if h.Name == name {
			return h.Value
		}
	}
	if r.Err != nil {
		return r.Err.Headers[name]
	}
	return ""
}

func fail(e *Error) Result { return Result{Status: e.Status, Err: e} }

// State is a set of streams: the whole memory engine, or one Raft group's FSM.
type State struct {
	Streams map[string]*Stream
	Buckets map[string]bool // every bucket a stream was ever created in
	// Erased holds the purged buckets: no stream may be created in them again.
	Erased map[string]bool
	// Peer resolves the state holding another key, for forks whose source lives in
	// another shard or group; nil means every key lives here. The engine must hold the
	// locks of every state a fork command touches.
	Peer func(key string) *State `json:"-"`
}

func (st *State) holder(key string) *State {
	if st.Peer != nil {
		if o := st.Peer(key); o != nil {
			return o
		}
	}
	return st
}

// NewState returns an empty state.
func NewState() *State {
	return &State{Streams: map[string]*Stream{}, Buckets: map[string]bool{}, Erased: map[string]bool{}}
}

// Live returns the stream at key if it exists and has not expired at now. A soft-deleted
// stream (deleted while forks read through it) is returned with SoftDeleted set.
func (st *State) Live(key string, now int64) *Stream {
	s := st.Streams[key]
	if s == nil || s.Expired(now) {
		return nil
	}
	return s
}

// BucketOf returns the bucket part of a key.
func BucketOf(key string) string {
	b, _, _ := strings.Cut(key, "/")
	return b
}

// NotFound is the 404 for a missing stream at key.
func (st *State) NotFound(key string) *Error {
	if st.Erased[BucketOf(key)] {
		return erasedError()
	}
	if !st.Buckets[BucketOf(key)] {
		return Errorf(http.StatusNotFound, CodeBucketNotFound, "bucket does not exist")
	}
	return Errorf(http.StatusNotFound, CodeStreamNotFound, "stream does not exist")
}

// Apply runs one command. It never reads the clock and never panics on any command.
func (st *State) Apply(c *Command) Result {
	if (c.Op == OpCreate || c.Op == OpRestoreStream) && st.Erased[BucketOf(c.Key)] {
		return fail(erasedError())
	}
	switch c.Op {
	case OpCreate:
		return st.create(c)
	case OpAppend:
		return st.appendCmd(c)
	case OpDelete:
		return st.deleteCmd(c)
	case OpTouch:
		if s := st.Live(c.Key, c.Now); s != nil && !s.SoftDeleted {
			s.renewForRead(c.Now)
		}
		return Result{Status: http.StatusNoContent}
	case OpPublishSnapshot:
		return st.publishSnapshot(c)
	case OpRetain:
		return st.retain(c)
	case OpRecordChunk:
		return st.recordChunk(c)
	case OpRestoreStream:
		return st.restoreStream(c)
	case OpPurgeBucket:
		return st.purgeBucket(c)
	}
	return fail(Errorf(http.StatusBadRequest, CodeInvalidRequest, "unknown command"))
}

// renewForRead applies the read renewal rule: at most once per quarter TTL, never earlier.
func (s *Stream) renewForRead(now int64) {
	if s.TTL <= 0 || s.ExpiresAtMs != 0 {
		return
	}
	if now-s.RenewedMs >= s.TTL*1000/4 && now > s.RenewedMs {
		s.RenewedMs = now
	}
}

// ReadRenewalDue reports whether a read at now should propose an OpTouch.
func (s *Stream) ReadRenewalDue(now int64) bool {
	return s.TTL > 0 && s.ExpiresAtMs == 0 && now-s.RenewedMs >= s.TTL*1000/4
}

func (s *Stream) renewForWrite(now int64) {
	if now > s.RenewedMs {
		s.RenewedMs = now
	}
}

func incHeader(v uint64) string { return strconv.FormatUint(v, 10) }

func (s *Stream) mismatch() *Error {
	return Errorf(http.StatusPreconditionFailed, CodeIncarnationMismatch, "Stream-Incarnation does not match the stream's current incarnation").
		With(HdrIncarnation, incHeader(s.Incarnation))
}

// configHeaders are the headers of a create answer.
func (s *Stream) configHeaders(r *Result) {
	r.set(HdrContentType, s.ContentType)
	r.set(HdrStreamNextOff, FormatOffset(s.Tail()))
	r.set(HdrIncarnation, incHeader(s.Incarnation))
	if s.TTL >= 0 {
		r.set(HdrStreamTTL, strconv.FormatInt(s.TTL, 10))
	}
	if s.ExpiresAt != "" {
		r.set(HdrStreamExpiresAt, s.ExpiresAt)
	}
	if s.Closed {
		r.set(HdrStreamClosed, "true")
	}
}

func (st *State) create(c *Command) Result {
	s := st.Live(c.Key, c.Now)
	if s != nil && s.SoftDeleted {
		return fail(Errorf(http.StatusConflict, CodeAlreadyExists, "stream was deleted but forks still read from it; the path cannot be reused until they are deleted"))
	}
	if c.IfIncarnation != 0 {
		if s == nil {
			return fail(Errorf(http.StatusPreconditionFailed, CodeIncarnationMismatch, "Stream-Incarnation was given but the stream does not exist"))
		}
		if s.Incarnation != c.IfIncarnation {
			return fail(s.mismatch())
		}
	}
	var src *Stream
	if c.Fork != nil {
		src = st.holder(c.Fork.Source).Live(c.Fork.Source, c.Now)
	}
	ct, ttl, exp, expMs := forkConfig(c, src)
	if ct == "" {
		ct = DefaultContentType
	}
	if s != nil {
		if s.ContentType != ct || s.TTL != ttl || s.ExpiresAtMs != expMs || s.Closed != c.Close || !sameFork(s.Fork, c.Fork) {
			return fail(Errorf(http.StatusConflict, CodeAlreadyExists, "stream already exists with a different configuration"))
		}
		r := Result{Status: http.StatusOK}
		s.configHeaders(&r)
		return r
	}
	if c.BodyFault != nil {
		return fail(c.BodyFault)
	}
	ns := &Stream{
		Key: c.Key, ContentType: ct, TTL: ttl, ExpiresAt: exp, ExpiresAtMs: expMs,
		Incarnation: c.NewIncarnation, CreatedMs: c.Now, RenewedMs: c.Now, StreamSeq: c.StreamSeq,
		Producers: map[string]*Producer{},
	}
	if c.Fork != nil {
		if e := st.forkInto(ns, src, c); e != nil {
			return fail(e)
		}
	}
	if len(c.Body) > 0 {
		ns.Appends = append(ns.Appends, ns.Tail())
		ns.Data.Append(c.Body)
	}
	ns.Closed = c.Close
	if old := st.Streams[c.Key]; old != nil {
		st.drop(old)
	}
	st.Streams[c.Key] = ns
	st.Buckets[BucketOf(c.Key)] = true
	r := Result{Status: http.StatusCreated, Created: true, Changed: true}
	ns.configHeaders(&r)
	return r
}

func (st *State) appendCmd(c *Command) Result {
	s := st.Live(c.Key, c.Now)
	if s == nil {
		return fail(st.NotFound(c.Key))
	}
	if s.SoftDeleted {
		return fail(Errorf(http.StatusGone, CodeStreamGone, "stream was deleted"))
	}
	closeOnly := len(c.Body) == 0 && c.Close && c.BodyFault == nil
	var pw *producerWrite
	if c.Producer != nil {
		var done *Result
		pw, done = s.producerCheck(c)
		if done != nil {
			if done.Status < 300 && c.IfIncarnation != 0 && c.IfIncarnation != s.Incarnation {
				return fail(s.mismatch())
			}
			return *done
		}
	}
	if s.Closed {
		if closeOnly && pw == nil {
			if c.IfIncarnation != 0 && c.IfIncarnation != s.Incarnation {
				return fail(s.mismatch())
			}
			r := Result{Status: http.StatusNoContent}
			r.set(HdrStreamNextOff, FormatOffset(s.Tail()))
			r.set(HdrIncarnation, incHeader(s.Incarnation))
			r.set(HdrStreamClosed, "true")
			return r
		}
		return fail(Errorf(http.StatusConflict, CodeStreamClosed, "stream is closed").
			With(HdrStreamClosed, "true").With(HdrStreamNextOff, FormatOffset(s.Tail())))
	}
	if !closeOnly {
		if c.BodyFault != nil && c.BodyFault.Code == CodeMissingContentType {
			return fail(c.BodyFault)
		}
		if c.BodyFault == nil || c.BodyFault.Code != CodeEmptyAppend {
			if c.ContentType != s.ContentType {
				return fail(Errorf(http.StatusConflict, CodeContentTypeMismatch, "Content-Type does not match the stream's content type %q", s.ContentType).
					With(HdrStreamNextOff, FormatOffset(s.Tail())))
			}
		}
		if c.BodyFault != nil {
			return fail(c.BodyFault)
		}
	}
	if c.StreamSeq != "" && s.StreamSeq != "" && c.StreamSeq <= s.StreamSeq {
		return fail(Errorf(http.StatusConflict, CodeStreamSeqConflict, "Stream-Seq must be greater than the last accepted value").
			With(HdrStreamLastSeq, s.StreamSeq).With(HdrStreamNextOff, FormatOffset(s.Tail())))
	}
	if c.DigestBad && pw != nil {
		return fail(Errorf(http.StatusBadRequest, CodeDigestMismatch, "Producer-Digest does not match the body"))
	}
	if c.IfIncarnation != 0 && c.IfIncarnation != s.Incarnation {
		return fail(s.mismatch())
	}
	// Apply.
	start := s.Tail()
	if len(c.Body) > 0 {
		s.Appends = append(s.Appends, start)
		s.Data.Append(c.Body)
	}
	if c.Close {
		s.Closed = true
	}
	if c.StreamSeq != "" {
		s.StreamSeq = c.StreamSeq
	}
	s.renewForWrite(c.Now)
	end := s.Tail()
	// The answer's headers in one allocation: at most 3, or 8 with a producer.
	hdrs := 3
	if pw != nil {
		hdrs = 8
	}
	r := Result{Status: http.StatusNoContent, Changed: true, Headers: make([]Header, 0, hdrs)}
	if pw != nil {
		s.producerApply(c, pw, start, end, &r)
	} else {
		r.set(HdrStreamNextOff, FormatOffset(end))
	}
	r.set(HdrIncarnation, incHeader(s.Incarnation))
	if s.Closed {
		r.set(HdrStreamClosed, "true")
	}
	return r
}

func (st *State) deleteCmd(c *Command) Result {
	s := st.Live(c.Key, c.Now)
	if s == nil {
		return fail(st.NotFound(c.Key))
	}
	if s.SoftDeleted {
		return fail(Errorf(http.StatusGone, CodeStreamGone, "stream was deleted"))
	}
	if c.IfIncarnation != 0 && c.IfIncarnation != s.Incarnation {
		return fail(s.mismatch())
	}
	if s.ForkRefs > 0 {
		s.SoftDeleted = true
	} else {
		delete(st.Streams, c.Key)
		st.drop(s)
	}
	return Result{Status: http.StatusNoContent, Changed: true, Deleted: s.Incarnation}
}

// drop releases what a removed stream holds on its fork source, cascading through
// soft-deleted ancestors that nothing references any more.
func (st *State) drop(s *Stream) {
	for s != nil && s.Fork != nil {
		h := st.holder(s.Fork.Source)
		src := h.Streams[s.Fork.Source]
		s = nil
		if src == nil {
			return
		}
		src.ForkRefs--
		if src.ForkRefs <= 0 && src.SoftDeleted {
			delete(h.Streams, src.Key)
			s = src
		}
	}
}

// InvolvesForks reports whether applying c may touch a stream in another state or other
// streams than c.Key (a fork create, removing a stream that is a fork or has forks, a
// bucket purge), so the engine knows which locks to take and what to recount.
func (st *State) InvolvesForks(c *Command) bool {
	if c.Fork != nil || c.Op == OpPurgeBucket {
		return true
	}
	if s := st.Streams[c.Key]; s != nil && (c.Op == OpCreate || c.Op == OpDelete) {
		return s.Fork != nil || s.ForkRefs > 0
	}
	return false
}

// Sweep removes streams expired at now that no fork reads through.
func (st *State) Sweep(now int64) {
	for k, s := range st.Streams {
		if s.Expired(now) && s.ForkRefs <= 0 {
			delete(st.Streams, k)
			st.drop(s)
		}
	}
}

func (st *State) publishSnapshot(c *Command) Result {
	s := st.Live(c.Key, c.Now)
	if s == nil || s.SoftDeleted {
		return fail(st.NotFound(c.Key))
	}
	if c.Offset > s.Tail() {
		return fail(Errorf(http.StatusConflict, CodeSnapshotConflict, "snapshot offset is beyond the stream tail"))
	}
	if c.Offset < s.Retained {
		return fail(Errorf(http.StatusGone, CodeStreamGone, "snapshot offset is below the retained offset").
			With(HdrStreamNextOff, FormatOffset(s.Retained)).With(HdrIncarnation, incHeader(s.Incarnation)))
	}
	if sn := s.Snapshot; sn != nil {
		if c.Offset < sn.Offset || c.Offset == sn.Offset && c.SnapshotDigest != sn.Digest {
			return fail(Errorf(http.StatusConflict, CodeSnapshotConflict, "a different snapshot is the latest").
				With(HdrSnapshotOffset, FormatOffset(sn.Offset)).With(HdrSnapshotDigest, sn.Digest))
		}
	}
	if s.IsJSON() && !s.IsBoundary(c.Offset) {
		if e := s.coldBoundaryFault(c, "snapshot"); e != nil {
			return fail(e)
		}
	}
	if c.IfIncarnation != 0 && c.IfIncarnation != s.Incarnation {
		return fail(s.mismatch())
	}
	r := Result{Status: http.StatusNoContent}
	if s.Snapshot == nil || s.Snapshot.Offset != c.Offset {
		s.Snapshot = &Snapshot{Offset: c.Offset, ContentType: c.SnapshotType, Digest: c.SnapshotDigest, Body: c.Body}
		if c.SnapshotColdKey != "" {
			s.Snapshot.Body, s.Snapshot.ColdKey, s.Snapshot.Size = nil, c.SnapshotColdKey, c.SnapshotSize
		}
		r.Changed = true
	}
	r.set(HdrSnapshotOffset, FormatOffset(c.Offset))
	r.set(HdrSnapshotDigest, s.Snapshot.Digest)
	r.set(HdrStreamNextOff, FormatOffset(c.Offset))
	r.set(HdrIncarnation, incHeader(s.Incarnation))
	return r
}

func (st *State) retain(c *Command) Result {
	s := st.Live(c.Key, c.Now)
	if s == nil || s.SoftDeleted {
		return fail(st.NotFound(c.Key))
	}
	if c.Offset > s.Retained {
		if s.Snapshot == nil || c.Offset > s.Snapshot.Offset {
			return fail(Errorf(http.StatusBadRequest, CodeInvalidRetention, "retention cannot move past the latest snapshot"))
		}
		if s.IsJSON() && !s.IsBoundary(c.Offset) {
			if e := s.coldBoundaryFault(c, "retention"); e != nil {
				return fail(e)
			}
		}
	}
	if c.IfIncarnation != 0 && c.IfIncarnation != s.Incarnation {
		return fail(s.mismatch())
	}
	r := Result{Status: http.StatusNoContent}
	if c.Offset > s.Retained {
		s.Retained = c.Offset
		s.Data.TrimBelow(c.Offset)
		s.trimAppends(c.Offset)
		s.trimChunks(c.Offset)
		r.Changed = true
	}
	r.set(HdrRetainedOffset, FormatOffset(s.Retained))
	r.set(HdrIncarnation, incHeader(s.Incarnation))
	return r
}

// trimAppends forgets append records that end at or below off.
func (s *Stream) trimAppends(off uint64) {
	i := 0
	for i+1 < len(s.Appends) && s.Appends[i+1] <= off {
		i++
	}
	if i > 0 {
		s.Appends = append([]uint64(nil), s.Appends[i:]...)
	}
}

// coldBoundaryFault is the refusal of an offset of a JSON stream that the hot buffer does
// not show to be a message boundary (nil: the proposer's cold read showed it is one). An
// offset whose preceding byte lies only in the cold tier is decided by the proposer's
// read: refuted answers 400 NOT_JSON_BOUNDARY; unverified (no read, or the read failed,
// or the byte left the hot buffer after the read) answers 503 JSON_BOUNDARY_UNVERIFIED,
// so an offset is never published or retained on a guess.
func (s *Stream) coldBoundaryFault(c *Command, what string) *Error {
	inCold := c.Offset > s.Retained && c.Offset <= s.Data.Base() && c.Offset <= s.Tail()
	switch {
	case inCold && c.BoundaryChecked:
		return nil
	case inCold && !c.BoundaryRefuted:
		return Errorf(http.StatusServiceUnavailable, CodeJSONBoundaryUnverified, "%s offset could not be verified as a JSON message boundary from the cold tier", what).
			With(HdrRetryAfter, "1")
	}
	return Errorf(http.StatusBadRequest, CodeNotJSONBoundary, "%s offset is not a JSON message boundary", what)
}

// trimChunks forgets the chunks wholly below off.
func (s *Stream) trimChunks(off uint64) {
	i := 0
	for i < len(s.Chunks) && s.Chunks[i].End <= off {
		i++
	}
	if i > 0 {
		s.Chunks = append([]ColdChunk(nil), s.Chunks[i:]...)
	}
}

// CodeInvalidColdFlush refuses a record-chunk command that does not fit the stream.
const CodeInvalidColdFlush = "INVALID_COLD_FLUSH"

// recordChunk applies OpRecordChunk: the range must start at the hot start of the same
// incarnation and end within the stream.
func (st *State) recordChunk(c *Command) Result {
	s := st.Live(c.Key, c.Now)
	if s == nil || s.SoftDeleted {
		return fail(st.NotFound(c.Key))
	}
	if c.IfIncarnation != s.Incarnation {
		return fail(s.mismatch())
	}
	if c.ChunkKey == "" || c.Offset != s.Data.Base() || c.ChunkEnd <= c.Offset || c.ChunkEnd > s.Tail() {
		return fail(Errorf(http.StatusConflict, CodeInvalidColdFlush, "cold chunk [%d, %d) does not start at the hot start %d or ends past the tail %d",
			c.Offset, c.ChunkEnd, s.Data.Base(), s.Tail()))
	}
	s.Chunks = append(s.Chunks, ColdChunk{Key: c.ChunkKey, Start: c.Offset, End: c.ChunkEnd})
	s.Data.TrimBelow(c.ChunkEnd)
	return Result{Status: http.StatusNoContent}
}

// heldByteIs reports whether the hot buffer holds the byte at off and it is c (a flushed
// byte is not held: the cold tier has it).
func (s *Stream) heldByteIs(off uint64, c byte) bool {
	b := &s.Data
	// Below Base never counts, even when the block holding it is still in memory: a
	// replica restored from a snapshot holds only [Base, End), and apply must decide
	// the same everywhere.
	if len(b.blocks) == 0 || off < b.base || off < b.starts[0] || off >= b.end {
		return false
	}
	return b.ByteAt(off) == c
}
