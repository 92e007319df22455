package raftlog

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"os"
	"path/filepath"
	"slices"
	"time"
)

// The stable side file: where a stable-store write (a term, a vote) goes when the journal
// cannot take it (ENOSPC with the reserve used up, EIO, a failed fsync). hashicorp/raft
// panics when it cannot save its current term, so Set and SetUint64 must not fail because
// of the journal's disk. The file is created at full size when the journal opens, while
// there is room, and is only ever overwritten in place afterwards: writing it needs no new
// block. See the package documentation for the layout and the recovery rule.

// stableSideName is the side file beside the segments.
const stableSideName = "stable"

// stableSlotBytes is the size of each of the side file's two slots. It bounds the stable
// values of every group together (about 100 bytes a group: some 10,000 groups).
const stableSlotBytes = 1 << 20

const (
	slotMagic      = "USTABLE1"
	slotHeaderSize = 40
)

// errSlotEmpty is a slot never written (all zeros).
var errSlotEmpty = errors.New("empty slot")

// stableSlot is one decoded slot: the stable values of every group as they were when the
// slot was written, and the end of the journal at that moment. Journal records at or after
// (seg, off) were written after the slot; records before it, before.
type stableSlot struct {
	gen    uint64
	seg    uint64
	off    uint64
	groups map[uint64]map[string][]byte
}

// before reports whether journal position (seg, off) was written before the slot.
func (s *stableSlot) before(seg uint64, off int64) bool {
	return seg < s.seg || seg == s.seg && uint64(off) < s.off
}

// encodeSlot encodes s into a slot image of at most size bytes:
//
//	0  magic "USTABLE1"
//	8  generation u64 (the newer valid slot wins)
//	16 journal segment id u64 \ the end of the journal
//	24 journal offset u64     / when the slot was written
//	32 payload length u32
//	36 crc32c of bytes 0..36 and the payload
//	40 payload: group count u32, then per group (ascending id): group id u64,
//	   stable payload length u32, stable payload (as a stable record's payload)
func encodeSlot(s *stableSlot, size int) ([]byte, error) {
	b := make([]byte, slotHeaderSize, 4096)
	ids := make([]uint64, 0, len(s.groups))
	for id, kv := range s.groups {
		if len(kv) > 0 {
			ids = append(ids, id)
		}
	}
	slices.Sort(ids)
	b = appendUint32(b, uint32(len(ids)))
	for _, id := range ids {
		kv := s.groups[id]
		b = binary.LittleEndian.AppendUint64(b, id)
		lenAt := len(b)
		b = appendUint32(b, 0)
		b = appendUint32(b, uint32(len(kv)))
		keys := make([]string, 0, len(kv))
		for k := range kv {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		for _, k := range keys {
			b = appendStablePair(b, []byte(k), kv[k])
		}
		binary.LittleEndian.PutUint32(b[lenAt:], uint32(len(b)-lenAt-4))
	}
	if len(b) > size {
		return nil, fmt.Errorf("raftlog: the stable values of %d groups take %d bytes, more than the side file's slot of %d", len(ids), len(b), size)
	}
	copy(b[0:8], slotMagic)
	binary.LittleEndian.PutUint64(b[8:], s.gen)
	binary.LittleEndian.PutUint64(b[16:], s.seg)
	binary.LittleEndian.PutUint64(b[24:], s.off)
	binary.LittleEndian.PutUint32(b[32:], uint32(len(b)-slotHeaderSize))
	binary.LittleEndian.PutUint32(b[36:], slotCRC(b[:36], b[slotHeaderSize:]))
	return b, nil
}

func slotCRC(head, payload []byte) uint32 {
	return crc32.Update(crc32.Checksum(head, castagnoli), castagnoli, payload)
}

// decodeSlot verifies and decodes one slot image (the whole slot; bytes after the payload
// are ignored: they are what an older, longer write left). A slot of zeros is errSlotEmpty;
// anything else that does not verify wraps errCorrupt.
func decodeSlot(b []byte) (*stableSlot, error) {
	if len(b) < slotHeaderSize {
		return nil, fmt.Errorf("%w: slot of %d bytes", errCorrupt, len(b))
	}
	if string(b[0:8]) != slotMagic {
		if bytes.Count(b[:slotHeaderSize], []byte{0}) == slotHeaderSize {
			return nil, errSlotEmpty
		}
		return nil, fmt.Errorf("%w: bad slot magic", errCorrupt)
	}
	n := uint64(binary.LittleEndian.Uint32(b[32:]))
	if n > uint64(len(b)-slotHeaderSize) {
		return nil, fmt.Errorf("%w: slot payload of %d bytes overruns the slot", errCorrupt, n)
	}
	p := b[slotHeaderSize : slotHeaderSize+int(n)]
	if slotCRC(b[:36], p) != binary.LittleEndian.Uint32(b[36:]) {
		return nil, fmt.Errorf("%w: slot checksum mismatch", errCorrupt)
	}
	s := &stableSlot{
		gen: binary.LittleEndian.Uint64(b[8:]),
		seg: binary.LittleEndian.Uint64(b[16:]),
		off: binary.LittleEndian.Uint64(b[24:]),
	}
	if s.gen == 0 {
		return nil, fmt.Errorf("%w: slot generation 0", errCorrupt)
	}
	if len(p) < 4 {
		return nil, fmt.Errorf("%w: slot payload too short", errCorrupt)
	}
	count := uint64(binary.LittleEndian.Uint32(p))
	if count > uint64(len(p))/12 {
		return nil, fmt.Errorf("%w: slot names %d groups in %d bytes", errCorrupt, count, len(p))
	}
	s.groups = make(map[uint64]map[string][]byte, count)
	pos := 4
	for i := uint64(0); i < count; i++ {
		if len(p)-pos < 12 {
			return nil, fmt.Errorf("%w: slot group %d out of bounds", errCorrupt, i)
		}
		id := binary.LittleEndian.Uint64(p[pos:])
		m := uint64(binary.LittleEndian.Uint32(p[pos+8:]))
		pos += 12
		if m > uint64(len(p)-pos) {
			return nil, fmt.Errorf("%w: slot group %d out of bounds", errCorrupt, i)
		}
		if _, dup := s.groups[id]; dup {
			return nil, fmt.Errorf("%w: slot holds group %d twice", errCorrupt, id)
		}
		kv := map[string][]byte{}
		if err := walkStable(p[pos:pos+int(m)], func(k, v []byte) { kv[string(k)] = append([]byte{}, v...) }); err != nil {
			return nil, err
		}
		s.groups[id] = kv
		pos += int(m)
	}
	if pos != len(p) {
		return nil, fmt.Errorf("%w: %d trailing bytes in the slot payload", errCorrupt, len(p)-pos)
	}
	return s, nil
}

// pickSlot chooses the newest valid slot of two images. Both empty: nil. One torn or
// damaged and the other valid: the valid one (a torn slot was never acknowledged: the
// other slot held the newest state while it was written). Both damaged: a disk fault.
func pickSlot(a, b []byte) (s *stableSlot, idx int, err error) {
	sa, ea := decodeSlot(a)
	sb, eb := decodeSlot(b)
	switch {
	case ea == nil && eb == nil:
		if sb.gen > sa.gen {
			return sb, 1, nil
		}
		return sa, 0, nil
	case ea == nil:
		return sa, 0, nil
	case eb == nil:
		return sb, 1, nil
	case errors.Is(ea, errSlotEmpty) || errors.Is(eb, errSlotEmpty):
		return nil, -1, nil
	}
	return nil, -1, fmt.Errorf("%w: both slots of the stable side file are damaged: %v; %v", ErrCorrupt, ea, eb)
}

// stableSide is the open side file (owned by the writer after Open).
type stableSide struct {
	f    *os.File
	gen  uint64 // generation of the newest valid slot, 0 when none
	slot int    // index of the newest valid slot, -1 when none

	loggedAt time.Time // last report of a side write (at most one every sideLogEvery)
}

// sideLogEvery bounds how often side writes are reported: on a full disk every vote and
// term goes there.
const sideLogEvery = 10 * time.Second

// openStableSide opens (creating at full size if needed) the side file and returns its
// newest valid slot, if any. A missing file that cannot be created (no room) is not an
// error: the side file is then absent until a later Open, and the journal works as before.
func openStableSide(dir string, logf func(string, ...any)) (*stableSide, *stableSlot, error) {
	p := filepath.Join(dir, stableSideName)
	f, err := os.OpenFile(p, os.O_RDWR, 0)
	if errors.Is(err, os.ErrNotExist) {
		f, err = createStableSide(p)
		if err != nil {
			logf("raftlog: cannot create the stable side file (%v); terms and votes depend on the journal's disk alone", err)
			return nil, nil, nil
		}
	}
	if err != nil {
		return nil, nil, fmt.Errorf("raftlog: %w", err)
	}
	img := make([]byte, 2*stableSlotBytes)
	if n, err := f.ReadAt(img, 0); n != len(img) {
		f.Close()
		return nil, nil, fmt.Errorf("raftlog: read %s (%d of %d bytes): %v", stableSideName, n, len(img), err)
	}
	s, idx, err := pickSlot(img[:stableSlotBytes], img[stableSlotBytes:])
	if err != nil {
		f.Close()
		return nil, nil, err
	}
	side := &stableSide{f: f, slot: idx}
	if s != nil {
		side.gen = s.gen
	}
	return side, s, nil
}

// createStableSide writes the side file in full (zeros, so its blocks are allocated) under
// a temporary name and renames it into place.
func createStableSide(p string) (*os.File, error) {
	tmp := p + ".tmp"
	f, err := os.Create(tmp)
	if err != nil {
		return nil, err
	}
	_, err = f.Write(make([]byte, 2*stableSlotBytes))
	if err == nil {
		err = f.Sync()
	}
	if err == nil {
		err = os.Rename(tmp, p)
	}
	if err == nil {
		err = syncDir(filepath.Dir(p))
	}
	if err != nil {
		f.Close()
		os.Remove(tmp)
		return nil, err
	}
	return f, nil
}

// write stores s (its gen is set here) in the slot that does not hold the newest state,
// and syncs it. On failure the newest valid slot is untouched.
func (d *stableSide) write(s *stableSlot) error {
	s.gen = d.gen + 1
	b, err := encodeSlot(s, stableSlotBytes)
	if err != nil {
		return err
	}
	idx := 0
	if d.slot == 0 {
		idx = 1
	}
	if _, err := d.f.WriteAt(b, int64(idx)*stableSlotBytes); err != nil {
		return fmt.Errorf("raftlog: write %s: %w", stableSideName, err)
	}
	if err := d.f.Sync(); err != nil {
		return fmt.Errorf("raftlog: fsync %s: %w", stableSideName, err)
	}
	d.gen, d.slot = s.gen, idx
	return nil
}

// applySlot applies the side file's slot found at Open to the stable values (recovery
// calls it where the journal reaches the slot's position, or at its end).
func (l *Log) applySlot() {
	s := l.sideSlot
	l.sideSlot = nil
	for id, kv := range s.groups {
		g := l.group(id)
		g.mu.Lock()
		for k, v := range kv {
			g.stable[k] = v
		}
		g.mu.Unlock()
	}
	l.recovery.StableSideApplied = true
}

// sideState is the stable values of every group with the pairs of frames applied on top,
// in order, positioned at the journal's end.
func (l *Log) sideState(frames []frame) *stableSlot {
	s := &stableSlot{seg: l.active.id, off: uint64(l.active.size), groups: map[uint64]map[string][]byte{}}
	l.groupsMu.RLock()
	for id, g := range l.groups {
		g.mu.RLock()
		if len(g.stable) > 0 {
			kv := make(map[string][]byte, len(g.stable)+1)
			for k, v := range g.stable {
				kv[k] = v
			}
			s.groups[id] = kv
		}
		g.mu.RUnlock()
	}
	l.groupsMu.RUnlock()
	for _, f := range frames {
		kv := s.groups[f.group]
		if kv == nil {
			kv = map[string][]byte{}
			s.groups[f.group] = kv
		}
		walkStable(f.payload, func(k, v []byte) { kv[string(k)] = v })
	}
	return s
}

// settleSide finishes at Open what recovery started with the side file's slot: a slot no
// journal frame came after is applied now; and when the journal now ends before the
// slot's position (a cut tail), the current state is written to the side file at the
// journal's end, so that records written from now on count as newer than the slot.
func (l *Log) settleSide(slot *stableSlot) error {
	if l.sideSlot != nil {
		l.applySlot()
	}
	if slot == nil || slot.seg < l.active.id || slot.seg == l.active.id && slot.off <= uint64(l.active.size) {
		return nil
	}
	return l.side.write(l.sideState(nil))
}

// sideRetryEvery is how long a stable write waits before trying again when neither the
// journal nor the side file could take it.
const sideRetryEvery = 200 * time.Millisecond

// writeStableSide makes the stable requests of a batch the journal could not write
// durable in the side file, then applies them. It returns nil once they are durable, or
// ErrClosed when the journal closes while the side file keeps failing. The caller owns the
// write state.
func (l *Log) writeStableSide(reqs []*request, cause error) error {
	if l.side == nil {
		return cause
	}
	var frames []frame
	for _, r := range reqs {
		for pos := 0; pos < len(r.buf); {
			n := frameHeaderSize + int(leUint32(r.buf[pos+8:]))
			b := r.buf[pos : pos+n]
			frames = append(frames, frame{typ: b[6], group: leUint64(b[12:]), payload: b[frameHeaderSize:]})
			pos += n
		}
	}
	for attempt := 0; ; attempt++ {
		err := l.side.write(l.sideState(frames))
		if err == nil {
			for _, f := range frames {
				l.applyFrame(nil, 0, f)
			}
			l.stats.sideWrites.Add(1)
			if time.Since(l.side.loggedAt) >= sideLogEvery {
				l.side.loggedAt = time.Now()
				l.logf("raftlog: the journal could not take a stable write (%v); it went to the stable side file (%d so far)", cause, l.stats.sideWrites.Load())
			}
			return nil
		}
		if attempt == 0 {
			l.logf("raftlog: neither the journal (%v) nor the stable side file (%v) takes a stable write; retrying every %v", cause, err, sideRetryEvery)
		}
		l.qmu.Lock()
		closing := l.closing
		l.qmu.Unlock()
		if closing {
			return ErrClosed
		}
		time.Sleep(sideRetryEvery)
	}
}
