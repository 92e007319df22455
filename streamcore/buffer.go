package streamcore

// blockSize bounds one block of stream bytes. Blocks are append-only: bytes below a block's
// length never change, so a reader may keep sub-slices without copying and without a lock,
// and a fork may share its source's blocks.
const blockSize = 1 << 20

// firstBlockSize is the least capacity of a stream's first block (a larger first append
// gets the next power of two). Small: most of a node's streams may be small and idle, and
// the first block is their whole cost (a fixed 4 KiB first block was 85% of the live heap
// of 100,000 streams of 64 bytes). Blocks double from there, so a growing stream reaches
// large blocks after a few.
const firstBlockSize = 256

// Buffer holds the bytes [Base, End) of a stream as a list of append-only blocks.
type Buffer struct {
	base   uint64   // offset of blocks[0][0]
	end    uint64   // tail
	blocks [][]byte // append-only; every block but the last is full to its capacity
	starts []uint64 // offset of each block's first byte
	arenas []*arena // owner of each block (nil: Go heap)
}

// End is the offset just past the last byte.
func (b *Buffer) End() uint64 { return b.end }

// Base is the offset of the first byte still held.
func (b *Buffer) Base() uint64 { return b.base }

// Append adds p at the tail. Blocks never grow in place: when the last one is full a new
// one is started, twice as large up to blockSize, so no byte is ever copied twice and
// slices handed out earlier stay valid.
func (b *Buffer) Append(p []byte) {
	for len(p) > 0 {
		n := len(b.blocks)
		if n == 0 || len(b.blocks[n-1]) == cap(b.blocks[n-1]) {
			c := firstBlockSize
			if n > 0 {
				c = min(2*cap(b.blocks[n-1]), blockSize)
			}
			for c < len(p) && c < blockSize {
				c *= 2
			}
			blk, a := allocBlock(c)
			b.blocks = append(b.blocks, blk)
			b.starts = append(b.starts, b.end)
			b.arenas = append(b.arenas, a)
			n++
		}
		last := b.blocks[n-1]
		take := min(len(p), cap(last)-len(last))
		b.blocks[n-1] = append(last, p[:take]...)
		b.end += uint64(take)
		p = p[take:]
	}
}

// Pin returns a value that keeps every block of the buffer mapped while it is reachable.
// Whoever keeps slices from Slices after releasing the lock that guards the buffer must
// keep a Pin alongside them.
func (b *Buffer) Pin() any { return b.arenas }

// Slices returns the bytes [from, to) as sub-slices of the blocks (no copy). The caller
// must not modify them, and keeps Pin while it uses them.
func (b *Buffer) Slices(from, to uint64) [][]byte {
	if from < b.base {
		from = b.base
	}
	if to > b.end {
		to = b.end
	}
	if from >= to {
		return nil
	}
	i := b.blockIndex(from)
	var out [][]byte
	for ; i < len(b.blocks) && from < to; i++ {
		start := b.starts[i]
		blk := b.blocks[i]
		lo := from - start
		hi := uint64(len(blk))
		if start+hi > to {
			hi = to - start
		}
		if lo < hi {
			out = append(out, blk[lo:hi:hi])
			from = start + hi
		}
	}
	return out
}

// Copy returns the bytes [from, to) as one new slice.
func (b *Buffer) Copy(from, to uint64) []byte {
	if to > b.end {
		to = b.end
	}
	if from >= to {
		return nil
	}
	out := make([]byte, 0, to-from)
	for _, s := range b.Slices(from, to) {
		out = append(out, s...)
	}
	return out
}

// ByteAt returns the byte at off (which must be in [Base, End)).
func (b *Buffer) ByteAt(off uint64) byte {
	i := b.blockIndex(off)
	return b.blocks[i][off-b.starts[i]]
}

func (b *Buffer) blockIndex(off uint64) int {
	lo, hi := 0, len(b.starts)
	for hi-lo > 1 {
		m := (lo + hi) / 2
		if b.starts[m] <= off {
			lo = m
		} else {
			hi = m
		}
	}
	return lo
}

// TrimBelow drops whole blocks that end at or below off; Base becomes off (bytes of the
// block that contains off may still be held but are never returned).
func (b *Buffer) TrimBelow(off uint64) {
	if off <= b.base {
		return
	}
	if off > b.end {
		off = b.end
	}
	drop := 0
	for drop < len(b.blocks)-1 && b.starts[drop+1] <= off {
		drop++
	}
	b.blocks = append([][]byte(nil), b.blocks[drop:]...)
	b.starts = append([]uint64(nil), b.starts[drop:]...)
	b.arenas = append([]*arena(nil), b.arenas[drop:]...)
	b.base = off
}

// Prefix returns a buffer that shares this buffer's bytes [Base, to). Appending to either
// never disturbs the other: shared blocks are capped so the next append reallocates.
func (b *Buffer) Prefix(to uint64) Buffer {
	if to > b.end {
		to = b.end
	}
	nb := Buffer{base: b.base, end: b.base}
	if to <= b.base {
		nb.end = to
		nb.base = to
		return nb
	}
	for i, blk := range b.blocks {
		start := b.starts[i]
		if start >= to {
			break
		}
		n := uint64(len(blk))
		if start+n > to {
			n = to - start
		}
		nb.blocks = append(nb.blocks, blk[:n:n])
		nb.starts = append(nb.starts, start)
		nb.arenas = append(nb.arenas, b.arenas[i])
		nb.end = start + n
	}
	return nb
}
