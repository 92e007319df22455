package server

import (
	"net/http"
	"runtime"
	"strings"

	"github.com/ursula-go/ursula/streamcore"
)

// handleImmutable answers the immutable resources (an incarnation's chunks and snapshots, cacheable forever).
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
