package replicator

import (
	"bytes"
	"encoding/binary"
	"errors"
	"math/rand/v2"
	"reflect"
	"strings"
	"sync"
	"testing"
)

// testPage returns page-sized bytes shaped like a SQLite table leaf page: a header and cell
// pointers, zeroed free space, then cells holding a random id, integers and text.
func testPage(size int, seed uint64) []byte {
	r := rand.New(rand.NewPCG(seed, 7))
	words := strings.Fields("alpha beta gamma delta order invoice customer shipped pending paid " +
		"london paris berlin tokyo note total amount status created updated quantity price")
	p := make([]byte, size)
	p[0] = 0x0d
	end, cells := size, 0
	for end > size/4 {
		var c []byte
		for range 16 {
			c = append(c, byte(r.Uint32())) // a random id: incompressible
		}
		c = binary.BigEndian.AppendUint64(c, 1_700_000_000+r.Uint64N(1_000_000))
		c = binary.BigEndian.AppendUint32(c, r.Uint32N(10_000))
		for range 3 + r.IntN(8) {
			c = append(c, words[r.IntN(len(words))]...)
			c = append(c, ' ')
		}
		if len(c) > end-size/4 {
			break
		}
		end -= len(c)
		copy(p[end:], c)
		binary.BigEndian.PutUint16(p[8+2*cells:], uint16(end))
		cells++
	}
	binary.BigEndian.PutUint16(p[3:], uint16(cells))
	return p
}

func testCommit(pageSize uint32, dbPages uint32, nos ...uint32) *Commit {
	c := &Commit{PageSize: pageSize, DBPages: dbPages}
	for _, no := range nos {
		c.Pages = append(c.Pages, Page{No: no, Data: testPage(int(pageSize), uint64(no))})
	}
	return c
}

func mustCommit(t testing.TB, c *Commit) []byte {
	t.Helper()
	b, err := encodeCommit(c)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// rawRecord frames a payload with any header fields and a correct CRC.
func rawRecord(version, kind byte, flags uint16, payload []byte) []byte {
	h := make([]byte, recordHeaderSize, recordHeaderSize+len(payload))
	copy(h, "URSQ")
	h[4], h[5] = version, kind
	le.PutUint16(h[6:], flags)
	le.PutUint32(h[8:], uint32(len(payload)))
	le.PutUint32(h[12:], checksum(h[:12], payload))
	return append(h, payload...)
}

// timedRecord compresses the time followed by a version 1 body and frames it as a
// version 2 record.
func timedRecord(kind RecordKind, unixNano int64, body []byte) []byte {
	timed := append(le.AppendUint64(nil, uint64(unixNano)), body...)
	return rawRecord(2, byte(kind), 0, encoder.EncodeAll(timed, nil))
}

// bodyRecord compresses any body and frames it as a version 1 record.
func bodyRecord(kind RecordKind, body []byte) []byte {
	return rawRecord(1, byte(kind), 0, encoder.EncodeAll(body, nil))
}

// rawZstd writes a zstd frame of raw blocks by hand: with an 8-byte content size of fcs,
// or without a content size when fcs < 0.
func rawZstd(body []byte, fcs int64) []byte {
	z := []byte{0x28, 0xb5, 0x2f, 0xfd}
	if fcs >= 0 {
		z = append(z, 0xe0) // single segment, 8-byte content size
		z = le.AppendUint64(z, uint64(fcs))
	} else {
		z = append(z, 0x00, 0x58) // no content size; window 16 MiB
	}
	for first := true; first || len(body) > 0; first = false {
		n := min(len(body), 128<<10)
		last := 0
		if n == len(body) {
			last = 1
		}
		hdr := uint32(last | n<<3) // raw block
		z = append(z, byte(hdr), byte(hdr>>8), byte(hdr>>16))
		z = append(z, body[:n]...)
		body = body[n:]
	}
	return z
}

// commitBody writes a commit body by hand, without validation.
func commitBody(pageSize, dbPages uint32, nos []uint32, dataLen int) []byte {
	b := le.AppendUint32(nil, pageSize)
	b = le.AppendUint32(b, dbPages)
	b = le.AppendUint32(b, uint32(len(nos)))
	for _, no := range nos {
		b = le.AppendUint32(b, no)
		b = append(b, testPage(dataLen, uint64(no))...)
	}
	return b
}

func TestRecordRoundTrip(t *testing.T) {
	want := []Record{
		{Kind: KindClaim, Claim: &Claim{Epoch: 1, Nonce: [16]byte{1, 2, 3}}},
		{Kind: KindCommit, Commit: testCommit(4096, 3, 1, 2, 3)},
		{Kind: KindCommit, Commit: testCommit(512, 1, 1)},
		{Kind: KindCommit, Commit: testCommit(65536, 9, 2, 9)},
		{Kind: KindCommit, Commit: testCommit(1024, ^uint32(0), 1, 1<<31, ^uint32(0))},
		{Kind: KindCommit, Commit: &Commit{PageSize: 4096, DBPages: 5, Pages: []Page{{No: 5, Data: make([]byte, 4096)}}}},
		{Kind: KindClaim, Claim: &Claim{Epoch: ^uint64(0), Nonce: [16]byte{15: 0xff}}},
	}
	const base = 1000
	var stream []byte
	for i := range want {
		var rec []byte
		if want[i].Claim != nil {
			rec = encodeClaim(*want[i].Claim)
		} else {
			rec = mustCommit(t, want[i].Commit)
		}
		want[i].Offset, want[i].End = base+uint64(len(stream)), base+uint64(len(stream)+len(rec))
		stream = append(stream, rec...)
	}
	got, consumed, err := DecodeRecords(stream, base, 1<<20)
	if err != nil || consumed != len(stream) {
		t.Fatalf("consumed %d of %d, err %v", consumed, len(stream), err)
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("decoded records differ:\n got %+v\nwant %+v", got, want)
	}
	// maxFrame <= 0 leaves only the format's limits.
	if got, _, err := DecodeRecords(stream, base, 0); err != nil || len(got) != len(want) {
		t.Fatalf("maxFrame 0: %d records, err %v", len(got), err)
	}
}

func TestEncodeCommitRefuses(t *testing.T) {
	page := func(no uint32, n int) Page { return Page{No: no, Data: make([]byte, n)} }
	for _, tc := range []struct {
		name string
		c    *Commit
		want string
	}{
		{"nil", nil, "nil commit"},
		{"page size 0", &Commit{PageSize: 0, DBPages: 1, Pages: []Page{page(1, 0)}}, "page size 0"},
		{"page size 256", &Commit{PageSize: 256, DBPages: 1, Pages: []Page{page(1, 256)}}, "page size 256"},
		{"page size 1000", &Commit{PageSize: 1000, DBPages: 1, Pages: []Page{page(1, 1000)}}, "page size 1000"},
		{"page size 128K", &Commit{PageSize: 1 << 17, DBPages: 1, Pages: []Page{page(1, 1<<17)}}, "page size 131072"},
		{"db size 0", &Commit{PageSize: 512, DBPages: 0, Pages: []Page{page(1, 512)}}, "database size is 0"},
		{"no pages", &Commit{PageSize: 512, DBPages: 1}, "no pages"},
		{"page 0", &Commit{PageSize: 512, DBPages: 2, Pages: []Page{page(0, 512)}}, "page 0 (#0) is outside 1..2"},
		{"page past db", &Commit{PageSize: 512, DBPages: 2, Pages: []Page{page(1, 512), page(3, 512)}}, "page 3 (#1) is outside 1..2"},
		{"unsorted", &Commit{PageSize: 512, DBPages: 3, Pages: []Page{page(2, 512), page(1, 512)}}, "page 1 (#1) does not follow page 2"},
		{"duplicate", &Commit{PageSize: 512, DBPages: 3, Pages: []Page{page(2, 512), page(2, 512)}}, "page 2 (#1) does not follow page 2"},
		{"short page", &Commit{PageSize: 512, DBPages: 3, Pages: []Page{page(2, 511)}}, "page 2 is 511 bytes, want 512"},
		{"long page", &Commit{PageSize: 512, DBPages: 3, Pages: []Page{page(2, 513)}}, "page 2 is 513 bytes, want 512"},
		{"over maxBodyBytes", &Commit{PageSize: 65536, DBPages: 1 << 20, Pages: make([]Page, 1<<14)}, "over the 1073741824 byte limit"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b, err := encodeCommit(tc.c)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %d bytes, err %v; want an error containing %q", len(b), err, tc.want)
			}
		})
	}
}

func TestDecodeDamage(t *testing.T) {
	good := mustCommit(t, testCommit(1024, 4, 1, 4))
	flip := func(i int) []byte { b := bytes.Clone(good); b[i] ^= 0x40; return b }
	setLen := func(n uint32) []byte { b := bytes.Clone(good); le.PutUint32(b[8:], n); return b }
	commit := func(ps, db uint32, nos ...uint32) []byte {
		return bodyRecord(KindCommit, commitBody(ps, db, nos, int(ps)))
	}
	for _, tc := range []struct {
		name string
		rec  []byte
		want string
	}{
		{"bad magic", flip(0), `bad magic "\x15RSQ"`},
		{"version 0", rawRecord(0, 1, 0, nil), "unknown version 0"},
		{"version 3", rawRecord(3, 1, 0, nil), "unknown version 3"},
		{"version 0", rawRecord(0, 1, 0, nil), "unknown version 0"},
		{"v2 claim short", timedRecord(KindClaim, 0, make([]byte, 23)), "claim body is 31 bytes, want 32"},
		{"v2 commit without time", rawRecord(2, 1, 0, encoder.EncodeAll(make([]byte, 5), nil)), "shorter than its time"},
		{"kind 0", rawRecord(1, 0, 0, nil), "unknown record kind 0"},
		{"kind 3", rawRecord(1, 3, 0, nil), "unknown record kind 3"},
		{"flags", rawRecord(1, 1, 1, nil), "flags 0001 are not zero"},
		{"flags high", rawRecord(1, 2, 0x8000, nil), "flags 8000 are not zero"},
		{"over maxFrame", setLen(1 << 20), "record of 1048592 bytes is over the 65536 byte limit"},
		{"crc of payload", flip(40), "crc32c mismatch"},
		{"crc of header", flip(12), "crc32c mismatch"},
		{"crc of length", setLen(uint32(len(good) - recordHeaderSize - 1)), "crc32c mismatch"},
		{"not zstd", rawRecord(1, 1, 0, []byte("plain text, not zstd")), "bad zstd payload"},
		{"empty payload", rawRecord(1, 2, 0, nil), "bad zstd payload"},
		{"zstd then garbage", rawRecord(1, 2, 0, append(encoder.EncodeAll(make([]byte, 24), nil), 1, 2, 3, 4, 5)), "bad zstd payload"},
		{"zstd size lie", rawRecord(1, 1, 0, rawZstd(commitBody(512, 1, []uint32{1}, 512), 600)), "bad zstd payload"},
		{"zstd size over limit", rawRecord(1, 1, 0, rawZstd(nil, maxBodyBytes+1)), "body of 1073741825 bytes is over the 1073741824 byte limit"},
		{"zstd size beyond ratio", rawRecord(1, 1, 0, rawZstd(nil, 100<<20)), "cannot decode to the 104857600 it declares"},
		{"zstd no size, long body", rawRecord(1, 1, 0, rawZstd(commitBody(512, 1, []uint32{1}, 512), -1)), "bad zstd payload"},
		{"two frames", rawRecord(1, 1, 0, append(rawZstd(commitBody(512, 1, []uint32{1}, 512), 528), rawZstd(make([]byte, 100), -1)...)), "bad zstd payload"},
		{"claim short", bodyRecord(KindClaim, make([]byte, 23)), "claim body is 23 bytes, want 24"},
		{"claim long", bodyRecord(KindClaim, make([]byte, 25)), "bad zstd payload"},
		{"commit short", bodyRecord(KindCommit, make([]byte, 11)), "commit body: 11 bytes, shorter than its 12 byte header"},
		{"commit page size", commit(768, 2, 1), "commit body: page size 768"},
		{"commit db size 0", commit(512, 0, 1), "commit body: database size is 0 pages"},
		{"commit no pages", commit(512, 1), "commit body: no pages"},
		{"commit page 0", commit(512, 2, 0), "commit body: page 0 (#0) is outside 1..2"},
		{"commit page past db", commit(512, 2, 1, 3), "commit body: page 3 (#1) is outside 1..2"},
		{"commit unsorted", commit(512, 9, 5, 4), "commit body: page 4 (#1) does not follow page 5"},
		{"commit duplicate", commit(512, 9, 5, 5), "commit body: page 5 (#1) does not follow page 5"},
		{"commit trailing bytes", bodyRecord(KindCommit, append(commitBody(512, 2, []uint32{1}, 512), 0)), "commit body: 529 bytes, want 528 for 1 pages of 512"},
		{"commit count lie", bodyRecord(KindCommit, le.AppendUint32(le.AppendUint32(le.AppendUint32(nil, 512), 1), ^uint32(0))), "commit body: 12 bytes, want"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			first := encodeClaim(Claim{Epoch: 3})
			const base = 500
			stream := append(append(bytes.Clone(first), tc.rec...), encodeClaim(Claim{Epoch: 4})...)
			recs, consumed, err := DecodeRecords(stream, base, 64<<10)
			var fe *frameError
			if !errors.As(err, &fe) {
				t.Fatalf("err %v, want a *frameError", err)
			}
			if fe.Offset != base+uint64(len(first)) || !strings.Contains(fe.Reason, tc.want) {
				t.Fatalf("got %v; want offset %d and a reason containing %q", err, base+len(first), tc.want)
			}
			if len(recs) != 1 || recs[0].Claim.Epoch != 3 || consumed != len(first) {
				t.Fatalf("got %d records, consumed %d; want the one before the damage", len(recs), consumed)
			}
		})
	}
}

func TestDecodeTruncated(t *testing.T) {
	var stream []byte
	var ends []int
	for _, rec := range [][]byte{
		mustCommit(t, testCommit(4096, 10, 1, 2, 7)),
		encodeClaim(Claim{Epoch: 2}),
		mustCommit(t, testCommit(4096, 10, 10)),
		encodeClaim(Claim{Epoch: 3}),
	} {
		stream = append(stream, rec...)
		ends = append(ends, len(stream))
	}
	for n := 0; n <= len(stream); n++ {
		recs, consumed, err := DecodeRecords(stream[:n], 0, 1<<20)
		whole := 0
		for whole < len(ends) && ends[whole] <= n {
			whole++
		}
		want := 0
		if whole > 0 {
			want = ends[whole-1]
		}
		if err != nil || consumed != want || len(recs) != whole {
			t.Fatalf("cut at %d: %d records, consumed %d, err %v; want %d records, consumed %d", n, len(recs), consumed, err, whole, want)
		}
	}
}

// TestDecodeCutHeader: a header cut short is checked as far as it goes.
func TestDecodeCutHeader(t *testing.T) {
	claim := encodeClaim(Claim{Epoch: 1})
	for _, tc := range []struct {
		tail, want string
	}{
		{"U", ""},
		{"URSQ\x01\x02\x00", ""},
		{"UX", `bad magic "UX"`},
		{"URSQ\x02", ""},
		{"URSQ\x03", "unknown version 3"},
		{"URSQ\x01\x07", "unknown record kind 7"},
		{"URSQ\x01\x01\x00\x01", "flags 0100 are not zero"},
		{"URSQ\x01\x01\x00\x00\x00\x00\x10\x00", "record of 1048592 bytes is over the 65536 byte limit"},
	} {
		recs, consumed, err := DecodeRecords(append(bytes.Clone(claim), tc.tail...), 0, 64<<10)
		if len(recs) != 1 || consumed != len(claim) {
			t.Errorf("%q: %d records, consumed %d", tc.tail, len(recs), consumed)
		}
		var fe *frameError
		if tc.want == "" && err != nil || tc.want != "" && (!errors.As(err, &fe) || fe.Offset != uint64(len(claim)) || !strings.Contains(fe.Reason, tc.want)) {
			t.Errorf("%q: err %v, want %q", tc.tail, err, tc.want)
		}
	}
}

func TestSnapshotRoundTrip(t *testing.T) {
	for _, h := range []SnapshotHeader{
		{PageSize: 4096, DBPages: 3, Epoch: 7, Offset: 123456},
		{PageSize: 512, DBPages: 1},
		{PageSize: 65536, DBPages: 40, Epoch: ^uint64(0), Offset: ^uint64(0)},
	} {
		var image []byte
		for i := range h.DBPages {
			image = append(image, testPage(int(h.PageSize), uint64(i))...)
		}
		blob, err := EncodeSnapshot(h, image)
		if err != nil {
			t.Fatal(err)
		}
		gh, gi, err := decodeSnapshot(blob, len(image))
		if err != nil || gh != h || !bytes.Equal(gi, image) {
			t.Fatalf("round trip of %+v: got %+v, %d bytes, err %v", h, gh, len(gi), err)
		}
	}
	// An all-zero image compresses about as far as zstd goes; it must still pass the
	// decoder's ratio check.
	h := SnapshotHeader{PageSize: 65536, DBPages: 256}
	zero := make([]byte, 256*65536)
	blob, err := EncodeSnapshot(h, zero)
	if err != nil {
		t.Fatal(err)
	}
	if _, gi, err := decodeSnapshot(blob, len(zero)); err != nil || !bytes.Equal(gi, zero) {
		t.Fatalf("zero image of %d bytes (%d compressed): err %v", len(zero), len(blob), err)
	}
}

func TestEncodeSnapshotRefuses(t *testing.T) {
	for _, tc := range []struct {
		h     SnapshotHeader
		image int
		want  string
	}{
		{SnapshotHeader{PageSize: 4000, DBPages: 1}, 4000, "page size 4000"},
		{SnapshotHeader{PageSize: 4096, DBPages: 0}, 0, "database size is 0"},
		{SnapshotHeader{PageSize: 4096, DBPages: 2}, 4096, "image is 4096 bytes, want 2 pages of 4096 = 8192"},
	} {
		if _, err := EncodeSnapshot(tc.h, make([]byte, tc.image)); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: err %v, want %q", tc.h, err, tc.want)
		}
	}
}

func TestDecodeSnapshotDamage(t *testing.T) {
	h := SnapshotHeader{PageSize: 1024, DBPages: 4, Epoch: 2, Offset: 99}
	good, err := encodeSnapshotV1(h, bytes.Repeat(testPage(1024, 1), 4))
	if err != nil {
		t.Fatal(err)
	}
	// reseal sets the length and CRC fields to match after an edit.
	reseal := func(b []byte) []byte {
		le.PutUint32(b[36:], uint32(len(b)-snapshotHeaderSize))
		le.PutUint32(b[32:], checksum(b[:32], b[snapshotHeaderSize:]))
		return b
	}
	edit := func(f func(b []byte) []byte) []byte { return f(bytes.Clone(good)) }
	for _, tc := range []struct {
		name     string
		blob     []byte
		maxImage int
		want     string
	}{
		{"empty", nil, 1 << 20, "0 bytes, shorter than the 40 byte header"},
		{"header cut", good[:39], 1 << 20, "39 bytes, shorter"},
		{"payload cut", good[:len(good)-1], 1 << 20, "payload bytes, blob has"},
		{"trailing bytes", append(bytes.Clone(good), 0), 1 << 20, "payload bytes, blob has"},
		{"bad magic", edit(func(b []byte) []byte { b[3] = 'Q'; return b }), 1 << 20, `bad magic "URSQ"`},
		{"version", edit(func(b []byte) []byte { b[4] = 3; return b }), 1 << 20, "unknown version 3"},
		{"reserved", edit(func(b []byte) []byte { b[6] = 1; return b }), 1 << 20, "reserved bytes 000100 are not zero"},
		{"crc", edit(func(b []byte) []byte { b[50] ^= 1; return b }), 1 << 20, "crc32c mismatch"},
		{"crc of epoch", edit(func(b []byte) []byte { b[16] ^= 1; return b }), 1 << 20, "crc32c mismatch"},
		{"page size", edit(func(b []byte) []byte { le.PutUint32(b[8:], 1000); return reseal(b) }), 1 << 20, "page size 1000"},
		{"db size 0", edit(func(b []byte) []byte { le.PutUint32(b[12:], 0); return reseal(b) }), 1 << 20, "database size is 0 pages"},
		{"over maxImage", good, 4095, "image of 4096 bytes is over the 4095 byte limit"},
		{"fewer pages than image", edit(func(b []byte) []byte { le.PutUint32(b[12:], 3); return reseal(b) }), 1 << 20, "body of 4096 bytes is over the 3072 byte limit"},
		{"more pages than image", edit(func(b []byte) []byte { le.PutUint32(b[12:], 5); return reseal(b) }), 1 << 20, "image is 4096 bytes, want 5120"},
		{"not zstd", reseal(append(bytes.Clone(good[:snapshotHeaderSize]), "nope, not zstd"...)), 1 << 20, "bad zstd payload"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, image, err := decodeSnapshot(tc.blob, tc.maxImage)
			if !errors.Is(err, errBadSnapshot) || !strings.Contains(err.Error(), tc.want) || image != nil {
				t.Fatalf("err %v, image %d bytes; want errBadSnapshot containing %q", err, len(image), tc.want)
			}
		})
	}
}

// TestConcurrentCodec shares the package encoder and decoder between goroutines (run it
// with -race).
func TestConcurrentCodec(t *testing.T) {
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := range 20 {
				c := testCommit(4096, 100, uint32(g+1), uint32(50+i))
				rec, err := encodeCommit(c)
				if err != nil {
					t.Error(err)
					return
				}
				recs, _, err := DecodeRecords(rec, 0, 1<<20)
				if err != nil || len(recs) != 1 || !reflect.DeepEqual(recs[0].Commit, c) {
					t.Errorf("goroutine %d: round trip failed: %v", g, err)
					return
				}
			}
		})
	}
	wg.Wait()
}

// FuzzDecodeRecords decodes arbitrary bytes. mode 0 decodes them as they are, mode 1 first
// fixes every whole record's CRC (to reach zstd and the body checks), mode 2 frames them
// as a compressed version 1 body and mode 3 as a version 2 one (to reach the body checks
// with valid zstd).
func FuzzDecodeRecords(f *testing.F) {
	seed := append(mustCommit(f, testCommit(512, 4, 1, 3)), encodeClaim(Claim{Epoch: 9, Nonce: [16]byte{1}})...)
	for mode := range byte(3) {
		f.Add(seed, mode)
		f.Add(seed[:len(seed)-5], mode)
		f.Add(encodeClaim(Claim{Epoch: 1}), mode)
		f.Add(rawRecord(1, 1, 0, rawZstd(commitBody(512, 2, []uint32{1, 2}, 512), -1)), mode)
	}
	f.Add(commitBody(512, 2, []uint32{1, 2}, 512), byte(2))
	f.Add(commitBody(1024, 9, []uint32{3}, 1024), byte(2))
	f.Add(append(le.AppendUint64(nil, 1_700_000_000_000_000_000), commitBody(512, 2, []uint32{2}, 512)...), byte(3))
	f.Add(bodyRecord(KindCommit, commitBody(512, 2, []uint32{1, 2}, 512)), byte(0)) // an old, version 1 record
	f.Fuzz(func(t *testing.T, data []byte, mode byte) {
		b := data
		switch mode % 4 {
		case 3: // a version 2 body: time, then the version 1 body
			if len(data) == 0 {
				return
			}
			b = rawRecord(2, 1+data[0]&1, 0, encoder.EncodeAll(data[1:], nil))
		case 1:
			b = fixCRCs(bytes.Clone(data))
		case 2:
			if len(data) == 0 {
				return
			}
			b = bodyRecord(RecordKind(1+data[0]&1), data[1:])
		}
		checkDecode(t, b)
	})
}

// fixCRCs rewrites the CRC of every whole record in b.
func fixCRCs(b []byte) []byte {
	for at := 0; len(b)-at >= recordHeaderSize; {
		end := uint64(at) + recordHeaderSize + uint64(le.Uint32(b[at+8:]))
		if end > uint64(len(b)) {
			break
		}
		le.PutUint32(b[at+12:], checksum(b[at:at+12], b[at+recordHeaderSize:end]))
		at = int(end)
	}
	return b
}

func checkDecode(t *testing.T, b []byte) {
	const base = 77
	recs, consumed, err := DecodeRecords(b, base, 1<<20)
	if consumed < 0 || consumed > len(b) {
		t.Fatalf("consumed %d of %d", consumed, len(b))
	}
	at := uint64(base)
	for _, r := range recs {
		if r.Offset != at || r.End <= r.Offset {
			t.Fatalf("record [%d,%d) does not follow %d", r.Offset, r.End, at)
		}
		at = r.End
		switch {
		case r.Kind == KindCommit && r.Commit != nil && r.Claim == nil:
			rec, err := encodeCommit(r.Commit)
			if err != nil {
				t.Fatalf("decoded commit does not encode: %v", err)
			}
			again, _, err := DecodeRecords(rec, 0, 0)
			if err != nil || len(again) != 1 || !reflect.DeepEqual(again[0].Commit, r.Commit) {
				t.Fatalf("re-encoded commit decodes differently (err %v)", err)
			}
		case r.Kind == KindClaim && r.Claim != nil && r.Commit == nil:
			again, _, err := DecodeRecords(encodeClaim(*r.Claim), 0, 0)
			if err != nil || len(again) != 1 || *again[0].Claim != *r.Claim {
				t.Fatalf("re-encoded claim decodes differently (err %v)", err)
			}
		default:
			t.Fatalf("record of kind %v with commit %v, claim %v", r.Kind, r.Commit != nil, r.Claim != nil)
		}
	}
	if at != base+uint64(consumed) {
		t.Fatalf("records end at %d, consumed says %d", at, base+consumed)
	}
	if err != nil {
		var fe *frameError
		if !errors.As(err, &fe) || fe.Offset != at {
			t.Fatalf("error %v: want a *frameError at %d, just after the last record", err, at)
		}
	}
}

// FuzzDecodeSnapshot decodes arbitrary blobs; with fix set, the length and CRC fields
// are first made to match.
func FuzzDecodeSnapshot(f *testing.F) {
	good, _ := encodeSnapshotV1(SnapshotHeader{PageSize: 512, DBPages: 2, Epoch: 3, Offset: 4}, bytes.Repeat(testPage(512, 5), 2))
	v2, _ := EncodeSnapshot(SnapshotHeader{PageSize: 512, DBPages: 300, Epoch: 3, Offset: 4}, bytes.Repeat(testPage(512, 5), 300))
	f.Add(v2, false)
	f.Add(good, false)
	f.Add(good, true)
	f.Add(good[:30], false)
	raw := append(bytes.Clone(good[:snapshotHeaderSize]), rawZstd(make([]byte, 1024), -1)...)
	f.Add(raw, true)
	f.Fuzz(func(t *testing.T, b []byte, fix bool) {
		if fix && len(b) >= snapshotHeaderSize {
			b = bytes.Clone(b)
			le.PutUint32(b[36:], uint32(len(b)-snapshotHeaderSize))
			le.PutUint32(b[32:], checksum(b[:32], b[snapshotHeaderSize:]))
		}
		h, image, err := decodeSnapshot(b, 1<<22)
		if err != nil {
			if !errors.Is(err, errBadSnapshot) || image != nil {
				t.Fatalf("err %v with %d image bytes", err, len(image))
			}
			return
		}
		if uint64(len(image)) != uint64(h.DBPages)*uint64(h.PageSize) {
			t.Fatalf("image of %d bytes for %+v", len(image), h)
		}
		blob, err := EncodeSnapshot(h, image)
		if err != nil {
			t.Fatal(err)
		}
		h2, image2, err := decodeSnapshot(blob, 1<<22)
		if err != nil || h2 != h || !bytes.Equal(image2, image) {
			t.Fatalf("re-encoded snapshot decodes differently (err %v)", err)
		}
	})
}

// typicalCommit is a 10-page transaction of 4 KiB pages.
func typicalCommit() *Commit {
	return testCommit(4096, 5000, 1, 17, 230, 231, 232, 1024, 1025, 2048, 4000, 4999)
}

func BenchmarkEncodeCommit(b *testing.B) {
	c := typicalCommit()
	b.SetBytes(int64(len(c.Pages)) * int64(c.PageSize))
	var n int
	for b.Loop() {
		rec, err := encodeCommit(c)
		if err != nil {
			b.Fatal(err)
		}
		n = len(rec)
	}
	b.ReportMetric(float64(n), "record-bytes")
}

func BenchmarkDecodeRecords(b *testing.B) {
	c := typicalCommit()
	rec := mustCommit(b, c)
	b.SetBytes(int64(len(c.Pages)) * int64(c.PageSize))
	for b.Loop() {
		if _, _, err := DecodeRecords(rec, 0, 1<<20); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(len(rec)), "record-bytes")
}

// TestVersion1RecordsStillDecode: records written before commit times existed (version 1)
// decode as they did, with no time; version 2 records carry the time they were given.
func TestVersion1RecordsStillDecode(t *testing.T) {
	claimBody := make([]byte, 24)
	le.PutUint64(claimBody, 7)
	old := append(bodyRecord(KindClaim, claimBody), bodyRecord(KindCommit, commitBody(512, 2, []uint32{1, 2}, 512))...)
	const when = 1_700_000_000_123_456_789
	cm := testCommit(512, 2, 2)
	cm.UnixNano = when
	stream := append(old, mustCommit(t, cm)...)
	stream = append(stream, encodeClaim(Claim{Epoch: 8, UnixNano: when + 1})...)
	recs, consumed, err := DecodeRecords(stream, 0, 1<<20)
	if err != nil || consumed != len(stream) || len(recs) != 4 {
		t.Fatalf("decoded %d records, consumed %d of %d: %v", len(recs), consumed, len(stream), err)
	}
	if recs[0].Claim.Epoch != 7 || recs[0].Claim.UnixNano != 0 || recs[1].Commit.UnixNano != 0 || len(recs[1].Commit.Pages) != 2 {
		t.Errorf("version 1 records decoded as %+v %+v", recs[0].Claim, recs[1].Commit)
	}
	if !reflect.DeepEqual(recs[2].Commit, cm) || recs[3].Claim.UnixNano != when+1 || recs[3].Claim.Epoch != 8 {
		t.Errorf("version 2 records decoded as %+v %+v", recs[2].Commit, recs[3].Claim)
	}
}

// TestDecodeNewerVersion (checklist-vfs T60, AB234): a whole, sound record of a version
// above the ones this build reads is refused by name as a newer version's (it wraps
// errForeignFormat), not as damage; one cut short is waited for; one whose checksum or
// flags fail is damage.
func TestDecodeNewerVersion(t *testing.T) {
	claim := encodeClaim(Claim{Epoch: 1})
	v3 := rawRecord(3, byte(KindClaim), 0, encoder.EncodeAll(make([]byte, 32), nil))
	badCRC := bytes.Clone(v3)
	badCRC[len(badCRC)-1] ^= 1
	for _, tc := range []struct {
		name            string
		rec             []byte
		foreign, damage bool
	}{
		{"whole", v3, true, false},
		{"cut", v3[:len(v3)-1], false, false},
		{"header cut", v3[:10], false, true},
		{"bad crc", badCRC, false, true},
		{"flags", rawRecord(3, byte(KindClaim), 1, encoder.EncodeAll(make([]byte, 32), nil)), false, true},
	} {
		recs, consumed, err := DecodeRecords(append(bytes.Clone(claim), tc.rec...), 0, 64<<10)
		if len(recs) != 1 || consumed != len(claim) {
			t.Errorf("%s: %d records, consumed %d", tc.name, len(recs), consumed)
		}
		var fe *frameError
		switch {
		case tc.foreign && (!errors.Is(err, errForeignFormat) || !strings.Contains(err.Error(), "newer version") || strings.Contains(err.Error(), "damaged")):
			t.Errorf("%s: %v, want a newer version's record refused by name", tc.name, err)
		case tc.damage && (!errors.As(err, &fe) || fe.Foreign):
			t.Errorf("%s: %v, want damage", tc.name, err)
		case !tc.foreign && !tc.damage && err != nil:
			t.Errorf("%s: %v, want to wait for the rest", tc.name, err)
		}
	}
}
