package abuse

import (
	"bytes"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// mountTmpfs mounts a tmpfs of size at a fresh directory, or skips the test.
func mountTmpfs(t *testing.T, size string) string {
	t.Helper()
	dir := t.TempDir()
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size="+size, "tmpfs", dir).CombinedOutput(); err != nil {
		t.Skipf("cannot mount a tmpfs here (needs root or CAP_SYS_ADMIN), skipping the full-disk case: %v %s", err, out)
	}
	t.Cleanup(func() { exec.Command("umount", "-l", dir).Run() })
	return dir
}

// TestFullDisk fills the data disk with appends: the node refuses writes with 503
// WalDiskPressure instead of crashing, keeps serving reads, says why in readiness, takes
// writes again by itself once space is freed, and has lost nothing it acknowledged.
func TestFullDisk(t *testing.T) {
	t.Run("floor", func(t *testing.T) { fullDisk(t, "") })
	// Without the floor the journal meets ENOSPC itself: still no crash.
	t.Run("enospc", func(t *testing.T) { fullDisk(t, "wal_min_free_bytes = -1") })
}

func fullDisk(t *testing.T, limits string) {
	mnt := mountTmpfs(t, "64m")
	data := filepath.Join(mnt, "data")
	n := start(t, data, limits)
	u := n.url + "/abuse/full"
	if res, b := do(t, "PUT", u, nil, "Content-Type", "application/octet-stream"); res.StatusCode/100 != 2 {
		t.Fatalf("create: %d %s", res.StatusCode, b)
	}
	// A filler takes most of the disk, so a few appends reach the floor.
	filler := filepath.Join(mnt, "filler")
	if err := os.WriteFile(filler, make([]byte, 40<<20), 0o644); err != nil {
		t.Fatal(err)
	}
	var acked bytes.Buffer
	var unknown []byte // an append whose outcome the node could not know (ENOSPC mid-way)
	pressure := 0
	for i := 0; i < 400 && pressure < 5 && unknown == nil; i++ {
		body := bytes.Repeat([]byte{byte('a' + i%26)}, 256<<10)
		res, b := do(t, "POST", u, body, "Content-Type", "application/octet-stream")
		switch {
		case res.StatusCode/100 == 2:
			acked.Write(body)
		case res.StatusCode == 503 && strings.Contains(string(b), "WAL_DISK_PRESSURE"):
			if res.Header.Get("Retry-After") == "" || res.Header.Get("X-Ursula-Not-Applied") != "WalDiskPressure" {
				t.Fatalf("pressure refusal without Retry-After or marker: %v", res.Header)
			}
			pressure++
		case res.StatusCode == 503 && strings.Contains(string(b), "OUTCOME_UNKNOWN"):
			unknown = body
		default:
			t.Fatalf("append %d: %d %s", i, res.StatusCode, b)
		}
		n.alive(t)
	}
	if pressure == 0 && unknown == nil {
		t.Fatalf("the disk never came under pressure (%d bytes acknowledged)", acked.Len())
	}
	res, b := do(t, "GET", n.url+"/__ursula/ready", nil)
	if res.StatusCode != 503 || !strings.Contains(string(b), "WalDiskPressure") {
		t.Fatalf("readiness under pressure: %d %s", res.StatusCode, b)
	}
	// The metrics say why too (the engine looks at the admission every 250 ms).
	waitFor(t, "the metrics report the disk pressure", func() bool {
		_, b := do(t, "GET", n.url+"/__ursula/metrics", nil)
		return strings.Contains(string(b), `"disk_pressure":"WalDiskPressure`)
	})
	walFull := dirBytes(t, filepath.Join(data, "wal"))
	if unknown != nil {
		// Settle the unknown outcome by reading: it applied whole or not at all.
		if streamLen(t, u) > acked.Len() {
			acked.Write(unknown)
		}
	}
	checkStream(t, u, acked.Bytes()) // reads still work
	os.Remove(filler)
	// Writes resume by themselves (the guard rechecks the free space as writes come).
	resumed := false
	for i := 0; i < 200 && !resumed; i++ {
		body := []byte("after the disk was freed")
		res, _ := do(t, "POST", u, body, "Content-Type", "application/octet-stream")
		if res.StatusCode/100 == 2 {
			acked.Write(body)
			resumed = true
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if !resumed {
		t.Fatal("writes did not resume after space was freed")
	}
	n.alive(t)
	checkStream(t, u, acked.Bytes())
	waitFor(t, "readiness returns by itself", func() bool {
		res, _ := do(t, "GET", n.url+"/__ursula/ready", nil)
		return res.StatusCode == 200
	})
	// Once the data is in the cold tier, the journal lets go of it: the log does not keep a
	// second copy of what the cold tier holds. The background flush uploads whole
	// flush_size pieces only, and a trim waits until the log it frees is worth four times
	// the snapshot it writes (the remaining hot bytes), which a few MiB left hot are not:
	// the operator's flush of the whole stream leaves none hot, so the trim must follow.
	admin := "http://" + n.adminAddr
	_, mb := do(t, "GET", admin+"/__ursula/metrics", nil)
	var metrics struct {
		Incarnation string `json:"process_incarnation"`
	}
	if err := json.Unmarshal(mb, &metrics); err != nil || metrics.Incarnation == "" {
		t.Fatalf("admin metrics without process_incarnation: %v %.200s", err, mb)
	}
	for i := 0; ; i++ {
		res, b := do(t, "POST", admin+"/__ursula/flush-cold/abuse/full", nil,
			"X-Ursula-Admin", "1", "X-Ursula-Process-Incarnation", metrics.Incarnation)
		if res.StatusCode/100 == 2 {
			break
		}
		if i == 100 || (res.StatusCode != 429 && res.StatusCode != 503) {
			t.Fatalf("flush-cold: %d %s", res.StatusCode, b)
		}
		time.Sleep(200 * time.Millisecond)
	}
	// On a timeout below, the journal's files, the metrics and the server's goroutines (to
	// its log) say why; cleanups run last first, so the node is still up for this one.
	t.Cleanup(func() {
		if !t.Failed() {
			return
		}
		segs, _ := filepath.Glob(filepath.Join(data, "wal", "*"))
		for _, p := range segs {
			if st, err := os.Stat(p); err == nil {
				t.Logf("journal file %s: %d bytes", filepath.Base(p), st.Size())
			}
		}
		if res, err := client.Get(n.url + "/__ursula/metrics"); err == nil {
			m, _ := io.ReadAll(res.Body)
			res.Body.Close()
			t.Logf("metrics: %s", m)
		}
		n.cmd.Process.Signal(syscall.SIGQUIT)
		time.Sleep(time.Second)
	})
	// Against what was acknowledged, not the journal's size under pressure: a trim may
	// already have run then (under pressure it does not wait for its worth).
	waitFor(t, "the journal is trimmed after the cold flush", func() bool {
		return dirBytes(t, filepath.Join(data, "wal")) < int64(acked.Len())/2
	})
	t.Logf("journal: %d bytes under pressure, %d after space returned and the data went cold (%d bytes acknowledged)",
		walFull, dirBytes(t, filepath.Join(data, "wal")), acked.Len())
	n.alive(t)
	checkStream(t, u, acked.Bytes())
	if strings.Contains(n.log.String(), "panic") {
		t.Fatalf("the server log holds a panic")
	}
}

// waitFor polls cond for up to 60 s (a loaded machine delays the background cold flush
// and the trim after it; an idle one meets these within seconds).
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(60 * time.Second); !cond(); time.Sleep(100 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting: %s", what)
		}
	}
}

// dirBytes is the size of the journal's segments in dir.
func dirBytes(t *testing.T, dir string) int64 {
	t.Helper()
	m, _ := filepath.Glob(filepath.Join(dir, "*.seg"))
	var n int64
	for _, p := range m {
		if st, err := os.Stat(p); err == nil {
			n += st.Size()
		}
	}
	return n
}

// checkStream reads the whole stream and compares it with what was acknowledged.
func checkStream(t *testing.T, u string, want []byte) {
	t.Helper()
	var got bytes.Buffer
	off := "-1"
	for i := 0; i < 10000; i++ {
		res, b := do(t, "GET", u+"?offset="+off, nil)
		if res.StatusCode != 200 {
			t.Fatalf("read at %s: %d %s", off, res.StatusCode, b)
		}
		got.Write(b)
		next := res.Header.Get("Stream-Next-Offset")
		if res.Header.Get("Stream-Up-To-Date") == "true" || next == off {
			break
		}
		off = next
	}
	if !bytes.Equal(got.Bytes(), want) {
		t.Fatalf("stream holds %d bytes (sha %x), %d acknowledged (sha %x)", got.Len(), sha256.Sum256(got.Bytes()), len(want), sha256.Sum256(want))
	}
}

// streamLen reads the stream's tail offset length in bytes (HEAD).
func streamLen(t *testing.T, u string) int {
	t.Helper()
	res, _ := do(t, "HEAD", u, nil)
	var n int
	fmt.Sscan(strings.TrimLeft(res.Header.Get("Stream-Next-Offset"), "0"), &n)
	return n
}
