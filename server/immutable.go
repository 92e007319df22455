package server

import (
	"encoding/binary"
	"encoding/hex"
	"net/http"
	"runtime"
	"strings"

	"github.com/ursula-go/ursula/internal/blake3seq"

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
	defer s.done(v)
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
	ct := streamcore.ReadContentType(v.ct)
	etag := chunkETag(v.inc, v.start, v.end, kindTag, ct, v.data)
	h.Set("Content-Type", ct)
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

// chunkETag is the strong validator of an immutable chunk: the incarnation token, the
// range, how the range ends (b: below the tail, o: at the open tail, c: at the closed
// tail), and a hash over the content type and the body, so that two answers under one
// ETag are byte-for-byte and type-for-type the same. A chunk marked immutable ends below
// the tail, so closing the stream later does not change its ETag.
func chunkETag(inc, start, end uint64, kind, contentType string, body [][]byte) string {
	var n [8]byte
	binary.LittleEndian.PutUint64(n[:], uint64(len(contentType)))
	sum := blake3seq.SumPieces(append([][]byte{n[:], []byte(contentType)}, body...)...)
	return `"i` + u64(inc) + ":" + u64(start) + ":" + u64(end) + ":" + kind + ":" + hex.EncodeToString(sum[:16]) + `"`
}
