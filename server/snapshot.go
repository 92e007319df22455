package server

import (
	"io"
	"net/http"
	"strconv"
	"strings"

	"github.com/ursula-go/ursula/coldtier"
	"github.com/ursula-go/ursula/streamcore"
)

// SnapshotDigest is the digest of a snapshot: lowercase hex BLAKE3 of
// (u64 little-endian len(content type) || content type || body).
func SnapshotDigest(contentType string, body []byte) string {
	return streamcore.SnapshotDigestOf(contentType, body)
}

func (s *Server) handlePublishSnapshot(w http.ResponseWriter, r *http.Request, t *target, offText string) {
	if r.Header.Get(streamcore.HdrSnapshotMatch) != "" {
		s.writeError(w, r, badHeader("Stream-Snapshot-Match was removed"))
		return
	}
	off, err := streamcore.ParseOffset(offText)
	if err != nil {
		s.writeError(w, r, streamcore.Errorf(http.StatusBadRequest, streamcore.CodeInvalidOffset, "%s", err.Error()))
		return
	}
	inc, e := parseIncarnation(r)
	if e != nil {
		s.writeError(w, r, e)
		return
	}
	ct := streamcore.DefaultContentType
	if raw := r.Header.Get("Content-Type"); raw != "" {
		n, ok := streamcore.NormalizeContentType(raw)
		if !ok {
			s.writeError(w, r, streamcore.Errorf(http.StatusBadRequest, streamcore.CodeInvalidSnapshot, "snapshot Content-Type is not a valid media type"))
			return
		}
		ct = n
	}
	if len(r.Header.Values(streamcore.HdrSnapshotParts)) > 0 {
		s.handleCommitParts(w, r, t, off, inc, ct)
		return
	}
	body, e := s.readBody(w, r)
	if e != nil {
		s.writeError(w, r, e)
		return
	}
	c := &streamcore.Command{
		Op: streamcore.OpPublishSnapshot, Key: t.key, Now: s.now(), IfIncarnation: inc,
		Offset: off, SnapshotType: ct, SnapshotDigest: SnapshotDigest(ct, body), Body: body,
	}
	staged, e := s.cold.StageSnapshot(t.key, c) // big bodies go to the cold store first
	if e != nil {
		s.writeError(w, r, e)
		return
	}
	res, e := s.propose(r.Context(), c)
	s.cold.UnstageSnapshot(staged, res, e)
	if e != nil {
		s.writeError(w, r, e)
		return
	}
	s.writeResult(w, r, t, res)
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

// parseRange reads one byte range. Anything but a single valid range
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

// writeColdSnapshot writes the bytes [lo, lo+n) of a cold snapshot body as the answer,
// after opening the object (so a store failure is still a clean 502).
func (s *Server) writeColdSnapshot(w http.ResponseWriter, r *http.Request, sn *streamcore.Snapshot, status int, lo, n uint64) {
	if s.cold == nil { // a body stored by a node with a cold store
		s.writeError(w, r, coldtier.Unconfigured())
		return
	}
	s.cold.Pin(sn.ColdKey)
	defer s.cold.Unpin(sn.ColdKey)
	var rc io.ReadCloser
	if r.Method != http.MethodHead && n > 0 {
		var e *streamcore.Error
		if rc, e = s.cold.OpenSnapshot(r.Context(), sn, int64(lo), int64(n)); e != nil {
			s.writeError(w, r, e)
			return
		}
		defer rc.Close()
	}
	w.Header().Set("Content-Length", strconv.FormatUint(n, 10))
	w.WriteHeader(status)
	if rc != nil {
		io.Copy(w, rc)
	}
}
