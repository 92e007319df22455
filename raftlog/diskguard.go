package raftlog

import (
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"time"
)

// DiskGuard is the node's write admission for the journal's disk: it refuses writes while
// the free space of the journal's filesystem is under a floor, or after the journal met
// ENOSPC, until the free space is back over a higher resume mark (no flapping). It is the
// one place that decides "WalDiskPressure"; the HTTP server asks it before reading a
// write's body (WriteRefusal), and the journal reports ENOSPC to it.
type DiskGuard struct {
	dir        string
	minFree    int64
	resumeFree int64
	statfs     func(dir string) (free, size int64, err error)

	mu       sync.Mutex
	checked  time.Time
	pressure bool
	reason   string
}

// diskCheckEvery bounds how stale the guard's view of the free space may be. statfs is
// cheap, so writes check it this often rather than a timer doing it less often.
const diskCheckEvery = 50 * time.Millisecond

// Default floors of free space, capped to a share of small filesystems so that a small
// disk is usable at all.
const (
	DefaultMinFreeBytes    = 512 << 20
	DefaultResumeFreeBytes = 1 << 30
)

// NewDiskGuard watches the filesystem of dir. minFree <= 0 and resumeFree <= 0 take the
// defaults, capped at 1/10 and 1/5 of the filesystem's size; minFree < 0 turns the floor
// off (ENOSPC still stops writes until space returns).
func NewDiskGuard(dir string, minFree, resumeFree int64) (*DiskGuard, error) {
	g := &DiskGuard{dir: dir, statfs: statfsFree}
	_, size, err := g.statfs(dir)
	if err != nil {
		return nil, fmt.Errorf("raftlog: disk guard: %w", err)
	}
	if minFree == 0 {
		minFree = min(DefaultMinFreeBytes, size/10)
	}
	if resumeFree <= 0 {
		resumeFree = min(DefaultResumeFreeBytes, size/5)
	}
	if minFree > 0 && resumeFree <= minFree {
		return nil, fmt.Errorf("raftlog: disk guard: resume free space %d must exceed the floor %d", resumeFree, minFree)
	}
	g.minFree, g.resumeFree = minFree, resumeFree
	return g, nil
}

func statfsFree(dir string) (free, size int64, err error) {
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err != nil {
		return 0, 0, err
	}
	return int64(st.Bavail) * int64(st.Bsize), int64(st.Blocks) * int64(st.Bsize), nil
}

// WriteRefusal returns ("WalDiskPressure", why) while writes must wait, "" otherwise.
func (g *DiskGuard) WriteRefusal() (token, reason string) {
	if g == nil {
		return "", ""
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if now := time.Now(); now.Sub(g.checked) >= diskCheckEvery {
		g.checked = now
		g.checkLocked()
	}
	if g.pressure {
		return "WalDiskPressure", g.reason
	}
	return "", ""
}

func (g *DiskGuard) checkLocked() {
	free, _, err := g.statfs(g.dir)
	switch {
	case err != nil:
		g.pressure, g.reason = true, "the free space of the journal's disk cannot be read: "+err.Error()
	case g.pressure && free >= g.resumeFree:
		g.pressure, g.reason = false, ""
	case !g.pressure && g.minFree > 0 && free < g.minFree:
		g.pressure = true
		g.reason = fmt.Sprintf("the journal's disk has %d bytes free, under the floor of %d; writes resume at %d", free, g.minFree, g.resumeFree)
	}
}

// NoSpace records that the journal met ENOSPC: writes stop until the resume mark.
func (g *DiskGuard) NoSpace() {
	if g == nil {
		return
	}
	g.mu.Lock()
	g.pressure = true
	g.reason = fmt.Sprintf("the journal's disk is full; writes resume once %d bytes are free", g.resumeFree)
	g.checked = time.Now()
	g.mu.Unlock()
}

// reserveName is a file of zeros the journal keeps beside its segments and deletes when
// it meets ENOSPC, so the records Raft cannot do without (terms, votes, the entries of
// a leader change) still find room on a full disk.
const reserveName = "reserve"

// reserveBytes is the size of the reserve.
const reserveBytes = 4 << 20

// makeReserve creates the reserve if it is missing; false when there was no room.
func makeReserve(dir string) bool {
	p := filepath.Join(dir, reserveName)
	if st, err := os.Stat(p); err == nil && st.Size() == reserveBytes {
		return true
	}
	tmp := p + ".tmp"
	f, err := os.Create(tmp)
	if err != nil {
		return false
	}
	// Written, not only sized: a sparse file would hold no blocks to give back.
	_, err = f.Write(make([]byte, reserveBytes))
	if err == nil {
		err = f.Sync()
	}
	f.Close()
	if err == nil {
		err = os.Rename(tmp, p)
	}
	if err != nil {
		os.Remove(tmp)
		return false
	}
	return true
}

// dropReserve deletes the reserve; false when there was none.
func dropReserve(dir string) bool {
	return os.Remove(filepath.Join(dir, reserveName)) == nil
}
