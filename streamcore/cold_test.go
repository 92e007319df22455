package streamcore

import (
	"net/http"
	"testing"
)

func TestRecordChunk(t *testing.T) {
	st := NewState()
	mustApply(t, st, create("b/s", "application/json", 1), http.StatusCreated)
	for i := 0; i < 4; i++ {
		mustApply(t, st, appendCmd("b/s", "application/json", `{"a":1}`+"\n", 2), http.StatusNoContent)
	}
	s := st.Streams["b/s"]
	inc := s.Incarnation
	rec := func(key string, from, to uint64, inc uint64) *Command {
		return &Command{Op: OpRecordChunk, Key: "b/s", Now: 3, IfIncarnation: inc, ChunkKey: key, Offset: from, ChunkEnd: to}
	}
	// Wrong start, past tail, wrong incarnation: refused, nothing changes.
	mustApply(t, st, rec("k", 8, 16, inc), http.StatusConflict)
	mustApply(t, st, rec("k", 0, 100, inc), http.StatusConflict)
	mustApply(t, st, rec("k", 0, 16, inc+1), http.StatusPreconditionFailed)
	mustApply(t, st, rec("k1", 0, 16, inc), http.StatusNoContent)
	mustApply(t, st, rec("k2", 16, 24, inc), http.StatusNoContent)
	if s.Data.Base() != 24 || s.Tail() != 32 || len(s.Chunks) != 2 {
		t.Fatalf("base %d tail %d chunks %v", s.Data.Base(), s.Tail(), s.Chunks)
	}
	if cs := s.ColdChunksFor(10, 20); len(cs) != 2 || cs[0].Key != "k1" {
		t.Fatalf("ColdChunksFor(10,20) = %v", cs)
	}
	if cs := s.ColdChunksFor(16, 24); len(cs) != 1 || cs[0].Key != "k2" {
		t.Fatalf("ColdChunksFor(16,24) = %v", cs)
	}
	// A snapshot at a cold offset needs the proposer's boundary check: unverified, it is
	// refused 503 and not applied; refuted, 400.
	if r := st.Apply(&Command{Op: OpPublishSnapshot, Key: "b/s", Now: 4, Offset: 16, SnapshotDigest: "d"}); r.Err == nil ||
		r.Status != http.StatusServiceUnavailable || r.Err.Code != CodeJSONBoundaryUnverified || s.Snapshot != nil {
		t.Fatalf("unverified cold boundary: %+v", r)
	}
	mustApply(t, st, &Command{Op: OpPublishSnapshot, Key: "b/s", Now: 4, Offset: 16, SnapshotDigest: "d", BoundaryRefuted: true}, http.StatusBadRequest)
	mustApply(t, st, &Command{Op: OpPublishSnapshot, Key: "b/s", Now: 4, Offset: 16, SnapshotDigest: "d", BoundaryChecked: true,
		SnapshotColdKey: "snap", SnapshotSize: 5}, http.StatusNoContent)
	if s.Snapshot.ColdKey != "snap" || s.Snapshot.BodySize() != 5 || s.Snapshot.Body != nil {
		t.Fatalf("snapshot %+v", s.Snapshot)
	}
	// Retention drops the chunks wholly below it.
	mustApply(t, st, &Command{Op: OpRetain, Key: "b/s", Now: 5, Offset: 16, BoundaryChecked: true}, http.StatusNoContent)
	if len(s.Chunks) != 1 || s.Chunks[0].Key != "k2" || s.Data.Base() != 24 {
		t.Fatalf("after retention: chunks %v base %d", s.Chunks, s.Data.Base())
	}
	// A fork below the hot start shares the chunks below its fork point.
	mustApply(t, st, &Command{Op: OpCreate, Key: "b/f", Now: 6, TTL: -1, Fork: &ForkSpec{Source: "b/s", Offset: 24, HasOffset: true}, NewIncarnation: 9}, http.StatusCreated)
	f := st.Streams["b/f"]
	if len(f.Chunks) != 1 || f.Data.Base() != 24 || f.Tail() != 24 {
		t.Fatalf("fork: chunks %v base %d tail %d", f.Chunks, f.Data.Base(), f.Tail())
	}
}

func TestBoundaryAtColdTail(t *testing.T) {
	st := NewState()
	mustApply(t, st, create("b/s", "application/json", 1), http.StatusCreated)
	mustApply(t, st, appendCmd("b/s", "application/json", `{"a":1}`+"\n", 2), http.StatusNoContent)
	s := st.Streams["b/s"]
	mustApply(t, st, &Command{Op: OpRecordChunk, Key: "b/s", Now: 3, IfIncarnation: s.Incarnation, ChunkKey: "k", Offset: 0, ChunkEnd: 8}, http.StatusNoContent)
	mustApply(t, st, &Command{Op: OpCreate, Key: "b/f", Now: 6, TTL: -1, Fork: &ForkSpec{Source: "b/s"}, NewIncarnation: 9}, http.StatusCreated)
	// The fork holds no hot byte: the boundary at its tail must be checked by the proposer.
	mustApply(t, st, &Command{Op: OpPublishSnapshot, Key: "b/f", Now: 4, Offset: 8, SnapshotDigest: "d"}, http.StatusServiceUnavailable)
	mustApply(t, st, &Command{Op: OpPublishSnapshot, Key: "b/f", Now: 4, Offset: 8, SnapshotDigest: "d", BoundaryChecked: true}, http.StatusNoContent)
}

// A JSON boundary that only the cold tier could show (protocol 21.5 and 24.3): a retention
// whose offset the proposer could not verify answers 503 JSON_BOUNDARY_UNVERIFIED and
// moves nothing; one it refuted answers 400 NOT_JSON_BOUNDARY; an offset in the hot
// buffer is decided there whatever the proposer sent.
func TestColdBoundaryUnverifiedIsNeverApplied(t *testing.T) {
	st := NewState()
	mustApply(t, st, create("b/s", "application/json", 1), http.StatusCreated)
	for i := 0; i < 3; i++ {
		mustApply(t, st, appendCmd("b/s", "application/json", `{"a":1}`+"\n", 2), http.StatusNoContent)
	}
	s := st.Streams["b/s"]
	mustApply(t, st, &Command{Op: OpRecordChunk, Key: "b/s", Now: 3, IfIncarnation: s.Incarnation, ChunkKey: "k", Offset: 0, ChunkEnd: 16}, http.StatusNoContent)
	mustApply(t, st, &Command{Op: OpPublishSnapshot, Key: "b/s", Now: 4, Offset: 24, SnapshotDigest: "d"}, http.StatusNoContent)
	r := st.Apply(&Command{Op: OpRetain, Key: "b/s", Now: 5, Offset: 8})
	if r.Err == nil || r.Status != http.StatusServiceUnavailable || r.Err.Code != CodeJSONBoundaryUnverified || r.Err.Headers[HdrRetryAfter] != "1" || s.Retained != 0 {
		t.Fatalf("unverified: %+v retained %d", r, s.Retained)
	}
	r = st.Apply(&Command{Op: OpRetain, Key: "b/s", Now: 5, Offset: 8, BoundaryRefuted: true})
	if r.Err == nil || r.Err.Code != CodeNotJSONBoundary || s.Retained != 0 {
		t.Fatalf("refuted: %+v", r)
	}
	r = st.Apply(&Command{Op: OpRetain, Key: "b/s", Now: 5, Offset: 20, BoundaryChecked: true}) // hot, mid-message
	if r.Err == nil || r.Err.Code != CodeNotJSONBoundary {
		t.Fatalf("hot non-boundary: %+v", r)
	}
	mustApply(t, st, &Command{Op: OpRetain, Key: "b/s", Now: 5, Offset: 8, BoundaryChecked: true}, http.StatusNoContent)
}
