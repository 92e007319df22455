package streamcore

import (
	"bytes"
	"fmt"
	"net/http"
	"reflect"
	"sort"
	"strings"
	"testing"
)

// The codec writes every field by hand. These lists are the fields it knows; adding a field
// to one of these types fails this test until the codec (and the list) learn it.
var codecFields = map[reflect.Type][]string{
	reflect.TypeFor[Command](): {"Op", "Key", "Now", "IfIncarnation", "ContentType", "TTL", "ExpiresAt", "ExpiresAtMs", "NewIncarnation", "Fork", "Body", "Messages", "Close", "StreamSeq", "BodyFault", "Producer", "DigestBad", "WithIncHdr", "Offset", "SnapshotType", "SnapshotDigest", "SnapshotColdKey", "SnapshotSize", "BoundaryChecked", "BoundaryRefuted", "ChunkKey", "ChunkEnd",
		"BodyFrame"}, // BodyFrame is where Body was read, not part of the command: never encoded
	reflect.TypeFor[ProducerHeaders](): {"ID", "Epoch", "Seq", "Digest"},
	reflect.TypeFor[ForkSpec]():        {"Source", "Offset", "HasOffset", "SubOffset"},
	reflect.TypeFor[Error]():           {"Status", "Code", "Message", "Headers"},
	reflect.TypeFor[State]():           {"Streams", "Buckets", "Erased", "Peer"},
	reflect.TypeFor[Stream]():          {"Key", "ContentType", "TTL", "ExpiresAt", "ExpiresAtMs", "Closed", "Incarnation", "CreatedMs", "RenewedMs", "Retained", "Data", "Appends", "StreamSeq", "Producers", "Receipts", "EpochFloor", "HasEpochFloor", "Snapshot", "Fork", "ForkRefs", "SoftDeleted", "closedByRecord", "Chunks", "PreviousIncarnation", "InheritedOffset"},
	reflect.TypeFor[Snapshot]():        {"Offset", "ContentType", "Digest", "Body", "ColdKey", "Size"},
	reflect.TypeFor[ColdChunk]():       {"Key", "Start", "End"},
	reflect.TypeFor[Producer]():        {"Epoch", "LastSeq", "LastSeen", "ClosedEpoch", "ClosedSeq", "HasClosed", "ClaimDigest", "Newest", "AboveFloor", "HistoryClosed"},
	reflect.TypeFor[Receipt]():         {"Producer", "Epoch", "Seq", "Digest", "Start", "End", "Closed"},
	reflect.TypeFor[ReceiptWindow]():   {"ring", "next"},
	reflect.TypeFor[Buffer]():          {"base", "end", "blocks", "starts", "arenas"},
}

func TestCodecKnowsEveryField(t *testing.T) {
	for typ, want := range codecFields {
		var have []string
		for i := range typ.NumField() {
			have = append(have, typ.Field(i).Name)
		}
		w := append([]string(nil), want...)
		sort.Strings(w)
		sort.Strings(have)
		if strings.Join(w, ",") != strings.Join(have, ",") {
			t.Errorf("%v has fields %v; the codec in statecodec.go knows %v: encode the new field, then update codecFields", typ, have, want)
		}
	}
}

// richState builds a state that uses every feature: JSON and binary streams, TTL and
// Expires-At, closes, Stream-Seq, producers (claims, closed epochs, expiry floors), a
// receipt ring that wrapped, snapshots, retention, forks with sub-offsets and a
// soft-deleted source.
func richState(t *testing.T) *State {
	st := NewState()
	now := int64(1_700_000_000_000)
	must := func(c *Command, status ...int) Result {
		t.Helper()
		if c.TTL == 0 && c.Op == OpCreate {
			c.TTL = -1
		}
		r := st.Apply(c)
		if r.Err != nil && len(status) == 0 {
			t.Fatalf("%s %s: %v", c.Op, c.Key, r.Err)
		}
		return r
	}
	must(&Command{Op: OpCreate, Key: "b/json", Now: now, ContentType: "application/json", NewIncarnation: 11, TTL: 3600, StreamSeq: "a"})
	for i := range 40 {
		must(&Command{Op: OpAppend, Key: "b/json", Now: now + int64(i), ContentType: "application/json", Body: []byte(fmt.Sprintf("{\"i\":%d}\n{\"j\":%d}\n", i, i)), Messages: 2, StreamSeq: fmt.Sprintf("b%03d", i)})
	}
	must(&Command{Op: OpCreate, Key: "b/bin", Now: now, ContentType: "application/octet-stream", NewIncarnation: 12, ExpiresAt: "2030-01-01T00:00:00Z", ExpiresAtMs: 1893456000000, TTL: -1, Body: bytes.Repeat([]byte{7}, 5000)})
	// Producers: enough writes to wrap the receipt ring, a re-claim at a higher epoch.
	for i := range ReceiptWindowSize + 10 {
		must(&Command{Op: OpAppend, Key: "b/bin", Now: now + int64(i), ContentType: "application/octet-stream", Body: bytes.Repeat([]byte{byte(i)}, 300), Producer: &ProducerHeaders{ID: "p1", Epoch: 1, Seq: uint64(i), Digest: fmt.Sprintf("%064x", i)}})
	}
	must(&Command{Op: OpAppend, Key: "b/bin", Now: now + 5000, ContentType: "application/octet-stream", Body: []byte("claim"), Producer: &ProducerHeaders{ID: "p1", Epoch: 2, Seq: 0}})
	must(&Command{Op: OpAppend, Key: "b/bin", Now: now + 5001, ContentType: "application/octet-stream", Body: []byte("x"), Producer: &ProducerHeaders{ID: "p2", Epoch: 3, Seq: 0}, WithIncHdr: true, IfIncarnation: 12})
	// A producer that expired raises the epoch floor.
	must(&Command{Op: OpAppend, Key: "b/bin", Now: now + ProducerExpiry + 10000, ContentType: "application/octet-stream", Body: []byte("late"), Producer: &ProducerHeaders{ID: "p2", Epoch: 5, Seq: 0}})
	// Snapshot and retention.
	must(&Command{Op: OpPublishSnapshot, Key: "b/bin", Now: now + 6000, Offset: 100000, SnapshotType: "application/x-sqlite3", SnapshotDigest: "d1", Body: []byte("snapshot body")})
	must(&Command{Op: OpRetain, Key: "b/bin", Now: now + 6001, Offset: 100000})
	// Forks: one with a sub-offset on the JSON stream, then delete the source (soft).
	must(&Command{Op: OpCreate, Key: "b/fork", Now: now + 7000, TTL: -1, NewIncarnation: 13, Fork: &ForkSpec{Source: "b/json", Offset: 14, HasOffset: true, SubOffset: 1}})
	must(&Command{Op: OpAppend, Key: "b/fork", Now: now + 7001, ContentType: "application/json", Body: []byte("{\"f\":1}\n"), Messages: 1})
	must(&Command{Op: OpCreate, Key: "b/fork2", Now: now + 7002, TTL: -1, NewIncarnation: 14, Fork: &ForkSpec{Source: "b/fork"}})
	must(&Command{Op: OpDelete, Key: "b/fork", Now: now + 7003})
	// Cold tier: a chunk trims the hot buffer mid-block; a snapshot stored as an object.
	must(&Command{Op: OpRecordChunk, Key: "b/json", Now: now + 7100, IfIncarnation: 11, Offset: 0, ChunkEnd: 100, ChunkKey: "chunks/1"})
	must(&Command{Op: OpPublishSnapshot, Key: "b/json", Now: now + 7101, Offset: 0, SnapshotType: "text/plain", SnapshotDigest: "d2", SnapshotColdKey: "snaps/1", SnapshotSize: 77})
	must(&Command{Op: OpCreate, Key: "c/closed", Now: now, TTL: -1, ContentType: "text/plain", NewIncarnation: 15, Body: []byte("bye"), Close: true})
	// A restore from backup: history fields and history-closed producers.
	restored := CaptureState(st).Streams["b/bin"]
	must(&Command{Op: OpDelete, Key: "b/bin", Now: now + 8000})
	must(&Command{Op: OpRestoreStream, Key: "b/bin", Now: now + 8001, NewIncarnation: 16, Body: EncodeStream(restored)})
	// A purged bucket: its fence is part of the state.
	must(&Command{Op: OpCreate, Key: "gone/s", Now: now, TTL: -1, ContentType: "text/plain", NewIncarnation: 17, Body: []byte("x")})
	must(&Command{Op: OpPurgeBucket, Key: "gone", Now: now + 8002})
	if !st.Streams["b/fork"].SoftDeleted || st.Streams["b/json"].ForkRefs != 1 {
		t.Fatal("fixture: soft delete did not happen")
	}
	if len(st.Streams["b/bin"].Receipts.ring) != ReceiptWindowSize || !st.Streams["b/bin"].HasEpochFloor {
		t.Fatal("fixture: ring did not wrap or no floor")
	}
	return st
}

func TestStateRoundTrip(t *testing.T) {
	st := richState(t)
	var buf bytes.Buffer
	if err := WriteState(&buf, st); err != nil {
		t.Fatal(err)
	}
	got, err := ReadState(buf.Bytes())
	if err != nil {
		t.Fatal(err)
	}
	if diff := deepDiff(reflect.ValueOf(st).Elem(), reflect.ValueOf(got).Elem(), "State"); diff != "" {
		t.Fatal(diff)
	}
	// A capture encodes like the state, and keeps doing so while the state moves on.
	capt := CaptureState(st)
	var bufc bytes.Buffer
	WriteState(&bufc, capt)
	if !bytes.Equal(buf.Bytes(), bufc.Bytes()) {
		t.Fatal("a capture encodes differently from its state")
	}
	// Encoding is canonical.
	var buf2 bytes.Buffer
	WriteState(&buf2, got)
	if !bytes.Equal(buf.Bytes(), buf2.Bytes()) {
		t.Fatal("re-encoding differs")
	}
	// The restored state behaves the same under further commands.
	for _, s := range []*State{st, got} {
		r := s.Apply(&Command{Op: OpAppend, Key: "b/bin", Now: 1_700_000_006_002, ContentType: "application/octet-stream", Body: []byte("dup?"), Producer: &ProducerHeaders{ID: "p1", Epoch: 2, Seq: 0}})
		if r.Status != http.StatusNoContent || r.Get(HdrStreamOffset) == "" {
			t.Fatalf("duplicate claim answer: %+v", r)
		}
	}
	for i := range 300 { // grow the buffers past block boundaries, move producers and receipts
		st.Apply(&Command{Op: OpAppend, Key: "b/bin", Now: 1_700_000_009_000, ContentType: "application/octet-stream", Body: bytes.Repeat([]byte{9}, 999), Producer: &ProducerHeaders{ID: "p1", Epoch: 2, Seq: uint64(i + 1)}})
		st.Apply(&Command{Op: OpAppend, Key: "b/json", Now: 1_700_000_009_000, ContentType: "application/json", Body: []byte("{\"z\":1}\n"), Messages: 1})
	}
	if r := st.Apply(&Command{Op: OpRetain, Key: "b/bin", Now: 1_700_000_009_001, Offset: 100000}); r.Err != nil {
		t.Fatal(r.Err)
	}
	bufc.Reset()
	WriteState(&bufc, capt)
	if !bytes.Equal(buf.Bytes(), bufc.Bytes()) {
		t.Fatal("a capture changed when its state applied more commands")
	}
	// Corrupt input is refused, never a panic.
	b := buf.Bytes()
	for i := 0; i < len(b); i += 1 + len(b)/500 {
		ReadState(b[:i])
	}
}

func TestCommandRoundTrip(t *testing.T) {
	c := &Command{Op: OpAppend, Key: "b/s", Now: -5, IfIncarnation: 9, ContentType: "text/plain", TTL: -1, ExpiresAt: "x", ExpiresAtMs: 77,
		NewIncarnation: 3, Fork: &ForkSpec{Source: "b/o", Offset: 4, HasOffset: true, SubOffset: 2}, Body: []byte("body"), Messages: 2, Close: true,
		StreamSeq: "s", BodyFault: Errorf(400, "BAD", "bad").With("A", "1").With("B", "2"), Producer: &ProducerHeaders{ID: "p", Epoch: 1, Seq: 2, Digest: "d"},
		DigestBad: true, WithIncHdr: true, Offset: 8, SnapshotType: "t", SnapshotDigest: "sd",
		SnapshotColdKey: "ck", SnapshotSize: 5, BoundaryChecked: true, ChunkKey: "k", ChunkEnd: 9}
	// Every field is set to a non-zero value, so a forgotten field shows up; the two
	// boundary verdicts exclude each other, and the refutation round-trips below.
	v := reflect.ValueOf(c).Elem()
	for i := range v.NumField() {
		if name := v.Type().Field(i).Name; v.Field(i).IsZero() && name != "BoundaryRefuted" && name != "BodyFrame" {
			t.Fatalf("fixture leaves %s zero", v.Type().Field(i).Name)
		}
	}
	b := AppendCommand(nil, c)
	got, err := DecodeCommand(b)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(c, got) {
		t.Fatalf("round trip:\n%+v\n%+v", c, got)
	}
	for i := range b {
		DecodeCommand(b[:i])
	}
	if _, err := DecodeCommand(append(b, 0)); err == nil {
		t.Fatal("trailing bytes accepted")
	}
	c.BoundaryChecked, c.BoundaryRefuted = false, true
	if got, err := DecodeCommand(AppendCommand(nil, c)); err != nil || !reflect.DeepEqual(c, got) {
		t.Fatalf("refuted boundary round trip: %v %+v", err, got)
	}
}

// deepDiff compares two values field by field, unexported fields included. Buffers are
// compared by content (their block layout is an allocation detail), funcs are skipped.
func deepDiff(a, b reflect.Value, path string) string {
	if a.Type() == reflect.TypeFor[Buffer]() {
		ba, bb := a.Addr().Interface().(*Buffer), b.Addr().Interface().(*Buffer)
		if ba.Base() != bb.Base() || ba.End() != bb.End() || ba.heldStart() != bb.heldStart() || !bytes.Equal(bytes.Join(ba.blocks, nil), bytes.Join(bb.blocks, nil)) {
			return path + ": buffers differ"
		}
		return ""
	}
	switch a.Kind() {
	case reflect.Func:
		return ""
	case reflect.Pointer:
		if a.IsNil() || b.IsNil() {
			if a.IsNil() != b.IsNil() {
				return path + ": nil vs non-nil"
			}
			return ""
		}
		return deepDiff(a.Elem(), b.Elem(), path)
	case reflect.Struct:
		for i := range a.NumField() {
			if d := deepDiff(a.Field(i), b.Field(i), path+"."+a.Type().Field(i).Name); d != "" {
				return d
			}
		}
		return ""
	case reflect.Slice:
		if a.Len() != b.Len() {
			return fmt.Sprintf("%s: len %d vs %d", path, a.Len(), b.Len())
		}
		for i := range a.Len() {
			if d := deepDiff(a.Index(i), b.Index(i), fmt.Sprintf("%s[%d]", path, i)); d != "" {
				return d
			}
		}
		return ""
	case reflect.Map:
		if a.Len() != b.Len() {
			return fmt.Sprintf("%s: map len %d vs %d", path, a.Len(), b.Len())
		}
		it := a.MapRange()
		for it.Next() {
			bv := b.MapIndex(it.Key())
			if !bv.IsValid() {
				return fmt.Sprintf("%s: key %v missing", path, it.Key())
			}
			if d := deepDiff(it.Value(), bv, fmt.Sprintf("%s[%v]", path, it.Key())); d != "" {
				return d
			}
		}
		return ""
	case reflect.String:
		if a.String() != b.String() {
			return fmt.Sprintf("%s: %q vs %q", path, a.String(), b.String())
		}
	case reflect.Bool:
		if a.Bool() != b.Bool() {
			return path + ": bool differs"
		}
	case reflect.Int, reflect.Int64, reflect.Int32, reflect.Uint8:
		if a.Kind() == reflect.Uint8 {
			if a.Uint() != b.Uint() {
				return path + ": differs"
			}
		} else if a.Int() != b.Int() {
			return fmt.Sprintf("%s: %d vs %d", path, a.Int(), b.Int())
		}
	case reflect.Uint, reflect.Uint64, reflect.Uint32:
		if a.Uint() != b.Uint() {
			return fmt.Sprintf("%s: %d vs %d", path, a.Uint(), b.Uint())
		}
	default:
		return fmt.Sprintf("%s: kind %v not compared; teach deepDiff", path, a.Kind())
	}
	return ""
}

// writeLog records the size of every write WriteState makes.
type writeLog struct {
	bytes.Buffer
	biggest int
	writes  int
	failAt  int // fail the write with this number (1-based), 0 never
}

func (w *writeLog) Write(p []byte) (int, error) {
	w.writes++
	if w.writes == w.failAt {
		return 0, fmt.Errorf("disk on fire")
	}
	w.biggest = max(w.biggest, len(p))
	return w.Buffer.Write(p)
}

// TestWriteStateStreams: a state holding megabytes of stream bytes is written in pieces
// no larger than a stream block (plus the encoder's small buffer), never as one slice the
// size of the state, round-trips exactly, and a write error ends the encoding with it.
func TestWriteStateStreams(t *testing.T) {
	st := richState(t)
	big := bytes.Repeat([]byte("0123456789abcdef"), 1<<16) // 1 MiB
	for i := range 6 {
		st.Apply(&Command{Op: OpAppend, Key: "b/bin", Now: 1_700_000_010_000, ContentType: "application/octet-stream", Body: big[i:]})
	}
	if st.Streams["b/bin"].Tail() < 6<<20-16 {
		t.Fatal("fixture: the stream did not grow")
	}
	var w writeLog
	if err := WriteState(&w, st); err != nil {
		t.Fatal(err)
	}
	if limit := blockSize + stateSpillBytes + 4096; w.biggest > limit || w.writes < 6 {
		t.Fatalf("%d writes, the biggest %d bytes (limit %d): the encoding was not streamed", w.writes, w.biggest, limit)
	}
	got, err := ReadState(w.Bytes())
	if err != nil {
		t.Fatal(err)
	}
	if diff := deepDiff(reflect.ValueOf(st).Elem(), reflect.ValueOf(got).Elem(), "State"); diff != "" {
		t.Fatal(diff)
	}
	var again bytes.Buffer
	WriteState(&again, got)
	if !bytes.Equal(w.Bytes(), again.Bytes()) {
		t.Fatal("re-encoding differs")
	}
	for _, at := range []int{1, 2, w.writes} {
		fw := writeLog{failAt: at}
		if err := WriteState(&fw, st); err == nil || !strings.Contains(err.Error(), "disk on fire") {
			t.Fatalf("write %d failed: WriteState returned %v", at, err)
		}
	}
}

// TestCommandSizeHint: the hint bounds the encoding, including every varint at its
// largest, so the raft engine's one allocation per proposal is never grown.
func TestCommandSizeHint(t *testing.T) {
	huge := uint64(1<<64 - 1)
	cases := []*Command{
		{Op: OpAppend, Key: "b/s"},
		{Op: OpAppend, Key: "b/s", ContentType: "application/octet-stream", Body: make([]byte, 4096), Now: -1 << 62,
			Producer: &ProducerHeaders{ID: "writer-1", Epoch: huge, Seq: huge, Digest: strings.Repeat("d", 64)}, StreamSeq: "0042"},
		{Op: OpCreate, Key: "b/f", Now: 1 << 62, IfIncarnation: huge, TTL: -1 << 62, ExpiresAt: "2030-01-01T00:00:00Z", ExpiresAtMs: 1 << 62,
			NewIncarnation: huge, Fork: &ForkSpec{Source: "b/o", Offset: huge, HasOffset: true, SubOffset: huge}, Messages: 1 << 40, Close: true,
			BodyFault: Errorf(400, "BAD_JSON", "the body is not JSON"), DigestBad: true, WithIncHdr: true, Offset: huge,
			SnapshotType: "t", SnapshotDigest: "sd", SnapshotColdKey: "k", SnapshotSize: huge, BoundaryRefuted: true, ChunkKey: "c", ChunkEnd: huge},
	}
	for i, c := range cases {
		if n, hint := len(AppendCommand(nil, c)), CommandSizeHint(c); n > hint {
			t.Fatalf("case %d: encoding of %d bytes, hint %d", i, n, hint)
		}
	}
}
