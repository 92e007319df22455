package replicator

import (
	"bytes"
	"errors"
	"io"
	"math/rand/v2"
	"testing"
)

// memAt is an io.WriterAt over a growing byte slice.
type memAt struct{ b []byte }

func (m *memAt) WriteAt(p []byte, off int64) (int, error) {
	if end := off + int64(len(p)); end > int64(len(m.b)) {
		m.b = append(m.b, make([]byte, end-int64(len(m.b)))...)
	}
	return copy(m.b[off:], p), nil
}

func streamImage(h SnapshotHeader, seed uint64) []byte {
	var image []byte
	for i := range h.DBPages {
		image = append(image, testPage(int(h.PageSize), seed+uint64(i))...)
	}
	return image
}

// The stream codec and the in-memory one read each other's blobs: old and new snapshots
// interoperate.
func TestSnapshotStreamInterop(t *testing.T) {
	noisy := make([]byte, 3<<20)
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range noisy {
		if i%3 == 0 {
			noisy[i] = byte(rng.Uint32())
		}
	}
	cases := []struct {
		h     SnapshotHeader
		image []byte
	}{
		{SnapshotHeader{PageSize: 4096, DBPages: 3, Epoch: 7, Offset: 123456}, nil},
		{SnapshotHeader{PageSize: 512, DBPages: 1}, nil},
		{SnapshotHeader{PageSize: 65536, DBPages: 40, Epoch: ^uint64(0), Offset: ^uint64(0)}, nil},
		{SnapshotHeader{PageSize: 65536, DBPages: 256}, make([]byte, 256*65536)}, // far over the zstd ratio of one block
		{SnapshotHeader{PageSize: 4096, DBPages: 768, Offset: 9}, noisy},         // several blocks and windows
	}
	for _, tc := range cases {
		image := tc.image
		if image == nil {
			image = streamImage(tc.h, 3)
		}
		var w memAt
		n, err := writeSnapshot(&w, tc.h, bytes.NewReader(image))
		if err != nil || n != int64(len(w.b)) {
			t.Fatalf("write %+v: %d bytes of %d, %v", tc.h, n, len(w.b), err)
		}
		gh, gi, err := decodeSnapshot(w.b, len(image))
		if err != nil || gh != tc.h || !bytes.Equal(gi, image) {
			t.Fatalf("decodeSnapshot of a streamed blob %+v: %+v, %v", tc.h, gh, err)
		}
		old, err := EncodeSnapshot(tc.h, image)
		if err != nil {
			t.Fatal(err)
		}
		v1, err := encodeSnapshotV1(tc.h, image)
		if err != nil {
			t.Fatal(err)
		}
		var w1 memAt
		if _, err := writeSnapshotV1(&w1, tc.h, bytes.NewReader(image)); err != nil {
			t.Fatal(err)
		}
		if gh, gi, err := decodeSnapshot(v1, len(image)); err != nil || gh != tc.h || !bytes.Equal(gi, image) {
			t.Fatalf("decodeSnapshot of a version 1 blob %+v: %+v, %v", tc.h, gh, err)
		}
		for name, blob := range map[string][]byte{"stream": w.b, "encode": old, "version 1": v1, "version 1 stream": w1.b} {
			var dst memAt
			gh, n, err := readSnapshot(bytes.NewReader(blob), &dst, maxSnapshotBody, maxSnapshotImage)
			if err != nil || gh != tc.h || n != int64(len(blob)) || !bytes.Equal(dst.b, image) {
				t.Fatalf("readSnapshot of the %s blob %+v: %+v, %d of %d bytes, %v", name, tc.h, gh, n, len(blob), err)
			}
		}
	}
}

func TestWriteSnapshotRefuses(t *testing.T) {
	var w memAt
	if _, err := writeSnapshot(&w, SnapshotHeader{PageSize: 4096, DBPages: 2}, bytes.NewReader(make([]byte, 4096))); err == nil {
		t.Fatal("a short image was encoded")
	}
	if _, err := writeSnapshot(&w, SnapshotHeader{PageSize: 1000, DBPages: 1}, bytes.NewReader(make([]byte, 1000))); err == nil {
		t.Fatal("a bad page size was encoded")
	}
}

type failReader struct{ err error }

func (f failReader) Read([]byte) (int, error) { return 0, f.err }

func TestReadSnapshotDamage(t *testing.T) {
	h := SnapshotHeader{PageSize: 4096, DBPages: 64, Epoch: 1, Offset: 2}
	var w memAt
	if _, err := writeSnapshotV1(&w, h, bytes.NewReader(streamImage(h, 9))); err != nil {
		t.Fatal(err)
	}
	good := w.b
	mut := func(f func(b []byte) []byte) []byte { return f(bytes.Clone(good)) }
	fix := func(b []byte) []byte {
		le.PutUint32(b[36:], uint32(len(b)-snapshotHeaderSize))
		le.PutUint32(b[32:], checksum(b[:32], b[snapshotHeaderSize:]))
		return b
	}
	for _, tc := range []struct {
		name              string
		blob              []byte
		maxBody, maxImage int64
	}{
		{"empty", nil, maxSnapshotBody, maxSnapshotImage},
		{"cut header", good[:20], maxSnapshotBody, maxSnapshotImage},
		{"cut payload", good[:len(good)-10], maxSnapshotBody, maxSnapshotImage},
		{"bad magic", mut(func(b []byte) []byte { b[0] = 'X'; return b }), maxSnapshotBody, maxSnapshotImage},
		{"bad version", mut(func(b []byte) []byte { b[4] = 9; return b }), maxSnapshotBody, maxSnapshotImage},
		{"reserved", mut(func(b []byte) []byte { b[6] = 1; return b }), maxSnapshotBody, maxSnapshotImage},
		{"page size", mut(func(b []byte) []byte { le.PutUint32(b[8:], 1000); return b }), maxSnapshotBody, maxSnapshotImage},
		{"flipped payload byte", mut(func(b []byte) []byte { b[len(b)/2] ^= 1; return b }), maxSnapshotBody, maxSnapshotImage},
		{"flipped offset", mut(func(b []byte) []byte { b[24] ^= 1; return b }), maxSnapshotBody, maxSnapshotImage},
		{"trailing bytes", mut(func(b []byte) []byte { return fix(append(b, 0, 0, 0, 0)) }), maxSnapshotBody, maxSnapshotImage},
		{"more pages declared", mut(func(b []byte) []byte { le.PutUint32(b[12:], 65); return fix(b) }), maxSnapshotBody, maxSnapshotImage},
		{"fewer pages declared", mut(func(b []byte) []byte { le.PutUint32(b[12:], 63); return fix(b) }), maxSnapshotBody, maxSnapshotImage},
		{"huge image declared", mut(func(b []byte) []byte { le.PutUint32(b[12:], 1<<31); return fix(b) }), maxSnapshotBody, maxSnapshotImage},
		{"body over the limit", good, int64(len(good) - 1), maxSnapshotImage},
		{"image over the limit", good, maxSnapshotBody, 64*4096 - 1},
	} {
		var dst memAt
		_, _, err := readSnapshot(bytes.NewReader(tc.blob), &dst, tc.maxBody, tc.maxImage)
		if !errors.Is(err, errBadSnapshot) {
			t.Errorf("%s: err %v, want errBadSnapshot", tc.name, err)
		}
		if len(dst.b) > 64*4096 {
			t.Errorf("%s: wrote %d bytes", tc.name, len(dst.b))
		}
	}
	// A failing transport is not damage.
	boom := errors.New("boom")
	_, _, err := readSnapshot(io.MultiReader(bytes.NewReader(good[:100]), failReader{boom}), &memAt{}, maxSnapshotBody, maxSnapshotImage)
	if !errors.Is(err, boom) || errors.Is(err, errBadSnapshot) {
		t.Fatalf("transport failure: %v", err)
	}
}

// limitAt refuses writes past a bound, so a fuzzed blob cannot make readSnapshot write
// (or allocate) much.
type limitAt struct {
	memAt
	limit int64
}

func (l *limitAt) WriteAt(p []byte, off int64) (int, error) {
	if off+int64(len(p)) > l.limit {
		return 0, errors.New("write past the image limit")
	}
	return l.memAt.WriteAt(p, off)
}

func FuzzReadSnapshot(f *testing.F) {
	h := SnapshotHeader{PageSize: 512, DBPages: 2, Epoch: 3, Offset: 4}
	old, _ := encodeSnapshotV1(h, bytes.Repeat(testPage(512, 5), 2))
	var w memAt
	writeSnapshot(&w, h, bytes.NewReader(bytes.Repeat(testPage(512, 5), 2)))
	f.Add(old, false)
	f.Add(w.b, true)
	f.Add(old[:30], false)
	f.Add(append(bytes.Clone(old[:snapshotHeaderSize]), rawZstd(make([]byte, 1024), -1)...), true)
	const maxImage = 1 << 22
	f.Fuzz(func(t *testing.T, b []byte, fix bool) {
		if fix && len(b) >= snapshotHeaderSize {
			b = bytes.Clone(b)
			le.PutUint32(b[36:], uint32(len(b)-snapshotHeaderSize))
			le.PutUint32(b[32:], checksum(b[:32], b[snapshotHeaderSize:]))
		}
		dst := &limitAt{limit: maxImage}
		h, n, err := readSnapshot(bytes.NewReader(b), dst, maxSnapshotBody, maxImage)
		// Whatever decodeSnapshot says of the blob, the stream reader says too.
		dh, image, derr := decodeSnapshot(b, maxImage)
		if (err == nil) != (derr == nil) {
			t.Fatalf("readSnapshot err %v, decodeSnapshot err %v", err, derr)
		}
		if err != nil {
			if !errors.Is(err, errBadSnapshot) {
				t.Fatalf("err %v does not wrap errBadSnapshot", err)
			}
			return
		}
		if h != dh || n != int64(len(b)) || !bytes.Equal(dst.b, image) {
			t.Fatalf("readSnapshot %+v %d bytes, decodeSnapshot %+v", h, n, dh)
		}
	})
}
