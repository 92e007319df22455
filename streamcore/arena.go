package streamcore

import (
	"runtime"
	"sync"
)

// Stream bytes are the one thing the server keeps in bulk, and first-touch page faults of
// fresh heap memory are expensive (measured 11.5 µs per 4 KiB page on this project's test
// machines, against 0.7 µs when the kernel populates a whole mapping at once). Large
// blocks therefore come from arenas: mappings populated up front and carved by a bump
// allocator. A cleanup takes an arena back (pool or unmap) once nothing references it;
// everything that holds a block (a Buffer, a reader's Pin) holds its arena.
// BenchmarkAppendHandler: 22-25 µs per 4 KiB append with arenas, 29-35 µs with heap
// blocks.

const (
	arenaSize     = 8 << 20
	arenaMinBlock = 64 << 10 // smaller blocks come from the Go heap
)

type arena struct {
	mem []byte
	off int
}

// Ready arenas wait in a pool, newest on top: arenas freed (nothing references them any
// more) and the one populated ahead of need. A node whose hot bytes go to the cold tier
// frees arenas as fast as it fills them, and populating a fresh one costs the kernel's
// zeroing and, on a virtual machine, the hypervisor's faults (13% of the CPU of 1 MiB
// appends at 400 MB/s), where reusing one costs nothing; so up to maxFreeArenas freed ones
// are kept. A reused arena is not zeroed: a block is empty (length 0) and nothing reads
// past what was appended to it. ReleaseArenas unmaps the pool (an idle node's memory
// return).
const maxFreeArenas = 16

var (
	arenaMu    sync.Mutex
	arenaCur   *arena
	freeArenas [][]byte // the pool
	// arenaFilling is set while a goroutine populates an arena ahead of need, started
	// when the pool runs empty: populating 8 MiB takes milliseconds, which an append
	// would otherwise wait for while it holds its partition's lock.
	arenaFilling bool
)

// fillAhead populates an arena for the pool in the background when the pool is empty
// (called with arenaMu held, at most one at a time). It goes to the bottom of the pool:
// arenas freed since are reused first.
func fillAhead() {
	if len(freeArenas) > 0 || arenaFilling {
		return
	}
	arenaFilling = true
	go func() {
		mem, ok := mapPopulated(arenaSize)
		arenaMu.Lock()
		defer arenaMu.Unlock()
		arenaFilling = false
		if ok {
			freeArenas = append([][]byte{mem}, freeArenas...)
		}
	}()
}

// allocBlock returns an empty block of capacity c and the arena that owns it (nil for a
// heap block).
func allocBlock(c int) ([]byte, *arena) {
	if c < arenaMinBlock || !arenasAvailable {
		return make([]byte, 0, c), nil
	}
	arenaMu.Lock()
	defer arenaMu.Unlock()
	if arenaCur == nil || len(arenaCur.mem)-arenaCur.off < c {
		var mem []byte
		if n := len(freeArenas); n > 0 {
			mem = freeArenas[n-1]
			freeArenas[n-1] = nil
			freeArenas = freeArenas[:n-1]
		}
		if mem == nil {
			var ok bool
			if mem, ok = mapPopulated(arenaSize); !ok {
				return make([]byte, 0, c), nil
			}
		}
		a := &arena{mem: mem}
		runtime.AddCleanup(a, recycle, mem)
		arenaCur = a
		fillAhead()
	}
	a := arenaCur
	blk := a.mem[a.off : a.off : a.off+c]
	a.off += c
	return blk, a
}

// recycle keeps the memory of an arena nothing references any more for reuse, or unmaps
// it when enough are kept.
func recycle(mem []byte) {
	arenaMu.Lock()
	if len(freeArenas) < maxFreeArenas {
		freeArenas = append(freeArenas, mem)
		mem = nil
	}
	arenaMu.Unlock()
	if mem != nil {
		unmap(mem)
	}
}

// ReleaseArenas unmaps the pool and returns how many bytes that gave back to the OS.
func ReleaseArenas() int {
	arenaMu.Lock()
	free := freeArenas
	freeArenas = nil
	arenaMu.Unlock()
	n := 0
	for _, mem := range free {
		n += len(mem)
		unmap(mem)
	}
	return n
}

// freeArenaCount is how many arenas the pool holds (tests).
func freeArenaCount() int {
	arenaMu.Lock()
	defer arenaMu.Unlock()
	return len(freeArenas)
}
