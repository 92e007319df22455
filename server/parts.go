package server

import (
	"io"
	"net/http"
	"strconv"
	"strings"

	"github.com/ursula-go/ursula/streamcore"
)

// Snapshot upload in parts: stage a part, discard the staged parts, commit them as one
// snapshot. The parts live in the cold store; the tier keeps their ledger and assembles
// them (coldtier/parts.go).

// maxPartID is the longest part id a commit may list; maxCommitListSize bounds its body.
const (
	maxPartID         = 64
	maxCommitListSize = streamcore.MaxSnapshotParts * (maxPartID + 1)
)

func noColdStore() *streamcore.Error {
	return streamcore.Errorf(http.StatusNotImplemented, streamcore.CodeNoColdStore, "snapshot upload in parts needs a cold store; this server has none")
}

// partsRequest checks what a part or a discard needs before anything else: a well-formed
// Stream-Incarnation, a cold store, the stream's leader here, the stream and the
// precondition. It returns the stream's incarnation.
func (s *Server) partsRequest(r *http.Request, key string) (uint64, *streamcore.Error) {
	ifInc, e := parseIncarnation(r)
	if e != nil {
		return 0, e
	}
	if s.cold == nil {
		return 0, noColdStore() // staged parts live in the cold store
	}
	if e := s.confirmLeader(r.Context(), key); e != nil {
		return 0, e
	}
	return s.partsTarget(key, ifInc)
}

// partsTarget checks that the stream exists and matches the Stream-Incarnation
// precondition, and returns its incarnation.
func (s *Server) partsTarget(key string, ifInc uint64) (uint64, *streamcore.Error) {
	var inc uint64
	var e *streamcore.Error
	s.engine.View(key, s.now(), func(st *streamcore.State, str *streamcore.Stream) {
		switch {
		case str == nil || str.SoftDeleted:
			e = st.NotFound(key)
		case ifInc != 0 && ifInc != str.Incarnation:
			e = incarnationMismatch(str.Incarnation)
		default:
			inc = str.Incarnation
		}
	})
	return inc, e
}

func incarnationMismatch(inc uint64) *streamcore.Error {
	return streamcore.Errorf(http.StatusPreconditionFailed, streamcore.CodeIncarnationMismatch, "Stream-Incarnation does not match the stream's current incarnation").
		With(streamcore.HdrIncarnation, u64(inc))
}

// handleStagePart serves POST {stream}/snapshot/{offset}/parts.
func (s *Server) handleStagePart(w http.ResponseWriter, r *http.Request, t *target, offText string) {
	if _, err := streamcore.ParseOffset(offText); err != nil {
		s.writeError(w, r, streamcore.Errorf(http.StatusBadRequest, streamcore.CodeInvalidOffset, "%s", err.Error()))
		return
	}
	inc, e := s.partsRequest(r, t.key)
	if e == nil && r.ContentLength > streamcore.MaxRequestBytes {
		e = tooLarge(true)
	}
	reserve := r.ContentLength
	if reserve < 0 {
		reserve = streamcore.MaxRequestBytes // no Content-Length: counts the most a part may be
	}
	if e == nil {
		e = s.cold.AdmitPart(r.Context(), t.key, inc, reserve)
	}
	if e != nil {
		drainBody(r)
		s.writeError(w, r, e)
		return
	}
	stored := int64(-1)
	defer func() { s.cold.PartDone(t.key, reserve, stored) }()
	body, e := s.readBody(w, r)
	if e != nil {
		s.writeError(w, r, e)
		return
	}
	id, e := s.cold.StorePart(t.key, inc, body)
	if e != nil {
		s.writeError(w, r, e)
		return
	}
	stored = int64(len(body))
	w.Header().Set(streamcore.HdrSnapshotPart, id)
	w.Header().Set(streamcore.HdrIncarnation, u64(inc))
	w.WriteHeader(http.StatusCreated)
}

// handleDiscardParts serves DELETE {stream}/snapshot/parts: every part of the current
// incarnation goes, and those of earlier incarnations staged over a minute ago.
func (s *Server) handleDiscardParts(w http.ResponseWriter, r *http.Request, t *target) {
	drainBody(r)
	inc, e := s.partsRequest(r, t.key)
	if e == nil {
		e = s.cold.DiscardParts(t.key, inc)
	}
	if e != nil {
		s.writeError(w, r, e)
		return
	}
	w.Header().Set(streamcore.HdrIncarnation, u64(inc))
	w.WriteHeader(http.StatusNoContent)
}

// handleCommitParts serves PUT {stream}/snapshot/{offset} with Stream-Snapshot-Parts.
func (s *Server) handleCommitParts(w http.ResponseWriter, r *http.Request, t *target, off, ifInc uint64, ct string) {
	e := func() *streamcore.Error {
		if s.cold == nil {
			return noColdStore()
		}
		nText := r.Header.Get(streamcore.HdrSnapshotParts)
		n, err := strconv.Atoi(nText)
		if err != nil || n < 1 || n > streamcore.MaxSnapshotParts || strconv.Itoa(n) != nText {
			return invalidCommit("Stream-Snapshot-Parts must be a decimal from 1 to %d without sign or leading zero", streamcore.MaxSnapshotParts)
		}
		return nil
	}()
	if e != nil {
		drainBody(r)
		s.writeError(w, r, e)
		return
	}
	digest := r.Header.Get(streamcore.HdrSnapshotDigest)
	n, _ := strconv.Atoi(r.Header.Get(streamcore.HdrSnapshotParts))
	list, err := io.ReadAll(io.LimitReader(r.Body, maxCommitListSize+1))
	drainBody(r)
	switch {
	case err != nil:
		s.writeError(w, r, streamcore.Errorf(http.StatusBadRequest, streamcore.CodeBodyUnreadable, "request body could not be read"))
		return
	case len(list) > maxCommitListSize:
		s.writeError(w, r, invalidCommit("the body is longer than any list of %d part ids", streamcore.MaxSnapshotParts))
		return
	case digest == "":
		s.writeError(w, r, invalidCommit("a commit needs Stream-Snapshot-Digest, the digest of the assembled snapshot"))
		return
	}
	if e := s.confirmLeader(r.Context(), t.key); e != nil {
		s.writeError(w, r, e)
		return
	}
	// The commit's key first: a repeat succeeds and a superseded or conflicting commit
	// answers 409 even when its parts are gone, and before the retention check.
	var inc uint64
	var latest *streamcore.Snapshot
	s.engine.View(t.key, s.now(), func(st *streamcore.State, str *streamcore.Stream) {
		switch {
		case str == nil || str.SoftDeleted:
			e = st.NotFound(t.key)
		default:
			inc = str.Incarnation
			if sn := str.Snapshot; sn != nil {
				latest = &streamcore.Snapshot{Offset: sn.Offset, Digest: sn.Digest}
			}
		}
	})
	if e != nil {
		s.writeError(w, r, e)
		return
	}
	if sn := latest; sn != nil && (off < sn.Offset || off == sn.Offset && digest != sn.Digest) {
		s.writeError(w, r, streamcore.Errorf(http.StatusConflict, streamcore.CodeSnapshotConflict, "a different snapshot is the latest").
			With(streamcore.HdrSnapshotOffset, streamcore.FormatOffset(sn.Offset)).With(streamcore.HdrSnapshotDigest, sn.Digest))
		return
	}
	if latest != nil && off == latest.Offset {
		// A repeat of the published snapshot: the publish answers it from the key.
		c := &streamcore.Command{Op: streamcore.OpPublishSnapshot, Key: t.key, Now: s.now(), IfIncarnation: ifInc,
			Offset: off, SnapshotType: ct, SnapshotDigest: digest}
		s.cold.CheckBoundary(t.key, c)
		res, e := s.propose(r.Context(), c)
		if e != nil {
			s.writeError(w, r, e)
			return
		}
		s.writeResult(w, r, t, res)
		return
	}
	if ifInc != 0 && ifInc != inc {
		s.writeError(w, r, incarnationMismatch(inc))
		return
	}
	ids, e := parsePartList(list, n)
	if e != nil {
		s.writeError(w, r, e)
		return
	}
	done, e := s.cold.CommitParts(t.key, inc, ifInc, off, ct, digest, ids, s.propose)
	if e != nil {
		s.writeError(w, r, e)
		return
	}
	select {
	case a := <-done:
		if a.Err != nil {
			s.writeError(w, r, a.Err)
			return
		}
		s.writeResult(w, r, t, a.Result)
	case <-r.Context().Done():
	}
}

func invalidCommit(format string, args ...any) *streamcore.Error {
	return streamcore.Errorf(http.StatusBadRequest, streamcore.CodeInvalidPartsCommit, format, args...)
}

// parsePartList checks a commit body: exactly n distinct ids of 1 to 64 visible ASCII
// characters, each followed by one LF and nothing else.
func parsePartList(body []byte, n int) ([]string, *streamcore.Error) {
	if len(body) == 0 || body[len(body)-1] != '\n' {
		return nil, invalidCommit("the body must list the part ids, each followed by one LF")
	}
	lines := strings.Split(string(body[:len(body)-1]), "\n")
	if len(lines) != n {
		return nil, invalidCommit("the body lists %d part ids; Stream-Snapshot-Parts says %d", len(lines), n)
	}
	seen := make(map[string]bool, n)
	for i, id := range lines {
		if len(id) == 0 || len(id) > maxPartID {
			return nil, invalidCommit("part id %d must be 1 to %d characters", i+1, maxPartID)
		}
		for j := 0; j < len(id); j++ {
			if id[j] < 0x21 || id[j] > 0x7e {
				return nil, invalidCommit("part id %d has a character that is not visible ASCII", i+1)
			}
		}
		if seen[id] {
			return nil, invalidCommit("part id %q is listed twice", id)
		}
		seen[id] = true
	}
	return lines, nil
}
