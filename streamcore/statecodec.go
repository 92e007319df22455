package streamcore

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"maps"
	"math"
	"slices"
	"sort"
)

// Binary codecs of Command and State, for engines that log commands and snapshot state
// (the raft engine). They are compact (varints, raw bodies, no JSON) and live here because
// the state has unexported parts (the receipt ring, the buffer layout).
//
// Every field of every encoded type is written explicitly. statecodec_test.go lists the
// fields of each type and fails when one is added without the codec knowing about it, and
// round-trips a State that uses every feature through reflect-based deep comparison.
//
// Format versions: the first byte of an encoded command or state. Decoders refuse versions
// they do not know.

const (
	commandCodecVersion = 1
	// 2 added the history-rewrite fields, 3 the erased buckets; 1 and 2 still decode.
	stateCodecVersion = 3
)

func knownStateVersion(v uint8) bool { return v >= 1 && v <= stateCodecVersion }

// ErrCodec reports a malformed encoded command or state.
var ErrCodec = errors.New("streamcore: malformed encoding")

// encoder appends to b. With w set (WriteState), it writes b out whenever spill is called
// past stateSpillBytes and writes large stream blocks to w directly, so encoding a state
// never builds one slice as large as the state (issue 20: the snapshot of a group holding
// megabytes of hot bytes spent its time growing and copying that slice).
type encoder struct {
	b    []byte
	w    io.Writer
	werr error // the first write error; later writes are skipped
}

// stateSpillBytes is the most WriteState buffers before writing to its writer.
const stateSpillBytes = 64 << 10

// spill writes the buffered bytes to w once they reach min bytes.
func (e *encoder) spill(min int) {
	if e.w == nil || len(e.b) < min || len(e.b) == 0 {
		return
	}
	if e.werr == nil {
		_, e.werr = e.w.Write(e.b)
	}
	e.b = e.b[:0]
}

// raw appends p, or with a writer and p large, writes what is buffered and then p itself
// (no copy into b).
func (e *encoder) raw(p []byte) {
	if e.w == nil || len(p) < stateSpillBytes/4 {
		e.b = append(e.b, p...)
		e.spill(stateSpillBytes)
		return
	}
	e.spill(1)
	if e.werr == nil {
		_, e.werr = e.w.Write(p)
	}
}

func (e *encoder) u(v uint64)          { e.b = binary.AppendUvarint(e.b, v) }
func (e *encoder) i(v int64)           { e.b = binary.AppendVarint(e.b, v) }
func (e *encoder) s(v string)          { e.u(uint64(len(v))); e.b = append(e.b, v...) }
func (e *encoder) bs(v []byte)         { e.u(uint64(len(v))); e.b = append(e.b, v...) }
func (e *encoder) bool(v bool)         { e.b = append(e.b, b2u(v)) }
func (e *encoder) byte(v uint8)        { e.b = append(e.b, v) }
func (e *encoder) present(p bool) bool { e.bool(p); return p }

func b2u(v bool) byte {
	if v {
		return 1
	}
	return 0
}

type decoder struct {
	b   []byte
	err error
	ver uint8 // state codec version being decoded
}

func (d *decoder) fail() {
	if d.err == nil {
		d.err = ErrCodec
	}
}

func (d *decoder) u() uint64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Uvarint(d.b)
	if n <= 0 {
		d.fail()
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *decoder) i() int64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Varint(d.b)
	if n <= 0 {
		d.fail()
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *decoder) n() int {
	v := d.u()
	if v > uint64(len(d.b)) || v > math.MaxInt32*8 {
		d.fail()
		return 0
	}
	return int(v)
}

func (d *decoder) raw(n int) []byte {
	if d.err != nil || n > len(d.b) {
		d.fail()
		return nil
	}
	p := d.b[:n:n]
	d.b = d.b[n:]
	return p
}

func (d *decoder) s() string { return string(d.raw(d.n())) }

// bs returns a slice that aliases the input (callers decoding from a buffer they keep
// unchanged may keep it; the raft engine never reuses log buffers).
func (d *decoder) bs() []byte {
	n := d.n()
	if n == 0 {
		d.raw(0)
		return nil
	}
	return d.raw(n)
}

func (d *decoder) byte() uint8 {
	p := d.raw(1)
	if p == nil {
		return 0
	}
	return p[0]
}

func (d *decoder) bool() bool {
	switch d.byte() {
	case 0:
		return false
	case 1:
		return true
	}
	d.fail()
	return false
}

// count reads a collection length, bounded by the remaining input (each element takes at
// least one byte), so a corrupt length cannot make the decoder allocate without bound.
func (d *decoder) count() int {
	v := d.u()
	if v > uint64(len(d.b)) {
		d.fail()
		return 0
	}
	return int(v)
}

// CommandSizeHint is an upper bound of len(AppendCommand(nil, c)) for the commands the
// engines propose (a BodyFault's headers aside), so a caller can allocate the buffer
// once: every varint counts its largest size.
func CommandSizeHint(c *Command) int {
	n := 40*binary.MaxVarintLen64 + len(c.Key) + len(c.ContentType) + len(c.ExpiresAt) + len(c.Body) +
		len(c.StreamSeq) + len(c.SnapshotType) + len(c.SnapshotDigest) + len(c.SnapshotColdKey) + len(c.ChunkKey)
	if c.Fork != nil {
		n += len(c.Fork.Source)
	}
	if c.Producer != nil {
		n += len(c.Producer.ID) + len(c.Producer.Digest)
	}
	if c.BodyFault != nil {
		n += len(c.BodyFault.Code) + len(c.BodyFault.Message)
		for k, v := range c.BodyFault.Headers {
			n += 2*binary.MaxVarintLen64 + len(k) + len(v)
		}
	}
	return n
}

// AppendCommand appends the binary encoding of c to b.
func AppendCommand(b []byte, c *Command) []byte {
	e := encoder{b: b}
	e.commandHead(c)
	e.b = append(e.b, c.Body...)
	e.commandTail(c)
	return e.b
}

// Body frames. A proposer that reads a large body can read it into a frame: a buffer with
// BodyFrameHead bytes of room before the body and BodyFrameTail after it. An engine that
// encodes the command into a log entry (AppendCommandAround) then writes the other
// fields around the body instead of copying the body into a new entry: for 1 MiB
// appends that copy, into fresh memory, was a fifth of the server's CPU.
const (
	BodyFrameHead = 512
	BodyFrameTail = 512
)

// NewBodyFrame returns a frame for a body of n bytes and the body, frame[BodyFrameHead:][:n].
func NewBodyFrame(n int) (frame, body []byte) {
	frame = make([]byte, BodyFrameHead+n, BodyFrameHead+n+BodyFrameTail)
	return frame, frame[BodyFrameHead:]
}

// AppendCommandAround returns prefix followed by the encoding of c, the bytes
// AppendCommand(prefix, c) returns, written in place around c.Body when c.BodyFrame is the
// frame Body lies in and the fields before the body fit in the room before it (fields
// after it that outgrow the room after it are appended as usual, with one copy). The
// entry shares the frame's memory. ok is false, and nothing is written, when Body is not
// in its frame (JSON bodies are normalised into new memory) or the room is too small.
func AppendCommandAround(prefix []byte, c *Command) (entry []byte, ok bool) {
	f, n := c.BodyFrame, len(c.Body)
	if n == 0 || len(f) == 0 {
		return nil, false
	}
	head := cap(f) - cap(c.Body)
	if head < 0 || head+n > len(f) || &f[head] != &c.Body[0] {
		return nil, false
	}
	var small [BodyFrameHead]byte
	e := encoder{b: append(small[:0], prefix...)}
	e.commandHead(c)
	h := len(e.b)
	if h > head {
		return nil, false
	}
	start := head - h
	copy(f[start:head], e.b)
	e.b = f[start : head+n]
	e.commandTail(c)
	return e.b, true
}

// commandHead encodes the fields of c before its body's bytes, the body's length last.
func (e *encoder) commandHead(c *Command) {
	e.byte(commandCodecVersion)
	e.byte(uint8(c.Op))
	e.s(c.Key)
	e.i(c.Now)
	e.u(c.IfIncarnation)
	e.s(c.ContentType)
	e.i(c.TTL)
	e.s(c.ExpiresAt)
	e.i(c.ExpiresAtMs)
	e.u(c.NewIncarnation)
	if e.present(c.Fork != nil) {
		e.forkSpec(c.Fork)
	}
	e.u(uint64(len(c.Body)))
}

// commandTail encodes the fields of c after its body.
func (e *encoder) commandTail(c *Command) {
	e.i(int64(c.Messages))
	e.bool(c.Close)
	e.s(c.StreamSeq)
	if e.present(c.BodyFault != nil) {
		e.err(c.BodyFault)
	}
	if e.present(c.Producer != nil) {
		e.s(c.Producer.ID)
		e.u(c.Producer.Epoch)
		e.u(c.Producer.Seq)
		e.s(c.Producer.Digest)
	}
	e.bool(c.DigestBad)
	e.bool(c.WithIncHdr)
	e.u(c.Offset)
	e.s(c.SnapshotType)
	e.s(c.SnapshotDigest)
	e.s(c.SnapshotColdKey)
	e.u(c.SnapshotSize)
	e.byte(boundaryVerdict(c))
	e.s(c.ChunkKey)
	e.u(c.ChunkEnd)
}

// DecodeCommand decodes a command encoded by AppendCommand. Body aliases b.
func DecodeCommand(b []byte) (*Command, error) {
	d := decoder{b: b}
	if v := d.byte(); v != commandCodecVersion {
		return nil, fmt.Errorf("%w: command codec version %d", ErrCodec, v)
	}
	c := &Command{}
	c.Op = Op(d.byte())
	c.Key = d.s()
	c.Now = d.i()
	c.IfIncarnation = d.u()
	c.ContentType = d.s()
	c.TTL = d.i()
	c.ExpiresAt = d.s()
	c.ExpiresAtMs = d.i()
	c.NewIncarnation = d.u()
	if d.bool() {
		c.Fork = d.forkSpec()
	}
	c.Body = d.bs()
	if c.Op == OpPublishSnapshot {
		c.Body = clone(c.Body) // kept as the snapshot body: never alias a log buffer
	}
	c.Messages = int(d.i())
	c.Close = d.bool()
	c.StreamSeq = d.s()
	if d.bool() {
		c.BodyFault = d.err2()
	}
	if d.bool() {
		c.Producer = &ProducerHeaders{ID: d.s(), Epoch: d.u(), Seq: d.u(), Digest: d.s()}
	}
	c.DigestBad = d.bool()
	c.WithIncHdr = d.bool()
	c.Offset = d.u()
	c.SnapshotType = d.s()
	c.SnapshotDigest = d.s()
	c.SnapshotColdKey = d.s()
	c.SnapshotSize = d.u()
	switch d.byte() {
	case 0:
	case 1:
		c.BoundaryChecked = true
	case 2:
		c.BoundaryRefuted = true
	default:
		d.fail()
	}
	c.ChunkKey = d.s()
	c.ChunkEnd = d.u()
	if err := d.finish(); err != nil {
		return nil, err
	}
	return c, nil
}

// finish reports the first decoding error, or a failure when bytes are left over.
func (d *decoder) finish() error {
	if d.err == nil && len(d.b) != 0 {
		d.fail()
	}
	return d.err
}

func (e *encoder) forkSpec(f *ForkSpec) {
	e.s(f.Source)
	e.u(f.Offset)
	e.bool(f.HasOffset)
	e.u(f.SubOffset)
}

func (d *decoder) forkSpec() *ForkSpec {
	return &ForkSpec{Source: d.s(), Offset: d.u(), HasOffset: d.bool(), SubOffset: d.u()}
}

func (e *encoder) err(x *Error) {
	e.i(int64(x.Status))
	e.s(x.Code)
	e.s(x.Message)
	keys := slices.Sorted(maps.Keys(x.Headers))
	e.u(uint64(len(keys)))
	for _, k := range keys {
		e.s(k)
		e.s(x.Headers[k])
	}
}

func (d *decoder) err2() *Error {
	x := &Error{Status: int(d.i()), Code: d.s(), Message: d.s()}
	if n := d.count(); n > 0 {
		x.Headers = make(map[string]string, n)
		for range n {
			k := d.s()
			x.Headers[k] = d.s()
		}
	}
	return x
}

// WriteState writes the binary encoding of every stream and bucket of st to w (Peer is not
// part of the state). Streams are written in key order, so equal states encode equally.
// A fork's bytes are written in full (its shared prefix is not deduplicated); a restored
// fork holds its own copy.
func WriteState(w io.Writer, st *State) error {
	e := encoder{b: make([]byte, 0, stateSpillBytes+4096), w: w}
	e.byte(stateCodecVersion)
	buckets := make([]string, 0, len(st.Buckets))
	for b, ok := range st.Buckets {
		if ok {
			buckets = append(buckets, b)
		}
	}
	sort.Strings(buckets)
	e.u(uint64(len(buckets)))
	for _, b := range buckets {
		e.s(b)
	}
	keys := slices.Sorted(maps.Keys(st.Streams))
	e.u(uint64(len(keys)))
	for _, k := range keys {
		e.s(k)
		e.stream(st.Streams[k])
		if e.spill(stateSpillBytes); e.werr != nil {
			return e.werr
		}
	}
	erased := make([]string, 0, len(st.Erased))
	for b, ok := range st.Erased {
		if ok {
			erased = append(erased, b)
		}
	}
	sort.Strings(erased)
	e.u(uint64(len(erased)))
	for _, b := range erased {
		e.s(b)
	}
	e.spill(1)
	return e.werr
}

// ReadState decodes a state written by WriteState.
func ReadState(b []byte) (*State, error) {
	d := decoder{b: b}
	if d.ver = d.byte(); !knownStateVersion(d.ver) {
		return nil, fmt.Errorf("%w: state codec version %d", ErrCodec, d.ver)
	}
	st := NewState()
	for range d.count() {
		st.Buckets[d.s()] = true
	}
	for n := d.count(); n > 0 && d.err == nil; n-- {
		k := d.s()
		st.Streams[k] = d.stream()
	}
	if d.ver >= 3 {
		for n := d.count(); n > 0 && d.err == nil; n-- {
			st.Erased[d.s()] = true
		}
	}
	if err := d.finish(); err != nil {
		return nil, err
	}
	return st, nil
}

func (e *encoder) stream(s *Stream) {
	e.s(s.Key)
	e.s(s.ContentType)
	e.i(s.TTL)
	e.s(s.ExpiresAt)
	e.i(s.ExpiresAtMs)
	e.bool(s.Closed)
	e.u(s.Incarnation)
	e.i(s.CreatedMs)
	e.i(s.RenewedMs)
	e.u(s.Retained)
	// Data: the held start (the first byte of the first block, which may lie below Base
	// after a trim: heldByteIs looks at it), Base, then the held bytes.
	held := s.Data.heldStart()
	e.u(held)
	e.u(s.Data.Base() - held)
	e.u(s.Data.End() - held)
	for _, blk := range s.Data.blocks {
		e.raw(blk)
	}
	e.u(uint64(len(s.Appends)))
	prev := uint64(0)
	for _, a := range s.Appends {
		e.u(a - prev) // ascending: deltas are small
		prev = a
	}
	e.s(s.StreamSeq)
	ids := slices.Sorted(maps.Keys(s.Producers))
	e.u(uint64(len(ids)))
	for _, id := range ids {
		e.s(id)
		e.producer(s.Producers[id])
	}
	e.receipts(&s.Receipts)
	e.u(s.EpochFloor)
	e.bool(s.HasEpochFloor)
	if e.present(s.Snapshot != nil) {
		e.u(s.Snapshot.Offset)
		e.s(s.Snapshot.ContentType)
		e.s(s.Snapshot.Digest)
		e.u(uint64(len(s.Snapshot.Body))) // as bs, without copying a large body into b
		e.raw(s.Snapshot.Body)
		e.s(s.Snapshot.ColdKey)
		e.u(s.Snapshot.Size)
	}
	if e.present(s.Fork != nil) {
		e.forkSpec(s.Fork)
	}
	e.i(int64(s.ForkRefs))
	e.bool(s.SoftDeleted)
	e.bool(s.closedByRecord)
	e.u(uint64(len(s.Chunks)))
	for _, ch := range s.Chunks {
		e.s(ch.Key)
		e.u(ch.Start)
		e.u(ch.End)
	}
	e.u(s.PreviousIncarnation)
	e.u(s.InheritedOffset)
}

// heldStart is the offset of the first byte the buffer still holds (Base when empty).
func (b *Buffer) heldStart() uint64 {
	if len(b.starts) == 0 {
		return b.base
	}
	return b.starts[0]
}

func (d *decoder) stream() *Stream {
	s := &Stream{Key: d.s(), ContentType: d.s(), TTL: d.i(), ExpiresAt: d.s(),
		ExpiresAtMs: d.i(), Closed: d.bool(), Incarnation: d.u(), CreatedMs: d.i(),
		RenewedMs: d.i(), Retained: d.u()}
	held := d.u()
	base := held + d.u()
	data := d.raw(d.n())
	if base > held+uint64(len(data)) {
		d.fail()
	}
	s.Data = Buffer{base: held, end: held}
	s.Data.Append(data) // copies: the restored state never aliases the input
	s.Data.base = base
	if n := d.count(); n > 0 {
		s.Appends = make([]uint64, n)
		prev := uint64(0)
		for i := range s.Appends {
			prev += d.u()
			s.Appends[i] = prev
		}
	}
	s.StreamSeq = d.s()
	s.Producers = map[string]*Producer{}
	for n := d.count(); n > 0 && d.err == nil; n-- {
		id := d.s()
		s.Producers[id] = d.producer()
	}
	d.receipts(&s.Receipts)
	s.EpochFloor = d.u()
	s.HasEpochFloor = d.bool()
	if d.bool() {
		s.Snapshot = &Snapshot{Offset: d.u(), ContentType: d.s(), Digest: d.s()}
		s.Snapshot.Body = clone(d.bs())
		s.Snapshot.ColdKey = d.s()
		s.Snapshot.Size = d.u()
	}
	if d.bool() {
		s.Fork = d.forkSpec()
	}
	s.ForkRefs = int(d.i())
	s.SoftDeleted = d.bool()
	s.closedByRecord = d.bool()
	if n := d.count(); n > 0 {
		s.Chunks = make([]ColdChunk, n)
		for i := range s.Chunks {
			s.Chunks[i] = ColdChunk{Key: d.s(), Start: d.u(), End: d.u()}
		}
	}
	if d.ver >= 2 {
		s.PreviousIncarnation = d.u()
		s.InheritedOffset = d.u()
	}
	return s
}

func (e *encoder) producer(p *Producer) {
	e.u(p.Epoch)
	e.u(p.LastSeq)
	e.i(p.LastSeen)
	e.u(p.ClosedEpoch)
	e.u(p.ClosedSeq)
	e.bool(p.HasClosed)
	e.s(p.ClaimDigest)
	e.receipt(&p.Newest)
	e.bool(p.AboveFloor)
	e.bool(p.HistoryClosed)
}

func (d *decoder) producer() *Producer {
	// Composite literal fields are evaluated left to right, in the encoder's order.
	p := &Producer{Epoch: d.u(), LastSeq: d.u(), LastSeen: d.i(), ClosedEpoch: d.u(),
		ClosedSeq: d.u(), HasClosed: d.bool(), ClaimDigest: d.s(), Newest: d.receipt(),
		AboveFloor: d.bool()}
	if d.ver >= 2 {
		p.HistoryClosed = d.bool()
	}
	return p
}

func (e *encoder) receipt(r *Receipt) {
	e.s(r.Producer)
	e.u(r.Epoch)
	e.u(r.Seq)
	e.s(r.Digest)
	e.u(r.Start)
	e.u(r.End)
	e.bool(r.Closed)
}

func (d *decoder) receipt() Receipt {
	return Receipt{Producer: d.s(), Epoch: d.u(), Seq: d.u(), Digest: d.s(), Start: d.u(), End: d.u(), Closed: d.bool()}
}

// receipts writes the ring in slot order and the next slot.
func (e *encoder) receipts(w *ReceiptWindow) {
	e.u(uint64(len(w.ring)))
	for i := range w.ring {
		e.receipt(&w.ring[i])
	}
	e.u(uint64(w.next))
}

func (d *decoder) receipts(w *ReceiptWindow) {
	n := d.count()
	if n > ReceiptWindowSize {
		d.fail()
		return
	}
	if n > 0 {
		w.ring = make([]Receipt, n)
		for i := range w.ring {
			w.ring[i] = d.receipt()
		}
	}
	next := d.u()
	if n < ReceiptWindowSize && next != 0 || n == ReceiptWindowSize && next >= ReceiptWindowSize {
		d.fail()
		return
	}
	w.next = int(next)
}

func clone(p []byte) []byte {
	if p == nil {
		return nil
	}
	return append([]byte(nil), p...)
}

// CaptureState returns a copy of st that WriteState can encode after the lock guarding st
// is released, while commands keep applying to st: the copy costs the stream and producer
// metadata, not the bytes. Stream bytes are shared (blocks are append-only: the copy's
// blocks are capped at their current length); append-only slices are shared capped;
// everything apply mutates in place (producers, the receipt ring) is copied.
func CaptureState(st *State) *State {
	c := &State{Streams: make(map[string]*Stream, len(st.Streams)), Buckets: make(map[string]bool, len(st.Buckets)),
		Erased: make(map[string]bool, len(st.Erased))}
	for b, ok := range st.Buckets {
		c.Buckets[b] = ok
	}
	for b, ok := range st.Erased {
		c.Erased[b] = ok
	}
	for k, s := range st.Streams {
		cs := *s
		cs.Data = s.Data.frozen()
		cs.Appends = s.Appends[:len(s.Appends):len(s.Appends)]
		cs.Chunks = append([]ColdChunk(nil), s.Chunks...)
		cs.Producers = make(map[string]*Producer, len(s.Producers))
		for id, p := range s.Producers {
			pc := *p
			cs.Producers[id] = &pc
		}
		cs.Receipts = ReceiptWindow{ring: append([]Receipt(nil), s.Receipts.ring...), next: s.Receipts.next}
		if s.Snapshot != nil {
			sn := *s.Snapshot
			cs.Snapshot = &sn
		}
		if s.Fork != nil {
			f := *s.Fork
			cs.Fork = &f
		}
		c.Streams[k] = &cs
	}
	return c
}

// frozen returns a buffer holding the same bytes whose blocks are capped at their current
// length, so later appends to b never write into memory the copy reads.
func (b *Buffer) frozen() Buffer {
	nb := Buffer{base: b.base, end: b.end,
		blocks: make([][]byte, len(b.blocks)),
		starts: append([]uint64(nil), b.starts...),
		arenas: append([]*arena(nil), b.arenas...)}
	for i, blk := range b.blocks {
		nb.blocks[i] = blk[:len(blk):len(blk)]
	}
	return nb
}

// boundaryVerdict is the one byte of a command's cold boundary check: 0 unverified,
// 1 a boundary, 2 not a boundary. A log written before refutations existed holds 0 or 1.
func boundaryVerdict(c *Command) byte {
	switch {
	case c.BoundaryChecked:
		return 1
	case c.BoundaryRefuted:
		return 2
	}
	return 0
}
