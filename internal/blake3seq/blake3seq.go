// Package blake3seq computes BLAKE3-256 in the calling goroutine.
//
// lukechampine.com/blake3 hashes any write longer than one 1 KiB chunk by starting a
// goroutine per subtree (Hasher.Write, and CompressEigentree past 16 chunks) and waiting
// for them. Each start wakes an idle processor, which on small VMs costs tens of
// microseconds: an 8 KB Producer-Digest took about 45 us on each side of an append. This
// package drives the same library's SIMD kernels (guts.CompressBuffer, 16 chunks at a
// time) from one goroutine and keeps the BLAKE3 tree itself, so the digests are the
// library's, bit for bit, without the fan-out. A busy server gains nothing from spreading
// one hash over its cores anyway: its other requests already use them.
package blake3seq

import (
	"math/bits"
	"sync"

	"lukechampine.com/blake3"
	"lukechampine.com/blake3/guts"
)

// Size is the digest size in bytes (BLAKE3-256).
const Size = 32

// bufSize is one SIMD batch: guts.CompressBuffer takes up to MaxSIMD chunks at once.
const bufSize = guts.MaxSIMD * guts.ChunkSize

// batchHeight is the height in the BLAKE3 tree of a full batch's subtree.
var batchHeight = bits.TrailingZeros(guts.MaxSIMD)

// Sum256 returns the unkeyed BLAKE3-256 digest of b.
func Sum256(b []byte) [Size]byte {
	if len(b) <= guts.ChunkSize {
		return blake3.Sum256(b) // one chunk: the library hashes it in place, no goroutine
	}
	return SumPieces(b)
}

// SumPieces returns the BLAKE3-256 digest of the pieces written one after the other.
func SumPieces(pieces ...[]byte) [Size]byte {
	h := hashers.Get().(*Hasher)
	h.Reset()
	for _, p := range pieces {
		h.Write(p)
	}
	var out [Size]byte
	h.sum(&out)
	hashers.Put(h)
	return out
}

// hashers keeps Hashers for Sum256: one is 18 KiB, too large for a goroutine's stack.
var hashers = sync.Pool{New: func() any { return new(Hasher) }}

// Hasher is a BLAKE3-256 hash.Hash that never starts goroutines. The zero value is ready.
type Hasher struct {
	// stack holds the chaining values of finished subtrees, one per height; chunks counts
	// the chunks in them, so its set bits are the occupied heights.
	stack  [64][8]uint32
	chunks uint64
	// buf holds the input not yet folded into the stack: the last batch is kept until
	// more input shows it is not the tree's right edge, where the root flag goes.
	buf [bufSize]byte
	n   int
}

// New returns a BLAKE3-256 Hasher.
func New() *Hasher { return new(Hasher) }

// Write adds p to the hash. It never fails.
func (h *Hasher) Write(p []byte) (int, error) {
	total := len(p)
	for len(p) > 0 {
		if h.n == bufSize {
			h.push(guts.ChainingValue(guts.CompressBuffer(&h.buf, bufSize, &guts.IV, h.chunks, 0)))
			h.n = 0
		}
		if h.n == 0 && len(p) > bufSize {
			// A whole batch with input after it: hash it in place, without the copy.
			h.push(guts.ChainingValue(guts.CompressBuffer((*[bufSize]byte)(p[:bufSize]), bufSize, &guts.IV, h.chunks, 0)))
			p = p[bufSize:]
			continue
		}
		c := copy(h.buf[h.n:], p)
		h.n += c
		p = p[c:]
	}
	return total, nil
}

// push adds the chaining value of a full batch, merging equal-height subtrees upwards.
func (h *Hasher) push(cv [8]uint32) {
	i := batchHeight
	for h.chunks&(1<<i) != 0 {
		cv = guts.ChainingValue(guts.ParentNode(h.stack[i], cv, &guts.IV, 0))
		i++
	}
	h.stack[i] = cv
	h.chunks += 1 << batchHeight
}

// sum writes the digest of everything written so far; the state is unchanged.
func (h *Hasher) sum(out *[Size]byte) {
	// The buffered batch is the right edge of the tree; the subtrees on the stack are
	// joined to it from the lowest up, and the top node gets the root flag.
	n := guts.CompressBuffer(&h.buf, h.n, &guts.IV, h.chunks, 0)
	for i := batchHeight; i < bits.Len64(h.chunks); i++ {
		if h.chunks&(1<<i) != 0 {
			n = guts.ParentNode(h.stack[i], guts.ChainingValue(n), &guts.IV, 0)
		}
	}
	n.Flags |= guts.FlagRoot
	words := guts.WordsToBytes(guts.CompressNode(n))
	copy(out[:], words[:Size])
}

// Sum appends the digest to b.
func (h *Hasher) Sum(b []byte) []byte {
	var out [Size]byte
	h.sum(&out)
	return append(b, out[:]...)
}

// Reset empties the hash.
func (h *Hasher) Reset() { h.chunks, h.n = 0, 0 }

// Size is the digest size in bytes.
func (h *Hasher) Size() int { return Size }

// BlockSize is BLAKE3's block size.
func (h *Hasher) BlockSize() int { return guts.BlockSize }
