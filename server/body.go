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

// readBody reads the request body under the 32 MiB limit and the node's body budget. The
// bytes stay charged until the request ends (the handler holds the body that long).
func (s *Server) readBody(w http.ResponseWriter, r *http.Request) ([]byte, *streamcore.Error) {
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
		buf := make([]byte, r.ContentLength)
		_, err := io.ReadFull(r.Body, buf)
		if err == nil {
			var one [1]byte
			if n, _ := r.Body.Read(one[:]); n > 0 {
				err = errors.New("body longer than Content-Length")
			}
		}
		if err != nil {
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
		n, err := io.ReadFull(r.Body, c[:])
		total += int64(n)
		if total > streamcore.MaxRequestBytes {
			release()
			return nil, tooLarge(false)
		}
		if err == io.EOF || err == io.ErrUnexpectedEOF {
			break
		}
		if err != nil {
			release()
			return nil, bodyReadError(err)
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
type pacedBody struct {
	body    io.ReadCloser
	rc      *http.ResponseController
	idle    time.Duration
	minRate int64
	start   time.Time
	read    int64
	done    bool
	onEOF   func()
}

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
	p.rc.SetReadDeadline(deadline)
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
	if p.onEOF != nil {
		p.onEOF()
	}
}

func (p *pacedBody) Close() error { return p.body.Close() }
