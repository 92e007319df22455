package server

import (
	"bytes"
	"io"
	"net/http"
	"runtime"
	"strconv"

	"github.com/ursula-go/ursula/streamcore"
)

// handleBootstrap answers GET /{b}/{s}/bootstrap: the latest snapshot and the updates after
// it as multipart/mixed.
func (s *Server) handleBootstrap(w http.ResponseWriter, r *http.Request, t *target) {
	if r.URL.Query().Has("live") {
		s.writeError(w, r, streamcore.Errorf(http.StatusBadRequest, streamcore.CodeInvalidQuery, "bootstrap has no live mode"))
		return
	}
	inc, e := parseIncarnation(r)
	if e != nil {
		s.writeError(w, r, e)
		return
	}
	// Take the snapshot point first, then read from it.
	head, e := s.look(t, streamcore.ReadOffset{Now: true}, 0, inc)
	if e != nil {
		s.writeError(w, r, e)
		return
	}
	from := head.retained
	if head.snap != nil {
		from = head.snap.Offset
	}
	v, e := s.look(t, streamcore.ReadOffset{Pos: from}, streamcore.MaxReadBytes, inc)
	defer s.done(v)
	if e != nil {
		s.writeError(w, r, e)
		return
	}
	s.renew(r.Context(), t, v)
	defer runtime.KeepAlive(v)
	updates := flatten(v.data)
	json := v.isJSON()
	if v.end < v.tail {
		if json {
			// Stop at the last boundary within the cap, but always send one message.
			if i := bytes.LastIndexByte(updates, '\n'); i >= 0 {
				updates = updates[:i+1]
			} else {
				rest := v.tail - v.start
				_ = rest
				updates = nil
			}
		} else {
			updates = nil
		}
	}
	if json && len(updates) == 0 && v.end < v.tail {
		// A single message larger than the cap: read just that message.
		full, _ := s.look(t, streamcore.ReadOffset{Pos: from}, streamcore.MaxRequestBytes, inc)
		defer s.done(full)
		if full != nil {
			all := flatten(full.data)
			if i := bytes.IndexByte(all, '\n'); i >= 0 {
				updates = all[:i+1]
			}
			defer runtime.KeepAlive(full)
		}
	}
	p := v.start + uint64(len(updates))
	boundary := streamcore.NewBoundary()
	h := w.Header()
	h.Set("Content-Type", "multipart/mixed; boundary="+boundary)
	snapOff := "-1"
	var first streamcore.Part
	first.ContentType = streamcore.DefaultContentType
	if v.snap != nil {
		snapOff = streamcore.FormatOffset(v.snap.Offset)
		first = streamcore.Part{ContentType: v.snap.ContentType, Body: v.snap.Body}
	}
	h.Set(streamcore.HdrSnapshotOffset, snapOff)
	h.Set(streamcore.HdrStreamNextOff, streamcore.FormatOffset(p))
	h.Set(streamcore.HdrIncarnation, u64(v.inc))
	if p == v.tail {
		h.Set(streamcore.HdrStreamUpToDate, "true")
		if v.closed {
			h.Set(streamcore.HdrStreamClosed, "true")
		}
	}
	var coldSnap io.ReadCloser // a snapshot body in the cold store, streamed into the first part
	if v.snap != nil && v.snap.ColdKey != "" {
		s.cold.Pin(v.snap.ColdKey)
		defer s.cold.Unpin(v.snap.ColdKey)
		rc, e := s.cold.OpenSnapshot(r.Context(), v.snap, 0, int64(v.snap.Size))
		if e != nil {
			s.writeError(w, r, e)
			return
		}
		defer rc.Close()
		coldSnap = rc
	}
	body := streamcore.AppendMultipartPart(nil, boundary, first)
	coldAt := len(body) - 2 // before the first part's closing CRLF
	if len(updates) > 0 {
		if json {
			for len(updates) > 0 {
				i := bytes.IndexByte(updates, '\n')
				body = streamcore.AppendMultipartPart(body, boundary, streamcore.Part{ContentType: "application/json", Body: updates[:i+1]})
				updates = updates[i+1:]
			}
		} else {
			body = streamcore.AppendMultipartPart(body, boundary, streamcore.Part{ContentType: v.ct, Body: updates})
		}
	}
	body = streamcore.AppendMultipartEnd(body, boundary)
	if coldSnap != nil {
		h.Set("Content-Length", strconv.Itoa(len(body)+int(v.snap.Size)))
		w.WriteHeader(http.StatusOK)
		w.Write(body[:coldAt])
		io.Copy(w, coldSnap)
		w.Write(body[coldAt:])
		return
	}
	h.Set("Content-Length", strconv.Itoa(len(body)))
	w.WriteHeader(http.StatusOK)
	w.Write(body)
}
