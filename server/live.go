package server

// Live reads: long-poll and SSE, and the cursors that keep caches from collapsing them.

import (
	"errors"
	"net/http"
	"runtime"
	"strconv"
	"time"

	"github.com/ursula-go/ursula/auth"
	"github.com/ursula-go/ursula/streamcore"
)

// cursorEpoch is 2024-10-09T00:00:00Z; cursors count 20-second intervals from it.
var cursorEpoch = time.Date(2024, 10, 9, 0, 0, 0, 0, time.UTC)

// nextCursor computes Stream-Cursor.
func (s *Server) nextCursor(client string) string {
	cur := int64(s.clock().Sub(cursorEpoch) / (20 * time.Second))
	if c, err := strconv.ParseInt(client, 10, 64); err == nil && c >= cur {
		jitter := 1 + randIntn(3600)
		step := int64((jitter + 19) / 20)
		return strconv.FormatInt(c+max(1, step), 10)
	}
	return strconv.FormatInt(cur, 10)
}

func (s *Server) liveSlot(w http.ResponseWriter, r *http.Request) bool {
	if n := s.live.Add(1); s.cfg.MaxLiveReaders > 0 && n > int64(s.cfg.MaxLiveReaders) {
		s.live.Add(-1)
		e := streamcore.Errorf(http.StatusServiceUnavailable, streamcore.CodeLiveReadBackpressure, "too many live readers on this node").
			With(streamcore.HdrRetryAfter, "1")
		s.writeError(w, r, e)
		return false
	}
	// Live answers wait as long as the client asked: no whole-response write deadline
	// (SSE bounds each write instead, see sseWrite).
	http.NewResponseController(w).SetWriteDeadline(time.Time{})
	return true
}

// sseWrite writes and flushes one piece of an event stream within LiveWriteTimeout, so a
// reader that stopped reading is dropped once its socket buffers stay full that long.
func (s *Server) sseWrite(rc *http.ResponseController, w http.ResponseWriter, b []byte) error {
	rc.SetWriteDeadline(time.Now().Add(s.cfg.Limits.LiveWriteTimeout))
	if _, err := w.Write(b); err != nil {
		return err
	}
	if err := rc.Flush(); err != nil && !errors.Is(err, http.ErrNotSupported) {
		return err
	}
	return nil
}

func (s *Server) longPoll(w http.ResponseWriter, r *http.Request, t *target, rq *readQuery, inc uint64) {
	if !s.liveSlot(w, r) {
		return
	}
	defer s.live.Add(-1)
	deadline := time.NewTimer(rq.timeout)
	defer deadline.Stop()
	off := rq.off
	var firstInc uint64
	for i := 0; ; i++ {
		ch := s.engine.Watch(t.key)
		v, e := s.lookShort(t, off, rq.maxBytes, inc)
		if e == nil && i > 0 && v.inc != firstInc {
			// Recreated while waiting: the old stream is gone.
			if inc != 0 {
				e = streamcore.Errorf(http.StatusPreconditionFailed, streamcore.CodeIncarnationMismatch, "stream was recreated").With(streamcore.HdrIncarnation, u64(v.inc))
			} else if off.Pos > v.tail {
				e = streamcore.Errorf(http.StatusRequestedRangeNotSatisfiable, streamcore.CodeOffsetOutOfRange, "stream was recreated").
					With(streamcore.HdrStreamNextOff, streamcore.FormatOffset(v.tail)).With(streamcore.HdrIncarnation, u64(v.inc))
			}
		}
		if e != nil {
			s.done(v)
			s.writeError(w, r, e)
			return
		}
		if i == 0 {
			firstInc = v.inc
			s.renew(r.Context(), t, v)
			if off.Now {
				off = streamcore.ReadOffset{Pos: v.start}
			}
		}
		if v.end > v.start {
			s.writeData(w, r, v, false, s.cursorIfOpen(v, rq))
			s.done(v)
			return
		}
		if v.closed {
			s.noContent(w, v, "")
			return
		}
		select {
		case <-ch:
		case <-deadline.C:
			s.noContent(w, v, s.nextCursor(rq.cursor))
			return
		case <-r.Context().Done():
			return
		}
	}
}

func (s *Server) cursorIfOpen(v *view, rq *readQuery) string {
	if v.closed && v.end == v.tail {
		return ""
	}
	return s.nextCursor(rq.cursor)
}

// noContent is the long-poll 204: timeout, or closed at the tail.
func (s *Server) noContent(w http.ResponseWriter, v *view, cursor string) {
	h := w.Header()
	h.Set(streamcore.HdrStreamNextOff, streamcore.FormatOffset(v.start))
	h.Set(streamcore.HdrStreamUpToDate, "true")
	h.Set(streamcore.HdrIncarnation, u64(v.inc))
	if v.closed {
		h.Set(streamcore.HdrStreamClosed, "true")
	}
	if cursor != "" {
		h.Set(streamcore.HdrStreamCursor, cursor)
	}
	w.WriteHeader(http.StatusNoContent)
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
	defer s.live.Add(-1)
	s.renew(r.Context(), t, v)
	b64 := !streamcore.IsText(v.ct)
	json := v.isJSON()
	maxBytes := rq.maxBytes
	if !b64 && maxBytes < 4 {
		maxBytes = 4
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
	if b64 {
		h.Set(streamcore.HdrSSEEncoding, "base64")
	}
	w.WriteHeader(http.StatusOK)
	rc := http.NewResponseController(w)
	keepAlive := time.NewTicker(s.cfg.Limits.SSEKeepAlive)
	defer keepAlive.Stop()
	firstInc := v.inc
	off := streamcore.ReadOffset{Pos: v.start}
	var buf []byte
	var idle <-chan time.Time
	if s.cfg.SSEMaxIdle > 0 {
		tm := time.NewTimer(s.cfg.SSEMaxIdle)
		defer tm.Stop()
		idle = tm.C
	}
	// A subscription does not outlive its credential: at the token's exp it ends with a
	// frame that tells expiry apart from the end of the stream.
	var expired <-chan time.Time
	if p := auth.FromContext(r.Context()); p != nil && !p.Expires.IsZero() {
		tm := time.NewTimer(time.Until(p.Expires))
		defer tm.Stop()
		expired = tm.C
	}
	sentInitial := false
	for {
		select {
		case <-expired: // also while data keeps arriving
			s.sseWrite(rc, w, []byte(sseCredentialExpired))
			return
		default:
		}
		ch := s.engine.Watch(t.key)
		v, e = s.lookShort(t, off, maxBytes, 0)
		if e == nil && v.inc != firstInc {
			e = streamcore.Errorf(http.StatusNotFound, streamcore.CodeStreamNotFound, "stream was deleted or recreated")
		}
		if e != nil {
			s.done(v)
			buf = streamcore.AppendSSEError(buf[:0], e)
			s.sseWrite(rc, w, buf)
			return
		}
		if !b64 && !v.jsonArray {
			trimText(v, json)
		}
		if v.end > v.start {
			payload := flatten(v.data)
			if v.jsonArray {
				payload = jsonArrayOf(v.data)
			}
			buf = buf[:0]
			buf = streamcore.AppendSSEData(buf, payload, b64)
			buf = streamcore.AppendSSEControl(buf, s.control(v, rq))
			err := s.sseWrite(rc, w, buf)
			runtime.KeepAlive(v)
			s.done(v)
			if err != nil {
				return
			}
			s.metrics.readBytes.Add(v.end - v.start)
			off = streamcore.ReadOffset{Pos: v.end}
			sentInitial = true
			if v.closed && v.end == v.tail {
				return
			}
			continue
		}
		if v.closed || !sentInitial {
			buf = streamcore.AppendSSEControl(buf[:0], s.control(v, rq))
			if s.sseWrite(rc, w, buf) != nil {
				return
			}
			sentInitial = true
			if v.closed {
				return
			}
		}
	wait:
		select {
		case <-ch:
		case <-keepAlive.C:
			// A comment line: clients ignore it; a reader that is gone or stopped reading
			// shows up as a failed write.
			if s.sseWrite(rc, w, []byte(":\n\n")) != nil {
				return
			}
			goto wait
		case <-idle:
			return
		case <-expired:
			s.sseWrite(rc, w, []byte(sseCredentialExpired))
			return
		case <-r.Context().Done():
			return
		}
	}
}

// sseCredentialExpired is the last frame of a subscription whose credential expired.
const sseCredentialExpired = "event: credential-expired\ndata: {}\n\n"

func (s *Server) control(v *view, rq *readQuery) streamcore.SSEControl {
	c := streamcore.SSEControl{StreamNextOffset: streamcore.FormatOffset(v.end)}
	atTail := v.end == v.tail
	if atTail {
		c.UpToDate = true
	}
	if v.closed && atTail {
		c.StreamClosed = true
	} else {
		c.StreamCursor = s.nextCursor(rq.cursor)
	}
	return c
}
