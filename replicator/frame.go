package replicator

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"math"
	"slices"
	"sync"

	"github.com/klauspost/compress/zstd"
)

// This file holds the frame format: records (commit, claim; version 2, which adds the
// wall-clock time to every body, and version 1, still read) and the snapshot blob
// (version 1; version 2 in snapshotv2.go). docs/frame-format.md is its description; keep the two in step.

// RecordKind says what a record holds.
type RecordKind uint8

const (
	KindCommit RecordKind = 1 // the page images of one transaction
	KindClaim  RecordKind = 2 // an owner claiming the stream at an epoch
)

func (k RecordKind) String() string {
	switch k {
	case KindCommit:
		return "commit"
	case KindClaim:
		return "claim"
	}
	return fmt.Sprintf("kind(%d)", uint8(k))
}

// maxBodyBytes is the largest decompressed record body. encodeCommit refuses a larger
// commit and a record that declares more is damage.
const maxBodyBytes = 1 << 30

const (
	recordVersion      = 2 // what writers write; readers also take version 1
	snapshotVersion    = 1
	recordHeaderSize   = 16
	recordTimeSize     = 8  // version 2: the body starts with the time, Unix nanoseconds
	commitHeaderSize   = 12 // page size, db size, page count
	claimBodySize      = 24 // epoch, nonce
	snapshotHeaderSize = 40
	// A zstd frame may leave out its content size only when the body is this short
	// (the encoder below does so only under 256 bytes, and only claims are that short).
	maxUndeclaredBody = 255
	// No zstd frame decodes to more than 32768 bytes per compressed byte (an RLE block:
	// 4 bytes on the wire, at most 128 KiB out), so a larger declared size is a lie.
	maxZstdRatio = 32768
)

var (
	recordMagic   = [4]byte{'U', 'R', 'S', 'Q'}
	snapshotMagic = [4]byte{'U', 'R', 'S', 'S'}
	castagnoli    = crc32.MakeTable(crc32.Castagnoli)
	le            = binary.LittleEndian
)

// The encoders and the decoder serve every call: EncodeAll and DecodeAll are safe for
// concurrent use. Each decode passes a buffer sized to its own limit and the decoder never
// grows it (WithDecodeAllCapLimit), so a hostile frame cannot make it allocate more than
// that; WithDecoderMaxMemory is the backstop over all calls.
//
// A record is encoded while its commit waits, so records use zstd's fastest level: the
// pages of a 100-row transaction took 46-56 us against 76-77 us at the default level (p50
// inside BenchmarkCommit, where the encoder's tables are cold), for frames about 10%
// larger. Snapshots, built in the background, keep the default level (encoder). Records
// leave out zstd's content checksum: the record's CRC-32C covers the compressed bytes.
var (
	encoder, _       = zstd.NewWriter(nil, zstd.WithEncoderLevel(zstd.SpeedDefault))
	recordEncoder, _ = zstd.NewWriter(nil, zstd.WithEncoderLevel(zstd.SpeedFastest), zstd.WithEncoderCRC(false))
	decoder, _       = zstd.NewReader(nil,
		zstd.WithDecoderMaxMemory(1<<40),
		zstd.WithDecodeAllCapLimit(true),
		zstd.WithDecoderConcurrency(0))
)

// Page is one database page: its 1-based number and its bytes.
type Page struct {
	No   uint32
	Data []byte
}

// Commit is the body of a commit record: the final images of the pages one transaction
// changed and the database size after it.
type Commit struct {
	// UnixNano is the wall-clock time of the commit on the writer, in Unix nanoseconds;
	// 0 means not recorded (version 1 records). It lets people name a commit by time.
	UnixNano int64
	PageSize uint32 // 512..65536, a power of two
	DBPages  uint32 // database size after the commit, in pages; > 0
	Pages    []Page // strictly increasing page numbers in 1..DBPages, each PageSize bytes
}

// Claim is the body of a claim record: an owner taking the stream at Epoch. Nonce is
// random per claiming process, so the owner recognises its own claim when it reads it back.
type Claim struct {
	UnixNano int64 // wall-clock time of the claim (0: not recorded, version 1 records)
	Epoch    uint64
	Nonce    [16]byte
}

// Record is one decoded record. Exactly one of Commit and Claim is set, as Kind says.
type Record struct {
	Kind   RecordKind
	Commit *Commit
	Claim  *Claim
	Offset uint64 // stream offset of the record's first byte
	End    uint64 // stream offset just past the record: the next record's Offset
}

// frameError reports a damaged record: what is wrong with it and where it starts.
// Foreign: the record starts with the magic of another implementation's format, so it is
// not damage but a stream this version does not read.
type frameError struct {
	Offset  uint64 // stream offset of the damaged record
	Reason  string
	Foreign bool
}

func (e *frameError) Error() string {
	if e.Foreign {
		return fmt.Sprintf("ursula: record at stream offset %d: %s", e.Offset, e.Reason)
	}
	return fmt.Sprintf("ursula: damaged record at stream offset %d: %s", e.Offset, e.Reason)
}

func (e *frameError) Unwrap() error {
	if e.Foreign {
		return errForeignFormat
	}
	return nil
}

// errForeignFormat is wrapped by the errors about bytes in another implementation's
// format: the original sqlite-ursula-vfs writes commit frames starting USQ1 and snapshot
// bodies starting USS1 or USS2, whose layouts differ from ours (docs/frame-format.md).
// Such a stream is refused by name rather than reported as damaged.
var errForeignFormat = errors.New("ursula: the stream was written in another implementation's format")

// foreignMagic names the format whose magic b starts with ("" when none of them).
func foreignMagic(b []byte) string {
	switch string(b[:min(len(b), 4)]) {
	case "USQ1":
		return "USQ1 (commit frames of the original sqlite-ursula-vfs)"
	case "USS1":
		return "USS1 (snapshot bodies of sqlite-ursula-vfs before 0.7; not attachable by any current version)"
	case "USS2":
		return "USS2 (snapshot bodies of the original sqlite-ursula-vfs 0.7)"
	}
	return ""
}

// errBadSnapshot is wrapped by every error of decodeSnapshot and readSnapshot about the
// blob's contents.
var errBadSnapshot = errors.New("ursula: damaged snapshot")

// encodeCommit returns the commit record of c: header and zstd-compressed body. It refuses
// a commit that breaks the format (page size, database size, page order and range, page
// lengths, maxBodyBytes) with an error that says what is wrong.
func encodeCommit(c *Commit) ([]byte, error) {
	if c == nil {
		return nil, errors.New("ursula: encode commit: nil commit")
	}
	if err := c.validate(); err != nil {
		return nil, fmt.Errorf("ursula: encode commit: %w", err)
	}
	bp := commitBodies.Get().(*[]byte)
	body := slices.Grow((*bp)[:0], recordTimeSize+int(c.bodySize()))[:recordTimeSize+commitHeaderSize]
	defer func() {
		if cap(body) <= maxPooledBody {
			*bp = body[:0]
			commitBodies.Put(bp)
		}
	}()
	le.PutUint64(body[0:], uint64(c.UnixNano))
	le.PutUint32(body[8:], c.PageSize)
	le.PutUint32(body[12:], c.DBPages)
	le.PutUint32(body[16:], uint32(len(c.Pages)))
	for _, p := range c.Pages {
		body = le.AppendUint32(body, p.No)
		body = append(body, p.Data...)
	}
	return seal(KindCommit, body), nil
}

// commitBodies holds the uncompressed bodies encodeCommit builds: seal compresses a body
// into a record of its own, so the body is free again once it returns.
var commitBodies = sync.Pool{New: func() any { return new([]byte) }}

// sealScratch holds the room seal compresses into.
var sealScratch = sync.Pool{New: func() any { return new([]byte) }}

// maxPooledBody is the largest buffer kept for reuse; a large transaction's is left to the GC.
const maxPooledBody = 1 << 20

// encodeClaim returns the claim record of c.
func encodeClaim(c Claim) []byte {
	body := make([]byte, recordTimeSize+claimBodySize)
	le.PutUint64(body, uint64(c.UnixNano))
	le.PutUint64(body[8:], c.Epoch)
	copy(body[16:], c.Nonce[:])
	return seal(KindClaim, body)
}

// DecodeRecords decodes the consecutive records at the start of b, which holds stream
// bytes from offset base on. maxFrame bounds a record's whole size, header included
// (0 or less: only the format's own limits).
//
// b may end inside a record, since a read can stop anywhere: that is not an error, and
// consumed stops at the last whole record. Damage (bad magic, unknown version or kind,
// non-zero flags, a record over maxFrame, CRC mismatch, bad zstd, a body that breaks the
// format) is a *frameError naming the damaged record's offset; recs then holds the records
// before it, consumed ends where it starts, and nothing after it is decoded. A header cut
// short is checked as far as it goes, so damage is reported without waiting for more bytes.
func DecodeRecords(b []byte, base uint64, maxFrame int) (recs []Record, consumed int, err error) {
	for consumed < len(b) {
		rest := b[consumed:]
		off := base + uint64(consumed)
		if f := foreignMagic(rest); f != "" {
			return recs, consumed, &frameError{Offset: off, Foreign: true,
				Reason: "written in the format " + f + ", which this implementation does not read; attach it with the implementation that wrote it, or use a new stream URL"}
		}
		if newer, whole := newerRecord(rest, maxFrame); newer && !whole {
			break // a newer version's record, not whole yet: judged when it is
		} else if newer {
			// A newer version of this implementation wrote it (checklist-vfs AB234): not
			// damage, a format this build does not read. Refused by name, like a foreign one.
			return recs, consumed, &frameError{Offset: off, Foreign: true, Reason: fmt.Sprintf(
				"unknown version %d: written by a newer version of this implementation (this one reads record versions 1 to %d); attach it with that version or later, or use a new stream URL",
				rest[4], recordVersion)}
		}
		if reason := checkHeader(rest[:min(len(rest), recordHeaderSize)], maxFrame); reason != "" {
			return recs, consumed, &frameError{Offset: off, Reason: reason}
		}
		if len(rest) < recordHeaderSize {
			break
		}
		size := recordHeaderSize + uint64(le.Uint32(rest[8:]))
		if uint64(len(rest)) < size {
			break
		}
		rec := rest[:size]
		if got, want := checksum(rec[:12], rec[recordHeaderSize:]), le.Uint32(rec[12:]); got != want {
			return recs, consumed, &frameError{Offset: off, Reason: fmt.Sprintf("crc32c mismatch: computed %08x, header says %08x", got, want)}
		}
		r, err := decodeBody(rec[4], RecordKind(rec[5]), rec[recordHeaderSize:])
		if err != nil {
			return recs, consumed, &frameError{Offset: off, Reason: err.Error()}
		}
		r.Offset, r.End = off, off+size
		recs = append(recs, r)
		consumed += int(size)
	}
	return recs, consumed, nil
}

// SnapshotHeader describes a snapshot blob: the database geometry, the highest epoch
// claimed in the folded records, and the stream offset (a record boundary) the snapshot
// folds the stream up to.
type SnapshotHeader struct {
	PageSize, DBPages uint32
	Epoch, Offset     uint64
}

// encodeSnapshotV1 returns the version 1 snapshot blob of a database image;
// len(image) must be h.DBPages*h.PageSize. Writers produce version 2 (EncodeSnapshot);
// this stays so tests can check that readers still read version 1.
func encodeSnapshotV1(h SnapshotHeader, image []byte) ([]byte, error) {
	if err := checkGeometry(h.PageSize, h.DBPages); err != nil {
		return nil, fmt.Errorf("ursula: encode snapshot: %w", err)
	}
	if want := uint64(h.DBPages) * uint64(h.PageSize); uint64(len(image)) != want {
		return nil, fmt.Errorf("ursula: encode snapshot: image is %d bytes, want %d pages of %d = %d", len(image), h.DBPages, h.PageSize, want)
	}
	blob := make([]byte, snapshotHeaderSize, snapshotHeaderSize+len(image)/4+64)
	blob = encoder.EncodeAll(image, blob)
	payload := blob[snapshotHeaderSize:]
	if len(payload) > math.MaxUint32 {
		return nil, fmt.Errorf("ursula: encode snapshot: compressed image of %d bytes does not fit the format", len(payload))
	}
	copy(blob, snapshotMagic[:])
	blob[4] = snapshotVersion
	blob[5], blob[6], blob[7] = 0, 0, 0
	le.PutUint32(blob[8:], h.PageSize)
	le.PutUint32(blob[12:], h.DBPages)
	le.PutUint64(blob[16:], h.Epoch)
	le.PutUint64(blob[24:], h.Offset)
	le.PutUint32(blob[32:], checksum(blob[:32], payload))
	le.PutUint32(blob[36:], uint32(len(payload)))
	return blob, nil
}

// parseSnapshotHeader checks the magic, version and reserved bytes of a snapshot header
// (snapshotHeaderSize bytes) and returns its fields; the geometry, length and crc are the
// caller's to check, in its order.
func parseSnapshotHeader(b []byte) (SnapshotHeader, error) {
	bad := func(format string, args ...any) (SnapshotHeader, error) {
		return SnapshotHeader{}, fmt.Errorf("%w: %s", errBadSnapshot, fmt.Sprintf(format, args...))
	}
	if f := foreignMagic(b); f != "" {
		// Also errBadSnapshot: a reader that can do without the snapshot still may.
		return SnapshotHeader{}, fmt.Errorf("%w: %w: the snapshot body is in the format %s, which this implementation does not read",
			errForeignFormat, errBadSnapshot, f)
	}
	if [4]byte(b[:4]) != snapshotMagic {
		return bad("bad magic %q", b[:4])
	}
	if b[4] != snapshotVersion {
		return bad("unknown version %d", b[4])
	}
	if b[5]|b[6]|b[7] != 0 {
		return bad("reserved bytes %x are not zero", b[5:8])
	}
	return SnapshotHeader{PageSize: le.Uint32(b[8:]), DBPages: le.Uint32(b[12:]), Epoch: le.Uint64(b[16:]), Offset: le.Uint64(b[24:])}, nil
}

// decodeSnapshot checks a snapshot blob and returns its header and database image. An image
// over maxImage bytes is refused before anything is decompressed. Damage is an error
// wrapping errBadSnapshot.
func decodeSnapshot(b []byte, maxImage int) (SnapshotHeader, []byte, error) {
	bad := func(format string, args ...any) (SnapshotHeader, []byte, error) {
		return SnapshotHeader{}, nil, fmt.Errorf("%w: %s", errBadSnapshot, fmt.Sprintf(format, args...))
	}
	if len(b) < snapshotHeaderSize {
		return bad("%d bytes, shorter than the %d byte header", len(b), snapshotHeaderSize)
	}
	if [4]byte(b[:4]) == snapshotMagic && b[4] == snapshotVersion2 {
		return decodeSnapshotV2(b, maxImage)
	}
	h, err := parseSnapshotHeader(b[:snapshotHeaderSize])
	if err != nil {
		return SnapshotHeader{}, nil, err
	}
	if n := le.Uint32(b[36:]); uint64(n) != uint64(len(b)-snapshotHeaderSize) {
		return bad("header says %d payload bytes, blob has %d", n, len(b)-snapshotHeaderSize)
	}
	payload := b[snapshotHeaderSize:]
	if got, want := checksum(b[:32], payload), le.Uint32(b[32:]); got != want {
		return bad("crc32c mismatch: computed %08x, header says %08x", got, want)
	}
	if err := checkGeometry(h.PageSize, h.DBPages); err != nil {
		return bad("%v", err)
	}
	size := uint64(h.DBPages) * uint64(h.PageSize)
	if maxImage < 0 || size > uint64(maxImage) {
		return bad("image of %d bytes is over the %d byte limit", size, maxImage)
	}
	image, err := unzstd(payload, int(size))
	if err != nil {
		return bad("%v", err)
	}
	if uint64(len(image)) != size {
		return bad("image is %d bytes, want %d", len(image), size)
	}
	return h, image, nil
}

// seal frames a body as a record of the given kind.
func seal(kind RecordKind, body []byte) []byte {
	// Compress into pooled room for the worst case, then keep only what the record
	// takes: a commit of a few pages compresses to a fraction of its size.
	sp := sealScratch.Get().(*[]byte)
	out := recordEncoder.EncodeAll(body, slices.Grow((*sp)[:0], recordHeaderSize+len(body)+64)[:recordHeaderSize])
	rec := slices.Clone(out)
	if cap(out) <= maxPooledBody {
		*sp = out[:0]
		sealScratch.Put(sp)
	}
	copy(rec, recordMagic[:])
	rec[4] = recordVersion
	rec[5] = byte(kind)
	rec[6], rec[7] = 0, 0 // flags
	le.PutUint32(rec[8:], uint32(len(rec)-recordHeaderSize))
	le.PutUint32(rec[12:], checksum(rec[:12], rec[recordHeaderSize:]))
	return rec
}

// newerRecord reports whether b starts with a record of a version above recordVersion
// whose header is whole and sound (our magic, zero flags, a length within maxFrame), and
// whether the record is whole with a matching checksum. A newer record that is whole but
// fails its checksum, or whose header is cut short, is left to checkHeader: damage.
func newerRecord(b []byte, maxFrame int) (newer, whole bool) {
	if len(b) < recordHeaderSize || [4]byte(b[:4]) != recordMagic || b[4] <= recordVersion || b[6] != 0 || b[7] != 0 {
		return false, false
	}
	size := recordHeaderSize + uint64(le.Uint32(b[8:]))
	if maxFrame > 0 && size > uint64(maxFrame) {
		return false, false
	}
	if uint64(len(b)) < size {
		return true, false
	}
	if checksum(b[:12], b[recordHeaderSize:size]) != le.Uint32(b[12:]) {
		return false, false
	}
	return true, true
}

// checkHeader checks the fields of a record header that h (possibly cut short) holds.
func checkHeader(h []byte, maxFrame int) string {
	n := len(h)
	switch {
	case string(h[:min(n, 4)]) != string(recordMagic[:min(n, 4)]):
		return fmt.Sprintf("bad magic %q", h[:min(n, 4)])
	case n > 4 && (h[4] < 1 || h[4] > recordVersion):
		return fmt.Sprintf("unknown version %d", h[4])
	case n > 5 && RecordKind(h[5]) != KindCommit && RecordKind(h[5]) != KindClaim:
		return fmt.Sprintf("unknown record kind %d", h[5])
	case n > 7 && (h[6] != 0 || h[7] != 0):
		return fmt.Sprintf("flags %04x are not zero", le.Uint16(h[6:]))
	case n >= 12 && maxFrame > 0 && recordHeaderSize+uint64(le.Uint32(h[8:])) > uint64(maxFrame):
		return fmt.Sprintf("record of %d bytes is over the %d byte limit", recordHeaderSize+uint64(le.Uint32(h[8:])), maxFrame)
	}
	return ""
}

func decodeBody(version byte, kind RecordKind, payload []byte) (Record, error) {
	timed := 0 // bytes of time in front of the version 1 body
	if version >= 2 {
		timed = recordTimeSize
	}
	if kind == KindClaim {
		body, err := unzstd(payload, timed+claimBodySize)
		if err != nil {
			return Record{}, err
		}
		if len(body) != timed+claimBodySize {
			return Record{}, fmt.Errorf("claim body is %d bytes, want %d", len(body), timed+claimBodySize)
		}
		c := &Claim{}
		if timed > 0 {
			c.UnixNano = int64(le.Uint64(body))
		}
		body = body[timed:]
		c.Epoch = le.Uint64(body)
		copy(c.Nonce[:], body[8:])
		return Record{Kind: kind, Claim: c}, nil
	}
	body, err := unzstd(payload, timed+maxBodyBytes)
	if err != nil {
		return Record{}, err
	}
	if len(body) < timed {
		return Record{}, fmt.Errorf("commit body of %d bytes is shorter than its time", len(body))
	}
	c, err := parseCommit(body[timed:])
	if err != nil {
		return Record{}, fmt.Errorf("commit body: %w", err)
	}
	if timed > 0 {
		c.UnixNano = int64(le.Uint64(body))
	}
	return Record{Kind: kind, Commit: c}, nil
}

// parseCommit reads a commit body. The pages' Data alias body.
func parseCommit(body []byte) (*Commit, error) {
	if len(body) < commitHeaderSize {
		return nil, fmt.Errorf("%d bytes, shorter than its %d byte header", len(body), commitHeaderSize)
	}
	c := &Commit{PageSize: le.Uint32(body[0:]), DBPages: le.Uint32(body[4:])}
	if err := checkGeometry(c.PageSize, c.DBPages); err != nil {
		return nil, err
	}
	n := le.Uint32(body[8:])
	if want := commitHeaderSize + uint64(n)*(4+uint64(c.PageSize)); uint64(len(body)) != want {
		return nil, fmt.Errorf("%d bytes, want %d for %d pages of %d", len(body), want, n, c.PageSize)
	}
	c.Pages = make([]Page, n)
	ps := int(c.PageSize)
	for i := range c.Pages {
		rest := body[commitHeaderSize+i*(4+ps):]
		c.Pages[i] = Page{No: le.Uint32(rest), Data: rest[4 : 4+ps : 4+ps]}
	}
	return c, c.validate()
}

// validate checks c against the format.
func (c *Commit) validate() error {
	if err := checkGeometry(c.PageSize, c.DBPages); err != nil {
		return err
	}
	if len(c.Pages) == 0 {
		return errors.New("no pages")
	}
	if size := c.bodySize(); size > maxBodyBytes {
		return fmt.Errorf("body of %d bytes is over the %d byte limit", size, maxBodyBytes)
	}
	var prev uint32
	for i, p := range c.Pages {
		switch {
		case p.No == 0 || p.No > c.DBPages:
			return fmt.Errorf("page %d (#%d) is outside 1..%d", p.No, i, c.DBPages)
		case p.No <= prev:
			return fmt.Errorf("page %d (#%d) does not follow page %d: numbers must be strictly increasing", p.No, i, prev)
		case uint64(len(p.Data)) != uint64(c.PageSize):
			return fmt.Errorf("page %d is %d bytes, want %d", p.No, len(p.Data), c.PageSize)
		}
		prev = p.No
	}
	return nil
}

func (c *Commit) bodySize() uint64 {
	return commitHeaderSize + uint64(len(c.Pages))*(4+uint64(c.PageSize))
}

func checkGeometry(pageSize, dbPages uint32) error {
	if pageSize < 512 || pageSize > 65536 || pageSize&(pageSize-1) != 0 {
		return fmt.Errorf("page size %d is not a power of two in 512..65536", pageSize)
	}
	if dbPages == 0 {
		return errors.New("database size is 0 pages")
	}
	return nil
}

// unzstd decompresses a payload that must decode to at most limit bytes. It allocates what
// the zstd frame declares (no more than limit, nor than the payload can decode to) and the
// decoder never grows that buffer.
func unzstd(payload []byte, limit int) ([]byte, error) {
	var h zstd.Header
	if err := h.Decode(payload); err != nil {
		return nil, fmt.Errorf("bad zstd payload: %v", err)
	}
	size := uint64(min(limit, maxUndeclaredBody))
	if h.HasFCS {
		size = h.FrameContentSize
	}
	switch {
	case h.Skippable:
		return nil, errors.New("bad zstd payload: a skippable frame")
	case h.DictionaryID != 0:
		return nil, fmt.Errorf("bad zstd payload: needs dictionary %d", h.DictionaryID)
	case size > uint64(limit):
		return nil, fmt.Errorf("body of %d bytes is over the %d byte limit", size, limit)
	case size > uint64(len(payload))*maxZstdRatio:
		return nil, fmt.Errorf("bad zstd payload: %d compressed bytes cannot decode to the %d it declares", len(payload), size)
	}
	out, err := decoder.DecodeAll(payload, make([]byte, 0, size))
	if errors.Is(err, zstd.ErrDecoderSizeExceeded) {
		return nil, fmt.Errorf("bad zstd payload: decodes to more than %d bytes", size)
	}
	if err != nil {
		return nil, fmt.Errorf("bad zstd payload: %v", err)
	}
	return out, nil
}

func checksum(head, payload []byte) uint32 {
	return crc32.Update(crc32.Update(0, castagnoli, head), castagnoli, payload)
}
