package raftengine

// Framed pipelines: the AppendEntries that hashicorp/raft pipelines to a follower (its
// steady-state replication) travel on one connection per peer for every group, as
// frames in a compact binary encoding, instead of one msgpack-encoded connection per
// group and follower.
//
// Measured on a 3-node loopback cluster, replication cost more CPU per append than the
// HTTP request that caused it: each group's AppendEntries was its own write syscall and
// its own read on the follower, decoded by reflection (msgpack) with every entry's body
// copied out, and handed through one more goroutine (the recovery gate's filter) before
// Raft saw it. Here:
//
//   - Writes are combined: whoever appends a frame while no write is in progress writes
//     everything queued meanwhile (first yielding the processor once when the link is
//     busy), so under load the frames of many groups leave in one syscall (and the
//     follower reads them with one), with no writer goroutine to wake.
//   - The encoding is uvarints and length-prefixed bytes; an entry's Data is a slice of
//     the frame it came in (no copy per entry).
//   - The follower hands a request straight to the group's Raft (Consumer), and one
//     goroutine per group returns the answers in order.
//
// Everything else (votes, heartbeats, the first AppendEntries of a follower and its
// catch-up, snapshots, leadership transfers) keeps hashicorp/raft's NetworkTransport on
// the group's own streams: those are rare or must not queue behind a busy link. A peer
// that does not accept the link (an older version) gets NetworkTransport's pipeline.
//
// A link connection starts with the preamble "URA1" and four zero bytes; the accepting
// node answers one byte (linkAck) and from there the dialer sends requests and the
// acceptor answers. Each frame is a uint32 length (big endian, of the rest), a kind
// byte, the group (uint32) and the request id (uint64), then the body.

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/raft"
)

var linkMagic = [4]byte{'U', 'R', 'A', '1'}

const (
	linkAck byte = 0xA1

	frameAppend     byte = 1 // leader -> follower: an AppendEntriesRequest
	frameAppendResp byte = 2 // follower -> leader: its AppendEntriesResponse
	frameError      byte = 3 // follower -> leader: the request failed (message)

	frameHeader = 4 + 1 + 4 + 8
	// maxLinkFrame bounds one frame (an AppendEntries of up to MaxAppendEntries
	// entries, each possibly a large body).
	maxLinkFrame = 1 << 30
	// linkInflight is the AppendEntries one pipeline has in flight, hashicorp/raft's
	// default (its PR 541): deeper pipelines send smaller batches for no gain.
	linkInflight = 2
	linkTimeout  = 10 * time.Second
	// linkDone is the room for complete requests Raft has not consumed yet: the link's
	// reader waits when it is full, so it is far more than linkInflight (a pipeline
	// whose consumer stopped sends at most a request or two before Raft closes it).
	linkDone = 64
	// linkQueue bounds the requests a follower's group has received and not answered.
	linkQueue = 256
)

// linkState is the Mux's part of the framed pipelines.
type linkState struct {
	lmu   sync.Mutex
	out   map[string]*linkEntry       // peer address -> link to it
	recv  map[uint32]*framedTransport // group -> its transport (follower side)
	serve map[*frameWriter]net.Conn   // accepted links, closed with the Mux

	served atomic.Uint64 // AppendEntries answered from links
}

// LinkRequests is how many AppendEntries this node took from framed pipelines.
func (m *Mux) LinkRequests() uint64 { return m.links.served.Load() }

type linkEntry struct {
	mu sync.Mutex // serialises dialing
	l  *peerLink
}

// frameWriter combines writes: send appends a frame to the queue, and the caller that
// finds no write in progress writes the queue (again, until it is empty), after a yield
// when the link is busy.
type frameWriter struct {
	c        net.Conn
	mu       sync.Mutex
	buf      []byte
	frames   int // frames in buf
	spare    []byte
	flushing bool
	err      error
	// companyAt is when a write last carried more than one frame, or was followed at
	// once by another: for linkBusyWindow after it the link counts as busy.
	companyAt time.Time
}

// linkBusyWindow is how long after a write with company a link counts as busy (see
// raftlog's busyWindow).
var linkBusyWindow = 10 * time.Millisecond

func (w *frameWriter) send(kind byte, group uint32, id uint64, body func([]byte) []byte) error {
	w.mu.Lock()
	if w.err != nil {
		err := w.err
		w.mu.Unlock()
		return err
	}
	start := len(w.buf)
	w.buf = append(w.buf, 0, 0, 0, 0, kind)
	w.buf = binary.BigEndian.AppendUint32(w.buf, group)
	w.buf = binary.BigEndian.AppendUint64(w.buf, id)
	w.buf = body(w.buf)
	binary.BigEndian.PutUint32(w.buf[start:], uint32(len(w.buf)-start-4))
	w.frames++
	if w.flushing {
		w.mu.Unlock()
		return nil
	}
	w.flushing = true
	if time.Since(w.companyAt) < linkBusyWindow {
		// A busy link: yield once before writing, so the goroutines already runnable
		// (other groups' replication with frames for this peer) queue theirs behind
		// this one and leave in the same write. On 2 cores at 64 writers this took the
		// leader from 3.4 to 1.7 write(2) calls per append and each follower from 1.4
		// to 0.4. A lone frame is not held back behind unrelated work.
		w.mu.Unlock()
		runtime.Gosched()
		w.mu.Lock()
	}
	for writes := 0; len(w.buf) > 0 && w.err == nil; writes++ {
		b, n := w.buf, w.frames
		w.buf, w.frames = w.spare[:0], 0
		w.mu.Unlock()
		now := time.Now()
		w.c.SetWriteDeadline(now.Add(linkTimeout))
		_, err := w.c.Write(b)
		w.mu.Lock()
		if n > 1 || writes > 0 {
			w.companyAt = now
		}
		if cap(b) <= 1<<20 {
			w.spare = b[:0]
		} else {
			w.spare = nil // a large entry's buffer is not kept
		}
		if err != nil {
			w.err = err
			w.buf, w.frames = nil, 0
		}
	}
	w.flushing = false
	err := w.err
	w.mu.Unlock()
	if err != nil {
		w.c.Close()
	}
	return err
}

// readFrame reads one frame; body is fresh memory the caller may keep slices of.
func readLinkFrame(r *bufio.Reader) (kind byte, group uint32, id uint64, body []byte, err error) {
	var h [frameHeader]byte
	if _, err = io.ReadFull(r, h[:]); err != nil {
		return
	}
	n := binary.BigEndian.Uint32(h[:4])
	if n < frameHeader-4 || n > maxLinkFrame {
		err = fmt.Errorf("raftengine: link frame of %d bytes", n)
		return
	}
	kind, group, id = h[4], binary.BigEndian.Uint32(h[5:9]), binary.BigEndian.Uint64(h[9:17])
	body = make([]byte, n-(frameHeader-4))
	_, err = io.ReadFull(r, body)
	return
}

// --- encoding ---

func appendBytes(b, p []byte) []byte {
	b = binary.AppendUvarint(b, uint64(len(p)))
	return append(b, p...)
}

func appendHeader(b []byte, h *raft.RPCHeader) []byte {
	b = binary.AppendUvarint(b, uint64(h.ProtocolVersion))
	b = appendBytes(b, h.ID)
	return appendBytes(b, h.Addr)
}

func appendAppendRequest(b []byte, a *raft.AppendEntriesRequest) []byte {
	b = appendHeader(b, &a.RPCHeader)
	b = binary.AppendUvarint(b, a.Term)
	b = appendBytes(b, a.Leader)
	b = binary.AppendUvarint(b, a.PrevLogEntry)
	b = binary.AppendUvarint(b, a.PrevLogTerm)
	b = binary.AppendUvarint(b, a.LeaderCommitIndex)
	b = binary.AppendUvarint(b, uint64(len(a.Entries)))
	for _, e := range a.Entries {
		b = binary.AppendUvarint(b, e.Index)
		b = binary.AppendUvarint(b, e.Term)
		b = append(b, byte(e.Type))
		b = appendBytes(b, e.Data)
		b = appendBytes(b, e.Extensions)
		if e.AppendedAt.IsZero() {
			b = append(b, 0)
		} else {
			b = append(b, 1)
			b = binary.AppendVarint(b, e.AppendedAt.UnixNano())
		}
	}
	return b
}

func appendAppendResponse(b []byte, r *raft.AppendEntriesResponse) []byte {
	b = appendHeader(b, &r.RPCHeader)
	b = binary.AppendUvarint(b, r.Term)
	b = binary.AppendUvarint(b, r.LastLog)
	var flags byte
	if r.Success {
		flags |= 1
	}
	if r.NoRetryBackoff {
		flags |= 2
	}
	return append(b, flags)
}

// frameReader decodes a frame body; the first error sticks.
type frameReader struct {
	b   []byte
	err error
}

var errLinkCodec = errors.New("raftengine: malformed link frame")

func (r *frameReader) uvarint() uint64 {
	if r.err != nil {
		return 0
	}
	v, n := binary.Uvarint(r.b)
	if n <= 0 {
		r.err = errLinkCodec
		return 0
	}
	r.b = r.b[n:]
	return v
}

func (r *frameReader) varint() int64 {
	if r.err != nil {
		return 0
	}
	v, n := binary.Varint(r.b)
	if n <= 0 {
		r.err = errLinkCodec
		return 0
	}
	r.b = r.b[n:]
	return v
}

func (r *frameReader) byte() byte {
	if r.err != nil || len(r.b) == 0 {
		r.err = errLinkCodec
		return 0
	}
	c := r.b[0]
	r.b = r.b[1:]
	return c
}

// bytes returns a slice of the frame (nil when empty).
func (r *frameReader) bytes() []byte {
	n := r.uvarint()
	if r.err != nil {
		return nil
	}
	if n > uint64(len(r.b)) {
		r.err = errLinkCodec
		return nil
	}
	p := r.b[:n:n]
	r.b = r.b[n:]
	if n == 0 {
		return nil
	}
	return p
}

func (r *frameReader) header(h *raft.RPCHeader) {
	h.ProtocolVersion = raft.ProtocolVersion(r.uvarint())
	h.ID = r.bytes()
	h.Addr = r.bytes()
}

func (r *frameReader) done() error {
	if r.err == nil && len(r.b) != 0 {
		r.err = errLinkCodec
	}
	return r.err
}

func decodeAppendRequest(b []byte) (*raft.AppendEntriesRequest, error) {
	r := frameReader{b: b}
	a := &raft.AppendEntriesRequest{}
	r.header(&a.RPCHeader)
	a.Term = r.uvarint()
	a.Leader = r.bytes()
	a.PrevLogEntry = r.uvarint()
	a.PrevLogTerm = r.uvarint()
	a.LeaderCommitIndex = r.uvarint()
	n := r.uvarint()
	if r.err == nil && n > uint64(len(r.b))/5 { // an entry takes at least 5 bytes
		r.err = errLinkCodec
	}
	if r.err != nil {
		return nil, r.err
	}
	if n > 0 {
		logs := make([]raft.Log, n)
		a.Entries = make([]*raft.Log, n)
		for i := range logs {
			e := &logs[i]
			e.Index = r.uvarint()
			e.Term = r.uvarint()
			e.Type = raft.LogType(r.byte())
			e.Data = r.bytes()
			e.Extensions = r.bytes()
			switch r.byte() {
			case 0:
			case 1:
				e.AppendedAt = time.Unix(0, r.varint())
			default:
				r.err = errLinkCodec
			}
			a.Entries[i] = e
		}
	}
	if err := r.done(); err != nil {
		return nil, err
	}
	return a, nil
}

func decodeAppendResponse(b []byte, out *raft.AppendEntriesResponse) error {
	r := frameReader{b: b}
	var resp raft.AppendEntriesResponse
	r.header(&resp.RPCHeader)
	resp.Term = r.uvarint()
	resp.LastLog = r.uvarint()
	flags := r.byte()
	if err := r.done(); err != nil {
		return err
	}
	resp.Success, resp.NoRetryBackoff = flags&1 != 0, flags&2 != 0
	*out = resp
	return nil
}

// --- leader side: links and pipelines ---

// peerLink is this node's link to one peer: requests out, answers in.
type peerLink struct {
	m       *Mux
	addr    string
	c       net.Conn
	w       *frameWriter
	mu      sync.Mutex
	pending map[uint64]*linkFuture
	next    uint64
	dead    bool
}

// link returns the live link to addr, dialing one when there is none.
func (m *Mux) link(addr string) (*peerLink, error) {
	m.links.lmu.Lock()
	if m.links.out == nil {
		m.links.out = map[string]*linkEntry{}
	}
	e := m.links.out[addr]
	if e == nil {
		e = &linkEntry{}
		m.links.out[addr] = e
	}
	m.links.lmu.Unlock()
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.l != nil {
		e.l.mu.Lock()
		dead := e.l.dead
		e.l.mu.Unlock()
		if !dead {
			return e.l, nil
		}
		e.l = nil
	}
	select {
	case <-m.done:
		return nil, errors.New("raftengine: cluster transport closed")
	default:
	}
	ctx, cancel := context.WithTimeout(context.Background(), linkTimeout)
	defer cancel()
	c, err := m.dial(ctx, addr)
	if err != nil {
		return nil, err
	}
	c.SetDeadline(time.Now().Add(linkTimeout))
	var pre [8]byte
	copy(pre[:], linkMagic[:])
	var ack [1]byte
	if _, err := c.Write(pre[:]); err != nil {
		c.Close()
		return nil, err
	}
	if _, err := io.ReadFull(c, ack[:]); err != nil || ack[0] != linkAck {
		c.Close()
		return nil, fmt.Errorf("raftengine: peer %s does not accept a framed pipeline", addr)
	}
	c.SetDeadline(time.Time{})
	l := &peerLink{m: m, addr: addr, c: c, w: &frameWriter{c: c}, pending: map[uint64]*linkFuture{}}
	go l.read(bufio.NewReaderSize(c, 64<<10))
	e.l = l
	return l, nil
}

// read takes the answers and completes their futures, until the connection fails.
func (l *peerLink) read(br *bufio.Reader) {
	for {
		kind, _, id, body, err := readLinkFrame(br)
		if err != nil {
			l.fail(err)
			return
		}
		l.mu.Lock()
		f := l.pending[id]
		delete(l.pending, id)
		if len(l.pending) == 0 {
			l.c.SetReadDeadline(time.Time{})
		} else {
			l.c.SetReadDeadline(time.Now().Add(linkTimeout))
		}
		l.mu.Unlock()
		if f == nil {
			continue
		}
		switch kind {
		case frameAppendResp:
			err = decodeAppendResponse(body, f.resp)
		case frameError:
			err = errors.New(string(body))
		default:
			err = errLinkCodec
		}
		if errors.Is(err, errLinkCodec) {
			f.complete(err)
			l.fail(err)
			return
		}
		f.complete(err)
	}
}

// fail closes the link and fails every request in flight on it.
func (l *peerLink) fail(err error) {
	l.mu.Lock()
	l.dead = true
	pend := l.pending
	l.pending = map[uint64]*linkFuture{}
	l.mu.Unlock()
	l.c.Close()
	for _, f := range pend {
		f.complete(err)
	}
}

// register assigns a request id to f.
func (l *peerLink) register(f *linkFuture) (uint64, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.dead {
		return 0, errors.New("raftengine: link to " + l.addr + " closed")
	}
	l.next++
	if len(l.pending) == 0 {
		// A follower that stops answering fails the link (and Raft's pipeline).
		l.c.SetReadDeadline(time.Now().Add(linkTimeout))
	}
	l.pending[l.next] = f
	return l.next, nil
}

// linkPipeline implements raft.AppendPipeline over a link.
type linkPipeline struct {
	l     *peerLink
	group uint32
	slots chan struct{}
	done  chan raft.AppendFuture
	shut  chan struct{}
	once  sync.Once
}

type linkFuture struct {
	p     *linkPipeline
	start time.Time
	args  *raft.AppendEntriesRequest
	resp  *raft.AppendEntriesResponse
	err   error
	ready chan struct{}
}

func (f *linkFuture) Error() error                          { <-f.ready; return f.err }
func (f *linkFuture) Start() time.Time                      { return f.start }
func (f *linkFuture) Request() *raft.AppendEntriesRequest   { return f.args }
func (f *linkFuture) Response() *raft.AppendEntriesResponse { return f.resp }

// complete answers f and hands it to its pipeline's consumer (a failed request carries
// an unsuccessful response: Raft stops the pipeline and falls back to plain
// AppendEntries).
func (f *linkFuture) complete(err error) {
	f.err = err
	close(f.ready)
	p := f.p
	<-p.slots // each future holds one slot until it is complete
	select {
	case p.done <- f:
	case <-p.shut:
	}
}

func (p *linkPipeline) AppendEntries(args *raft.AppendEntriesRequest, resp *raft.AppendEntriesResponse) (raft.AppendFuture, error) {
	select {
	case p.slots <- struct{}{}:
	case <-p.shut:
		return nil, raft.ErrPipelineShutdown
	}
	f := &linkFuture{p: p, start: time.Now(), args: args, resp: resp, ready: make(chan struct{})}
	id, err := p.l.register(f)
	if err != nil {
		<-p.slots
		return nil, err
	}
	// A failed write closes the connection: the link's reader then fails f with every
	// other request in flight (never here, on Raft's replication goroutine, which must
	// not wait for its own pipeline's consumer).
	p.l.w.send(frameAppend, p.group, id, func(b []byte) []byte { return appendAppendRequest(b, args) })
	return f, nil
}

func (p *linkPipeline) Consumer() <-chan raft.AppendFuture { return p.done }

func (p *linkPipeline) Close() error {
	p.once.Do(func() { close(p.shut) })
	return nil
}

// --- follower side ---

// framedTransport is a group's transport: the inner transport (the recovery gate over
// NetworkTransport) for everything, and framed pipelines for steady replication.
type framedTransport struct {
	raft.Transport
	m     *Mux
	group uint32
	ch    chan raft.RPC
	respQ chan pendingAnswer
	stop  <-chan struct{}
}

type pendingAnswer struct {
	ch chan raft.RPCResponse
	w  *frameWriter
	id uint64
}

// Framed wraps inner, group's transport on this Mux, so that its pipelines use links.
// stop ends its goroutines (the engine's shutdown).
func (m *Mux) Framed(group uint32, inner raft.Transport, stop <-chan struct{}) raft.Transport {
	t := &framedTransport{Transport: inner, m: m, group: group, ch: make(chan raft.RPC, 16),
		respQ: make(chan pendingAnswer, linkQueue), stop: stop}
	m.links.lmu.Lock()
	if m.links.recv == nil {
		m.links.recv = map[uint32]*framedTransport{}
	}
	m.links.recv[group] = t
	m.links.lmu.Unlock()
	go t.forward(inner.Consumer())
	go t.answer()
	return t
}

// Consumer implements raft.Transport: the inner transport's requests and the links'.
func (t *framedTransport) Consumer() <-chan raft.RPC { return t.ch }

func (t *framedTransport) forward(in <-chan raft.RPC) {
	for {
		select {
		case rpc := <-in:
			select {
			case t.ch <- rpc:
			case <-t.stop:
				return
			}
		case <-t.stop:
			return
		}
	}
}

// answer writes the group's answers to link requests, in the order they came.
func (t *framedTransport) answer() {
	for {
		var p pendingAnswer
		select {
		case p = <-t.respQ:
		case <-t.stop:
			return
		}
		var r raft.RPCResponse
		select {
		case r = <-p.ch:
		case <-t.stop:
			return
		}
		if r.Error != nil {
			p.w.send(frameError, t.group, p.id, func(b []byte) []byte { return append(b, r.Error.Error()...) })
			continue
		}
		resp, ok := r.Response.(*raft.AppendEntriesResponse)
		if !ok {
			p.w.send(frameError, t.group, p.id, func(b []byte) []byte { return append(b, "unexpected response"...) })
			continue
		}
		p.w.send(frameAppendResp, t.group, p.id, func(b []byte) []byte { return appendAppendResponse(b, resp) })
	}
}

// AppendEntriesPipeline implements raft.Transport: a pipeline on the link to target,
// or the inner transport's when the peer takes no link.
func (t *framedTransport) AppendEntriesPipeline(id raft.ServerID, target raft.ServerAddress) (raft.AppendPipeline, error) {
	raftAddr, _ := splitAddr(string(target))
	l, err := t.m.link(raftAddr)
	if err != nil {
		return t.Transport.AppendEntriesPipeline(id, target)
	}
	return &linkPipeline{l: l, group: t.group, slots: make(chan struct{}, linkInflight),
		done: make(chan raft.AppendFuture, linkDone), shut: make(chan struct{})}, nil
}

// RequestPreVote implements raft.WithPreVote through the inner transport.
func (t *framedTransport) RequestPreVote(id raft.ServerID, target raft.ServerAddress, args *raft.RequestPreVoteRequest, resp *raft.RequestPreVoteResponse) error {
	pv, ok := t.Transport.(raft.WithPreVote)
	if !ok {
		return errors.New("transport without pre-vote")
	}
	return pv.RequestPreVote(id, target, args, resp)
}

// serveLink answers the requests of a link another node dialed (after its preamble).
func (m *Mux) serveLink(c net.Conn) {
	w := &frameWriter{c: c}
	m.links.lmu.Lock()
	if m.links.serve == nil {
		m.links.serve = map[*frameWriter]net.Conn{}
	}
	m.links.serve[w] = c
	m.links.lmu.Unlock()
	defer func() {
		m.links.lmu.Lock()
		delete(m.links.serve, w)
		m.links.lmu.Unlock()
		c.Close()
	}()
	select {
	case <-m.done:
		return
	default:
	}
	c.SetWriteDeadline(time.Now().Add(linkTimeout))
	if _, err := c.Write([]byte{linkAck}); err != nil {
		return
	}
	br := bufio.NewReaderSize(c, 64<<10)
	for {
		kind, group, id, body, err := readLinkFrame(br)
		if err != nil || kind != frameAppend {
			return
		}
		m.links.lmu.Lock()
		t := m.links.recv[group]
		m.links.lmu.Unlock()
		if t == nil {
			w.send(frameError, group, id, func(b []byte) []byte { return append(b, "no such group"...) })
			continue
		}
		req, err := decodeAppendRequest(body)
		if err != nil {
			return
		}
		m.links.served.Add(1)
		ch := make(chan raft.RPCResponse, 1)
		select {
		case t.respQ <- pendingAnswer{ch: ch, w: w, id: id}:
		case <-t.stop:
			return
		}
		select {
		case t.ch <- raft.RPC{Command: req, RespChan: ch}:
		case <-t.stop:
			return
		}
	}
}

// closeLinks closes every link (the Mux is closing).
func (m *Mux) closeLinks() {
	m.links.lmu.Lock()
	var out []*linkEntry
	for _, e := range m.links.out {
		out = append(out, e)
	}
	var in []net.Conn
	for _, c := range m.links.serve {
		in = append(in, c)
	}
	m.links.lmu.Unlock()
	for _, e := range out {
		e.mu.Lock()
		l := e.l
		e.mu.Unlock()
		if l != nil {
			l.fail(errors.New("raftengine: cluster transport closed"))
		}
	}
	for _, c := range in {
		c.Close()
	}
}
