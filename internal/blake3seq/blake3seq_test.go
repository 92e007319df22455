package blake3seq

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"runtime"
	"testing"

	"lukechampine.com/blake3"
)

// sizes around every boundary the tree has: a block, a chunk, a batch, two batches.
var sizes = []int{0, 1, 63, 64, 65, 1023, 1024, 1025, 2048, 3000, 8000, 8192, 8193,
	16383, 16384, 16385, 17408, 32767, 32768, 32769, 49152, 65536, 65537, 100000,
	1 << 20, 1<<20 + 1, 3<<20 + 12345}

func input(n int) []byte {
	b := make([]byte, n)
	r := rand.New(rand.NewPCG(uint64(n), 7))
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return b
}

// TestMatchesLibrary: every size gives the library's digest, written whole or in pieces.
func TestMatchesLibrary(t *testing.T) {
	for _, n := range sizes {
		b := input(n)
		want := blake3.Sum256(b)
		if got := Sum256(b); got != want {
			t.Fatalf("Sum256 of %d bytes: %x, want %x", n, got, want)
		}
		for _, piece := range []int{1, 100, 1024, 5000, 16384, 40000} {
			if piece > n && n > 0 {
				continue
			}
			h := New()
			for rest := b; len(rest) > 0; {
				k := min(piece, len(rest))
				h.Write(rest[:k])
				rest = rest[k:]
			}
			if got := h.Sum(nil); !bytes.Equal(got, want[:]) {
				t.Fatalf("%d bytes in pieces of %d: %x, want %x", n, piece, got, want)
			}
		}
	}
}

// TestSumKeepsState: Sum in the middle does not disturb the hash, and Reset empties it.
func TestSumKeepsState(t *testing.T) {
	b := input(50000)
	h := New()
	h.Write(b[:20000])
	mid := blake3.Sum256(b[:20000])
	if got := h.Sum([]byte("x")); !bytes.Equal(got, append([]byte("x"), mid[:]...)) {
		t.Fatalf("Sum after 20000 bytes: %x", got)
	}
	h.Write(b[20000:])
	if want := blake3.Sum256(b); !bytes.Equal(h.Sum(nil), want[:]) {
		t.Fatal("Sum after a Sum in the middle differs from the library")
	}
	h.Reset()
	h.Write(b[:5])
	if want := blake3.Sum256(b[:5]); !bytes.Equal(h.Sum(nil), want[:]) {
		t.Fatal("Sum after Reset differs from the library")
	}
	if h.Size() != 32 || h.BlockSize() != 64 {
		t.Fatalf("Size %d BlockSize %d", h.Size(), h.BlockSize())
	}
}

// TestNoGoroutines: hashing a large input starts no goroutine (the library's Write does).
func TestNoGoroutines(t *testing.T) {
	b := input(4 << 20)
	before := runtime.NumGoroutine()
	done := make(chan int)
	go func() {
		h := New()
		h.Write(b)
		h.Sum(nil)
		done <- runtime.NumGoroutine()
	}()
	// The hashing goroutine itself is the only one added while it runs.
	if during := <-done; during > before+1 {
		t.Fatalf("%d goroutines while hashing, %d before", during, before)
	}
}

func FuzzMatchesLibrary(f *testing.F) {
	f.Add([]byte("abc"), uint16(1))
	f.Add(input(17000), uint16(1000))
	f.Fuzz(func(t *testing.T, b []byte, piece uint16) {
		want := blake3.Sum256(b)
		h := New()
		p := max(int(piece), 1)
		for rest := b; len(rest) > 0; {
			k := min(p, len(rest))
			h.Write(rest[:k])
			rest = rest[k:]
		}
		if got := h.Sum(nil); !bytes.Equal(got, want[:]) {
			t.Fatalf("%d bytes in pieces of %d: %x, want %x", len(b), p, got, want)
		}
	})
}

func BenchmarkSum256(b *testing.B) {
	for _, n := range []int{1000, 8000, 64 << 10, 1 << 20} {
		in := input(n)
		b.Run(fmt.Sprintf("seq-%d", n), func(b *testing.B) {
			b.SetBytes(int64(n))
			for b.Loop() {
				Sum256(in)
			}
		})
		b.Run(fmt.Sprintf("library-%d", n), func(b *testing.B) {
			b.SetBytes(int64(n))
			for b.Loop() {
				blake3.Sum256(in)
			}
		})
	}
}

// TestSumPieces: pieces hash as their concatenation.
func TestSumPieces(t *testing.T) {
	b := input(40000)
	want := blake3.Sum256(b)
	if got := SumPieces(b[:3], b[3:17000], nil, b[17000:]); got != want {
		t.Fatalf("SumPieces: %x, want %x", got, want)
	}
}
