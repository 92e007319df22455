package server

// SSE subscriptions, and how an idle one costs little.
//
// A subscription catches up in its request's handler. Once it is at the tail and has to
// wait, it parks: on HTTP/1.1 the handler takes the connection over (Hijack) and returns,
// so an idle reader holds no goroutine, no stack and none of net/http's per-connection
// buffers (4 KiB read + 4 KiB write + the response's own), only its socket, this small
// struct and one timer: about 2 KiB instead of about 34 KiB (measured with 10,000 idle
// readers, ursula-bench sse-idle). A parked subscription waits on the same per-stream
// watch channel as before; one goroutine per channel (not per reader) waits for it and
// resumes every subscription parked on it, each in a goroutine of its own for the
// delivery, which parks again once done. The subscription writes the chunked framing of
// its response itself from then on (the head, with Transfer-Encoding: chunked, was sent
// by net/http). A reader that went away is found by a sweep every sseSweepInterval (a
// non-blocking read of each parked connection, about a microsecond each; on Unix), or by
// a failed write (a delivery or the keep-alive comment, sse_keepalive), whichever comes
// first. HTTP/2 (TLS with h2) cannot hand a
// connection over: there the handler waits, as every subscription did before.

import (
	"crypto/tls"
	"encoding/base64"
	"net"
	"net/http"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/ursula-go/ursula/auth"
	"github.com/ursula-go/ursula/streamcore"
)

// chunkHead is the room kept in front of every frame for its chunk-size line: eight hex
// digits (leading zeros are valid chunk-size syntax) and CRLF, filled in once the frame's
// length is known, so a parked subscription writes a frame with one write and no copy.
const chunkHead = len("00000000\r\n")

// States of a subscription.
const (
	sseRunning int32 = iota // a goroutine runs its loop
	sseParked               // waiting on a watch channel and its timer, no goroutine
	sseDone
)

// sseSub is one SSE subscription.
type sseSub struct {
	s        *Server
	t        *target
	rq       *readQuery
	b64      bool
	json     bool
	maxBytes uint64
	firstInc uint64
	off      streamcore.ReadOffset
	sentInit bool
	buf      []byte

	// Before the hand-over: net/http's writer. After: the connection.
	w    http.ResponseWriter
	rc   *http.ResponseController
	conn net.Conn

	keepAliveAt time.Time // the next keep-alive comment, unless something is written first
	idleAt      time.Time // server.sse_max_idle: the subscription ends (zero: never)
	expiresAt   time.Time // the credential's exp: ends with credential-expired (zero: never)

	failed bool // a write failed: the connection is of no more use

	state atomic.Int32
	timer *time.Timer // fires at the earliest of the three times above (or a spare wake)
	// timerAt is when the timer is set to fire. A resume by the stream leaves the timer
	// running, and parking again re-arms it only when it would fire after the new wake
	// time or already fired: a spare wake finds nothing to do and parks again, which costs
	// less than stopping and re-arming the timer on every event.
	timerAt time.Time
	// deadlineAt is the connection's write deadline. A write moves it only when less than
	// three quarters of LiveWriteTimeout is left (see writeChunk).
	deadlineAt time.Time
	wait       *sseWait // parked: the channel's set it is in (guarded by the hub's lock)
}

// sseHub holds the parked subscriptions of a server.
type sseHub struct {
	mu         sync.Mutex
	waits      map[<-chan struct{}]*sseWait // parked subscriptions by the watch channel they wait on
	subs       map[*sseSub]struct{}         // every subscription that owns its connection
	closing    bool                         // the http.Server shuts down: no more parking
	sweeping   bool                         // the sweep of gone readers runs
	sweepEvery time.Duration                // tests: the sweep's interval (0: sseSweepInterval)
	hooked     sync.Map                     // *http.Server -> true once its shutdown hook is set
}

// sseWait is the set of subscriptions parked on one watch channel; one goroutine waits
// on the channel for all of them.
type sseWait struct {
	ch   <-chan struct{}
	subs map[*sseSub]struct{} // nil once resumed together
	stop chan struct{}        // closed when the last subscription left before ch closed
}

func (s *Server) serveSSE(w http.ResponseWriter, r *http.Request, t *target, rq *readQuery, inc uint64) {
	// Validation errors are plain HTTP answers before the event stream starts.
	v, e := s.look(t, rq.off, 0, inc)
	if e != nil {
		s.writeError(w, r, e)
		return
	}
	if !s.liveSlot(w, r) {
		return
	}
	handedOver := false
	defer func() {
		if !handedOver {
			s.live.Add(-1)
		}
	}()
	s.renew(r.Context(), t, v)
	c := &sseSub{s: s, t: t, rq: rq, b64: !streamcore.IsText(v.ct), json: v.isJSON(), maxBytes: rq.maxBytes,
		firstInc: v.inc, off: streamcore.ReadOffset{Pos: v.start}, w: w, rc: http.NewResponseController(w)}
	if !c.b64 && c.maxBytes < 4 {
		c.maxBytes = 4
	}
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-store, no-cache")
	if v.jsonArray {
		h.Set(streamcore.HdrSSEDataType, v.ct)
	} else {
		h.Set(streamcore.HdrSSEDataType, streamcore.ReadContentType(v.ct))
	}
	h.Set(streamcore.HdrIncarnation, u64(v.inc))
	if c.b64 {
		h.Set(streamcore.HdrSSEEncoding, "base64")
	}
	// The connection can be handed over only while net/http frames the answer with
	// chunks over HTTP/1.1 (HTTP/2 has no hijack).
	canPark := r.ProtoMajor == 1 && r.ProtoMinor >= 1 && r.Method == http.MethodGet
	if canPark {
		// A handed-over connection is closed after the last chunk. Said up front, so a
		// client (a gateway's pool) does not send its next request on it as it closes:
		// that request would meet a reset and, not being idempotent, fail.
		h.Set("Connection", "close")
	}
	w.WriteHeader(http.StatusOK)
	now := time.Now()
	c.keepAliveAt = now.Add(s.cfg.Limits.SSEKeepAlive)
	if s.cfg.SSEMaxIdle > 0 {
		c.idleAt = now.Add(s.cfg.SSEMaxIdle)
	}
	// A subscription does not outlive its credential: at the token's exp it ends with a
	// frame that tells expiry apart from the end of the stream.
	if p := auth.FromContext(r.Context()); p != nil && !p.Expires.IsZero() {
		c.expiresAt = p.Expires
	}
	for {
		ch, ok := c.step()
		if !ok {
			return
		}
		if canPark {
			conn, ended := c.handOver()
			if ended {
				return
			}
			if conn != nil {
				handedOver = true
				c.conn, c.w, c.rc = conn, nil, nil
				s.sse.adopt(c, r)
				c.park(ch) // from here on the subscription lives without this goroutine
				return
			}
			canPark = false
		}
		// Wait here, in the handler.
		tm := time.NewTimer(time.Until(c.nextWake()))
		select {
		case <-ch:
		case <-tm.C:
		case <-r.Context().Done():
			tm.Stop()
			return
		}
		tm.Stop()
	}
}

// handOver takes the connection from net/http (everything written is flushed after each
// write). It returns nil when net/http cannot hand it over (the subscription then waits in
// its handler), and ended when it took the connection but the client had sent more bytes
// after its request: a pipelined request it must not drop, so the subscription ends with
// its last chunk and the connection closes (the client sends that request again).
func (c *sseSub) handOver() (conn net.Conn, ended bool) {
	conn, brw, err := c.rc.Hijack()
	if err != nil {
		return nil, false
	}
	if brw.Reader.Buffered() > 0 {
		conn.SetWriteDeadline(time.Now().Add(c.s.cfg.Limits.LiveWriteTimeout))
		conn.Write([]byte("0\r\n\r\n"))
		conn.Close()
		return nil, true
	}
	return conn, false
}

// step runs the subscription until it has to wait: it returns the watch channel to wait
// on, or false when the subscription ended (its last frame, if any, is written).
func (c *sseSub) step() (<-chan struct{}, bool) {
	s := c.s
	for {
		now := time.Now()
		if !c.expiresAt.IsZero() && !now.Before(c.expiresAt) { // also while data keeps arriving
			c.writeConst(sseCredentialExpired)
			return nil, false
		}
		ch := s.engine.Watch(c.t.key)
		v, e := s.lookShort(c.t, c.off, c.maxBytes, 0)
		if e == nil && v.inc != c.firstInc {
			e = streamcore.Errorf(http.StatusNotFound, streamcore.CodeStreamNotFound, "stream was deleted or recreated")
		}
		if e != nil {
			s.done(v)
			c.write(streamcore.AppendSSEError(c.frame(), e))
			return nil, false
		}
		if !c.b64 && !v.jsonArray {
			trimText(v, c.json)
		}
		if v.end > v.start {
			parts := v.data
			if v.jsonArray {
				parts = [][]byte{jsonArrayOf(v.data)}
			}
			buf := streamcore.AppendSSEDataParts(c.frame(), parts, c.b64)
			buf = streamcore.AppendSSEControl(buf, s.control(v, c.rq))
			err := c.write(buf)
			runtime.KeepAlive(v)
			s.done(v)
			if err != nil {
				return nil, false
			}
			s.metrics.readBytes.Add(v.end - v.start)
			c.off = streamcore.ReadOffset{Pos: v.end}
			c.sentInit = true
			if v.closed && v.end == v.tail {
				return nil, false
			}
			continue
		}
		if v.closed || !c.sentInit {
			if c.write(streamcore.AppendSSEControl(c.frame(), s.control(v, c.rq))) != nil {
				return nil, false
			}
			c.sentInit = true
			if v.closed {
				return nil, false
			}
		}
		if !c.idleAt.IsZero() && !now.Before(c.idleAt) {
			return nil, false
		}
		if !now.Before(c.keepAliveAt) {
			// A comment line: clients ignore it; a reader that is gone or stopped reading
			// shows up as a failed write.
			if c.writeConst(":\n\n") != nil {
				return nil, false
			}
		}
		return ch, true
	}
}

// frame returns the subscription's buffer, empty but for the room of the chunk-size line.
func (c *sseSub) frame() []byte {
	return append(c.buf[:0], "00000000\r\n"...)
}

// writeConst writes a constant frame.
func (c *sseSub) writeConst(frame string) error { return c.write(append(c.frame(), frame...)) }

// write sends one piece of the event stream, b (built on frame()), within
// LiveWriteTimeout, so a reader that stopped reading is dropped once its socket buffers
// stay full that long.
func (c *sseSub) write(b []byte) error {
	if c.conn == nil {
		c.keepAliveAt = time.Now().Add(c.s.cfg.Limits.SSEKeepAlive)
		err := c.s.sseWrite(c.rc, c.w, b[chunkHead:])
		c.keep(b)
		return err
	}
	b = chunkFrame(b)
	err := c.writeChunk(b)
	c.keep(b)
	return err
}

// maxKeptFrame is the largest frame buffer a subscription keeps for its next frame: a
// reader that once got an 8 MiB event must not hold 8 MiB while it waits for more.
const maxKeptFrame = 64 << 10

// keep keeps b, a written frame, to build the next one in, unless it grew too large.
func (c *sseSub) keep(b []byte) {
	if cap(b) > maxKeptFrame {
		c.buf = nil
		return
	}
	c.buf = b[:0]
}

// nextWake is the earliest time the subscription has something to do without a change of
// its stream.
func (c *sseSub) nextWake() time.Time {
	t := c.keepAliveAt
	if !c.idleAt.IsZero() && c.idleAt.Before(t) {
		t = c.idleAt
	}
	if !c.expiresAt.IsZero() && c.expiresAt.Before(t) {
		t = c.expiresAt
	}
	return t
}

// adopt records a subscription that owns its connection, so the shutdown of r's server
// closes it (net/http forgets hijacked connections).
func (h *sseHub) adopt(c *sseSub, r *http.Request) {
	if hs, ok := r.Context().Value(http.ServerContextKey).(*http.Server); ok {
		if _, loaded := h.hooked.LoadOrStore(hs, true); !loaded {
			hs.RegisterOnShutdown(h.shutdown)
		}
	}
	h.mu.Lock()
	if h.subs == nil {
		h.subs = map[*sseSub]struct{}{}
		h.waits = map[<-chan struct{}]*sseWait{}
	}
	h.subs[c] = struct{}{}
	if !h.sweeping {
		h.sweeping = true
		go h.sweep()
	}
	h.mu.Unlock()
}

// sseSweepInterval is how often the parked connections are looked at for clients that
// went away (net/http noticed that at once with a reading goroutine per connection; this
// costs one non-blocking read per parked reader and interval instead: measured 6 us each
// on a loaded VM, so 12 ms of CPU per second for 10,000 idle readers).
const sseSweepInterval = 5 * time.Second

// sweep ends the parked subscriptions whose client closed the connection, every
// sseSweepInterval while there are subscriptions that own their connection.
func (h *sseHub) sweep() {
	every := h.sweepEvery
	if every <= 0 {
		every = sseSweepInterval
	}
	tick := time.NewTicker(every)
	defer tick.Stop()
	var parked []*sseSub
	for range tick.C {
		h.mu.Lock()
		if len(h.subs) == 0 || h.closing {
			h.sweeping = false
			h.mu.Unlock()
			return
		}
		parked = parked[:0]
		for c := range h.subs {
			if c.state.Load() == sseParked {
				parked = append(parked, c)
			}
		}
		h.mu.Unlock()
		for i, c := range parked {
			if peerGone(c.conn) && c.claim() {
				c.failed = true
				c.finish()
			}
			parked[i] = nil
		}
	}
}

// socketOf finds the socket under the connection wrappers of this package and TLS.
func socketOf(c net.Conn) syscall.Conn {
	for range 8 {
		switch x := c.(type) {
		case *limitedConn:
			c = x.Conn
		case *refusalConn:
			c = x.Conn
		case *refusalTLSConn:
			c = x.tc
		case *tls.Conn:
			c = x.NetConn()
		case syscall.Conn:
			return x
		default:
			return nil
		}
	}
	return nil
}

// shutdown ends every subscription that owns its connection: parked ones at once, running
// ones at their next write (their connection is closed under them).
func (h *sseHub) shutdown() {
	h.mu.Lock()
	h.closing = true
	subs := make([]*sseSub, 0, len(h.subs))
	for c := range h.subs {
		subs = append(subs, c)
	}
	h.mu.Unlock()
	for _, c := range subs {
		c.conn.Close() // a running subscription fails its next write
		c.resume()
	}
}

// park leaves the subscription waiting on ch and its timer, with no goroutine; or, when
// ch is already closed, runs it again at once. Called by the goroutine that ran it.
func (c *sseSub) park(ch <-chan struct{}) {
	for {
		h := &c.s.sse
		h.mu.Lock()
		if h.closing {
			h.mu.Unlock()
			c.finish()
			return
		}
		select {
		case <-ch:
			// Changed since the look: no parking, look again.
			h.mu.Unlock()
		default:
			w := h.waits[ch]
			if w == nil {
				w = &sseWait{ch: ch, subs: map[*sseSub]struct{}{}, stop: make(chan struct{})}
				h.waits[ch] = w
				go h.waitOn(w)
			}
			w.subs[c] = struct{}{}
			c.wait = w
			c.buf = shrink(c.buf)
			c.armTimer(time.Now())
			c.state.Store(sseParked)
			h.mu.Unlock()
			return
		}
		var ok bool
		if ch, ok = c.step(); !ok {
			c.finish()
			return
		}
	}
}

// armTimer makes the timer fire by the subscription's next wake time. A timer still set
// for that time or earlier is left as it is (see timerAt), unless it is due within
// timerMargin: it could then fire before the subscription is marked parked, and its
// resume would find it running and be lost.
func (c *sseSub) armTimer(now time.Time) {
	wake := c.nextWake()
	switch {
	case c.timer == nil:
		c.timer = time.AfterFunc(wake.Sub(now), c.resume)
	case c.timerAt.After(now.Add(timerMargin)) && !c.timerAt.After(wake):
		return
	default:
		c.timer.Reset(wake.Sub(now))
	}
	c.timerAt = wake
}

// timerMargin: a timer due sooner than this is re-armed when a subscription parks.
const timerMargin = time.Second

// shrink drops a buffer a large frame grew, so an idle subscription holds a small one.
func shrink(b []byte) []byte {
	if cap(b) > 512 {
		return nil
	}
	return b
}

// waitOn resumes the subscriptions parked on ch once it is closed (or at shutdown).
func (h *sseHub) waitOn(w *sseWait) {
	select {
	case <-w.ch:
	case <-w.stop:
		return
	}
	h.mu.Lock()
	if h.waits[w.ch] == w {
		delete(h.waits, w.ch)
	}
	subs := w.subs
	w.subs = nil
	h.mu.Unlock()
	wakeTogether(subs)
}

// sseShare identifies the subscriptions of one stream that get the same next frame: the
// same position and reading parameters, and no cursor of their own (the control event's
// cursor is then the same for all).
type sseShare struct {
	off, maxBytes, inc uint64
	b64, compat        bool
}

// wakeTogether resumes the subscriptions parked on one watch channel. Those that would
// read the same bytes get one frame, read and encoded once, and each only writes it: the
// fan-out of an append to many readers costs one read of the stream, not one per reader.
func wakeTogether(subs map[*sseSub]struct{}) {
	groups := map[sseShare][]*sseSub{}
	now := time.Now()
	for c := range subs {
		// Claimed first: from then on nothing else runs it (its timer may fire meanwhile),
		// so its fields are this goroutine's to read.
		if !c.claim() {
			continue
		}
		if c.rq.cursor != "" || !c.sentInit || c.off.Now || !c.expiresAt.IsZero() && !now.Before(c.expiresAt) ||
			!c.idleAt.IsZero() && !now.Before(c.idleAt) {
			go c.run()
			continue
		}
		k := sseShare{off: c.off.Pos, maxBytes: c.maxBytes, inc: c.firstInc, b64: c.b64, compat: c.t.compat}
		groups[k] = append(groups[k], c)
	}
	for _, g := range groups {
		if len(g) == 1 {
			go g[0].run()
			continue
		}
		deliverShared(g)
	}
}

// deliverShared reads and encodes the next frame of g (claimed subscriptions with one
// sseShare) once, then each writes it in a goroutine of its own and parks again. Anything but plain
// data (an error, a closed stream, nothing new) takes the full path of each.
func deliverShared(g []*sseSub) {
	c0 := g[0]
	s := c0.s
	ch := s.engine.Watch(c0.t.key)
	v, e := s.lookShort(c0.t, c0.off, c0.maxBytes, 0)
	if e == nil && !c0.b64 && !v.jsonArray {
		trimText(v, c0.json)
	}
	if e != nil || v.inc != c0.firstInc || v.closed || v.end <= v.start {
		s.done(v)
		for _, c := range g {
			go c.run()
		}
		return
	}
	parts, size := v.data, int(v.end-v.start)
	if v.jsonArray {
		parts = [][]byte{jsonArrayOf(v.data)}
		size = len(parts[0])
	}
	if c0.b64 {
		size = base64.StdEncoding.EncodedLen(size) + (size/768+1)*6 // "data:" and LF per 1024 characters
	}
	frame := streamcore.AppendSSEDataParts(append(make([]byte, 0, chunkHead+size+256), "00000000\r\n"...), parts, c0.b64)
	frame = streamcore.AppendSSEControl(frame, s.control(v, c0.rq))
	frame = chunkFrame(frame)
	runtime.KeepAlive(v)
	s.done(v)
	end, n := v.end, v.end-v.start
	for _, c := range g {
		go func() {
			defer c.recoverPanic()
			if c.writeChunk(frame) != nil {
				c.finish()
				return
			}
			s.metrics.readBytes.Add(n)
			c.off = streamcore.ReadOffset{Pos: end}
			c.park(ch)
		}()
	}
}

// chunkFrame fills in the chunk-size line in front of b (built on frame()) and ends the
// chunk: b is then one chunk of the answer, ready to write as it is.
func chunkFrame(b []byte) []byte {
	n := len(b) - chunkHead
	const hexDigits = "0123456789abcdef"
	for i := 7; i >= 0; i-- {
		b[i] = hexDigits[n&15]
		n >>= 4
	}
	return append(b, '\r', '\n')
}

// writeChunk writes one whole chunk to the connection within LiveWriteTimeout, or at
// least three quarters of it: the deadline moves only when less than that is left, so a
// reader that gets an event every few milliseconds does not cost a deadline change per
// event (a timer update in the runtime's poller), and a reader whose socket stays full is
// still dropped after 3/4 to 4/4 of LiveWriteTimeout.
func (c *sseSub) writeChunk(b []byte) error {
	now := time.Now()
	c.keepAliveAt = now.Add(c.s.cfg.Limits.SSEKeepAlive)
	if lt := c.s.cfg.Limits.LiveWriteTimeout; c.deadlineAt.Sub(now) < lt-lt/4 {
		c.deadlineAt = now.Add(lt)
		c.conn.SetWriteDeadline(c.deadlineAt)
	}
	_, err := c.conn.Write(b)
	c.failed = c.failed || err != nil
	if err == nil {
		// The bucket's bytes out (GET /__ursula/usage) count an event stream's body as
		// net/http's writer counted it before the hand-over: without the chunk framing.
		c.s.usage.read(c.t.bucket, int64(len(b)-chunkHead-2))
	}
	return err
}

// resume runs a parked subscription again in a goroutine of its own: its stream changed,
// its timer fired, or the server shuts down. Whoever comes first wins; the others find it
// running already.
func (c *sseSub) resume() {
	if c.claim() {
		go c.run()
	}
}

// claim takes a parked subscription out of its wait for the caller to run it; false when
// it is not parked, or the server shuts down (it is then ended here).
func (c *sseSub) claim() bool {
	if !c.state.CompareAndSwap(sseParked, sseRunning) {
		return false
	}
	h := &c.s.sse
	h.mu.Lock()
	if w := c.wait; w != nil && w.subs != nil {
		delete(w.subs, c)
		if len(w.subs) == 0 {
			// The last one left before the channel closed: its goroutine goes too.
			delete(h.waits, w.ch)
			w.subs = nil
			close(w.stop)
		}
	}
	c.wait = nil
	closing := h.closing
	h.mu.Unlock()
	// The timer keeps running (timerAt): if it fires while the subscription runs, its
	// resume finds it not parked and does nothing.
	if closing {
		c.finish()
		return false
	}
	return true
}

// recoverPanic ends the subscription on a panic of its goroutine (net/http recovers the
// panics of handlers; a subscription's own goroutine must too).
func (c *sseSub) recoverPanic() {
	if v := recover(); v != nil {
		c.s.cfg.Logger.Error("sse subscription panic", "stream", c.t.key, "err", v)
		c.failed = true
		c.finish()
	}
}

// run is the goroutine of a resumed subscription: deliver, then park again or end.
func (c *sseSub) run() {
	defer c.recoverPanic()
	ch, ok := c.step()
	if !ok {
		c.finish()
		return
	}
	c.park(ch)
}

// finish ends a subscription that owns its connection: the last chunk unless a write
// failed, then the connection closes and the live-reader slot is free.
func (c *sseSub) finish() {
	c.state.Store(sseDone)
	if !c.failed {
		c.conn.SetWriteDeadline(time.Now().Add(c.s.cfg.Limits.LiveWriteTimeout))
		c.conn.Write([]byte("0\r\n\r\n"))
	}
	c.conn.Close()
	if c.timer != nil {
		c.timer.Stop()
	}
	h := &c.s.sse
	h.mu.Lock()
	delete(h.subs, c)
	h.mu.Unlock()
	c.s.live.Add(-1)
}
