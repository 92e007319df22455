package raftengine

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"reflect"
	"sync"
	"testing"
	"time"

	"github.com/ursula-go/ursula/streamcore"
)

func openSingle(t *testing.T, groups int) *Engine {
	t.Helper()
	e, err := Open(Config{NodeID: 1, GroupCount: groups, RaftLog: io.Discard, BatchProposals: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	waitReady(t, e)
	return e
}

func produce(key, body string, epoch, seq uint64) *streamcore.Command {
	c := appendCmd(key, body)
	c.Producer = &streamcore.ProducerHeaders{ID: "p", Epoch: epoch, Seq: seq}
	return c
}

func entry(c *streamcore.Command) *proposal {
	return &proposal{data: streamcore.AppendCommand([]byte{entryCommand}, c)}
}

// One batch entry answers each of its commands exactly as the same commands proposed one
// by one (each its own entry, on a second engine) answer them: creates, appends to two streams, a producer's
// duplicate, its sequence gap, a stale epoch and a write to a missing stream, in order
// inside one entry.
func TestBatchEntryAnswersLikeSingleCommands(t *testing.T) {
	e := openSingle(t, 1)
	now := time.Now().UnixMilli()
	cmds := []*streamcore.Command{
		create("b/one"), create("b/two"),
		produce("b/one", "a", 1, 0), produce("b/two", "x", 1, 0),
		produce("b/one", "b", 1, 1), produce("b/one", "b", 1, 1), // duplicate
		produce("b/one", "c", 1, 3),                              // gap
		produce("b/one", "c", 1, 2), produce("b/one", "z", 0, 3), // stale epoch
		appendCmd("b/missing", "m"), appendCmd("b/two", "y"),
	}
	for _, c := range cmds {
		c.Now = now
	}
	batch := make([]*proposal, len(cmds))
	for i, c := range cmds {
		batch[i] = entry(c)
	}
	g := e.groupOf("b/one")
	resp, err := g.applyRaw(context.Background(), encodeBatch(batch))
	if err != nil {
		t.Fatal(err)
	}
	got, ok := resp.(batchAnswer)
	if !ok || len(got) != len(cmds) {
		t.Fatalf("answer %T %v", resp, resp)
	}
	m := openSingle(t, 1)
	for i, c := range cmds {
		want, err := m.Propose(context.Background(), c)
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(got[i], want) {
			t.Errorf("command %d: batch answered %+v, alone %+v", i, got[i], want)
		}
	}
	for _, k := range []string{"b/one", "b/two"} {
		if r, want := read(e, k), read(m, k); r != want {
			t.Errorf("%s holds %q, one by one %q", k, r, want)
		}
	}
	if r := read(e, "b/one"); r != "abc" {
		t.Errorf("b/one holds %q, want abc", r)
	}
}

// Many writers at once on few groups (so their proposals share entries): every producer's
// writes land once and in order, each retry of an accepted write answers as a
// duplicate, and the log holds no more entries than there were commands.
func TestConcurrentProposalsKeepOrderAndDedup(t *testing.T) {
	e := openSingle(t, 2)
	ctx := context.Background()
	const writers, writes = 24, 30
	for w := range writers {
		if r, err := e.Propose(ctx, create(fmt.Sprintf("b/w%d", w))); err != nil || r.Status != http.StatusCreated {
			t.Fatalf("create: %v %+v", err, r)
		}
	}
	before := e.groups[0].r.LastIndex() + e.groups[1].r.LastIndex()
	var wg sync.WaitGroup
	errs := make(chan error, writers)
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			k := fmt.Sprintf("b/w%d", w)
			for s := range uint64(writes) {
				body := fmt.Sprintf("%d;", s)
				r, err := e.Propose(ctx, produce(k, body, 1, s))
				if err != nil || r.Status != http.StatusOK && r.Status != http.StatusNoContent {
					errs <- fmt.Errorf("%s seq %d: %v %+v", k, s, err, r)
					return
				}
				again, err := e.Propose(ctx, produce(k, body, 1, s))
				if err != nil || again.Status != http.StatusNoContent || again.Get(streamcore.HdrProducerSeq) != fmt.Sprint(s) {
					errs <- fmt.Errorf("%s retry of seq %d: %v %+v", k, s, err, again)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	for w := range writers {
		var want bytes.Buffer
		for s := range writes {
			fmt.Fprintf(&want, "%d;", s)
		}
		if got := read(e, fmt.Sprintf("b/w%d", w)); got != want.String() {
			t.Fatalf("b/w%d holds %q, want %q", w, got, want.String())
		}
	}
	after := e.groups[0].r.LastIndex() + e.groups[1].r.LastIndex()
	if n := after - before; n > 2*writers*writes {
		t.Fatalf("%d entries for %d commands", n, 2*writers*writes)
	}
	t.Logf("%d commands in %d entries", 2*writers*writes, after-before)
}

func TestDecodeBatch(t *testing.T) {
	one := entry(appendCmd("b/s", "x"))
	two := entry(produce("b/t", "yy", 1, 0))
	good := encodeBatch([]*proposal{one, two})[1:]
	cmds, err := decodeBatch(good)
	if err != nil || len(cmds) != 2 || !bytes.Equal(cmds[0], one.data[1:]) || !bytes.Equal(cmds[1], two.data[1:]) {
		t.Fatalf("round trip: %v %q", err, cmds)
	}
	for _, tc := range []struct {
		name string
		b    []byte
	}{
		{"empty", nil},
		{"count beyond the entry", []byte{200, 1}},
		{"length beyond the entry", []byte{1, 5, 1, 2}},
		{"truncated", good[:len(good)-1]},
		{"trailing bytes", append(append([]byte(nil), good...), 0)},
		{"bad varint", []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}},
	} {
		if _, err := decodeBatch(tc.b); err == nil {
			t.Errorf("%s: accepted", tc.name)
		}
	}
	if cmds, err := decodeBatch([]byte{0}); err != nil || len(cmds) != 0 {
		t.Errorf("zero commands: %v %v", cmds, err)
	}
}

func FuzzDecodeBatch(f *testing.F) {
	f.Add(encodeBatch([]*proposal{entry(appendCmd("b/s", "x")), entry(create("b/t"))})[1:])
	f.Add([]byte{1, 0})
	f.Fuzz(func(t *testing.T, b []byte) {
		cmds, err := decodeBatch(b)
		if err != nil {
			return
		}
		n := 0
		for _, c := range cmds {
			n += len(c)
		}
		if n > len(b) {
			t.Fatalf("%d command bytes from a %d byte entry", n, len(b))
		}
	})
}
