package vfs

import (
	"bufio"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestCrashChild is the writer process of TestKill9: it commits rows 1, 2, 3 ... and
// prints each row once its commit returned (acknowledged by the server), until killed.
func TestCrashChild(t *testing.T) {
	url, path := os.Getenv("URSULA_CRASH_URL"), os.Getenv("URSULA_CRASH_PATH")
	if url == "" {
		t.Skip("run by TestKill9")
	}
	db, err := Open(url, Options{Path: path})
	if err != nil {
		fmt.Println("open-error", err)
		os.Exit(3)
	}
	if _, err := db.Exec(`CREATE TABLE IF NOT EXISTS t(x INTEGER PRIMARY KEY, pad BLOB)`); err != nil {
		fmt.Println("create-error", err)
		os.Exit(3)
	}
	var next int
	db.QueryRow(`SELECT coalesce(max(x), 0) + 1 FROM t`).Scan(&next)
	fmt.Println("ready", next)
	for i := next; ; i++ {
		// Some commits are big (several WAL frames, page spills), most are small.
		q := `INSERT INTO t VALUES (?, randomblob(200))`
		if i%7 == 0 {
			q = `INSERT INTO t VALUES (?, randomblob(30000))`
		}
		if _, err := db.Exec(q, i); err != nil {
			fmt.Println("commit-error", err)
			os.Exit(3)
		}
		fmt.Println("acked", i)
	}
}

// TestKill9: a writer process is killed with SIGKILL at random points of its commit loop
// (before the append, during it, between the acknowledgement and the local WAL write,
// during checkpoints). Each time, re-attaching on the same boot resumes, and the database
// holds every acknowledged commit exactly once, at most the one in flight beyond that,
// no gap, and equals a rebuild from the stream (checklist-vfs T1-T4, T10, AA).
func TestKill9(t *testing.T) {
	if testing.Short() {
		t.Skip("spawns processes")
	}
	base := startServer(t)
	url := base + "/crash/db"
	path := filepath.Join(t.TempDir(), "crash.db")
	rng := rand.New(rand.NewPCG(1, 2))
	acked := 0
	for round := 0; round < 6; round++ {
		cmd := exec.Command(os.Args[0], "-test.run=^TestCrashChild$", "-test.count=1")
		cmd.Env = append(os.Environ(), "URSULA_CRASH_URL="+url, "URSULA_CRASH_PATH="+path)
		out, _ := cmd.StdoutPipe()
		cmd.Stderr = nil
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		sc := bufio.NewScanner(out)
		target := acked + 5 + rng.IntN(60)
		lastAcked := acked
		deadline := time.Now().Add(30 * time.Second)
		for sc.Scan() && time.Now().Before(deadline) {
			f := strings.Fields(sc.Text())
			if len(f) == 0 {
				continue
			}
			switch f[0] {
			case "acked":
				lastAcked, _ = strconv.Atoi(f[1])
			case "open-error", "create-error", "commit-error":
				cmd.Process.Kill()
				cmd.Wait()
				t.Fatalf("round %d: child: %s", round, sc.Text())
			}
			if lastAcked >= target {
				break
			}
		}
		// Let it run into the next commit for a random moment, then kill -9.
		time.Sleep(time.Duration(rng.IntN(3000)) * time.Microsecond)
		cmd.Process.Signal(syscall.SIGKILL)
		for sc.Scan() { // acks printed before the kill landed
			if f := strings.Fields(sc.Text()); len(f) == 2 && f[0] == "acked" {
				lastAcked, _ = strconv.Atoi(f[1])
			}
		}
		cmd.Wait()
		if lastAcked < target {
			t.Fatalf("round %d: the child acknowledged only %d of %d commits", round, lastAcked, target)
		}
		acked = lastAcked

		db, err := Open(url, Options{Path: path})
		if err != nil {
			t.Fatalf("round %d: re-attach: %v", round, err)
		}
		st, _ := Status(path)
		n := count(t, db, `SELECT count(*) FROM t`)
		max := count(t, db, `SELECT coalesce(max(x), 0) FROM t`)
		var ok string
		db.QueryRow(`PRAGMA integrity_check`).Scan(&ok)
		db.Close()
		if ok != "ok" || n != max || n < acked || n > acked+1 {
			t.Fatalf("round %d (%s): %d rows, max %d, integrity %s; %d commits acknowledged", round, st.AttachMode, n, max, ok, acked)
		}
		if st.AttachMode != "resumed" {
			t.Errorf("round %d: same-boot re-attach was %q, want resumed", round, st.AttachMode)
		}
		if r := rebuiltCount(t, url); r != n {
			t.Fatalf("round %d: the stream rebuilds to %d rows, the resumed file has %d", round, r, n)
		}
		acked = n
		t.Logf("round %d: killed after %d acknowledged commits, resumed with %d rows", round, lastAcked, n)
	}
}
