package streamcore

import (
	"fmt"
	"testing"
)

// receiptModel is the window's specification: the last ReceiptWindowSize receipts, and a
// lookup that returns the newest one with the key.
type receiptModel []Receipt

func (m *receiptModel) add(r Receipt) {
	*m = append(*m, r)
	if len(*m) > ReceiptWindowSize {
		*m = (*m)[1:]
	}
}

func (m receiptModel) find(id string, epoch, seq uint64) (Receipt, bool) {
	for i := len(m) - 1; i >= 0; i-- {
		if r := m[i]; r.Producer == id && r.Epoch == epoch && r.Seq == seq {
			return r, true
		}
	}
	return Receipt{}, false
}

// checkWindow adds ops receipts (producer, epoch, seq small so keys repeat) to a window and
// to the model, and compares every lookup of every key after each add, and after an
// encode/decode round trip.
func checkWindow(t *testing.T, ops []byte) {
	t.Helper()
	var w ReceiptWindow
	var m receiptModel
	keyOf := func(b byte) (string, uint64, uint64) {
		return fmt.Sprintf("p%d", b%3), uint64(b/3) % 2, uint64(b/6) % 8
	}
	compare := func(w *ReceiptWindow, when string) {
		for b := range 48 {
			id, ep, seq := keyOf(byte(b))
			got, gok := w.find(id, ep, seq)
			want, wok := m.find(id, ep, seq)
			if got != want || gok != wok {
				t.Fatalf("%s: find(%s,%d,%d) = %+v %v, want %+v %v", when, id, ep, seq, got, gok, want, wok)
			}
		}
	}
	for i, b := range ops {
		id, ep, seq := keyOf(b)
		r := Receipt{Producer: id, Epoch: ep, Seq: seq, Start: uint64(i), End: uint64(i) + 1}
		w.add(r)
		m.add(r)
		if i%97 == 0 || i == len(ops)-1 {
			compare(&w, fmt.Sprintf("after add %d", i))
		}
	}
	var e encoder
	e.receipts(&w)
	d := decoder{b: e.b}
	var back ReceiptWindow
	d.receipts(&back)
	if d.err != nil {
		t.Fatalf("decode: %v", d.err)
	}
	compare(&back, "after a round trip")
}

// TestReceiptWindowMatchesModel: the ring without an index answers like the list of the
// last ReceiptWindowSize receipts, before and after it wraps, for keys held twice (the
// newest wins) and for keys that left the window.
func TestReceiptWindowMatchesModel(t *testing.T) {
	for _, n := range []int{0, 1, 5, ReceiptWindowSize - 1, ReceiptWindowSize, ReceiptWindowSize + 1, 3*ReceiptWindowSize + 17} {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			ops := make([]byte, n)
			for i := range ops {
				ops[i] = byte(i*7 + i/13)
			}
			checkWindow(t, ops)
		})
	}
	// A key that only the oldest evicted slot held is gone.
	var w ReceiptWindow
	w.add(Receipt{Producer: "old", Seq: 1})
	for i := range ReceiptWindowSize {
		w.add(Receipt{Producer: "new", Seq: uint64(i)})
	}
	if _, ok := w.find("old", 0, 1); ok {
		t.Fatal("a receipt that left the window was found")
	}
	if r, ok := w.find("new", 0, 0); !ok || r.Seq != 0 {
		t.Fatalf("the oldest receipt in the window: %+v %v", r, ok)
	}
}

func FuzzReceiptWindow(f *testing.F) {
	f.Add([]byte{1, 2, 3, 1, 2, 3})
	f.Add(make([]byte, ReceiptWindowSize+3))
	f.Fuzz(func(t *testing.T, ops []byte) {
		if len(ops) > 4*ReceiptWindowSize {
			ops = ops[:4*ReceiptWindowSize]
		}
		checkWindow(t, ops)
	})
}

// BenchmarkProducerAppend: producer appends to 64 streams in turn, through State.Apply
// (the state machine's share of an append, receipts included). The 64-byte case keeps
// the memory taken small, so first-touch page faults do not hide the per-write work.
func BenchmarkProducerAppend(b *testing.B) {
	for _, size := range []int{64, 4096} {
		b.Run(fmt.Sprint(size), func(b *testing.B) { benchProducerAppend(b, size) })
	}
}

func benchProducerAppend(b *testing.B, size int) {
	st := NewState()
	const streams = 64
	keys := make([]string, streams)
	for i := range keys {
		keys[i] = fmt.Sprintf("bench/s%d", i)
		if r := st.Apply(create(keys[i], "application/octet-stream", 1)); r.Status != 201 {
			b.Fatalf("create: %d", r.Status)
		}
	}
	body := string(make([]byte, size))
	b.SetBytes(int64(size))
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		k := keys[i%streams]
		c := prod(appendCmd(k, "application/octet-stream", body, 2), "writer-"+k, 0, uint64(i/streams))
		if r := st.Apply(c); r.Status != 200 {
			b.Fatalf("append %d: %d %v", i, r.Status, r.Err)
		}
	}
}
