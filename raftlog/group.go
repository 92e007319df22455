package raftlog

import (
	"encoding/binary"
	"errors"
	"fmt"
	"sync"

	"github.com/hashicorp/raft"
)

// ErrKeyNotFound is what Get returns for a key never set. Its text is the one
// hashicorp/raft compares against ("not found").
var ErrKeyNotFound = errors.New("not found")

// groupState is the in-memory view of one group: where each live entry is,
// and the group's stable-store values.
type groupState struct {
	id     uint64
	mu     sync.RWMutex
	first  uint64 // index of locs[0]; meaningless when locs is empty
	locs   []loc
	stable map[string][]byte
}

func (g *groupState) last() uint64 {
	if len(g.locs) == 0 {
		return 0
	}
	return g.first + uint64(len(g.locs)) - 1
}

// GroupStore is one Raft group's view of the journal. It implements
// raft.LogStore, raft.StableStore and raft.MonotonicLogStore.
type GroupStore struct {
	l *Log
	g *groupState
}

var (
	_ raft.LogStore          = (*GroupStore)(nil)
	_ raft.StableStore       = (*GroupStore)(nil)
	_ raft.MonotonicLogStore = (*GroupStore)(nil)
)

// Group returns the store of group id, creating its (empty) state on first use.
func (l *Log) Group(id uint64) *GroupStore {
	return &GroupStore{l: l, g: l.group(id)}
}

func (l *Log) group(id uint64) *groupState {
	l.groupsMu.RLock()
	g := l.groups[id]
	l.groupsMu.RUnlock()
	if g != nil {
		return g
	}
	l.groupsMu.Lock()
	defer l.groupsMu.Unlock()
	if g = l.groups[id]; g == nil {
		g = &groupState{id: id, stable: map[string][]byte{}}
		l.groups[id] = g
	}
	return g
}

// ID is the group id.
func (s *GroupStore) ID() uint64 { return s.g.id }

// IsMonotonic tells raft the store keeps no gaps: after restoring a snapshot
// raft deletes the whole log instead of leaving a hole below new entries.
func (s *GroupStore) IsMonotonic() bool { return true }

// FirstIndex returns the first live index, 0 when the log is empty.
func (s *GroupStore) FirstIndex() (uint64, error) {
	s.g.mu.RLock()
	defer s.g.mu.RUnlock()
	if len(s.g.locs) == 0 {
		return 0, nil
	}
	return s.g.first, nil
}

// LastIndex returns the last live index, 0 when the log is empty.
func (s *GroupStore) LastIndex() (uint64, error) {
	s.g.mu.RLock()
	defer s.g.mu.RUnlock()
	return s.g.last(), nil
}

// GetLog reads entry index from its segment (pread; the page cache keeps
// recent entries hot). Wrap the store in raft.NewLogCache for a memory cache.
func (s *GroupStore) GetLog(index uint64, out *raft.Log) error {
	return s.readEntry(index, out, false)
}

// GetLogMeta reads only the fixed part of entry index: Index, Term, Type and
// AppendedAt, with Data and Extensions nil (a 37-byte pread instead of the
// whole body). It is for scans that look at entry types, such as raft's
// start-up scan for configuration entries, which would otherwise read every
// body of the log once more before the state machine replays it.
func (s *GroupStore) GetLogMeta(index uint64, out *raft.Log) error {
	return s.readEntry(index, out, true)
}

// EntrySizes returns the first live index and, for each live entry from it
// on, the length of its data plus its extensions, from the in-memory index
// (no I/O), so an engine can size its log at start-up without reading it.
func (s *GroupStore) EntrySizes() (first uint64, sizes []uint32) {
	s.g.mu.RLock()
	defer s.g.mu.RUnlock()
	if len(s.g.locs) == 0 {
		return 0, nil
	}
	sizes = make([]uint32, len(s.g.locs))
	for i, lc := range s.g.locs {
		sizes[i] = lc.n - entryHeaderSize
	}
	return s.g.first, sizes
}

func (s *GroupStore) readEntry(index uint64, out *raft.Log, meta bool) error {
	g, l := s.g, s.l
	var head [entryHeaderSize]byte
	for attempt := 0; ; attempt++ {
		g.mu.RLock()
		if len(g.locs) == 0 || index < g.first || index > g.last() {
			g.mu.RUnlock()
			return raft.ErrLogNotFound
		}
		lc := g.locs[index-g.first]
		g.mu.RUnlock()

		var buf []byte
		if meta {
			buf = head[:]
		} else {
			buf = make([]byte, lc.n)
		}
		l.segMu.RLock()
		if l.segs == nil {
			l.segMu.RUnlock()
			return ErrClosed
		}
		seg := l.segs[uint64(lc.seg)]
		var err error
		if seg != nil {
			_, err = seg.f.ReadAt(buf, int64(lc.off))
		}
		l.segMu.RUnlock()
		if seg == nil {
			// Purged between the lookup and the read: the entry was either
			// deleted or copied forward; look again.
			if attempt < 3 {
				continue
			}
			return raft.ErrLogNotFound
		}
		if err != nil {
			return fmt.Errorf("raftlog: read group %d index %d: %w", g.id, index, err)
		}
		if meta {
			err = decodeEntryMeta(buf, int(lc.n), out)
		} else {
			err = decodeEntry(buf, out)
		}
		if err != nil {
			return fmt.Errorf("raftlog: group %d index %d: %w", g.id, index, err)
		}
		if out.Index != index {
			return fmt.Errorf("raftlog: group %d: index %d holds entry %d", g.id, index, out.Index)
		}
		return nil
	}
}

// StoreLog stores one entry.
func (s *GroupStore) StoreLog(e *raft.Log) error {
	return s.StoreLogs([]*raft.Log{e})
}

// StoreLogs appends consecutive entries. An entry at or below the last index
// replaces that index and everything after it. An entry that leaves a gap
// after the last index starts the log anew there (the entries before are
// dropped): the store keeps no holes, and raft only stores past a gap after
// restoring a snapshot that covers everything before it (for example when a
// crash lost the delete that normally follows a snapshot install).
func (s *GroupStore) StoreLogs(logs []*raft.Log) error {
	if len(logs) == 0 {
		return nil
	}
	size := 0
	for i, e := range logs {
		if e.Index == 0 {
			return fmt.Errorf("raftlog: group %d: log index 0", s.g.id)
		}
		if i > 0 && e.Index != logs[i-1].Index+1 {
			return fmt.Errorf("raftlog: group %d: non-consecutive indexes %d, %d", s.g.id, logs[i-1].Index, e.Index)
		}
		n := encodedEntrySize(e)
		if n > maxEntryBytes {
			return fmt.Errorf("raftlog: group %d: entry %d is %d bytes, limit %d", s.g.id, e.Index, n, maxEntryBytes)
		}
		size += n
	}

	r := requestPool.Get().(*request)
	b := r.buf[:0]
	if cap(b) < size+frameHeaderSize+4 {
		b = make([]byte, 0, size+(size/recordSplitBytes+1)*(frameHeaderSize+4))
	}
	for i := 0; i < len(logs); {
		start := len(b)
		b = append(b, make([]byte, frameHeaderSize+4)...)
		count, bytes := 0, 0
		for ; i < len(logs); i++ {
			n := encodedEntrySize(logs[i])
			if count > 0 && bytes+n > recordSplitBytes {
				break
			}
			b = appendEntry(b, logs[i])
			count++
			bytes += n
		}
		binary.LittleEndian.PutUint32(b[start+frameHeaderSize:], uint32(count))
		putFrameHeader(b[start:start+frameHeaderSize], recEntries, s.g.id, b[start+frameHeaderSize:])
	}
	r.buf = b
	r.sync = s.l.opt.Fsync == FsyncAlways
	err := s.l.submit(r)
	s.l.release(r)
	return err
}

// DeleteRange deletes entries min..max inclusive. Raft only deletes a prefix
// (compaction after a snapshot), a suffix (conflict truncation) or
// everything; a range strictly inside the log is refused.
func (s *GroupStore) DeleteRange(min, max uint64) error {
	if min > max {
		return nil
	}
	g := s.g
	g.mu.RLock()
	empty, first, last := len(g.locs) == 0, g.first, g.last()
	g.mu.RUnlock()
	if empty || max < first || min > last {
		return nil
	}
	if min > first && max < last {
		return fmt.Errorf("raftlog: group %d: DeleteRange(%d, %d) is inside the log %d..%d; only prefixes and suffixes can be deleted", g.id, min, max, first, last)
	}
	r := requestPool.Get().(*request)
	r.buf = appendFrame(r.buf[:0], recDeleteRange, g.id, func(p []byte) []byte {
		p = binary.LittleEndian.AppendUint64(p, min)
		return binary.LittleEndian.AppendUint64(p, max)
	})
	// A suffix delete must not be outlived by the entries it removed; it
	// follows the mode like appends do. Prefix deletes never need a sync:
	// replaying them late only keeps entries raft no longer asks for.
	r.sync = s.l.opt.Fsync == FsyncAlways && max >= last
	err := s.l.submit(r)
	s.l.release(r)
	return err
}

// Set stores a stable value; always fsynced before it returns. It does not fail
// because of the journal's disk: what the journal cannot take (ENOSPC, EIO, a
// failed journal) goes to the stable side file, and if that fails too, Set
// retries until it succeeds or the journal closes (ErrClosed).
func (s *GroupStore) Set(key, val []byte) error {
	r := requestPool.Get().(*request)
	r.buf = appendFrame(r.buf[:0], recStable, s.g.id, func(p []byte) []byte {
		p = appendUint32(p, 1)
		return appendStablePair(p, key, val)
	})
	r.sync = true
	r.stable = true
	err := s.l.submit(r)
	s.l.release(r)
	return err
}

// Get returns a copy of a stable value, or ErrKeyNotFound.
func (s *GroupStore) Get(key []byte) ([]byte, error) {
	s.g.mu.RLock()
	defer s.g.mu.RUnlock()
	v, ok := s.g.stable[string(key)]
	if !ok {
		return nil, ErrKeyNotFound
	}
	return append([]byte{}, v...), nil
}

// SetUint64 stores val as 8 big-endian bytes; always fsynced.
func (s *GroupStore) SetUint64(key []byte, val uint64) error {
	var b [8]byte
	binary.BigEndian.PutUint64(b[:], val)
	return s.Set(key, b[:])
}

// GetUint64 returns the value stored by SetUint64, 0 when the key is absent.
func (s *GroupStore) GetUint64(key []byte) (uint64, error) {
	s.g.mu.RLock()
	defer s.g.mu.RUnlock()
	v, ok := s.g.stable[string(key)]
	if !ok {
		return 0, nil
	}
	if len(v) != 8 {
		return 0, fmt.Errorf("raftlog: group %d: key %q holds %d bytes, not a uint64", s.g.id, key, len(v))
	}
	return binary.BigEndian.Uint64(v), nil
}

func (l *Log) release(r *request) {
	if cap(r.buf) > 4*recordSplitBytes {
		r.buf = nil // do not pin huge batches in the pool
	}
	r.err = nil
	r.stable = false
	requestPool.Put(r)
}

// applyFrame applies one verified frame at (seg, off) to the in-memory state.
// Live writes and replay both come through here, so a restart rebuilds
// exactly the state the running journal had. It is total: every verified
// frame has a defined effect. It reports whether a group's oldest entry may
// have moved to a later segment (a purge may now delete files).
func (l *Log) applyFrame(seg *segment, off int64, f frame) bool {
	if f.typ == recShutdown {
		return false
	}
	g := l.group(f.group)
	g.mu.Lock()
	defer g.mu.Unlock()
	switch f.typ {
	case recEntries:
		// The payload was verified (validatePayload), so it is walked here
		// without a callback to keep the hot path free of allocations.
		p := f.payload
		count := int(leUint32(p))
		pos := 4
		for i := 0; i < count; i++ {
			idx := leUint64(p[pos:])
			end := pos + entryHeaderSize + int(leUint32(p[pos+29:])&^nilLen) + int(leUint32(p[pos+33:])&^nilLen)
			if i == 0 {
				switch {
				case len(g.locs) == 0 || idx <= g.first || idx > g.last()+1:
					// Empty, rewritten from its start, or a gap: this run starts the log.
					g.first = idx
					g.locs = g.locs[:0]
				case idx <= g.last():
					g.locs = g.locs[:idx-g.first]
				}
			}
			g.locs = append(g.locs, loc{seg: uint32(seg.id), off: uint32(off + frameHeaderSize + int64(pos)), n: uint32(end - pos)})
			pos = end
		}
		return false
	case recDeleteRange:
		min := binary.LittleEndian.Uint64(f.payload[0:8])
		max := binary.LittleEndian.Uint64(f.payload[8:16])
		if len(g.locs) == 0 || max < g.first || min > g.last() {
			return false
		}
		oldSeg := g.locs[0].seg
		switch {
		case min <= g.first && max >= g.last():
			g.locs = nil
		case min <= g.first:
			g.locs = g.locs[max-g.first+1:]
			g.first = max + 1
			if cap(g.locs) > 1024 && len(g.locs) < cap(g.locs)/4 {
				g.locs = append([]loc(nil), g.locs...)
			}
		case max >= g.last():
			g.locs = g.locs[:min-g.first]
		}
		return len(g.locs) == 0 || g.locs[0].seg != oldSeg
	case recStable:
		walkStable(f.payload, func(k, v []byte) {
			g.stable[string(k)] = append([]byte{}, v...)
		})
	}
	return false
}

func appendUint32(b []byte, v uint32) []byte { return binary.LittleEndian.AppendUint32(b, v) }
func leUint32(b []byte) uint32               { return binary.LittleEndian.Uint32(b) }
func leUint64(b []byte) uint64               { return binary.LittleEndian.Uint64(b) }
