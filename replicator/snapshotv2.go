package replicator

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"math"

	"github.com/ursula-go/ursula/client"
)

// Snapshot blob version 2: page-addressable. The image is cut into independent zstd
// frames of a fixed number of pages, and an index right after the header gives each
// frame's byte range and CRC, so a reader gets the header and index with one ranged GET
// and then any frame by range (package lazy), while a full restore still reads the blob
// front to back (readSnapshot). docs/frame-format.md describes the bytes.

const (
	snapshotVersion2       = 2
	snapshotV2HeaderSize   = 48
	snapshotIndexEntrySize = 16 // offset u64, length u32, crc u32
	// snapshotFrameImage is how much image one frame holds when a writer cuts it: small
	// enough that a point lookup fetches little, large enough that zstd still compresses.
	snapshotFrameImage = 64 << 10
	// maxSnapshotFrameImage bounds one frame's image on read: a reader allocates that much.
	maxSnapshotFrameImage = 16 << 20
)

// SnapshotFrame is one entry of a version 2 snapshot's index: where the frame's bytes are
// in the blob and the CRC-32C of those bytes.
type SnapshotFrame struct {
	Offset uint64
	Length uint32
	CRC    uint32
}

// SnapshotIndex is the header and index of a version 2 snapshot blob: enough to fetch
// and check any frame alone.
type SnapshotIndex struct {
	SnapshotHeader
	PagesPerFrame uint32
	Frames        []SnapshotFrame
	Size          uint64 // the whole blob's size: just past the last frame
}

// SnapshotPrefixLen tells, from the first bytes of a snapshot blob (at least 40), the
// blob's version and how many bytes from its start hold the header and, in version 2,
// the index: what ParseSnapshotIndex needs.
func SnapshotPrefixLen(b []byte) (version int, n int64, err error) {
	if len(b) < snapshotHeaderSize {
		return 0, 0, fmt.Errorf("%w: %d bytes, shorter than the %d byte header", errBadSnapshot, len(b), snapshotHeaderSize)
	}
	if [4]byte(b[:4]) != snapshotMagic {
		return 0, 0, fmt.Errorf("%w: bad magic %q", errBadSnapshot, b[:4])
	}
	switch b[4] {
	case snapshotVersion:
		return snapshotVersion, snapshotHeaderSize, nil
	case snapshotVersion2:
		if len(b) < snapshotV2HeaderSize {
			return snapshotVersion2, snapshotV2HeaderSize, nil // ask again with the whole header
		}
		_, _, frames, err := parseV2Header(b)
		if err != nil {
			return 0, 0, err
		}
		return snapshotVersion2, snapshotV2HeaderSize + int64(frames)*snapshotIndexEntrySize, nil
	}
	return 0, 0, fmt.Errorf("%w: unknown version %d", errBadSnapshot, b[4])
}

// parseV2Header checks the fixed fields of a version 2 header (48 bytes) and returns the
// header, pages per frame and frame count. The crc is the caller's to check with the index.
func parseV2Header(b []byte) (SnapshotHeader, uint32, uint32, error) {
	bad := func(format string, args ...any) (SnapshotHeader, uint32, uint32, error) {
		return SnapshotHeader{}, 0, 0, fmt.Errorf("%w: %s", errBadSnapshot, fmt.Sprintf(format, args...))
	}
	if len(b) < snapshotV2HeaderSize {
		return bad("%d bytes, shorter than the %d byte version 2 header", len(b), snapshotV2HeaderSize)
	}
	if [4]byte(b[:4]) != snapshotMagic {
		return bad("bad magic %q", b[:4])
	}
	if b[4] != snapshotVersion2 {
		return bad("version %d, want 2", b[4])
	}
	if b[5]|b[6]|b[7] != 0 || le.Uint32(b[44:]) != 0 {
		return bad("reserved bytes are not zero")
	}
	h := SnapshotHeader{PageSize: le.Uint32(b[8:]), DBPages: le.Uint32(b[12:]), Epoch: le.Uint64(b[16:]), Offset: le.Uint64(b[24:])}
	if err := checkGeometry(h.PageSize, h.DBPages); err != nil {
		return bad("%v", err)
	}
	ppf, frames := le.Uint32(b[32:]), le.Uint32(b[36:])
	if ppf == 0 || uint64(ppf)*uint64(h.PageSize) > maxSnapshotFrameImage {
		return bad("%d pages per frame of %d bytes is outside 1..%d bytes", ppf, h.PageSize, maxSnapshotFrameImage)
	}
	if want := (uint64(h.DBPages) + uint64(ppf) - 1) / uint64(ppf); uint64(frames) != want {
		return bad("%d frames, want %d for %d pages of %d per frame", frames, want, h.DBPages, ppf)
	}
	return h, ppf, frames, nil
}

// ParseSnapshotIndex checks the header and index of a version 2 snapshot blob (b holds at
// least the prefix SnapshotPrefixLen gives) and returns them. maxBody bounds the blob's
// whole size. Damage is an error wrapping the package's damaged-snapshot error.
func ParseSnapshotIndex(b []byte, maxBody int64) (*SnapshotIndex, error) {
	bad := func(format string, args ...any) (*SnapshotIndex, error) {
		return nil, fmt.Errorf("%w: %s", errBadSnapshot, fmt.Sprintf(format, args...))
	}
	h, ppf, frames, err := parseV2Header(b)
	if err != nil {
		return nil, err
	}
	prefix := snapshotV2HeaderSize + uint64(frames)*snapshotIndexEntrySize
	if maxBody >= 0 && prefix > uint64(maxBody) {
		return bad("index of %d frames is over the %d byte body limit", frames, maxBody)
	}
	if uint64(len(b)) < prefix {
		return bad("%d bytes, shorter than the %d byte header and index", len(b), prefix)
	}
	if got, want := checksum(b[:40], b[snapshotV2HeaderSize:prefix]), le.Uint32(b[40:]); got != want {
		return bad("header and index crc32c mismatch: computed %08x, header says %08x", got, want)
	}
	x := &SnapshotIndex{SnapshotHeader: h, PagesPerFrame: ppf, Frames: make([]SnapshotFrame, frames)}
	pos := prefix
	for i := range x.Frames {
		e := b[snapshotV2HeaderSize+i*snapshotIndexEntrySize:]
		f := SnapshotFrame{Offset: le.Uint64(e), Length: le.Uint32(e[8:]), CRC: le.Uint32(e[12:])}
		if f.Offset != pos {
			return bad("frame %d starts at %d, want %d (frames follow each other)", i, f.Offset, pos)
		}
		_, n := x.FramePages(i)
		if f.Length == 0 || uint64(f.Length) > zstdBound(uint64(n)*uint64(h.PageSize)) {
			return bad("frame %d is %d bytes, outside 1..%d for its %d pages", i, f.Length, zstdBound(uint64(n)*uint64(h.PageSize)), n)
		}
		pos += uint64(f.Length)
		if maxBody >= 0 && pos > uint64(maxBody) {
			return bad("body of at least %d bytes is over the %d byte limit", pos, maxBody)
		}
		x.Frames[i] = f
	}
	x.Size = pos
	return x, nil
}

// zstdBound is the most a zstd frame of n input bytes may take, with room to spare:
// zstd never expands input by more than a few bytes per 128 KiB block plus its header.
func zstdBound(n uint64) uint64 { return n + n>>7 + 1024 }

// FramePages returns the first page (1-based) of frame i and how many pages it holds.
func (x *SnapshotIndex) FramePages(i int) (first, n uint32) {
	first = uint32(i)*x.PagesPerFrame + 1
	return first, min(x.PagesPerFrame, x.DBPages-first+1)
}

// FrameOf returns the frame that holds page no (1..DBPages).
func (x *SnapshotIndex) FrameOf(no uint32) int { return int((no - 1) / x.PagesPerFrame) }

// DecodeFrame checks frame i's bytes (exactly its index entry's range) against its length
// and CRC and returns its pages' image. Damage is an error wrapping the package's
// damaged-snapshot error; it never returns an image that does not match the index.
func (x *SnapshotIndex) DecodeFrame(i int, b []byte) ([]byte, error) {
	bad := func(format string, args ...any) ([]byte, error) {
		return nil, fmt.Errorf("%w: frame %d: %s", errBadSnapshot, i, fmt.Sprintf(format, args...))
	}
	if i < 0 || i >= len(x.Frames) {
		return bad("no such frame (the snapshot has %d)", len(x.Frames))
	}
	f := x.Frames[i]
	if uint64(len(b)) != uint64(f.Length) {
		return bad("%d bytes, the index says %d", len(b), f.Length)
	}
	if got := crc32.Checksum(b, castagnoli); got != f.CRC {
		return bad("crc32c mismatch: computed %08x, index says %08x", got, f.CRC)
	}
	_, n := x.FramePages(i)
	size := int(n) * int(x.PageSize)
	image, err := unzstd(b, size)
	if err != nil {
		return bad("%v", err)
	}
	if len(image) != size {
		return bad("image is %d bytes, want %d pages of %d", len(image), n, x.PageSize)
	}
	return image, nil
}

// writeSnapshotV2 writes the version 2 blob of the image (h.DBPages*h.PageSize bytes read
// from image) to w: the frames from just past the index on, then the index and header,
// whose crc is known only at the end. It returns the blob size.
func writeSnapshotV2(w io.WriterAt, h SnapshotHeader, image io.Reader) (int64, error) {
	if err := checkGeometry(h.PageSize, h.DBPages); err != nil {
		return 0, fmt.Errorf("ursula: encode snapshot: %w", err)
	}
	ppf := max(1, uint32(snapshotFrameImage/h.PageSize))
	frames := (uint64(h.DBPages) + uint64(ppf) - 1) / uint64(ppf)
	x := &SnapshotIndex{SnapshotHeader: h, PagesPerFrame: ppf, Frames: make([]SnapshotFrame, frames)}
	prefix := make([]byte, snapshotV2HeaderSize+frames*snapshotIndexEntrySize)
	pos := uint64(len(prefix))
	raw := make([]byte, uint64(ppf)*uint64(h.PageSize))
	var out, zeroOut []byte
	zeroLen := -1
	for i := range x.Frames {
		_, n := x.FramePages(i)
		buf := raw[:uint64(n)*uint64(h.PageSize)]
		if got, err := io.ReadFull(image, buf); err != nil {
			if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
				return 0, fmt.Errorf("ursula: encode snapshot: image is %d bytes, want %d pages of %d = %d",
					uint64(i)*uint64(ppf)*uint64(h.PageSize)+uint64(got), h.DBPages, h.PageSize, uint64(h.DBPages)*uint64(h.PageSize))
			}
			return 0, fmt.Errorf("ursula: encode snapshot: %w", err)
		}
		if isZero(buf) && zeroLen == len(buf) {
			// A run of zero pages (a sparse or freshly grown file) encodes the same each
			// time: reuse the encoding instead of compressing it again.
			out = append(out[:0], zeroOut...)
		} else {
			out = encoder.EncodeAll(buf, out[:0])
			if isZero(buf) {
				zeroOut, zeroLen = append([]byte(nil), out...), len(buf)
			}
		}
		if len(out) > math.MaxUint32 {
			return 0, fmt.Errorf("ursula: encode snapshot: frame %d does not fit the format", i)
		}
		if _, err := w.WriteAt(out, int64(pos)); err != nil {
			return 0, fmt.Errorf("ursula: encode snapshot: %w", err)
		}
		x.Frames[i] = SnapshotFrame{Offset: pos, Length: uint32(len(out)), CRC: crc32.Checksum(out, castagnoli)}
		pos += uint64(len(out))
	}
	copy(prefix, snapshotMagic[:])
	prefix[4] = snapshotVersion2
	le.PutUint32(prefix[8:], h.PageSize)
	le.PutUint32(prefix[12:], h.DBPages)
	le.PutUint64(prefix[16:], h.Epoch)
	le.PutUint64(prefix[24:], h.Offset)
	le.PutUint32(prefix[32:], ppf)
	le.PutUint32(prefix[36:], uint32(frames))
	for i, f := range x.Frames {
		e := prefix[snapshotV2HeaderSize+i*snapshotIndexEntrySize:]
		le.PutUint64(e, f.Offset)
		le.PutUint32(e[8:], f.Length)
		le.PutUint32(e[12:], f.CRC)
	}
	le.PutUint32(prefix[40:], checksum(prefix[:40], prefix[snapshotV2HeaderSize:]))
	if _, err := w.WriteAt(prefix, 0); err != nil {
		return 0, fmt.Errorf("ursula: encode snapshot: %w", err)
	}
	return int64(pos), nil
}

// isZero reports whether b holds only zero bytes.
func isZero(b []byte) bool {
	for len(b) >= len(zeroPage) {
		if !bytes.Equal(b[:len(zeroPage)], zeroPage[:]) {
			return false
		}
		b = b[len(zeroPage):]
	}
	return bytes.Equal(b, zeroPage[:len(b)])
}

var zeroPage [64 << 10]byte

// WriteSnapshot writes the snapshot blob (version 2) of the image of h.DBPages pages of
// h.PageSize bytes, read in order from image, to w, without holding the image in memory,
// and returns the blob size.
func WriteSnapshot(w io.WriterAt, h SnapshotHeader, image io.Reader) (int64, error) {
	return writeSnapshotV2(w, h, image)
}

// readSnapshotV2 goes on from readSnapshot once the first 40 bytes (head) said version 2:
// it reads the rest of the header and the index, then every frame in order, checks each
// and writes its pages to dst. Nothing may follow the last frame.
func readSnapshotV2(r io.Reader, head []byte, dst io.WriterAt, maxBody, maxImage int64) (SnapshotHeader, int64, error) {
	bad := func(format string, args ...any) (SnapshotHeader, int64, error) {
		return SnapshotHeader{}, 0, fmt.Errorf("%w: %s", errBadSnapshot, fmt.Sprintf(format, args...))
	}
	short := func(err error, what string) (SnapshotHeader, int64, error) {
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			return bad("the blob ends inside %s", what)
		}
		return SnapshotHeader{}, 0, err
	}
	b := make([]byte, snapshotV2HeaderSize)
	copy(b, head)
	if _, err := io.ReadFull(r, b[len(head):]); err != nil {
		return short(err, "the header")
	}
	h, _, frames, err := parseV2Header(b)
	if err != nil {
		return SnapshotHeader{}, 0, err
	}
	prefix := int64(snapshotV2HeaderSize) + int64(frames)*snapshotIndexEntrySize
	if prefix > maxBody {
		return bad("index of %d frames is over the %d byte body limit", frames, maxBody)
	}
	if size := int64(h.DBPages) * int64(h.PageSize); size > maxImage {
		return bad("image of %d bytes is over the %d byte limit", size, maxImage)
	}
	b = append(b, make([]byte, prefix-snapshotV2HeaderSize)...)
	if _, err := io.ReadFull(r, b[snapshotV2HeaderSize:]); err != nil {
		return short(err, "the index")
	}
	x, err := ParseSnapshotIndex(b, maxBody)
	if err != nil {
		return SnapshotHeader{}, 0, err
	}
	var frame []byte
	for i, f := range x.Frames {
		frame = append(frame[:0], make([]byte, f.Length)...)
		if _, err := io.ReadFull(r, frame); err != nil {
			return short(err, fmt.Sprintf("frame %d", i))
		}
		image, err := x.DecodeFrame(i, frame)
		if err != nil {
			return SnapshotHeader{}, 0, err
		}
		first, _ := x.FramePages(i)
		if _, err := dst.WriteAt(image, int64(first-1)*int64(h.PageSize)); err != nil {
			return SnapshotHeader{}, 0, err
		}
	}
	var one [1]byte
	if n, err := io.ReadFull(r, one[:]); n > 0 {
		return bad("bytes follow the last frame")
	} else if err != nil && !errors.Is(err, io.EOF) {
		return SnapshotHeader{}, 0, err
	}
	return h, int64(x.Size), nil
}

// decodeSnapshotV2 is decodeSnapshot for a version 2 blob in memory.
func decodeSnapshotV2(b []byte, maxImage int) (SnapshotHeader, []byte, error) {
	var dst sliceAt
	h, n, err := readSnapshotV2(bytes.NewReader(b[snapshotHeaderSize:]), b[:snapshotHeaderSize], &dst, int64(len(b)), int64(maxImage))
	if err != nil {
		return SnapshotHeader{}, nil, err
	}
	if n != int64(len(b)) {
		return SnapshotHeader{}, nil, fmt.Errorf("%w: the frames end at %d, the blob at %d", errBadSnapshot, n, len(b))
	}
	return h, dst.b, nil
}

// sliceAt is an io.WriterAt over a growing byte slice.
type sliceAt struct{ b []byte }

func (s *sliceAt) WriteAt(p []byte, off int64) (int, error) {
	if end := off + int64(len(p)); end > int64(len(s.b)) {
		s.b = append(s.b, make([]byte, end-int64(len(s.b)))...)
	}
	return copy(s.b[off:], p), nil
}

// EncodeSnapshot returns the snapshot blob (version 2) of a database image;
// len(image) must be h.DBPages*h.PageSize.
func EncodeSnapshot(h SnapshotHeader, image []byte) ([]byte, error) {
	if err := checkGeometry(h.PageSize, h.DBPages); err != nil {
		return nil, fmt.Errorf("ursula: encode snapshot: %w", err)
	}
	if want := uint64(h.DBPages) * uint64(h.PageSize); uint64(len(image)) != want {
		return nil, fmt.Errorf("ursula: encode snapshot: image is %d bytes, want %d pages of %d = %d", len(image), h.DBPages, h.PageSize, want)
	}
	var w sliceAt
	if _, err := writeSnapshotV2(&w, h, bytes.NewReader(image)); err != nil {
		return nil, err
	}
	return w.b, nil
}

// FetchSnapshot reads the whole snapshot published at off (a stream offset as the
// protocol writes it), of either version, into dst from offset 0, and returns its header.
// It is how a lazy reader installs a version 1 snapshot, which has no frames to fetch
// alone. Damage is a *Error of kind damaged; a failed read is classified as Restore's are.
func FetchSnapshot(ctx context.Context, c *client.Client, url, off string, dst io.WriterAt) (SnapshotHeader, error) {
	body, _, err := openSnapshot(ctx, c, url, off)
	if err != nil {
		return SnapshotHeader{}, classifyRead(err, "snapshot read")
	}
	defer body.Close()
	h, _, err := readSnapshot(body, dst, maxSnapshotBody, maxSnapshotImage)
	if errors.Is(err, errBadSnapshot) {
		return SnapshotHeader{}, newError(KindDamaged, ActionStop, err, "snapshot at %s", off)
	}
	if _, ok := err.(*client.Error); ok {
		return SnapshotHeader{}, classifyRead(err, "snapshot read")
	}
	return h, err
}

// IsDamagedSnapshot reports an error about a snapshot blob's contents (never about the
// transport).
func IsDamagedSnapshot(err error) bool { return errors.Is(err, errBadSnapshot) }

// ClassifyRead turns a client error of a stream or snapshot read into the typed *Error
// the rest of the package returns.
func ClassifyRead(err error, what string) error { return classifyRead(err, what) }
