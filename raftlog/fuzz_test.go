package raftlog

import (
	"bytes"
	"encoding/binary"
	"testing"

	"github.com/hashicorp/raft"
)

// validSegment builds segment 3 holding a few records derived from seed.
func validSegment(seed []byte) []byte {
	b := make([]byte, segHeaderSize)
	encodeSegHeader(b, 3)
	var ents []*raft.Log
	for i := 0; i < 3; i++ {
		e := &raft.Log{Index: 10 + uint64(i), Term: 2, Data: seed}
		if i == 1 {
			e.Extensions = seed
			e.Data = nil
		}
		ents = append(ents, e)
	}
	start := len(b)
	b = appendFrame(b, recEntries, 42, func(p []byte) []byte {
		p = appendUint32(p, uint32(len(ents)))
		for _, e := range ents {
			p = appendEntry(p, e)
		}
		return p
	})
	sealFrame(b[start:], 3, int64(start))
	start = len(b)
	b = appendFrame(b, recStable, 42, func(p []byte) []byte {
		return appendStablePair(appendUint32(p, 1), []byte("k"), seed)
	})
	sealFrame(b[start:], 3, int64(start))
	start = len(b)
	b = appendFrame(b, recDeleteRange, 42, func(p []byte) []byte {
		return binary.LittleEndian.AppendUint64(binary.LittleEndian.AppendUint64(p, 10), 10)
	})
	sealFrame(b[start:], 3, int64(start))
	start = len(b)
	b = appendFrame(b, recShutdown, 0, func(p []byte) []byte { return p })
	sealFrame(b[start:], 3, int64(start))
	return b
}

// replayBytes replays b as segment 3 through a small window, so frames
// straddle window boundaries and the window has to grow.
func replayBytes(b []byte) (*Log, int64, error) {
	l := &Log{groups: map[uint64]*groupState{}, segs: map[uint64]*segment{}}
	end, err := l.replaySegment(&segment{id: 3}, bytes.NewReader(b), int64(len(b)), &replayBuf{window: 40})
	return l, end, err
}

// FuzzDecodeSegment: arbitrary bytes never panic the decoder, and what it
// accepts is a prefix of the input.
func FuzzDecodeSegment(f *testing.F) {
	f.Add(validSegment([]byte("hello")))
	f.Add(validSegment(nil))
	f.Add([]byte(segMagic))
	f.Fuzz(func(t *testing.T, b []byte) {
		if !bytes.HasPrefix(b, []byte(segMagic)) {
			// Reach the frame decoder: most inputs would stop at the header.
			h := make([]byte, segHeaderSize, segHeaderSize+len(b))
			encodeSegHeader(h, 3)
			b = append(h, b...)
		}
		_, end, err := replayBytes(b)
		if end < 0 || end > int64(len(b)) {
			t.Fatalf("end %d outside 0..%d", end, len(b))
		}
		if err == nil && end != int64(len(b)) {
			t.Fatalf("no error but stopped at %d of %d", end, len(b))
		}
		scanAfterDamage(b, 3, 0)
		scanAfterDamage(b, 3, 100)
		var e raft.Log
		decodeEntry(b, &e)
	})
}

// FuzzDamagedFrame: any change of one byte of a valid segment is detected
// (crc32c catches every burst of up to 32 bits), and the records before the
// damaged one are still accepted.
func FuzzDamagedFrame(f *testing.F) {
	f.Add([]byte("payload"), uint16(40), byte(1))
	f.Add([]byte{}, uint16(7), byte(0x80))
	f.Add(bytes.Repeat([]byte{0xaa}, 300), uint16(500), byte(0xff))
	f.Fuzz(func(t *testing.T, seed []byte, pos uint16, mask byte) {
		good := validSegment(seed)
		l, end, err := replayBytes(good)
		if err != nil || end != int64(len(good)) {
			t.Fatalf("valid segment rejected at %d: %v", end, err)
		}
		if v, _ := (&GroupStore{l: l, g: l.groups[42]}).Get([]byte("k")); !bytes.Equal(v, seed) {
			t.Fatalf("stable value %q, want %q", v, seed)
		}
		if mask == 0 {
			return
		}
		bad := append([]byte(nil), good...)
		p := int(pos) % len(bad)
		bad[p] ^= mask
		_, end, err = replayBytes(bad)
		if err == nil {
			t.Fatalf("damage at %d (mask %#x) accepted", p, mask)
		}
		if end > int64(p) {
			t.Fatalf("damage at %d but accepted up to %d", p, end)
		}
	})
}
