package replicator

import (
	"bufio"
	"errors"
	"fmt"
	"hash"
	"hash/crc32"
	"io"
	"math"

	"github.com/klauspost/compress/zstd"
)

// Streaming form of the snapshot blob: the same bytes as EncodeSnapshot / decodeSnapshot
// (40-byte header, then one zstd frame that declares its content size), written and read
// through a few MiB of buffers instead of the whole image and the whole body in memory,
// so databases of many GiB publish and install.

const (
	// maxSnapshotBody is the largest snapshot body (header and compressed image) a
	// rebuild accepts: the largest body the server stores (Ursula-Max-Snapshot-Bytes).
	maxSnapshotBody = 1 << 30
	// snapshotMaxWindow bounds the zstd window a streaming install keeps. Our encoder uses
	// 8 MiB (SpeedDefault); a frame asking for more is not one of ours.
	snapshotMaxWindow = 64 << 20
	// snapshotChunk is how much image one read or write of the stream codec moves.
	snapshotChunk = 1 << 20
)

// writeSnapshot writes the snapshot blob (version 2, snapshotv2.go) of the image (h.DBPages*h.PageSize bytes read
// from image) to w: the compressed image from byte 40 on, then the header at 0, whose
// crc and length are known only at the end. It returns the blob size.
func writeSnapshot(w io.WriterAt, h SnapshotHeader, image io.Reader) (int64, error) {
	return writeSnapshotV2(w, h, image)
}

// writeSnapshotV1 is writeSnapshot for version 1 blobs, kept for tests of readers.
func writeSnapshotV1(w io.WriterAt, h SnapshotHeader, image io.Reader) (int64, error) {
	if err := checkGeometry(h.PageSize, h.DBPages); err != nil {
		return 0, fmt.Errorf("ursula: encode snapshot: %w", err)
	}
	size := int64(h.DBPages) * int64(h.PageSize)
	var head [snapshotHeaderSize]byte
	copy(head[:], snapshotMagic[:])
	head[4] = snapshotVersion
	le.PutUint32(head[8:], h.PageSize)
	le.PutUint32(head[12:], h.DBPages)
	le.PutUint64(head[16:], h.Epoch)
	le.PutUint64(head[24:], h.Offset)

	out := &crcWriter{w: io.NewOffsetWriter(w, snapshotHeaderSize), crc: crc32.New(castagnoli)}
	out.crc.Write(head[:32])
	bw := bufio.NewWriterSize(out, snapshotChunk)
	enc, err := zstd.NewWriter(nil, zstd.WithEncoderLevel(zstd.SpeedDefault), zstd.WithEncoderConcurrency(2))
	if err != nil {
		return 0, err
	}
	enc.ResetContentSize(bw, size)
	n, err := io.CopyBuffer(enc, io.LimitReader(image, size), make([]byte, snapshotChunk))
	if err == nil && n != size {
		err = fmt.Errorf("image is %d bytes, want %d pages of %d = %d", n, h.DBPages, h.PageSize, size)
	}
	if cerr := enc.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = bw.Flush()
	}
	if err != nil {
		return 0, fmt.Errorf("ursula: encode snapshot: %w", err)
	}
	if out.n > math.MaxUint32 {
		return 0, fmt.Errorf("ursula: encode snapshot: compressed image of %d bytes does not fit the format", out.n)
	}
	le.PutUint32(head[32:], out.crc.Sum32())
	le.PutUint32(head[36:], uint32(out.n))
	if _, err := w.WriteAt(head[:], 0); err != nil {
		return 0, fmt.Errorf("ursula: encode snapshot: %w", err)
	}
	return snapshotHeaderSize + out.n, nil
}

type crcWriter struct {
	w   io.Writer
	crc hash.Hash32
	n   int64
}

func (c *crcWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.crc.Write(p[:n])
	c.n += int64(n)
	return n, err
}

// readSnapshot reads a snapshot blob from r and writes its image to dst from offset 0. A
// blob over maxBody bytes or an image over maxImage is refused from the header, before
// anything is decompressed; the zstd window is bounded, so damaged input never makes it
// allocate more than a few tens of MiB. The crc covers the whole payload and is checked
// at its end: on an error dst may hold part of an image and is to be discarded. Damage is
// an error wrapping errBadSnapshot; a failing r or dst is returned as it is. It returns
// the header and the blob size.
func readSnapshot(r io.Reader, dst io.WriterAt, maxBody, maxImage int64) (SnapshotHeader, int64, error) {
	bad := func(format string, args ...any) (SnapshotHeader, int64, error) {
		return SnapshotHeader{}, 0, fmt.Errorf("%w: %s", errBadSnapshot, fmt.Sprintf(format, args...))
	}
	var b [snapshotHeaderSize]byte
	if n, err := io.ReadFull(r, b[:]); err != nil {
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			return bad("%d bytes, shorter than the %d byte header", n, snapshotHeaderSize)
		}
		return SnapshotHeader{}, 0, err
	}
	if [4]byte(b[:4]) == snapshotMagic && b[4] == snapshotVersion2 {
		return readSnapshotV2(r, b[:], dst, maxBody, maxImage)
	}
	h, err := parseSnapshotHeader(b[:])
	if err != nil {
		return SnapshotHeader{}, 0, err
	}
	if err := checkGeometry(h.PageSize, h.DBPages); err != nil {
		return bad("%v", err)
	}
	payloadLen := int64(le.Uint32(b[36:]))
	if snapshotHeaderSize+payloadLen > maxBody {
		return bad("body of %d bytes is over the %d byte limit", snapshotHeaderSize+payloadLen, maxBody)
	}
	size := int64(h.DBPages) * int64(h.PageSize)
	if size > maxImage {
		return bad("image of %d bytes is over the %d byte limit", size, maxImage)
	}
	crc := crc32.New(castagnoli)
	crc.Write(b[:32])
	src := &countingReader{r: io.TeeReader(io.LimitReader(r, payloadLen), crc)}
	br := bufio.NewReaderSize(src, 64<<10)
	var zh zstd.Header
	peek, _ := br.Peek(zstd.HeaderMaxSize)
	if err := zh.Decode(peek); err != nil {
		return bad("bad zstd payload: %v", err)
	}
	switch {
	case zh.Skippable:
		return bad("bad zstd payload: a skippable frame")
	case zh.DictionaryID != 0:
		return bad("bad zstd payload: needs dictionary %d", zh.DictionaryID)
	case zh.HasFCS && zh.FrameContentSize != uint64(size):
		return bad("zstd frame holds %d bytes, the header says %d", zh.FrameContentSize, size)
	case !zh.HasFCS && size > maxUndeclaredBody:
		return bad("bad zstd payload: no content size for an image of %d bytes", size)
	}
	dec, err := zstd.NewReader(br, zstd.WithDecoderConcurrency(2), zstd.WithDecoderMaxWindow(snapshotMaxWindow))
	if err != nil {
		return bad("bad zstd payload: %v", err)
	}
	defer dec.Close()
	buf := make([]byte, snapshotChunk)
	var off int64
	for {
		n, rerr := io.ReadFull(dec, buf)
		if n > 0 {
			if off+int64(n) > size {
				return bad("image decodes to more than the %d bytes the header says", size)
			}
			if _, err := dst.WriteAt(buf[:n], off); err != nil {
				return SnapshotHeader{}, 0, err
			}
			off += int64(n)
		}
		if rerr == io.EOF || rerr == io.ErrUnexpectedEOF {
			break
		}
		if rerr != nil {
			if src.err != nil {
				return SnapshotHeader{}, 0, src.err // the transport, not the blob
			}
			return bad("bad zstd payload: %v", rerr)
		}
	}
	if src.err != nil {
		return SnapshotHeader{}, 0, src.err
	}
	if off != size {
		return bad("image is %d bytes, want %d", off, size)
	}
	// The frame ended: nothing may follow it inside the payload.
	if rest, _ := io.Copy(io.Discard, br); rest != 0 {
		return bad("%d bytes follow the zstd frame", rest)
	}
	if src.err != nil {
		return SnapshotHeader{}, 0, src.err
	}
	if src.n != payloadLen {
		return bad("header says %d payload bytes, blob has %d", payloadLen, src.n)
	}
	if got, want := crc.Sum32(), le.Uint32(b[32:]); got != want {
		return bad("crc32c mismatch: computed %08x, header says %08x", got, want)
	}
	return h, snapshotHeaderSize + payloadLen, nil
}

// countingReader counts bytes and keeps the first error other than EOF, so a transport
// failure is told apart from a damaged frame.
type countingReader struct {
	r   io.Reader
	n   int64
	err error
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	if err != nil && err != io.EOF && c.err == nil {
		c.err = err
	}
	return n, err
}
