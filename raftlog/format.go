package raftlog

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"time"

	"github.com/hashicorp/raft"
)

// On-disk layout; see the package documentation for the full description.
const (
	segMagic      = "UNODELOG"
	formatVersion = 1
	segHeaderSize = 32

	frameMagic0     = 0x4e // 'N'
	frameMagic1     = 0x4c // 'L'
	frameHeaderSize = 24

	// flagAfterSync marks a frame written when every byte before it in the
	// segment had been fsynced. Recovery uses it to tell a torn tail (only
	// unsynced frames after the damage) from damage to synced data.
	flagAfterSync = 0x01

	// entryHeaderSize: index u64, term u64, type u8, appended-at seconds i64,
	// appended-at nanoseconds u32, data length u32, extensions length u32.
	entryHeaderSize = 37

	// recordSplitBytes is where a StoreLogs batch is cut into a run of records,
	// so recovery and GetLog never have to handle one huge payload.
	recordSplitBytes = 1 << 20
	// maxEntryBytes bounds one encoded entry; offsets in the index are uint32.
	maxEntryBytes = 256 << 20
	// nilLen marks a nil Data or Extensions (as opposed to an empty one) in
	// the length field, so GetLog returns exactly what was stored.
	nilLen = 1 << 31
	// maxPayloadBytes bounds a record payload (one oversized entry + count).
	maxPayloadBytes = maxEntryBytes + 4
)

// Record types.
const (
	recEntries     byte = 1 // a run of consecutive raft log entries of one group
	recDeleteRange byte = 2 // min u64, max u64 (inclusive) of one group
	recStable      byte = 3 // one or more stable-store key/value pairs of one group
	recShutdown    byte = 4 // empty; written by Close as the last record
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// errTorn means the bytes end before a complete frame: an interrupted write.
var errTorn = errors.New("incomplete frame")

// errCorrupt wraps every verification failure of a complete frame.
var errCorrupt = errors.New("corrupt frame")

func encodeSegHeader(b []byte, segID uint64) {
	copy(b[0:8], segMagic)
	binary.LittleEndian.PutUint32(b[8:12], formatVersion)
	binary.LittleEndian.PutUint32(b[12:16], 0)
	binary.LittleEndian.PutUint64(b[16:24], segID)
	binary.LittleEndian.PutUint32(b[24:28], 0)
	binary.LittleEndian.PutUint32(b[28:32], crc32.Checksum(b[0:28], castagnoli))
}

// checkSegHeader verifies a segment header. A short header is errTorn.
func checkSegHeader(b []byte, segID uint64) error {
	if len(b) < segHeaderSize {
		return errTorn
	}
	if string(b[0:8]) != segMagic {
		return fmt.Errorf("%w: bad segment magic %q", errCorrupt, b[0:8])
	}
	if crc32.Checksum(b[0:28], castagnoli) != binary.LittleEndian.Uint32(b[28:32]) {
		return fmt.Errorf("%w: segment header checksum mismatch", errCorrupt)
	}
	if v := binary.LittleEndian.Uint32(b[8:12]); v != formatVersion {
		return &VersionError{Version: v}
	}
	if id := binary.LittleEndian.Uint64(b[16:24]); id != segID {
		return fmt.Errorf("%w: segment header names segment %d, file name says %d", errCorrupt, id, segID)
	}
	return nil
}

// VersionError reports a segment written in a format this build cannot read.
type VersionError struct{ Version uint32 }

func (e *VersionError) Error() string {
	return fmt.Sprintf("raftlog: segment format version %d is not supported (this build reads version %d)", e.Version, formatVersion)
}

// putFrameHeader writes the position-independent part of a frame header and
// the payload checksum. sealFrame adds the header checksum once the frame's
// position is known (that is the flusher's job, so encoding can run in the
// callers' goroutines).
func putFrameHeader(h []byte, typ byte, group uint64, payload []byte) {
	h[4] = frameMagic0
	h[5] = frameMagic1
	h[6] = typ
	h[7] = 0
	binary.LittleEndian.PutUint32(h[8:12], uint32(len(payload)))
	binary.LittleEndian.PutUint64(h[12:20], group)
	binary.LittleEndian.PutUint32(h[20:24], crc32.Checksum(payload, castagnoli))
}

// headerCRC covers header bytes 4..24 plus the frame's position (segment id
// and offset), so a damaged length field or a frame replayed at another place
// never verifies.
func headerCRC(h []byte, segID uint64, off int64) uint32 {
	c := crc32.Update(0, castagnoli, h[4:frameHeaderSize])
	return crcUint64(crcUint64(c, segID), uint64(off))
}

// crcUint64 is crc32.Update over the 8 little-endian bytes of v, done
// bytewise so the hot path does not allocate a slice for them.
func crcUint64(crc uint32, v uint64) uint32 {
	crc = ^crc
	for i := 0; i < 8; i++ {
		crc = castagnoli[byte(crc)^byte(v)] ^ (crc >> 8)
		v >>= 8
	}
	return ^crc
}

func sealFrame(h []byte, segID uint64, off int64) {
	binary.LittleEndian.PutUint32(h[0:4], headerCRC(h, segID, off))
}

// frame is one decoded, verified record. payload aliases the input buffer.
type frame struct {
	typ     byte
	flags   byte
	group   uint64
	payload []byte
}

// decodeFrame verifies the frame starting at b[0], located at (segID, off).
// It returns the frame and its total size, errTorn when b ends before the
// frame does, or an error wrapping errCorrupt.
func decodeFrame(b []byte, segID uint64, off int64) (frame, int, error) {
	if len(b) < frameHeaderSize {
		return frame{}, 0, errTorn
	}
	h := b[:frameHeaderSize]
	if h[4] != frameMagic0 || h[5] != frameMagic1 {
		return frame{}, 0, fmt.Errorf("%w: bad frame magic", errCorrupt)
	}
	if headerCRC(h, segID, off) != binary.LittleEndian.Uint32(h[0:4]) {
		return frame{}, 0, fmt.Errorf("%w: frame header checksum mismatch", errCorrupt)
	}
	n := binary.LittleEndian.Uint32(h[8:12])
	if n > maxPayloadBytes {
		return frame{}, 0, fmt.Errorf("%w: payload length %d too large", errCorrupt, n)
	}
	if uint64(len(b)-frameHeaderSize) < uint64(n) {
		return frame{}, 0, errTorn
	}
	payload := b[frameHeaderSize : frameHeaderSize+int(n)]
	if crc32.Checksum(payload, castagnoli) != binary.LittleEndian.Uint32(h[20:24]) {
		return frame{}, 0, fmt.Errorf("%w: payload checksum mismatch", errCorrupt)
	}
	f := frame{typ: h[6], flags: h[7], group: binary.LittleEndian.Uint64(h[12:20]), payload: payload}
	if h[7]&^flagAfterSync != 0 {
		return frame{}, 0, fmt.Errorf("%w: unknown frame flags %#x", errCorrupt, h[7])
	}
	if err := validatePayload(f); err != nil {
		return frame{}, 0, err
	}
	return f, frameHeaderSize + int(n), nil
}

// validatePayload checks the structure of a checksummed payload, so that
// apply code can walk it without further bounds checks failing.
func validatePayload(f frame) error {
	p := f.payload
	switch f.typ {
	case recEntries:
		_, err := walkEntries(p, nil)
		return err
	case recDeleteRange:
		if len(p) != 16 {
			return fmt.Errorf("%w: delete-range payload has %d bytes", errCorrupt, len(p))
		}
		return nil
	case recStable:
		return walkStable(p, nil)
	case recShutdown:
		if len(p) != 0 || f.group != 0 {
			return fmt.Errorf("%w: shutdown record with a payload or group", errCorrupt)
		}
		return nil
	default:
		return fmt.Errorf("%w: unknown record type %d", errCorrupt, f.typ)
	}
}

// walkEntries walks an entries payload, calling fn with each entry's index
// and its byte range within p. Indexes must be consecutive.
func walkEntries(p []byte, fn func(index uint64, start, end int)) (int, error) {
	if len(p) < 4 {
		return 0, fmt.Errorf("%w: entries payload too short", errCorrupt)
	}
	count := int(binary.LittleEndian.Uint32(p[0:4]))
	if count == 0 {
		return 0, fmt.Errorf("%w: empty entries record", errCorrupt)
	}
	pos := 4
	var prev uint64
	for i := 0; i < count; i++ {
		if len(p)-pos < entryHeaderSize {
			return 0, fmt.Errorf("%w: entry %d header out of bounds", errCorrupt, i)
		}
		e := p[pos:]
		idx := binary.LittleEndian.Uint64(e[0:8])
		if idx == 0 || (i > 0 && idx != prev+1) {
			return 0, fmt.Errorf("%w: entry index %d after %d", errCorrupt, idx, prev)
		}
		dl, el := binary.LittleEndian.Uint32(e[29:33]), binary.LittleEndian.Uint32(e[33:37])
		if (dl&nilLen != 0 && dl != nilLen) || (el&nilLen != 0 && el != nilLen) {
			return 0, fmt.Errorf("%w: entry %d has a nil field with a length", errCorrupt, i)
		}
		body := uint64(dl&^nilLen) + uint64(el&^nilLen)
		if uint64(len(p)-pos-entryHeaderSize) < body {
			return 0, fmt.Errorf("%w: entry %d body out of bounds", errCorrupt, i)
		}
		end := pos + entryHeaderSize + int(body)
		if fn != nil {
			fn(idx, pos, end)
		}
		prev = idx
		pos = end
	}
	if pos != len(p) {
		return 0, fmt.Errorf("%w: %d trailing bytes after entries", errCorrupt, len(p)-pos)
	}
	return count, nil
}

func encodedEntrySize(e *raft.Log) int {
	return entryHeaderSize + len(e.Data) + len(e.Extensions)
}

func appendEntry(b []byte, e *raft.Log) []byte {
	var h [entryHeaderSize]byte
	binary.LittleEndian.PutUint64(h[0:8], e.Index)
	binary.LittleEndian.PutUint64(h[8:16], e.Term)
	h[16] = byte(e.Type)
	binary.LittleEndian.PutUint64(h[17:25], uint64(e.AppendedAt.Unix()))
	binary.LittleEndian.PutUint32(h[25:29], uint32(e.AppendedAt.Nanosecond()))
	binary.LittleEndian.PutUint32(h[29:33], fieldLen(e.Data))
	binary.LittleEndian.PutUint32(h[33:37], fieldLen(e.Extensions))
	b = append(b, h[:]...)
	b = append(b, e.Data...)
	return append(b, e.Extensions...)
}

func fieldLen(b []byte) uint32 {
	if b == nil {
		return nilLen
	}
	return uint32(len(b))
}

// decodeEntry fills out from one encoded entry. Data and Extensions alias b,
// which the caller hands over (it is freshly allocated per GetLog).
func decodeEntry(b []byte, out *raft.Log) error {
	if len(b) < entryHeaderSize {
		return fmt.Errorf("%w: entry too short", errCorrupt)
	}
	dlen, elen, err := decodeEntryHead(b, len(b), out)
	if err != nil {
		return err
	}
	dl := int(dlen &^ nilLen)
	out.Data, out.Extensions = nil, nil
	if dlen != nilLen {
		out.Data = b[entryHeaderSize : entryHeaderSize+dl : entryHeaderSize+dl]
	}
	if elen != nilLen {
		out.Extensions = b[entryHeaderSize+dl:]
	}
	return nil
}

// decodeEntryMeta decodes the fixed part of an entry whose stored length is n
// (b holds at least its first entryHeaderSize bytes); Data and Extensions
// come back nil.
func decodeEntryMeta(b []byte, n int, out *raft.Log) error {
	if len(b) < entryHeaderSize {
		return fmt.Errorf("%w: entry too short", errCorrupt)
	}
	_, _, err := decodeEntryHead(b, n, out)
	out.Data, out.Extensions = nil, nil
	return err
}

// decodeEntryHead decodes the fixed fields of an entry whose stored length is
// n and checks that the data and extension lengths add up to n.
func decodeEntryHead(b []byte, n int, out *raft.Log) (dlen, elen uint32, err error) {
	dlen = binary.LittleEndian.Uint32(b[29:33])
	elen = binary.LittleEndian.Uint32(b[33:37])
	dl, el := int(dlen&^nilLen), int(elen&^nilLen)
	if n != entryHeaderSize+dl+el {
		return 0, 0, fmt.Errorf("%w: entry length mismatch", errCorrupt)
	}
	out.Index = binary.LittleEndian.Uint64(b[0:8])
	out.Term = binary.LittleEndian.Uint64(b[8:16])
	out.Type = raft.LogType(b[16])
	sec := int64(binary.LittleEndian.Uint64(b[17:25]))
	nsec := int64(binary.LittleEndian.Uint32(b[25:29]))
	// UTC() leaves a nil location, so a zero AppendedAt comes back as time.Time{}.
	out.AppendedAt = time.Unix(sec, nsec).UTC()
	return dlen, elen, nil
}

// walkStable walks a stable payload: count u32, then count times
// (key length u32, key, value length u32, value).
func walkStable(p []byte, fn func(key, val []byte)) error {
	if len(p) < 4 {
		return fmt.Errorf("%w: stable payload too short", errCorrupt)
	}
	count := int(binary.LittleEndian.Uint32(p[0:4]))
	pos := 4
	for i := 0; i < count; i++ {
		var kv [2][]byte
		for j := range kv {
			if len(p)-pos < 4 {
				return fmt.Errorf("%w: stable pair %d out of bounds", errCorrupt, i)
			}
			n := binary.LittleEndian.Uint32(p[pos:])
			pos += 4
			if uint64(len(p)-pos) < uint64(n) {
				return fmt.Errorf("%w: stable pair %d out of bounds", errCorrupt, i)
			}
			kv[j] = p[pos : pos+int(n)]
			pos += int(n)
		}
		if fn != nil {
			fn(kv[0], kv[1])
		}
	}
	if pos != len(p) {
		return fmt.Errorf("%w: %d trailing bytes after stable pairs", errCorrupt, len(p)-pos)
	}
	return nil
}

func appendStablePair(b, key, val []byte) []byte {
	b = binary.LittleEndian.AppendUint32(b, uint32(len(key)))
	b = append(b, key...)
	b = binary.LittleEndian.AppendUint32(b, uint32(len(val)))
	return append(b, val...)
}

// appendFrame appends one complete (unsealed) frame to b and returns it. The
// payload is produced by fill, which appends to its argument.
func appendFrame(b []byte, typ byte, group uint64, fill func([]byte) []byte) []byte {
	start := len(b)
	b = append(b, make([]byte, frameHeaderSize)...)
	b = fill(b)
	putFrameHeader(b[start:start+frameHeaderSize], typ, group, b[start+frameHeaderSize:])
	return b
}
