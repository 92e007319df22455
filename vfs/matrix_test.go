package vfs

import (
	"context"
	"database/sql"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/ursula-go/ursula/client"
	"github.com/ursula-go/ursula/replicator"
	"github.com/ursula-go/ursula/streamcore"
	"github.com/ursula-go/ursula/test/faultproxy"
)

// TestReattachReplaysARefusedButAppliedCommit (checklist-vfs K97, T23): when a layer
// refused a commit (vouched as not applied) after the stream applied it, and the owner
// attaches again before its next commit, the attach replays the stream, so the commit
// the application was told failed is in the database without any error or event.
func TestReattachReplaysARefusedButAppliedCommit(t *testing.T) {
	e := newProofEnv(t, "replayed")
	e.proxy.Script(faultproxy.Fault{Kind: faultproxy.RefuseAfter, Status: http.StatusPaymentRequired, Marked: true})
	if err := e.insert(2); errKind(err) != replicator.KindPaymentRequired {
		t.Fatalf("got %v, want payment_required", err)
	}
	e.reopen()
	owner, err := e.ownerIDs()
	if err != nil || !slices.Equal(owner, []int{1, 2}) {
		t.Fatalf("the reattached owner reads %v (%v), want the refused-but-applied row too", owner, err)
	}
	e.agrees("after the reattach")
	e.mustInsert(3)
	e.agrees("after the next commit")
}

// TestForeignAppends (checklist-vfs J87, N116, N120, T16): a writer that appends with a
// Stream-Seq above the owner's fences the owner at its next commit (action stop), which
// writes nothing. A foreign append without Stream-Seq cannot be refused by the server;
// the owner's next commit then lands past the foreign bytes, its receipt does not span
// the offset it was sent for, and the owner is poisoned instead of acknowledging it.
// (Such an append also breaks rebuilds of the stream until a snapshot past it exists.)
func TestForeignAppends(t *testing.T) {
	base := startServer(t)
	c, _ := client.New("")
	ctx := context.Background()
	for _, withSeq := range []bool{true, false} {
		name := map[bool]string{true: "with-stream-seq", false: "without-stream-seq"}[withSeq]
		t.Run(name, func(t *testing.T) {
			url := base + "/foreign/" + name
			db, err := Open(url, Options{Path: filepath.Join(t.TempDir(), "a.db")})
			if err != nil {
				t.Fatal(err)
			}
			defer db.Close()
			mustExec(t, db, `CREATE TABLE t(x)`)
			opts := client.AppendOptions{ContentType: "application/octet-stream"}
			if withSeq {
				opts.StreamSeq = streamcore.FormatOffset(1 << 50)
			}
			if _, err := c.Append(ctx, url, []byte("foreign"), opts); err != nil {
				t.Fatal(err)
			}
			_, err = db.Exec(`INSERT INTO t VALUES (1)`)
			e, ok := replicator.AsError(err)
			switch {
			case withSeq && (!ok || e.Kind != replicator.KindFenced || e.Action != replicator.ActionStop):
				t.Fatalf("commit after a foreign append with a higher Stream-Seq: %v", err)
			case !withSeq && (!ok || e.Action != replicator.ActionReattach):
				t.Fatalf("commit after a foreign append without Stream-Seq: %v", err)
			}
		})
	}
}

// TestTakeoverPingPong (checklist-vfs N115, T19): two owners taking the stream from each
// other in turn each learn it as fenced with action stop, and a fenced database stays
// fenced: nothing reopens it behind the application's back, so later reads and writes
// keep failing until the application attaches it again itself.
func TestTakeoverPingPong(t *testing.T) {
	base := startServer(t)
	url := base + "/pingpong/db"
	paths := []string{filepath.Join(t.TempDir(), "a.db"), filepath.Join(t.TempDir(), "b.db")}
	a, err := Open(url, Options{Path: paths[0]})
	if err != nil {
		t.Fatal(err)
	}
	mustExec(t, a, `CREATE TABLE t(x)`)
	cur := a
	for round := 1; round <= 4; round++ {
		next, err := Open(url, Options{Path: paths[round%2]})
		if err != nil {
			t.Fatalf("round %d: the taking owner: %v", round, err)
		}
		mustExec(t, next, `INSERT INTO t VALUES (?)`, round)
		for i := 0; i < 2; i++ {
			_, err := cur.Exec(`INSERT INTO t VALUES (-1)`)
			if e, ok := replicator.AsError(err); !ok || e.Kind != replicator.KindFenced || e.Action != replicator.ActionStop {
				t.Fatalf("round %d: the fenced owner's commit %d: %v", round, i, err)
			}
		}
		if st, _ := Status(paths[(round+1)%2]); !st.Fenced {
			t.Fatalf("round %d: the fenced owner's status: %+v", round, st)
		}
		cur.Close()
		cur = next
	}
	defer cur.Close()
	if n := count(t, cur, `SELECT count(*) FROM t WHERE x > 0`); n != 4 {
		t.Fatalf("%d rows, want 4", n)
	}
	if n := count(t, cur, `SELECT count(*) FROM t WHERE x < 0`); n != 0 {
		t.Fatalf("a fenced owner's commit reached the stream")
	}
}

// TestTakeoverDuringACommit (checklist-vfs T12): a new owner attaching while the old
// owner's commit is in flight (held in a slow proxy) either finds that commit on the
// stream (it landed before the claim: acknowledged) or fences it (it landed after: the
// old owner is told fenced), never both; an acknowledged commit is never lost. An attach
// that meets the old owner's commit landing between its rebuild and its claim fails as
// fenced and may be retried.
func TestTakeoverDuringACommit(t *testing.T) {
	e := newProofEnv(t, "takeover")
	e.proxy.Script(faultproxy.Fault{Kind: faultproxy.Delay, Delay: 100 * time.Millisecond})
	var wg sync.WaitGroup
	var oldErr error
	wg.Add(1)
	go func() {
		defer wg.Done()
		oldErr = e.insert(2)
	}()
	var newOwner *sql.DB
	var err error
	for attempt := 0; attempt < 5; attempt++ {
		if newOwner, err = Open(e.direct, Options{Path: filepath.Join(t.TempDir(), "new.db")}); err == nil {
			break
		}
		if errKind(err) != replicator.KindFenced {
			t.Fatalf("the new owner's attach: %v", err)
		}
	}
	if err != nil {
		t.Fatal(err)
	}
	defer newOwner.Close()
	wg.Wait()
	stream := e.streamIDs()
	_, held := slices.BinarySearch(stream, 2)
	switch {
	case oldErr == nil && !held:
		t.Fatalf("the old owner's commit was acknowledged and is not on the stream %v", stream)
	case oldErr != nil && errKind(oldErr) != replicator.KindFenced:
		t.Fatalf("the old owner's commit: %v, want success or fenced", oldErr)
	case oldErr != nil && held:
		t.Fatalf("the old owner was told fenced but its commit is on the stream %v", stream)
	}
	if owner, _ := ids(newOwner); !slices.Equal(owner, stream) {
		t.Fatalf("the new owner reads %v, the stream holds %v", owner, stream)
	}
}

// TestBodyLimitReset (checklist-vfs T26): a layer in front of the stream with a lower
// body limit that resets the connection instead of answering a readable 413 gives no
// answer at all, which proves nothing: the commit is retried within the budget and then
// poisons (outcome_unknown, reattach). Smaller commits go through after reattaching.
func TestBodyLimitReset(t *testing.T) {
	t.Setenv("URSULA_VFS_RETRY_MS", "1500") // room for retries on a loaded machine
	e := newProofEnv(t, "bodylimit")
	e.proxy.Match(func(r *http.Request) bool { return faultproxy.IsCommit(r) && r.ContentLength > 16<<10 })
	e.proxy.Choose(func(*http.Request) faultproxy.Fault { return faultproxy.Fault{Kind: faultproxy.DropBefore} })
	_, err := e.db.Exec(`INSERT INTO t VALUES (2, randomblob(200000))`)
	if k := errKind(err); k != replicator.KindOutcomeUnknown {
		t.Fatalf("a commit reset over the body limit: %v, want outcome_unknown", err)
	}
	if st, _ := Status(e.path); !st.Poisoned {
		t.Fatal("not poisoned")
	}
	if e.proxy.Count(faultproxy.DropBefore) < 2 {
		t.Fatalf("the commit was sent %d times, want retries within the budget", e.proxy.Count(faultproxy.DropBefore))
	}
	e.agrees("after the poison")
	e.mustInsert(3)
	e.agrees("after a small commit")
}

// TestAttachOutcomes (checklist-vfs D30, T48): an attach whose claim got no answer may
// have fenced the previous owner, so it fails with outcome_unknown (reattach); an attach
// that meets another writer's commit landing between its rebuild and its claim fails as
// fenced; a local file that cannot be written fails with local_setup. None of them
// leaves a usable handle, and a later attach succeeds.
func TestAttachOutcomes(t *testing.T) {
	e := newProofEnv(t, "attach")
	e.proxy.Match(isClaim)

	newPath := func() string { return filepath.Join(t.TempDir(), "b.db") }
	e.proxy.Script(faultproxy.Fault{Kind: faultproxy.DropAfter})
	if _, err := Open(e.url, Options{Path: newPath()}); errKind(err) != replicator.KindOutcomeUnknown {
		t.Fatalf("claim without an answer: %v, want outcome_unknown", err)
	}
	// The claim that got no answer landed: the first owner is fenced by it.
	if err := e.insert(2); errKind(err) != replicator.KindFenced {
		t.Fatalf("the first owner after the unanswered claim: %v, want fenced", err)
	}
	e.reopen()

	// Another owner claims the stream between the attach's rebuild and its claim.
	var race sync.Once
	e.proxy.Choose(func(*http.Request) faultproxy.Fault {
		race.Do(e.claimDirect)
		return faultproxy.Fault{}
	})
	if _, err := Open(e.url, Options{Path: newPath()}); errKind(err) != replicator.KindFenced {
		t.Fatalf("a claim racing a commit: %v, want fenced", err)
	}
	e.proxy.Choose(nil)

	dir := t.TempDir()
	if err := os.Chmod(dir, 0o500); err != nil {
		t.Fatal(err)
	}
	defer os.Chmod(dir, 0o700)
	if os.Getuid() != 0 {
		if _, err := Open(e.url, Options{Path: filepath.Join(dir, "c.db")}); errKind(err) != replicator.KindLocalSetup {
			t.Fatalf("an unwritable directory: %v, want local_setup", err)
		}
	}
	db, err := Open(e.url, Options{Path: newPath()})
	if err != nil {
		t.Fatalf("a clean attach after all that: %v", err)
	}
	defer db.Close()
	if got, _ := ids(db); !slices.Equal(got, e.streamIDs()) {
		t.Fatalf("the new owner reads %v", got)
	}
}

// claimDirect claims the stream as another owner would, past the proxy.
func (e *proofEnv) claimDirect() {
	r, err := replicator.Attach(context.Background(), e.direct, filepath.Join(e.t.TempDir(), "other.db"), replicator.Options{Log: io.Discard})
	if err != nil {
		e.t.Errorf("the racing claim: %v", err)
		return
	}
	r.Close()
}
