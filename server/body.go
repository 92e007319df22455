package server

// Request bodies: read as they arrive, into pooled chunks, within a node-wide budget of
// body bytes in flight, from a sender that keeps a minimum pace. A declared
// Content-Length reserves nothing: 300 clients that announce 32 MiB and send a few bytes
// hold a few chunks, not 9 GiB.

import (
	"errors"
	"io"
	"net/http"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ursula-go/ursula/streamcore"
)

// CodeIngressBodyLimit refuses a write whose body does not fit in what is left of the
// node's in-flight body budget; nothing of it was proposed.
const CodeIngressBodyLimit = "INGRESS_BODY_BYTES_LIMIT_REACHED"

// bodyChunk is the unit bodies are read in and charged to the budget by.
const bodyChunk = 64 << 10

// bodyBudget counts the request body bytes the node holds, against a limit.
type bodyBudget struct {
	limit  int64
	used   atomic.Int64
	chunks sync.Pool // *[bodyChunk]byte
}

func newBodyBudget(limit int64) *bodyBudget {
	b := &bodyBudget{limit: limit}
	b.chunks.New = func() any { return new([bodyChunk]byte) }
	return b
}

// take charges n bytes, or reports that they do not fit.
func (b *bodyBudget) take(n int64) bool {
	if b.used.Add(n) > b.limit {
		b.used.Add(-n)
		return false
	}
	return true
}

func (b *bodyBudget) give(n int64) { b.used.Add(-n) }

func ingressRefusal() *streamcore.Error {
	return streamcore.Errorf(http.StatusServiceUnavailable, CodeIngressBodyLimit, "the node holds as many request body bytes in flight as it admits").
		With(streamcore.HdrRetryAfter, "1").
		With(streamcore.HdrNotApplied, "IngressBodyBytesLimitReached")
}

func bodyTooSlow() *streamcore.Error {
	return streamcore.Errorf(http.StatusRequestTimeout, streamcore.CodeBodyTooSlow, "the request body arrived too slowly").
		With(streamcore.HdrNotApplied, "BodyTooSlow").With("Connection", "close")
}

// Scratch bodies: a handler whose engine copies the body before the proposal returns (an
// append: the memory engine copies it into the stream's buffer, a replicated engine into
// its log entry) reads a body up to bodyChunk into a pooled buffer, returned when the
// request ends, instead of a fresh zeroed allocation for every request.
const (
	scratchMinShift = 12 // the smallest class, 4 KiB
	scratchClasses  = 5  // 4, 8, 16, 32, 64 KiB (bodyChunk)
)

type scratchBody struct {
	class int
	buf   []byte
}

var scratchPools [scratchClasses]sync.Pool

// getScratch returns a pooled buffer of length n (n <= bodyChunk).
func getScratch(n int) *scratchBody {
	class := 0
	for n > 1<<(scratchMinShift+class) {
		class++
	}
	if v := scratchPools[class].Get(); v != nil {
		sb := v.(*scratchBody)
		sb.buf = sb.buf[:n]
		return sb
	}
	return &scratchBody{class: class, buf: make([]byte, n, 1<<(scratchMinShift+class))}
}

func putScratch(sb *scratchBody) { scratchPools[sb.class].Put(sb) }

// readBody reads the request body under the 32 MiB limit and the node's body budget. The
// bytes stay charged until the request ends (the handler holds the body that long).
func (s *Server) readBody(w http.ResponseWriter, r *http.Request) ([]byte, *streamcore.Error) {
	return s.readBodyAs(w, r, false)
}

// readScratchBody is readBody for a handler that keeps no reference to the body once it
// returns (nor does anything it hands the body to): a body up to bodyChunk is read into a
// pooled buffer that goes back to its pool when the request ends.
func (s *Server) readScratchBody(w http.ResponseWriter, r *http.Request) ([]byte, *streamcore.Error) {
	return s.readBodyAs(w, r, true)
}

func (s *Server) readBodyAs(w http.ResponseWriter, r *http.Request, scratch bool) ([]byte, *streamcore.Error) {
	if e := s.admitWrite(); e != nil {
		return nil, e
	}
	if r.ContentLength > streamcore.MaxRequestBytes {
		return nil, tooLarge(true)
	}
	if r.ContentLength == 0 {
		return nil, nil
	}
	b := s.bodies
	// A declared length that cannot fit even in an idle node's budget, or in what is left
	// now, is refused before a byte is read: waiting for it would only hold the budget.
	if r.ContentLength > 0 && r.ContentLength > b.limit-b.used.Load() {
		return nil, ingressRefusal()
	}
	var charged int64
	keep := func(n int64) {
		if sw, ok := w.(*statusWriter); ok {
			sw.bodyCharge += n
		} else {
			b.give(n) // not under ServeHTTP: nothing releases it later
		}
	}
	if r.ContentLength > 0 && r.ContentLength <= bodyChunk {
		// Small declared body: one exact allocation, charged before it is filled.
		if !b.take(r.ContentLength) {
			return nil, ingressRefusal()
		}
		sw, _ := w.(*statusWriter)
		var buf []byte
		if scratch && sw != nil && sw.scratch == nil {
			sw.scratch = getScratch(int(r.ContentLength)) // ServeHTTP returns it
			buf = sw.scratch.buf
		} else {
			buf = make([]byte, r.ContentLength)
		}
		if err := readExact(r.Body, buf); err != nil {
			b.give(r.ContentLength)
			return nil, bodyReadError(err)
		}
		keep(r.ContentLength)
		return buf, nil
	}
	var chunks []*[bodyChunk]byte
	release := func() {
		for _, c := range chunks {
			b.chunks.Put(c)
		}
		b.give(charged)
	}
	var total int64
	for {
		if !b.take(bodyChunk) {
			release()
			return nil, ingressRefusal()
		}
		charged += bodyChunk
		c := b.chunks.Get().(*[bodyChunk]byte)
		chunks = append(chunks, c)
		n, err := FillBody(r.Body, c[:])
		total += int64(n)
		if total > streamcore.MaxRequestBytes {
			release()
			return nil, tooLarge(false)
		}
		if err == io.EOF {
			if r.ContentLength > 0 && total != r.ContentLength {
				release()
				return nil, bodyReadError(io.ErrUnexpectedEOF)
			}
			break
		}
		if err != nil {
			release()
			return nil, bodyReadError(err)
		}
		if l := r.ContentLength; l > 0 && total*2 >= l && total < l {
			// Half of a declared length has arrived: the rest goes straight into one
			// exact buffer, which saves assembling that half from chunks. Memory is
			// reserved for a declared length only once half of it came.
			return s.finishExact(w, r, chunks, total, release, keep)
		}
	}
	out := make([]byte, total)
	for i, c := range chunks {
		copy(out[i*bodyChunk:], c[:])
	}
	release()
	// The assembled body is charged in place of the chunks; it is never more than them.
	b.used.Add(total)
	keep(total)
	return out, nil
}

// FillBody reads into p until it is full or the body ends. Unlike io.ReadFull it keeps the
// body's own end apart from a cut: io.EOF is the end of the body (with n possibly short
// of len(p)); a body cut before its declared length or its last chunk comes as the
// reader's io.ErrUnexpectedEOF, which must fail the request, not end the body there.
func FillBody(body io.Reader, p []byte) (int, error) {
	n := 0
	for n < len(p) {
		k, err := body.Read(p[n:])
		n += k
		if err != nil {
			return n, err
		}
	}
	return n, nil
}

// finishExact reads the rest of a body of declared length r.ContentLength, of which the
// chunks hold the first total bytes, into one buffer of that length; release gives the
// chunks and their charge back.
func (s *Server) finishExact(w http.ResponseWriter, r *http.Request, chunks []*[bodyChunk]byte, total int64, release func(), keep func(int64)) ([]byte, *streamcore.Error) {
	b := s.bodies
	l := r.ContentLength
	if !b.take(l) {
		release()
		return nil, ingressRefusal()
	}
	// Room around the body: an engine that encodes the append into a log entry writes the
	// entry around it instead of copying it (streamcore.AppendCommandAround).
	frame, out := streamcore.NewBodyFrame(int(l))
	if sw, ok := w.(*statusWriter); ok {
		sw.bodyFrame = frame
	}
	for i, c := range chunks {
		copy(out[i*bodyChunk:total], c[:])
	}
	release()
	if err := readExact(r.Body, out[total:]); err != nil {
		b.give(l)
		return nil, bodyReadError(err)
	}
	keep(l)
	return out, nil
}

// bodyFrameOf returns the frame the request's large body was read into (nil if none): an
// engine that encodes the command into a log entry writes the entry around the body in it.
func bodyFrameOf(w http.ResponseWriter) []byte {
	if sw, ok := w.(*statusWriter); ok {
		return sw.bodyFrame
	}
	return nil
}

// readExact fills buf with the rest of a body of declared length (one ReadFull: the bytes
// come in as few reads as the connection has them) and checks that nothing follows.
func readExact(body io.Reader, buf []byte) error {
	if _, err := io.ReadFull(body, buf); err != nil {
		return err
	}
	var one [1]byte
	if n, _ := body.Read(one[:]); n > 0 {
		return errors.New("body longer than Content-Length")
	}
	return nil
}

func bodyReadError(err error) *streamcore.Error {
	if errors.Is(err, errBodyTooSlow) {
		return bodyTooSlow()
	}
	return streamcore.Errorf(http.StatusBadRequest, streamcore.CodeBodyUnreadable, "request body could not be read")
}

func drainBody(r *http.Request) {
	io.Copy(io.Discard, io.LimitReader(r.Body, streamcore.MaxRequestBytes))
}

var errBodyTooSlow = errors.New("request body too slow")

// pacedBody holds a sender to a pace: each read must bring bytes within idle, and after
// the first idle period the body must average at least minRate bytes a second. It moves
// the connection's read deadline, so it ends with the deadline cleared: Go's server keeps
// reading the connection in the background after the body, and a deadline left there
// would cancel the request.
//
// Moving a deadline is not free (a runtime timer update), and a body usually comes in a
// few reads a few microseconds apart. So a read keeps the deadline already set when the
// exact one is later by less than deadlineSlack of the idle period: the deadline in force
// is never later than the exact one, and at most idle/64 earlier (156 ms of 10 s).
type pacedBody struct {
	body    io.ReadCloser
	rc      *http.ResponseController
	idle    time.Duration
	minRate int64
	start   time.Time
	read    int64
	done    bool
	set     time.Time // the read deadline in force (zero: none set yet)
	// writeTimeout, when not zero, restarts the response's write deadline once the body
	// has arrived (paceRequest set it from start).
	writeTimeout time.Duration
}

// deadlineSlack is the fraction of the idle period (1/64) by which a deadline already in
// force may precede the exact one before it is moved.
const deadlineSlack = 64

func (p *pacedBody) Read(b []byte) (int, error) {
	if p.done {
		return p.body.Read(b)
	}
	now := time.Now()
	deadline := now.Add(p.idle)
	if p.minRate > 0 {
		// The latest moment at which the bytes read so far plus this read still meet the
		// rate, never earlier than one idle period from the start.
		byRate := p.start.Add(p.idle + time.Duration((p.read+1)*int64(time.Second)/p.minRate))
		if byRate.Before(deadline) {
			deadline = byRate
		}
		if !deadline.After(now) {
			p.finish(false)
			return 0, errBodyTooSlow
		}
	}
	// The exact deadline never moves back (now and the bytes read only grow).
	if p.set.IsZero() || deadline.Sub(p.set) >= p.idle/deadlineSlack {
		p.rc.SetReadDeadline(deadline)
		p.set = deadline
	}
	n, err := p.body.Read(b)
	p.read += int64(n)
	if err != nil {
		slow := errors.Is(err, os.ErrDeadlineExceeded)
		p.finish(!slow)
		if slow {
			return n, errBodyTooSlow
		}
	}
	return n, err
}

// finish ends the pacing. A body that arrived clears the deadline; a sender that fell
// behind keeps an expired one, so whatever reads the connection next (Go's server
// discarding the rest) fails at once instead of waiting on the sender.
func (p *pacedBody) finish(arrived bool) {
	if p.done {
		return
	}
	p.done = true
	if !arrived {
		p.rc.SetReadDeadline(time.Unix(1, 0))
		return
	}
	p.rc.SetReadDeadline(time.Time{})
	if p.writeTimeout > 0 {
		// The write deadline set at the start stays when the body came quickly: it is
		// then earlier than a restarted one by less than the same slack.
		if now := time.Now(); now.Sub(p.start) >= p.writeTimeout/deadlineSlack {
			p.rc.SetWriteDeadline(now.Add(p.writeTimeout))
		}
	}
}

func (p *pacedBody) Close() error { return p.body.Close() }
