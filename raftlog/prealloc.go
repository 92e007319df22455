package raftlog

import (
	"errors"
	"os"
	"path/filepath"
	"sync"
)

// Prepared segments (FsyncAlways only; the package documentation says why and how):
// the next segment is written full of zeros in the background while the active one
// fills, and the roll renames it into place, so the journal's fsyncs flush data into
// blocks already written instead of committing a growing file's metadata each time.

// preallocName is the segment being prepared; a leftover one is deleted by Open.
const preallocName = "prealloc.tmp"

// preallocChunk is the write size of the preparation.
const preallocChunk = 1 << 20

// preparer runs the background preparation of the next segment.
type preparer struct {
	mu    sync.Mutex
	ready bool // preallocName holds segMax synced zero bytes
	busy  bool
	off   bool // closing: start nothing more
	wg    sync.WaitGroup
	size  int64
	dir   string
	logf  func(string, ...any)
	guard *DiskGuard
	// failed is logged once: the journal works without preparation.
	failed bool
}

// kick starts a preparation unless one is ready or under way, or the disk is under
// pressure (the zeros would take room the journal's own writes need).
func (p *preparer) kick() {
	if p == nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ready || p.busy || p.off {
		return
	}
	if tok, _ := p.guard.WriteRefusal(); tok != "" {
		return
	}
	p.busy = true
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		err := p.prepare()
		p.mu.Lock()
		p.busy = false
		p.ready = err == nil
		logIt := err != nil && !p.failed && !p.off // a Close cut it short: nothing to say
		p.failed = p.failed || err != nil && !p.off
		p.mu.Unlock()
		if logIt {
			p.logf("raftlog: cannot prepare the next segment (it will grow as it is written, with slower fsyncs): %v", err)
		}
	}()
}

func (p *preparer) prepare() error {
	path := filepath.Join(p.dir, preallocName)
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR|os.O_TRUNC, 0o644)
	if err != nil {
		return err
	}
	zero := make([]byte, preallocChunk)
	for off := int64(0); off < p.size && err == nil; off += preallocChunk {
		p.mu.Lock()
		stop := p.off
		p.mu.Unlock()
		if stop {
			err = errors.New("closing")
			break
		}
		n := min(preallocChunk, p.size-off)
		if _, err = f.WriteAt(zero[:n], off); err == nil {
			// Each chunk reaches the disk before the next is written, so the zeros
			// never queue up ahead of the journal's fsyncs, and the final fsync has
			// nothing left but the file's size.
			writeback(f, off, n)
		}
	}
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(path)
	}
	return err
}

// isReady reports whether a prepared file waits.
func (p *preparer) isReady() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.ready
}

// leaveForPrepared reports whether the next frame (at off) should go to a prepared
// segment now rather than when the active one is full: true once, for the segment that
// was active at Open when it is not a prepared one (a new journal's first, or one an
// older build or FsyncNever wrote), so that a node writing little does not wait for
// 64 MiB before its fsyncs get faster. The sealed segment may be small; it is purged
// like any other.
func (l *Log) leaveForPrepared(off int64) bool {
	return l.prep != nil && l.active.id == l.openSeg && !l.active.zeroTail &&
		off > l.active.base && l.prep.isReady()
}

// take hands over the prepared file (opened for writing), or nil when none is ready.
func (p *preparer) take() *os.File {
	if p == nil {
		return nil
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.ready {
		return nil
	}
	p.ready = false
	f, err := os.OpenFile(filepath.Join(p.dir, preallocName), os.O_RDWR, 0)
	if err != nil {
		return nil
	}
	return f
}

// stop waits for a preparation under way and starts no other. The prepared file
// stays; the next Open deletes it.
func (p *preparer) stop() {
	if p == nil {
		return
	}
	p.mu.Lock()
	p.off = true
	p.mu.Unlock()
	p.wg.Wait()
}

// allZero reports whether b holds only zero bytes.
func allZero(b []byte) bool {
	for len(b) >= 8 {
		if leUint64(b) != 0 {
			return false
		}
		b = b[8:]
	}
	for _, c := range b {
		if c != 0 {
			return false
		}
	}
	return true
}
