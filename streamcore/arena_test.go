package streamcore

import (
	"bytes"
	"runtime"
	"testing"
	"time"
)

// An arena nothing references any more is kept and reused (not unmapped and populated
// again), up to maxFreeArenas, and ReleaseArenas gives the kept ones back.
func TestArenaReuse(t *testing.T) {
	if !arenasAvailable {
		t.Skip("no arenas on this platform")
	}
	// settle runs collections until the kept count stops changing (every cleanup of an
	// arena that became garbage has run) and returns it.
	settle := func() int {
		n, same := freeArenaCount(), 0
		for deadline := time.Now().Add(10 * time.Second); same < 3 && time.Now().Before(deadline); {
			runtime.GC()
			time.Sleep(10 * time.Millisecond)
			if m := freeArenaCount(); m == n {
				same++
			} else {
				n, same = m, 0
			}
		}
		return n
	}
	settle() // arenas other tests left
	ReleaseArenas()
	fill := func() *Buffer {
		b := &Buffer{}
		chunk := bytes.Repeat([]byte{0xAB}, 1<<20)
		for range 3 * arenaSize >> 20 { // three arenas' worth
			b.Append(chunk)
		}
		return b
	}
	b := fill()
	held := map[*byte]bool{}
	for _, a := range b.arenas {
		held[&a.mem[0]] = true
	}
	if len(held) < 2 {
		t.Fatalf("the buffer spans %d arenas", len(held))
	}
	b = nil
	arenaMu.Lock()
	arenaCur = nil // the next block must come from a kept arena
	arenaMu.Unlock()
	kept := settle()
	if kept < 2 || kept > maxFreeArenas {
		t.Fatalf("%d arenas kept after the buffer went, want 2..%d", kept, maxFreeArenas)
	}
	// The next arenas come from the kept ones, and a reused block holds only what was
	// appended to it.
	b2 := &Buffer{}
	b2.Append(bytes.Repeat([]byte{1}, 1<<20))
	if freeArenaCount() != kept-1 {
		t.Fatalf("kept arenas %d -> %d: not reused", kept, freeArenaCount())
	}
	if !held[&b2.arenas[len(b2.arenas)-1].mem[0]] {
		t.Fatal("the new block is not in a kept arena")
	}
	if got := b2.blocks[len(b2.blocks)-1]; len(got) != 1<<20 || bytes.IndexByte(got, 0xAB) >= 0 {
		t.Fatal("a reused block shows bytes of its arena's previous life")
	}
	if n := ReleaseArenas(); n < (kept-1)*arenaSize {
		t.Fatalf("ReleaseArenas gave back %d bytes, want at least %d", n, (kept-1)*arenaSize)
	}
	if freeArenaCount() != 0 {
		t.Fatal("arenas still kept after ReleaseArenas")
	}
	runtime.KeepAlive(b2)
}
