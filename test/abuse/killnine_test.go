package abuse

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	ucl "github.com/ursula-go/ursula/client"
)

// TestKillNineUnderProducerLoad: one round of kill -9 of a real `ursula server` (default
// raft engine) under 8 concurrent idempotent producers; everything acknowledged survives,
// once and in order. The long version is TestSoakKillNineUnderProducerLoad.
func TestKillNineUnderProducerLoad(t *testing.T) {
	killNineUnderLoad(t, 1, 3*time.Second, "")
}

// TestKillNineFsyncAlways: the same with fsync = "always" and 64 KiB journal segments, so
// the journal rolls many times into segments prepared full of zeros (raftlog's prepared
// segments) and each kill -9 leaves the active one running on in zeros after its last
// frame; two rounds, so the second restart opens a journal that the first one continued
// inside those zeros.
func TestKillNineFsyncAlways(t *testing.T) {
	dataDir := killNineUnderLoad(t, 2, 2*time.Second, "[raft.wal]\nfsync = \"always\"\nsegment_size = 65536\n")
	// The journal did run on prepared segments: the running node holds the next one ready
	// (polled: a roll meanwhile starts another preparation).
	waitFor(t, "a prepared segment beside the journal", func() bool {
		st, err := os.Stat(filepath.Join(dataDir, "wal", "prealloc.tmp"))
		return err == nil && st.Size() == 65536
	})
}

// TestSoakKillNineUnderProducerLoad (make soak): 5 rounds of kill -9 under load.
func TestSoakKillNineUnderProducerLoad(t *testing.T) {
	if !soak() {
		t.Skip("a soak: URSULA_SOAK=1 (make soak)")
	}
	killNineUnderLoad(t, 5, 10*time.Second, "")
}

// killNineUnderLoad runs writers idempotent producers, each appending "%08d\n" of its
// Producer-Seq to a stream of its own and retrying the same seq until acknowledged. Each
// round lets them run for runFor, SIGKILLs the server and starts it again on the same data
// directory; then every stream must read back as 0, 1, 2, ... with at least every
// acknowledged record: nothing acknowledged lost, nothing written twice, nothing reordered.
func killNineUnderLoad(t *testing.T, rounds int, runFor time.Duration, config string) (dataDir string) {
	const writers = 8
	dataDir = t.TempDir()
	n := startConfig(t, dataDir, config)
	var base atomic.Pointer[string]
	base.Store(&n.url)
	cl, err := ucl.New("", ucl.WithTimeouts(5*time.Second, 10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Duration(rounds)*(runFor+90*time.Second))
	defer cancel()
	streamURL := func(w int) string { return fmt.Sprintf("%s/soak/kill-%d", *base.Load(), w) }
	for w := range writers {
		if _, err := cl.Create(ctx, streamURL(w), ucl.CreateOptions{ContentType: "application/octet-stream"}); err != nil {
			t.Fatalf("create stream %d: %v", w, err)
		}
	}

	var acked [writers]atomic.Int64 // records 0..acked-1 of each writer are acknowledged
	var retries atomic.Int64
	var stop atomic.Bool
	var wg sync.WaitGroup
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			pid := fmt.Sprintf("soak-writer-%d", w)
			for seq := uint64(0); !stop.Load(); seq++ {
				rec := []byte(fmt.Sprintf("%08d\n", seq))
				for {
					_, err := cl.Append(ctx, streamURL(w), rec, ucl.AppendOptions{ContentType: "application/octet-stream",
						Producer: &ucl.ProducerKey{ID: pid, Epoch: 0, Seq: seq}})
					if err == nil {
						break
					}
					if ctx.Err() != nil {
						t.Errorf("writer %d: seq %d never acknowledged before the test deadline: %v", w, seq, err)
						return
					}
					retries.Add(1)
					time.Sleep(20 * time.Millisecond) // the node is down or restarting
				}
				acked[w].Store(int64(seq) + 1)
			}
		}()
	}

	// check reads every stream whole and holds it to the acknowledged counts; exact: no
	// record beyond them either (once the writers stopped, nothing is in flight).
	check := func(when string, want [writers]int64, exact bool) {
		t.Helper()
		for w := range writers {
			data := readWhole(t, ctx, cl, streamURL(w))
			lines := bytes.Split(data, []byte("\n"))
			if len(lines) > 0 && len(lines[len(lines)-1]) == 0 {
				lines = lines[:len(lines)-1]
			}
			for i, l := range lines {
				if v, err := strconv.Atoi(string(l)); err != nil || v != i {
					t.Fatalf("%s: stream %d record %d is %q, want %08d (lost, duplicated or reordered)", when, w, i, l, i)
				}
			}
			if int64(len(lines)) < want[w] || (exact && int64(len(lines)) != want[w]) {
				t.Fatalf("%s: stream %d holds %d records, %d acknowledged", when, w, len(lines), want[w])
			}
		}
	}
	snapshot := func() (s [writers]int64, total int64) {
		for w := range writers {
			s[w] = acked[w].Load()
			total += s[w]
		}
		return s, total
	}

	for round := 1; round <= rounds; round++ {
		time.Sleep(runFor)
		if err := n.cmd.Process.Signal(syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		n.cmd.Wait()
		// Acknowledged so far: answered before the kill, so on disk.
		want, total := snapshot()
		n = startConfig(t, dataDir, config)
		base.Store(&n.url)
		check(fmt.Sprintf("after kill %d", round), want, false)
		t.Logf("round %d: %d appends acknowledged before kill -9, all present once and in order after the restart", round, total)
		if total == 0 {
			t.Fatalf("round %d: no append acknowledged in %v", round, runFor)
		}
	}
	stop.Store(true)
	wg.Wait()
	want, total := snapshot()
	check("at the end", want, true)
	n.alive(t)
	t.Logf("%d rounds, %d appends acknowledged, %d retries across the kills", rounds, total, retries.Load())
	return dataDir
}

// readWhole reads a stream from its start until up to date (bounded by ctx).
func readWhole(t *testing.T, ctx context.Context, cl *ucl.Client, u string) []byte {
	t.Helper()
	var out []byte
	off := "-1"
	for {
		rr, err := cl.Read(ctx, u, ucl.ReadOptions{Offset: off})
		if err != nil {
			t.Fatalf("read %s at %s: %v", u, off, err)
		}
		out = append(out, rr.Data...)
		if rr.UpToDate || rr.NextOffset == "" || rr.NextOffset == off {
			return out
		}
		off = rr.NextOffset
	}
}
