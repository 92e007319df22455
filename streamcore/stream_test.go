package streamcore

import (
	"net/http"
	"testing"
)

const inc1 = 1<<52 + 7

func mustApply(t *testing.T, st *State, c *Command, status int) Result {
	t.Helper()
	r := st.Apply(c)
	if r.Status != status {
		msg := ""
		if r.Err != nil {
			msg = r.Err.Error()
		}
		t.Fatalf("%s: status %d, want %d (%s)", c.Op, r.Status, status, msg)
	}
	return r
}

func create(key, ct string, now int64) *Command {
	return &Command{Op: OpCreate, Key: key, Now: now, ContentType: ct, TTL: -1, NewIncarnation: inc1}
}

func appendCmd(key, ct, body string, now int64) *Command {
	return &Command{Op: OpAppend, Key: key, Now: now, ContentType: ct, Body: []byte(body)}
}

func prod(c *Command, id string, epoch, seq uint64) *Command {
	c.Producer = &ProducerHeaders{ID: id, Epoch: epoch, Seq: seq}
	return c
}

func TestCreateIdempotentAndConflict(t *testing.T) {
	st := NewState()
	r := mustApply(t, st, create("b1bb/s", "text/plain", 1), http.StatusCreated)
	if !r.Created || r.Get(HdrIncarnation) == "" || r.Get(HdrStreamNextOff) != FormatOffset(0) {
		t.Fatalf("create answer: %+v", r)
	}
	c := create("b1bb/s", "text/plain", 2)
	c.NewIncarnation = inc1 + 1
	r = mustApply(t, st, c, http.StatusOK) // 7.6: same config, same token
	if r.Get(HdrIncarnation) != u(inc1) {
		t.Fatalf("repeat create changed the token: %s", r.Get(HdrIncarnation))
	}
	mustApply(t, st, create("b1bb/s", "application/json", 3), http.StatusConflict) // 7.7
	cl := create("b1bb/s", "text/plain", 4)
	cl.Close = true
	mustApply(t, st, cl, http.StatusConflict) // 7.7 closure differs
	// 7.11: precondition on a missing stream creates nothing.
	miss := create("b1bb/t", "text/plain", 5)
	miss.IfIncarnation = inc1
	mustApply(t, st, miss, http.StatusPreconditionFailed)
	if st.Streams["b1bb/t"] != nil {
		t.Fatal("412 create made a stream")
	}
}

func TestAppendOrderAndClose(t *testing.T) {
	st := NewState()
	mustApply(t, st, create("b1bb/s", "text/plain", 1), http.StatusCreated)
	r := mustApply(t, st, appendCmd("b1bb/s", "text/plain", "hello", 2), http.StatusNoContent)
	if r.Get(HdrStreamNextOff) != FormatOffset(5) {
		t.Fatalf("next offset %s", r.Get(HdrStreamNextOff))
	}
	mustApply(t, st, appendCmd("b1bb/s", "application/json", "[1]\n", 3), http.StatusConflict) // 8.2
	mustApply(t, st, appendCmd("b1bb/x", "text/plain", "x", 3), http.StatusNotFound)           // 8.1
	// Stream-Seq: bytewise, strictly increasing (9.2); a conflict carries Stream-Last-Seq.
	a := appendCmd("b1bb/s", "text/plain", "a", 4)
	a.StreamSeq = "9"
	mustApply(t, st, a, http.StatusNoContent)
	b := appendCmd("b1bb/s", "text/plain", "b", 5)
	b.StreamSeq = "10"
	r = mustApply(t, st, b, http.StatusConflict)
	if r.Err.Code != CodeStreamSeqConflict || r.Get(HdrStreamLastSeq) != "9" {
		t.Fatalf("stream seq conflict: %+v", r.Err)
	}
	// Close-only, then appends are refused; close again is idempotent (8.7, 8.8).
	cl := &Command{Op: OpAppend, Key: "b1bb/s", Now: 6, Close: true}
	r = mustApply(t, st, cl, http.StatusNoContent)
	if r.Get(HdrStreamClosed) != "true" || r.Get(HdrStreamNextOff) != FormatOffset(6) {
		t.Fatalf("close answer %+v", r)
	}
	mustApply(t, st, cl, http.StatusNoContent)
	r = mustApply(t, st, appendCmd("b1bb/s", "text/plain", "late", 7), http.StatusConflict)
	if r.Err.Code != CodeStreamClosed || r.Get(HdrStreamClosed) != "true" {
		t.Fatalf("closed refusal %+v", r.Err)
	}
	if got := string(st.Streams["b1bb/s"].Data.Copy(0, 100)); got != "helloa" {
		t.Fatalf("stored %q", got)
	}
}

func TestProducerRules(t *testing.T) {
	st := NewState()
	mustApply(t, st, create("b1bb/s", "text/plain", 1), http.StatusCreated)
	k := "b1bb/s"
	// 10.5: unknown producer must start at 0.
	r := mustApply(t, st, prod(appendCmd(k, "text/plain", "x", 2), "p", 0, 3), http.StatusConflict)
	if r.Get(HdrProducerExpectedSeq) != "0" || r.Get(HdrProducerReceivedSeq) != "3" {
		t.Fatalf("%+v", r.Err)
	}
	// 10.4, 10.8: claim and continue.
	r = mustApply(t, st, prod(appendCmd(k, "text/plain", "aa", 3), "p", 0, 0), http.StatusOK)
	if r.Get(HdrStreamOffset) != FormatOffset(0) || r.Get(HdrStreamNextOff) != FormatOffset(2) {
		t.Fatalf("receipt %+v", r.Headers)
	}
	mustApply(t, st, prod(appendCmd(k, "text/plain", "bb", 4), "p", 0, 1), http.StatusOK)
	// 10.10: duplicate gets its original receipt and writes nothing.
	r = mustApply(t, st, prod(appendCmd(k, "text/plain", "aa", 5), "p", 0, 0), http.StatusNoContent)
	if r.Get(HdrStreamOffset) != FormatOffset(0) || r.Get(HdrProducerSeq) != "1" {
		t.Fatalf("dup receipt %+v", r.Headers)
	}
	// 10.9: gap.
	r = mustApply(t, st, prod(appendCmd(k, "text/plain", "zz", 6), "p", 0, 5), http.StatusConflict)
	if r.Get(HdrProducerExpectedSeq) != "2" {
		t.Fatalf("gap %+v", r.Err)
	}
	// 10.7: new epoch must start at 0.
	mustApply(t, st, prod(appendCmd(k, "text/plain", "zz", 6), "p", 1, 1), http.StatusBadRequest)
	// 10.6: new epoch claim reports what it closed.
	r = mustApply(t, st, prod(appendCmd(k, "text/plain", "cc", 7), "p", 1, 0), http.StatusOK)
	if r.Get(HdrProducerClosedEpoch) != "0" || r.Get(HdrProducerClosedSeq) != "1" {
		t.Fatalf("claim %+v", r.Headers)
	}
	// 10.11, 10.12: the closed epoch is fenced.
	r = mustApply(t, st, prod(appendCmd(k, "text/plain", "dd", 8), "p", 0, 2), http.StatusForbidden)
	if r.Err.Code != CodeEpochClosed || r.Get(HdrProducerEpoch) != "1" || r.Get(HdrProducerOutcome) != "epoch-closed;by=claim" {
		t.Fatalf("fence %+v", r.Err)
	}
	// 9.10: a Stream-Seq conflict uses up no producer seq.
	a := prod(appendCmd(k, "text/plain", "ee", 9), "p", 1, 1)
	a.StreamSeq = "5"
	mustApply(t, st, a, http.StatusOK)
	b := prod(appendCmd(k, "text/plain", "ff", 10), "p", 1, 2)
	b.StreamSeq = "4"
	mustApply(t, st, b, http.StatusConflict)
	b.StreamSeq = "6"
	mustApply(t, st, b, http.StatusOK)
	if got := string(st.Streams[k].Data.Copy(0, 100)); got != "aabbcceeff" {
		t.Fatalf("stored %q", got)
	}
}

func TestProducerKeyConflictAndDigest(t *testing.T) {
	st := NewState()
	k := "b1bb/s"
	mustApply(t, st, create(k, "text/plain", 1), http.StatusCreated)
	c := prod(appendCmd(k, "text/plain", "a", 2), "p", 0, 0)
	c.Producer.Digest = "aa"
	mustApply(t, st, c, http.StatusOK)
	d := prod(appendCmd(k, "text/plain", "b", 3), "p", 0, 0)
	d.Producer.Digest = "bb"
	r := mustApply(t, st, d, http.StatusForbidden) // 10.22
	if r.Err.Code != CodeKeyConflict || r.Get(HdrProducerOutcome) != "key-conflict" {
		t.Fatalf("%+v", r.Err)
	}
	bad := prod(appendCmd(k, "text/plain", "c", 4), "p", 0, 1)
	bad.DigestBad = true
	r = mustApply(t, st, bad, http.StatusBadRequest) // 10.20
	if r.Err.Code != CodeDigestMismatch {
		t.Fatalf("%+v", r.Err)
	}
}

func TestReceiptWindowEviction(t *testing.T) {
	st := NewState()
	k := "b1bb/s"
	mustApply(t, st, create(k, "text/plain", 1), http.StatusCreated)
	for i := 0; i <= ReceiptWindowSize+10; i++ {
		mustApply(t, st, prod(appendCmd(k, "text/plain", "x", 2), "p", 0, uint64(i)), http.StatusOK)
	}
	r := mustApply(t, st, prod(appendCmd(k, "text/plain", "x", 3), "p", 0, 1), http.StatusNoContent)
	if r.Get(HdrProducerOutcome) != "receipt-evicted" || r.Get(HdrStreamOffset) != "" {
		t.Fatalf("evicted receipt: %+v", r.Headers)
	}
	r = mustApply(t, st, prod(appendCmd(k, "text/plain", "x", 3), "p", 0, ReceiptWindowSize+10), http.StatusNoContent)
	if r.Get(HdrStreamOffset) == "" {
		t.Fatalf("newest receipt must be kept: %+v", r.Headers)
	}
}

func TestProducerLimitAndExpiry(t *testing.T) {
	st := NewState()
	k := "b1bb/s"
	mustApply(t, st, create(k, "text/plain", 0), http.StatusCreated)
	for i := 0; i < MaxProducers; i++ {
		mustApply(t, st, prod(appendCmd(k, "text/plain", "x", 1), "p"+u(uint64(i)), 0, 0), http.StatusOK)
	}
	r := mustApply(t, st, prod(appendCmd(k, "text/plain", "x", 2), "new", 0, 0), http.StatusTooManyRequests) // 10.27
	if r.Err.Code != CodeProducerLimit {
		t.Fatal(r.Err)
	}
	// An hour later the least recently seen idle producer is evicted.
	mustApply(t, st, prod(appendCmd(k, "text/plain", "x", 1+ProducerIdleEvict), "new", 0, 0), http.StatusOK)
	if len(st.Streams[k].Producers) != MaxProducers {
		t.Fatalf("producers %d", len(st.Streams[k].Producers))
	}
	// 10.26: seven days later the state is forgotten; seq > 0 is then a gap.
	later := int64(2 + ProducerIdleEvict + ProducerExpiry)
	mustApply(t, st, prod(appendCmd(k, "text/plain", "x", later), "new", 0, 1), http.StatusConflict)
	// 10.29: with Stream-Incarnation, an epoch at the floor is refused as expired.
	c := prod(appendCmd(k, "text/plain", "x", later), "new", 0, 0)
	c.WithIncHdr = true
	r = mustApply(t, st, c, http.StatusForbidden)
	if r.Err.Code != CodeProducerExpired {
		t.Fatal(r.Err)
	}
}

func TestTTLSliding(t *testing.T) {
	st := NewState()
	k := "b1bb/s"
	c := create(k, "text/plain", 0)
	c.TTL = 10
	mustApply(t, st, c, http.StatusCreated)
	mustApply(t, st, appendCmd(k, "text/plain", "x", 9000), http.StatusNoContent) // renews to 19000
	if st.Live(k, 18999) == nil {
		t.Fatal("append must renew the TTL")
	}
	if st.Live(k, 19000) != nil {
		t.Fatal("stream must expire")
	}
	mustApply(t, st, appendCmd(k, "text/plain", "x", 19000), http.StatusNotFound)
	// 7.12: an expired stream counts as missing; PUT makes a new incarnation.
	c2 := create(k, "text/plain", 19001)
	c2.NewIncarnation = inc1 + 5
	r := mustApply(t, st, c2, http.StatusCreated)
	if r.Get(HdrIncarnation) != u(inc1+5) {
		t.Fatal("new incarnation expected")
	}
}

func TestSnapshotAndRetention(t *testing.T) {
	st := NewState()
	k := "b1bb/s"
	mustApply(t, st, create(k, "application/json", 0), http.StatusCreated)
	mustApply(t, st, appendCmd(k, "application/json", "1\n2\n3\n", 1), http.StatusNoContent)
	ret := &Command{Op: OpRetain, Key: k, Now: 2, Offset: 2}
	mustApply(t, st, ret, http.StatusBadRequest) // 24.2: no snapshot yet
	snap := &Command{Op: OpPublishSnapshot, Key: k, Now: 3, Offset: 3, SnapshotDigest: "d1", SnapshotType: "application/json"}
	r := mustApply(t, st, snap, http.StatusBadRequest) // 21.5: not a boundary
	if r.Err.Code != CodeNotJSONBoundary {
		t.Fatal(r.Err)
	}
	snap.Offset = 4
	mustApply(t, st, snap, http.StatusNoContent)
	mustApply(t, st, snap, http.StatusNoContent) // 21.10 idempotent
	other := *snap
	other.SnapshotDigest = "d2"
	r = mustApply(t, st, &other, http.StatusConflict) // 21.11
	if r.Get(HdrSnapshotOffset) != FormatOffset(4) {
		t.Fatal("conflict must name the latest snapshot")
	}
	beyond := *snap
	beyond.Offset = 100
	r = mustApply(t, st, &beyond, http.StatusConflict) // 21.8
	if r.Get(HdrSnapshotOffset) != "" {
		t.Fatal("beyond-tail conflict carries no snapshot headers")
	}
	ret.Offset = 6
	mustApply(t, st, ret, http.StatusBadRequest) // past the snapshot
	ret.Offset = 4
	r = mustApply(t, st, ret, http.StatusNoContent)
	if r.Get(HdrRetainedOffset) != FormatOffset(4) {
		t.Fatal(r.Headers)
	}
	ret.Offset = 2
	r = mustApply(t, st, ret, http.StatusNoContent) // 24.4 no-op
	if r.Get(HdrRetainedOffset) != FormatOffset(4) {
		t.Fatal(r.Headers)
	}
	low := *snap
	low.Offset = 2
	mustApply(t, st, &low, http.StatusGone) // 21.9
}

func TestIncarnationPrecedence(t *testing.T) {
	st := NewState()
	k := "b1bb/s"
	mustApply(t, st, create(k, "text/plain", 0), http.StatusCreated)
	a := appendCmd(k, "text/plain", "x", 1)
	a.IfIncarnation = inc1 + 1
	r := mustApply(t, st, a, http.StatusPreconditionFailed)
	if r.Get(HdrIncarnation) != u(inc1) {
		t.Fatal("412 must carry the current token")
	}
	// A write that would be refused anyway keeps its own refusal (32.1).
	b := appendCmd(k, "application/json", "1\n", 1)
	b.IfIncarnation = inc1 + 1
	mustApply(t, st, b, http.StatusConflict)
	d := &Command{Op: OpDelete, Key: k, Now: 2, IfIncarnation: inc1 + 1}
	mustApply(t, st, d, http.StatusPreconditionFailed)
	d.IfIncarnation = inc1
	mustApply(t, st, d, http.StatusNoContent)
	mustApply(t, st, d, http.StatusNotFound)
}

func TestForkSharesPrefixAndSoftDeletes(t *testing.T) {
	st := NewState()
	mustApply(t, st, create("b1bb/src", "text/plain", 0), http.StatusCreated)
	mustApply(t, st, appendCmd("b1bb/src", "text/plain", "hello world", 1), http.StatusNoContent)
	f := create("b1bb/fork", "", 2)
	f.Fork = &ForkSpec{Source: "b1bb/src", Offset: 5, HasOffset: true}
	mustApply(t, st, f, http.StatusCreated)
	mustApply(t, st, appendCmd("b1bb/fork", "text/plain", "!", 3), http.StatusNoContent)
	mustApply(t, st, appendCmd("b1bb/src", "text/plain", "?", 3), http.StatusNoContent)
	if got := string(st.Streams["b1bb/fork"].Data.Copy(0, 100)); got != "hello!" {
		t.Fatalf("fork %q", got)
	}
	if got := string(st.Streams["b1bb/src"].Data.Copy(0, 100)); got != "hello world?" {
		t.Fatalf("source %q", got)
	}
	mustApply(t, st, &Command{Op: OpDelete, Key: "b1bb/src", Now: 4}, http.StatusNoContent)
	if s := st.Streams["b1bb/src"]; s == nil || !s.SoftDeleted {
		t.Fatal("source with a fork must be soft-deleted")
	}
	mustApply(t, st, &Command{Op: OpDelete, Key: "b1bb/fork", Now: 5}, http.StatusNoContent)
	if st.Streams["b1bb/src"] != nil {
		t.Fatal("deleting the last fork must collect the soft-deleted source")
	}
}

func TestBufferSlicesAcrossBlocks(t *testing.T) {
	var b Buffer
	chunk := make([]byte, 300000)
	for i := range chunk {
		chunk[i] = byte(i)
	}
	for i := 0; i < 10; i++ {
		b.Append(chunk)
	}
	if b.End() != 3000000 {
		t.Fatal(b.End())
	}
	got := b.Copy(299990, 1200010)
	for i, c := range got {
		if c != byte((299990+i)%300000) {
			t.Fatalf("byte %d wrong", i)
		}
	}
	p := b.Prefix(1500000)
	p.Append([]byte{1, 2, 3})
	if b.ByteAt(1500000) != chunk[0] || p.ByteAt(1500000) != 1 {
		t.Fatal("prefix append disturbed the source")
	}
	b.TrimBelow(2100000)
	if b.Base() != 2100000 || len(b.Copy(0, 2100010)) != 10 {
		t.Fatal("trim")
	}
}
