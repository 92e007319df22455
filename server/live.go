package server

// Live reads: long-poll and SSE, and the cursors that keep caches from collapsing them.

import (
	"errors"
	"net/http"
	"strconv"
	"time"

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
