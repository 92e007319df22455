package server

import (
	"bytes"
	"io"
	"net/http"
	"runtime"
	"strconv"
	"strings"

	"github.com/ursula-go/ursula/streamcore"
)

// handleBootstrap answers GET /{b}/{s}/bootstrap: the latest snapshot and the updates after
// it as multipart/mixed (checklist 25).
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
		s.cold.pin(v.snap.ColdKey)
		defer s.cold.unpin(v.snap.ColdKey)
		rc, e := s.openColdSnapshot(r.Context(), v.snap)
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

// handleReadSnapshot answers GET /{b}/{s}/snapshot/{offset} and, with immutable set, the
// snapshot resource under /incarnation/{token}/snapshot/{offset}.
func (s *Server) handleReadSnapshot(w http.ResponseWriter, r *http.Request, t *target, offText string, immutable bool) {
	off, err := streamcore.ParseOffset(offText)
	if err != nil {
		code := streamcore.CodeInvalidOffset
		if immutable {
			code = streamcore.CodeInvalidResource
		}
		s.writeError(w, r, streamcore.Errorf(http.StatusBadRequest, code, "%s", err.Error()))
		return
	}
	var inc uint64
	if !immutable {
		var e *streamcore.Error
		if inc, e = parseIncarnation(r); e != nil {
			s.writeError(w, r, e)
			return
		}
	}
	v, e := s.look(t, streamcore.ReadOffset{Now: true}, 0, 0)
	if e != nil {
		s.writeError(w, r, e)
		return
	}
	s.serveSnapshot(w, r, t, v, off, inc, immutable)
}

func (s *Server) serveSnapshot(w http.ResponseWriter, r *http.Request, t *target, v *view, off, inc uint64, immutable bool) {
	sn := v.snap
	if sn == nil || sn.Offset != off {
		s.writeError(w, r, streamcore.Errorf(http.StatusNotFound, streamcore.CodeSnapshotNotFound, "no snapshot at this offset is the latest").
			With(streamcore.HdrIncarnation, u64(v.inc)))
		return
	}
	h := w.Header()
	size := sn.BodySize()
	lo, hi, ranged, unsat := parseRange(r, size)
	if unsat {
		h.Set("Content-Range", "bytes */"+u64(size))
		s.writeError(w, r, streamcore.Errorf(http.StatusRequestedRangeNotSatisfiable, streamcore.CodeRangeNotSatisfiable, "range start is beyond the snapshot size").
			With(streamcore.HdrIncarnation, u64(v.inc)))
		return
	}
	if inc != 0 && inc != v.inc {
		s.writeError(w, r, streamcore.Errorf(http.StatusPreconditionFailed, streamcore.CodeIncarnationMismatch, "Stream-Incarnation does not match").
			With(streamcore.HdrIncarnation, u64(v.inc)))
		return
	}
	s.renew(r.Context(), t, v)
	etag := `"` + sn.Digest + `"`
	h.Set("Content-Type", sn.ContentType)
	h.Set(streamcore.HdrSnapshotOffset, streamcore.FormatOffset(sn.Offset))
	h.Set(streamcore.HdrSnapshotDigest, sn.Digest)
	h.Set(streamcore.HdrStreamNextOff, streamcore.FormatOffset(sn.Offset))
	h.Set(streamcore.HdrIncarnation, u64(v.inc))
	h.Set("ETag", etag)
	h.Set("Accept-Ranges", "bytes")
	if immutable {
		h.Set(streamcore.HdrImmutable, "true")
	} else if sn.Offset == v.tail {
		h.Set(streamcore.HdrStreamUpToDate, "true")
	}
	if etagMatches(r, etag) {
		w.WriteHeader(http.StatusNotModified)
		return
	}
	if sn.ColdKey != "" {
		status, from, n := http.StatusOK, uint64(0), size
		if ranged {
			h.Set("Content-Range", "bytes "+u64(lo)+"-"+u64(hi)+"/"+u64(size))
			status, from, n = http.StatusPartialContent, lo, hi-lo+1
		}
		s.writeColdSnapshot(w, r, sn, status, from, n)
		return
	}
	body := sn.Body
	status := http.StatusOK
	if ranged {
		body = body[lo : hi+1]
		h.Set("Content-Range", "bytes "+u64(lo)+"-"+u64(hi)+"/"+u64(size))
		status = http.StatusPartialContent
	}
	h.Set("Content-Length", strconv.Itoa(len(body)))
	w.WriteHeader(status)
	if r.Method != http.MethodHead {
		w.Write(body)
	}
}

// parseRange reads one byte range (checklist 23.5-23.7). Anything but a single valid range
// (or any If-Range) means the whole body.
func parseRange(r *http.Request, size uint64) (lo, hi uint64, ranged, unsat bool) {
	rh := r.Header.Get("Range")
	if rh == "" || r.Header.Get("If-Range") != "" || r.Header.Get("If-None-Match") != "" {
		return 0, 0, false, false
	}
	spec, ok := strings.CutPrefix(strings.TrimSpace(rh), "bytes=")
	if !ok || strings.Contains(spec, ",") {
		return 0, 0, false, false
	}
	a, b, ok := strings.Cut(strings.TrimSpace(spec), "-")
	if !ok {
		return 0, 0, false, false
	}
	if a == "" {
		n, err := strconv.ParseUint(b, 10, 64)
		if err != nil || n == 0 {
			return 0, 0, false, false
		}
		if size == 0 {
			return 0, 0, false, true
		}
		n = min(n, size)
		return size - n, size - 1, true, false
	}
	start, err := strconv.ParseUint(a, 10, 64)
	if err != nil {
		return 0, 0, false, false
	}
	end := size - 1
	if b != "" {
		e, err := strconv.ParseUint(b, 10, 64)
		if err != nil || e < start {
			return 0, 0, false, false
		}
		end = min(e, size-1)
	}
	if start >= size {
		return 0, 0, false, true
	}
	return start, end, true, false
}

// handleImmutable answers the immutable resources of checklist 26.
func (s *Server) handleImmutable(w http.ResponseWriter, r *http.Request, t *target, token, kind, offText string) {
	if r.URL.RawQuery != "" || strings.HasSuffix(r.RequestURI, "?") {
		s.writeError(w, r, streamcore.Errorf(http.StatusBadRequest, streamcore.CodeQueryNotAccepted, "immutable resources take no query string"))
		return
	}
	inc, ok := parseSafeInt(token)
	if !ok || inc < 1<<52 {
		s.writeError(w, r, streamcore.Errorf(http.StatusBadRequest, streamcore.CodeInvalidResource, "incarnation token is not one this server issues"))
		return
	}
	if kind == "snapshot" {
		off, err := streamcore.ParseOffset(offText)
		if err != nil {
			s.writeError(w, r, streamcore.Errorf(http.StatusBadRequest, streamcore.CodeInvalidResource, "%s", err.Error()))
			return
		}
		v, e := s.look(t, streamcore.ReadOffset{Now: true}, 0, 0)
		if e != nil {
			s.writeError(w, r, e)
			return
		}
		s.serveSnapshot(w, r, t, v, off, inc, true)
		return
	}
	off, err := streamcore.ParseOffset(offText)
	if err != nil {
		s.writeError(w, r, streamcore.Errorf(http.StatusBadRequest, streamcore.CodeInvalidResource, "%s", err.Error()))
		return
	}
	chunkEnd := (off/streamcore.ChunkGrid + 1) * streamcore.ChunkGrid
	v, e := s.look(t, streamcore.ReadOffset{Pos: off}, chunkEnd-off, inc)
	if e != nil {
		s.writeError(w, r, e)
		return
	}
	defer runtime.KeepAlive(v)
	s.renew(r.Context(), t, v)
	h := w.Header()
	kindTag := "o"
	switch {
	case v.end < v.tail:
		kindTag = "b"
	case v.closed:
		kindTag = "c"
	}
	etag := `"i` + u64(v.inc) + ":" + u64(v.start) + ":" + u64(v.end) + ":" + kindTag + `"`
	h.Set("Content-Type", streamcore.ReadContentType(v.ct))
	h.Set(streamcore.HdrIncarnation, u64(v.inc))
	h.Set(streamcore.HdrStreamOffset, streamcore.FormatOffset(v.start))
	h.Set(streamcore.HdrStreamNextOff, streamcore.FormatOffset(v.end))
	if v.closed && v.end == v.tail {
		h.Set(streamcore.HdrStreamClosed, "true")
	}
	if v.end == chunkEnd && chunkEnd < v.tail || v.closed && v.end == v.tail {
		h.Set(streamcore.HdrImmutable, "true")
	}
	h.Set("ETag", etag)
	if etagMatches(r, etag) {
		w.WriteHeader(http.StatusNotModified)
		return
	}
	h.Set("Content-Length", u64(v.end-v.start))
	w.WriteHeader(http.StatusOK)
	if r.Method != http.MethodHead {
		for _, p := range v.data {
			w.Write(p)
		}
	}
}
