package streamcore

import (
	"net/http"
	"testing"
)

func TestRestoreStreamIsAHistoryRewrite(t *testing.T) {
	src := NewState()
	src.Apply(&Command{Op: OpCreate, Key: "b/s", Now: 1, TTL: -1, ContentType: "text/plain", NewIncarnation: 1 << 52})
	w := func(st *State, seq uint64, inc uint64, body string) Result {
		return st.Apply(&Command{Op: OpAppend, Key: "b/s", Now: 2, ContentType: "text/plain", Body: []byte(body),
			IfIncarnation: inc, WithIncHdr: inc != 0, Producer: &ProducerHeaders{ID: "p", Epoch: 3, Seq: seq, Digest: body}})
	}
	for i, b := range []string{"aa", "bb", "cc"} {
		if r := w(src, uint64(i), 0, b); r.Err != nil {
			t.Fatal(r.Err)
		}
	}
	old := src.Streams["b/s"]
	enc := EncodeStream(CaptureState(src).Streams["b/s"])

	dst := NewState()
	r := dst.Apply(&Command{Op: OpRestoreStream, Key: "b/s", Now: 5, NewIncarnation: 1<<52 + 7, Body: enc})
	if r.Status != http.StatusCreated {
		t.Fatalf("restore: %d %v", r.Status, r.Err)
	}
	if r.Get(HdrPreviousIncarnation) != incHeader(old.Incarnation) || r.Get(HdrInheritedOffset) != FormatOffset(6) {
		t.Fatalf("history headers: %v", r.Headers)
	}
	if got := string(dst.Streams["b/s"].Data.Copy(0, 6)); got != "aabbcc" {
		t.Fatalf("bytes %q", got)
	}
	// A repeat of a surviving write gets its receipt.
	if r := w(dst, 1, 0, "bb"); r.Err != nil || r.Get(HdrStreamOffset) != FormatOffset(2) {
		t.Fatalf("repeat: %d %v %v", r.Status, r.Err, r.Headers)
	}
	// A new write of the epoch is refused: the epoch was closed by the rewrite.
	r = w(dst, 3, 0, "dd")
	if r.Status != http.StatusForbidden || r.Get(HdrProducerOutcome) != "epoch-closed;by=history" || r.Get(HdrProducerClosedSeq) != "2" {
		t.Fatalf("new write: %d %v", r.Status, r.Err)
	}
	// The old token gets 412.
	if r := w(dst, 0, old.Incarnation, "aa"); r.Status != http.StatusPreconditionFailed {
		t.Fatalf("old token: %d", r.Status)
	}
	// A later epoch applies.
	r = dst.Apply(&Command{Op: OpAppend, Key: "b/s", Now: 6, ContentType: "text/plain", Body: []byte("ee"), Producer: &ProducerHeaders{ID: "p", Epoch: 4, Seq: 0}})
	if r.Err != nil || r.Get(HdrStreamOffset) != FormatOffset(6) {
		t.Fatalf("new epoch: %v", r.Err)
	}
	// A retried restore is answered as done; into a different stream it is refused.
	if r := dst.Apply(&Command{Op: OpRestoreStream, Key: "b/s", Now: 7, NewIncarnation: 1<<52 + 8, Body: enc}); r.Status != http.StatusOK {
		t.Fatalf("retried restore: %d", r.Status)
	}
	dst.Apply(&Command{Op: OpCreate, Key: "b/t", Now: 1, TTL: -1, ContentType: "text/plain", NewIncarnation: 1<<52 + 9})
	if r := dst.Apply(&Command{Op: OpRestoreStream, Key: "b/t", Now: 7, NewIncarnation: 1<<52 + 10, Body: enc}); r.Status != http.StatusConflict {
		t.Fatalf("restore over another stream: %d", r.Status)
	}
}

func TestRestoreTwiceWithoutWriteNamesTheFirstToken(t *testing.T) {
	a := NewState()
	a.Apply(&Command{Op: OpCreate, Key: "b/s", Now: 1, TTL: -1, ContentType: "text/plain", NewIncarnation: 1 << 52, Body: []byte("xyz")})
	b := NewState()
	b.Apply(&Command{Op: OpRestoreStream, Key: "b/s", Now: 2, NewIncarnation: 1<<52 + 1, Body: EncodeStream(a.Streams["b/s"])})
	c := NewState()
	c.Apply(&Command{Op: OpRestoreStream, Key: "b/s", Now: 3, NewIncarnation: 1<<52 + 2, Body: EncodeStream(b.Streams["b/s"])})
	if prev, inh, _ := c.Streams["b/s"].History(); prev != 1<<52 || inh != 3 {
		t.Fatalf("history %d %d", prev, inh)
	}
}

func TestInlineCold(t *testing.T) {
	st := NewState()
	st.Apply(&Command{Op: OpCreate, Key: "b/s", Now: 1, TTL: -1, ContentType: "text/plain", NewIncarnation: 1 << 52, Body: []byte("0123456789")})
	st.Apply(&Command{Op: OpRecordChunk, Key: "b/s", Now: 2, IfIncarnation: 1 << 52, Offset: 0, ChunkEnd: 4, ChunkKey: "k"})
	s := CaptureState(st).Streams["b/s"]
	if err := s.InlineCold(0, []byte("012")); err == nil {
		t.Fatal("short cold range accepted")
	}
	if err := s.InlineCold(0, []byte("0123")); err != nil {
		t.Fatal(err)
	}
	if got := string(s.Data.Copy(0, 10)); got != "0123456789" || s.Chunks != nil {
		t.Fatalf("got %q chunks %v", got, s.Chunks)
	}
}

// An in-place rewrite (IfIncarnation set, no body): the answers of each case.
func TestRewriteInPlace(t *testing.T) {
	const inc, next = 1 << 52, 1<<52 + 9
	setup := func() *State {
		st := NewState()
		st.Apply(&Command{Op: OpCreate, Key: "b/s", Now: 1, TTL: -1, ContentType: "text/plain", NewIncarnation: inc})
		st.Apply(&Command{Op: OpAppend, Key: "b/s", Now: 2, ContentType: "text/plain", Body: []byte("abc")})
		return st
	}
	for _, tc := range []struct {
		name    string
		key     string
		ifInc   uint64
		newInc  uint64
		prepare func(*State)
		status  int
	}{
		{"rewrites", "b/s", inc, next, nil, http.StatusOK},
		{"needs a new token", "b/s", inc, 0, nil, http.StatusBadRequest},
		{"missing stream", "b/none", inc, next, nil, http.StatusPreconditionFailed},
		{"other incarnation", "b/s", inc + 1, next, nil, http.StatusPreconditionFailed},
		{"fork family", "b/s", inc, next, func(st *State) { st.Streams["b/s"].ForkRefs = 1 }, http.StatusConflict},
		{"repeat", "b/s", inc, next, func(st *State) {
			st.Apply(&Command{Op: OpRestoreStream, Key: "b/s", Now: 3, IfIncarnation: inc, NewIncarnation: next})
		}, http.StatusOK},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st := setup()
			if tc.prepare != nil {
				tc.prepare(st)
			}
			r := st.Apply(&Command{Op: OpRestoreStream, Key: tc.key, Now: 4, IfIncarnation: tc.ifInc, NewIncarnation: tc.newInc})
			if r.Status != tc.status {
				t.Fatalf("status %d (%v), want %d", r.Status, r.Err, tc.status)
			}
			s := st.Streams["b/s"]
			if tc.status != http.StatusOK {
				if s.Incarnation != inc || s.PreviousIncarnation != 0 {
					t.Fatal("a refused rewrite changed the stream")
				}
				return
			}
			if s.Incarnation != next || s.PreviousIncarnation != inc || s.InheritedOffset != 3 ||
				r.Get(HdrPreviousIncarnation) != incHeader(inc) || r.Get(HdrInheritedOffset) != FormatOffset(3) {
				t.Fatalf("stream %d/%d/%d headers %v", s.Incarnation, s.PreviousIncarnation, s.InheritedOffset, r.Headers)
			}
		})
	}
}
