package coldtier

import (
	"bytes"
	"errors"
	"io"
	"testing"
)

// failAfter fails every write after the first n bytes.
type failAfter struct {
	bytes.Buffer
	n int
}

func (w *failAfter) Write(p []byte) (int, error) {
	if w.Len()+len(p) > w.n {
		return 0, errors.New("full")
	}
	return w.Buffer.Write(p)
}

// TestSlicesReader: reading, seeking and WriteTo give the same bytes from any position,
// WriteTo writes each piece once (no copy through a buffer) and stops at a write error.
func TestSlicesReader(t *testing.T) {
	parts := [][]byte{[]byte("abc"), nil, []byte("defgh"), []byte("i")}
	all := "abcdefghi"
	for _, c := range []struct {
		name   string
		seek   int64
		writes int
	}{
		{"from the start", 0, 3},
		{"inside the first piece", 2, 3},
		{"at a piece boundary", 3, 2},
		{"inside a later piece", 5, 2},
		{"the last byte", 8, 1},
		{"at the end", 9, 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := newSlicesReader(parts)
			if _, err := r.Seek(c.seek, io.SeekStart); err != nil {
				t.Fatal(err)
			}
			got, err := io.ReadAll(struct{ io.Reader }{r}) // Read only
			if err != nil || string(got) != all[c.seek:] {
				t.Fatalf("Read: %q %v, want %q", got, err, all[c.seek:])
			}
			r.Seek(c.seek, io.SeekStart)
			var w countWrites
			n, err := r.WriteTo(&w)
			if err != nil || n != int64(len(all))-c.seek || w.String() != all[c.seek:] || w.writes != c.writes {
				t.Fatalf("WriteTo: %d bytes %q in %d writes, %v; want %q in %d writes", n, w.String(), w.writes, err, all[c.seek:], c.writes)
			}
			if n, err := r.WriteTo(&w); n != 0 || err != nil {
				t.Fatalf("WriteTo at the end: %d %v", n, err)
			}
		})
	}
	r := newSlicesReader(parts)
	w := &failAfter{n: 4}
	if n, err := r.WriteTo(w); err == nil || n != 3 {
		t.Fatalf("WriteTo into a failing writer: %d %v, want 3 bytes and the error", n, err)
	}
}

type countWrites struct {
	bytes.Buffer
	writes int
}

func (w *countWrites) Write(p []byte) (int, error) {
	w.writes++
	return w.Buffer.Write(p)
}
