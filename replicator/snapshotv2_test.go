package replicator

import (
	"bytes"
	"errors"
	"strings"
	"testing"
)

// v2Blob returns a version 2 blob of dbPages pages of 4 KiB (16 pages per frame).
func v2Blob(t testing.TB, dbPages uint32) (SnapshotHeader, []byte, []byte) {
	h := SnapshotHeader{PageSize: 4096, DBPages: dbPages, Epoch: 5, Offset: 777}
	image := streamImage(h, 11)
	blob, err := EncodeSnapshot(h, image)
	if err != nil {
		t.Fatal(err)
	}
	return h, image, blob
}

// Every frame decodes alone, by its index entry, to its pages of the image.
func TestSnapshotV2Frames(t *testing.T) {
	h, image, blob := v2Blob(t, 37) // 3 frames, the last one short
	ver, n, err := SnapshotPrefixLen(blob[:snapshotHeaderSize])
	if err != nil || ver != 2 || n != snapshotV2HeaderSize {
		t.Fatalf("prefix of the first 40 bytes: version %d, %d bytes, %v", ver, n, err)
	}
	ver, n, err = SnapshotPrefixLen(blob[:snapshotV2HeaderSize])
	if err != nil || ver != 2 || n != snapshotV2HeaderSize+3*snapshotIndexEntrySize {
		t.Fatalf("prefix: version %d, %d bytes, %v", ver, n, err)
	}
	x, err := ParseSnapshotIndex(blob[:n], int64(len(blob)))
	if err != nil || x.SnapshotHeader != h || len(x.Frames) != 3 || x.Size != uint64(len(blob)) {
		t.Fatalf("index %+v, %v", x, err)
	}
	for i, f := range x.Frames {
		got, err := x.DecodeFrame(i, blob[f.Offset:f.Offset+uint64(f.Length)])
		first, np := x.FramePages(i)
		want := image[int(first-1)*4096 : int(first-1+np)*4096]
		if err != nil || !bytes.Equal(got, want) {
			t.Fatalf("frame %d: %d bytes, %v", i, len(got), err)
		}
		if x.FrameOf(first) != i || x.FrameOf(first+np-1) != i {
			t.Fatalf("FrameOf of frame %d's pages", i)
		}
	}
	if v1, _ := encodeSnapshotV1(h, image); true {
		if ver, _, err := SnapshotPrefixLen(v1); ver != 1 || err != nil {
			t.Fatalf("version 1 blob: version %d, %v", ver, err)
		}
	}
}

// A truncated frame, a wrong index or a checksum mismatch is a clear error, never an image.
func TestSnapshotV2Damage(t *testing.T) {
	_, image, good := v2Blob(t, 40)
	x, err := ParseSnapshotIndex(good, int64(len(good)))
	if err != nil {
		t.Fatal(err)
	}
	prefix := int(x.Frames[0].Offset)
	reseal := func(b []byte) []byte {
		le.PutUint32(b[40:], checksum(b[:40], b[snapshotV2HeaderSize:prefix]))
		return b
	}
	edit := func(f func(b []byte) []byte) []byte { return f(bytes.Clone(good)) }
	f1 := x.Frames[1]
	for _, tc := range []struct {
		name, want string
		blob       []byte
	}{
		{"cut in a frame", "ends inside frame 2", good[:len(good)-3]},
		{"cut in the index", "ends inside the index", good[:prefix-3]},
		{"trailing bytes", "bytes follow the last frame", append(bytes.Clone(good), 1)},
		{"frame byte flipped", "frame 1: crc32c mismatch", edit(func(b []byte) []byte { b[f1.Offset+5] ^= 1; return b })},
		{"index crc", "header and index crc32c mismatch", edit(func(b []byte) []byte { b[snapshotV2HeaderSize+3] ^= 1; return b })},
		{"header crc", "header and index crc32c mismatch", edit(func(b []byte) []byte { b[16] ^= 1; return b })},
		{"frame offset", "frame 1 starts at", edit(func(b []byte) []byte {
			le.PutUint64(b[snapshotV2HeaderSize+snapshotIndexEntrySize:], f1.Offset+1)
			return reseal(b)
		})},
		{"frame length", "frame 1: crc32c mismatch", edit(func(b []byte) []byte {
			// Frame 1 claims one byte more, frame 2 one less: the ranges still tile.
			le.PutUint32(b[snapshotV2HeaderSize+snapshotIndexEntrySize+8:], f1.Length+1)
			le.PutUint64(b[snapshotV2HeaderSize+2*snapshotIndexEntrySize:], x.Frames[2].Offset+1)
			le.PutUint32(b[snapshotV2HeaderSize+2*snapshotIndexEntrySize+8:], x.Frames[2].Length-1)
			return reseal(b)
		})},
		{"frame count", "frames, want", edit(func(b []byte) []byte { le.PutUint32(b[36:], 2); return b })},
		{"pages per frame", "pages per frame", edit(func(b []byte) []byte { le.PutUint32(b[32:], 0); return b })},
		{"reserved", "reserved bytes", edit(func(b []byte) []byte { b[45] = 1; return b })},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, img, err := decodeSnapshot(tc.blob, len(image)); !errors.Is(err, errBadSnapshot) || img != nil {
				t.Fatalf("decodeSnapshot: err %v, %d bytes; want errBadSnapshot", err, len(img))
			}
			var dst memAt
			_, _, err := readSnapshot(bytes.NewReader(tc.blob), &dst, maxSnapshotBody, maxSnapshotImage)
			if !errors.Is(err, errBadSnapshot) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("readSnapshot: err %v; want errBadSnapshot containing %q", err, tc.want)
			}
		})
	}
	// A frame cut short or taken from another range is refused alone too.
	if _, err := x.DecodeFrame(1, good[f1.Offset:f1.Offset+uint64(f1.Length)-1]); !errors.Is(err, errBadSnapshot) {
		t.Fatalf("short frame: %v", err)
	}
	f0 := x.Frames[0]
	if _, err := x.DecodeFrame(1, good[f0.Offset:f0.Offset+uint64(f1.Length)]); !errors.Is(err, errBadSnapshot) {
		t.Fatalf("wrong range: %v", err)
	}
}

// FuzzSnapshotV2 feeds arbitrary bytes to the version 2 decoder: the index parser and the
// frame decoder (what a lazy reader uses) agree with the whole-blob reader, and neither
// panics nor returns an image that does not match.
func FuzzSnapshotV2(f *testing.F) {
	h := SnapshotHeader{PageSize: 512, DBPages: 300, Epoch: 1, Offset: 2}
	good, _ := EncodeSnapshot(h, streamImage(h, 3))
	f.Add(good, false)
	f.Add(good[:200], false)
	f.Add(good[:len(good)-1], true)
	f.Fuzz(func(t *testing.T, b []byte, reseal bool) {
		if len(b) >= snapshotV2HeaderSize && reseal {
			b = bytes.Clone(b)
			b[0], b[1], b[2], b[3], b[4] = 'U', 'R', 'S', 'S', 2
			if _, n, err := SnapshotPrefixLen(b); err == nil && n <= int64(len(b)) {
				le.PutUint32(b[40:], checksum(b[:40], b[snapshotV2HeaderSize:n]))
			}
		}
		const maxImage = 1 << 22
		dh, image, derr := decodeSnapshot(b, maxImage)
		if derr != nil && !errors.Is(derr, errBadSnapshot) {
			t.Fatalf("err %v does not wrap errBadSnapshot", derr)
		}
		ver, n, err := SnapshotPrefixLen(b)
		if err != nil || ver != 2 || n > int64(len(b)) {
			return
		}
		x, err := ParseSnapshotIndex(b, int64(len(b)))
		if err != nil {
			if derr == nil {
				t.Fatalf("index refused (%v) but the blob decodes", err)
			}
			return
		}
		var lazy []byte
		for i, fr := range x.Frames {
			if fr.Offset+uint64(fr.Length) > uint64(len(b)) {
				return
			}
			img, err := x.DecodeFrame(i, b[fr.Offset:fr.Offset+uint64(fr.Length)])
			if err != nil {
				if !errors.Is(err, errBadSnapshot) || img != nil {
					t.Fatalf("frame %d: %v with %d bytes", i, err, len(img))
				}
				return
			}
			lazy = append(lazy, img...)
		}
		if derr == nil && (dh != x.SnapshotHeader || !bytes.Equal(lazy, image)) {
			t.Fatalf("frames and whole blob decode differently")
		}
	})
}
