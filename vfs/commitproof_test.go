package vfs

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math/rand"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ncruces/go-sqlite3"
	"github.com/ursula-go/ursula/client"
	"github.com/ursula-go/ursula/replicator"
	"github.com/ursula-go/ursula/streamcore"
	"github.com/ursula-go/ursula/test/faultproxy"
)

// proofEnv is one database written through a fault proxy in front of a real server.
type proofEnv struct {
	t      *testing.T
	proxy  *faultproxy.Proxy
	direct string // the stream's URL on the server itself
	url    string // the stream's URL through the proxy
	path   string
	db     *sql.DB
}

func newProofEnv(t *testing.T, name string) *proofEnv {
	t.Helper()
	base := startServer(t)
	p, err := faultproxy.New(base)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	e := &proofEnv{t: t, proxy: p, direct: base + "/proof/" + name, url: p.URL + "/proof/" + name, path: filepath.Join(t.TempDir(), name+".db")}
	e.open()
	t.Cleanup(func() { e.db.Close() })
	e.mustInsert(1)
	return e
}

func (e *proofEnv) open() {
	e.t.Helper()
	db, err := Open(e.url, Options{Path: e.path})
	if err != nil {
		e.t.Fatal(err)
	}
	e.db = db
	if _, err := db.Exec(`CREATE TABLE IF NOT EXISTS t(id INTEGER PRIMARY KEY, v BLOB)`); err != nil {
		e.t.Fatal(err)
	}
}

// reopen closes the owner and attaches it again (the way out of a poisoned file).
func (e *proofEnv) reopen() {
	e.t.Helper()
	e.db.Close()
	e.open()
}

func (e *proofEnv) insert(id int) error {
	_, err := e.db.Exec(`INSERT INTO t VALUES (?, randomblob(100))`, id)
	return err
}

func (e *proofEnv) mustInsert(id int) {
	e.t.Helper()
	if err := e.insert(id); err != nil {
		e.t.Fatalf("insert %d: %v", id, err)
	}
}

// ownerIDs are the rows the owner reads; an error when the file refuses reads (poisoned).
func (e *proofEnv) ownerIDs() ([]int, error) {
	return ids(e.db)
}

// streamIDs are the rows of a fresh rebuild of the stream, read from the server directly.
func (e *proofEnv) streamIDs() []int {
	e.t.Helper()
	c, _ := client.New("")
	p := filepath.Join(e.t.TempDir(), fmt.Sprintf("rebuilt-%d.db", time.Now().UnixNano()))
	defer os.Remove(p)
	if _, err := replicator.Restore(context.Background(), c, e.direct, p, 0, streamcore.MaxRequestBytes, nil); err != nil {
		e.t.Fatal(err)
	}
	db, err := sql.Open("sqlite3", "file:"+p+"?mode=ro")
	if err != nil {
		e.t.Fatal(err)
	}
	defer db.Close()
	got, err := ids(db)
	if err != nil {
		e.t.Fatal(err)
	}
	return got
}

func ids(db *sql.DB) ([]int, error) {
	rows, err := db.Query(`SELECT id FROM t ORDER BY id`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []int
	for rows.Next() {
		var id int
		if err := rows.Scan(&id); err != nil {
			return nil, err
		}
		out = append(out, id)
	}
	return out, rows.Err()
}

// agrees fails the test unless the owner reads exactly what a rebuild of the stream holds,
// or refuses to read at all (poisoned), in which case it reopens it and checks again.
func (e *proofEnv) agrees(when string) {
	e.t.Helper()
	stream := e.streamIDs()
	owner, err := e.ownerIDs()
	if err != nil {
		st, _ := Status(e.path)
		if !st.Poisoned && !st.Fenced {
			e.t.Fatalf("%s: the owner cannot read and is not poisoned: %v", when, err)
		}
		e.reopen()
		if owner, err = e.ownerIDs(); err != nil {
			e.t.Fatalf("%s: the reopened owner cannot read: %v", when, err)
		}
	}
	if !slices.Equal(owner, stream) {
		e.t.Fatalf("%s: the owner reads %v, the stream holds %v", when, owner, stream)
	}
}

func errKind(err error) replicator.Kind {
	var e *Error
	if errors.As(err, &e) {
		return e.Kind
	}
	return ""
}

// TestRefusalAfterTheStreamAppliedIsAcknowledged: a layer that refuses a commit without
// the vouched not-applied marker after the stream applied it does not make the commit
// fail: the retry is answered as a repeat of the same frame, or the check of the stream
// finds it, and the owner keeps the row the stream holds.
func TestRefusalAfterTheStreamAppliedIsAcknowledged(t *testing.T) {
	t.Setenv("URSULA_VFS_RETRY_MS", "1000")
	for _, status := range []int{401, 402, 403, 409, 429, 500, 502, 503} {
		t.Run(strconv.Itoa(status), func(t *testing.T) {
			e := newProofEnv(t, fmt.Sprintf("after%d", status))
			e.proxy.Script(faultproxy.Fault{Kind: faultproxy.RefuseAfter, Status: status})
			e.mustInsert(2)
			e.agrees("after the refused-but-applied commit")
			e.mustInsert(3)
			e.agrees("after the next commit")
			if got := e.streamIDs(); !slices.Equal(got, []int{1, 2, 3}) {
				t.Fatalf("the stream holds %v", got)
			}
		})
	}
}

// TestRefusalBeforeTheStreamFailsAlone: a refusal the stream never saw fails the commit
// alone, marked or not (unmarked ones after a check of the stream), the file stays usable,
// and the next commit reuses the producer seq and is acknowledged.
func TestRefusalBeforeTheStreamFailsAlone(t *testing.T) {
	t.Setenv("URSULA_VFS_RETRY_MS", "1000")
	for _, status := range []int{401, 402, 403, 409, 429} {
		for _, marked := range []bool{false, true} {
			t.Run(fmt.Sprintf("%d marked=%t", status, marked), func(t *testing.T) {
				e := newProofEnv(t, fmt.Sprintf("before%d%t", status, marked))
				f := faultproxy.Fault{Kind: faultproxy.RefuseBefore, Status: status, Marked: marked}
				e.proxy.Script(f, f, f, f, f, f, f, f, f, f, f, f, f, f, f, f)
				err := e.insert(2)
				if err == nil {
					t.Fatal("the refused commit succeeded")
				}
				if st, _ := Status(e.path); st.Poisoned || !st.WritesRefused {
					t.Fatalf("after a refusal: poisoned=%t writes_refused=%t (%v)", st.Poisoned, st.WritesRefused, err)
				}
				e.agrees("after the refusal")
				e.proxy.Script()
				e.mustInsert(3)
				e.agrees("after the next commit")
				if got := e.streamIDs(); !slices.Equal(got, []int{1, 3}) {
					t.Fatalf("the stream holds %v", got)
				}
			})
		}
	}
}

// TestUnmarked5xxBeforeTheStreamPoisonsWhenTheBudgetEnds: a 5xx without the marker leaves
// the outcome unknown; when the budget runs out the file is poisoned, and reopening it
// gives what the stream holds.
func TestUnmarked5xxBeforeTheStreamPoisonsWhenTheBudgetEnds(t *testing.T) {
	t.Setenv("URSULA_VFS_RETRY_MS", "1000")
	e := newProofEnv(t, "unknown5xx")
	f := faultproxy.Fault{Kind: faultproxy.RefuseBefore, Status: 502}
	e.proxy.Script(f, f, f, f, f, f, f, f, f, f, f, f)
	if err := e.insert(2); errKind(err) != replicator.KindOutcomeUnknown {
		t.Fatalf("got %v, want outcome_unknown", err)
	}
	e.proxy.Script()
	e.agrees("after the poison")
}

// TestVouchedRefusalThatLiedIsCaughtBeforeTheNextCommit (checklist-vfs K95, T22): a layer
// that marks and vouches a refusal after the stream applied the commit breaks the rule
// the marker stands for; the commit fails alone, but the next commit finds the refused
// one on the stream and poisons the file, with a reason starting "a commit refused as
// never applied may have been applied after all", instead of building on a state the
// stream does not hold. (An unknown attempt before a duplicate answer cannot make the
// duplicate pass as this commit's ack here: every attempt carries the frame's digest and
// a receipt must span this very frame.)
func TestVouchedRefusalThatLiedIsCaughtBeforeTheNextCommit(t *testing.T) {
	e := newProofEnv(t, "liar")
	e.proxy.Script(faultproxy.Fault{Kind: faultproxy.RefuseAfter, Status: 402, Marked: true})
	if err := e.insert(2); errKind(err) != replicator.KindPaymentRequired {
		t.Fatalf("got %v, want payment_required", err)
	}
	err := e.insert(3)
	if errKind(err) != replicator.KindLocalState || !strings.Contains(err.Error(), "a commit refused as never applied may have been applied after all") {
		t.Fatalf("the next commit: %v", err)
	}
	e.agrees("after the poison")
	if got := e.streamIDs(); !slices.Equal(got, []int{1, 2}) {
		t.Fatalf("the stream holds %v", got)
	}
}

// TestLostAnswersAreAcknowledgedOnce: an answer dropped after the stream applied the
// commit, a request cut midway, a connection closed before forwarding, a delayed request
// and a retry that overtakes the attempt it repeats all end with the commit on the stream
// exactly once and the owner equal to it.
func TestLostAnswersAreAcknowledgedOnce(t *testing.T) {
	for _, f := range []faultproxy.Fault{
		{Kind: faultproxy.DropAfter}, {Kind: faultproxy.DropBefore}, {Kind: faultproxy.CutBody},
		{Kind: faultproxy.Delay, Delay: 50 * time.Millisecond}, {Kind: faultproxy.Hold},
	} {
		t.Run(f.Kind.String(), func(t *testing.T) {
			e := newProofEnv(t, f.Kind.String())
			e.proxy.Script(f)
			e.mustInsert(2)
			e.mustInsert(3)
			e.agrees("after the commits")
			if got := e.streamIDs(); !slices.Equal(got, []int{1, 2, 3}) {
				t.Fatalf("the stream holds %v", got)
			}
		})
	}
}

// TestUncheckableRefusalHoldsTheNextCommit: when a refusal proved nothing and the stream
// cannot be read to check it, the next commit is refused unsent (refused_commit_unchecked)
// instead of reusing the producer seq blindly; once the stream reads again it goes through.
func TestUncheckableRefusalHoldsTheNextCommit(t *testing.T) {
	t.Setenv("URSULA_VFS_RETRY_MS", "1000")
	e := newProofEnv(t, "unchecked")
	e.proxy.Match(func(r *http.Request) bool { return r.Method != http.MethodHead })
	f := faultproxy.Fault{Kind: faultproxy.RefuseBefore, Status: 402}
	e.proxy.Script(f, f, f, f, f, f, f, f, f, f, f, f, f, f, f, f, f, f, f, f)
	if err := e.insert(2); errKind(err) != replicator.KindPaymentRequired {
		t.Fatalf("got %v, want payment_required", err)
	}
	if err := e.insert(3); errKind(err) != replicator.KindRefusedUnchecked {
		t.Fatalf("got %v, want refused_commit_unchecked", err)
	}
	e.proxy.Script()
	e.proxy.Match(nil)
	e.mustInsert(4)
	e.agrees("after the check")
	if got := e.streamIDs(); !slices.Equal(got, []int{1, 4}) {
		t.Fatalf("the stream holds %v", got)
	}
}

// TestMixedFaultsNeverDiverge (checklist-vfs T61, without owner handoffs or crashes: see
// TestKill9 and TestTwoOwners) drives a few hundred commits through randomly chosen faults
// (seeded: URSULA_FAULT_SEED repeats a run). After every failed commit and at the end, the
// owner reads exactly what a rebuild of the stream holds (a poisoned owner after reopening),
// and every acknowledged commit is on the stream. URSULA_FAULT_COMMITS sets the number of
// commits (300; make soak runs more). The same run through the extension is the Python
// binding's MixedFaultTest.
func TestMixedFaultsNeverDiverge(t *testing.T) {
	t.Setenv("URSULA_VFS_RETRY_MS", "150")
	seed := time.Now().UnixNano()
	if v, err := strconv.ParseInt(os.Getenv("URSULA_FAULT_SEED"), 10, 64); err == nil {
		seed = v
	}
	t.Logf("seed %d (URSULA_FAULT_SEED=%d repeats this run)", seed, seed)
	rng := rand.New(rand.NewSource(seed))
	e := newProofEnv(t, "mixed")
	e.proxy.Choose(faultproxy.Mixed(rng, []int{401, 402, 403, 409, 429, 500, 502, 503}))
	acked := []int{1}
	failed, poisoned := 0, 0
	commits := 300
	if n, err := strconv.Atoi(os.Getenv("URSULA_FAULT_COMMITS")); err == nil && n > 0 {
		commits = n
	}
	for id := 2; id <= commits; id++ {
		err := e.insert(id)
		if err == nil {
			acked = append(acked, id)
			continue
		}
		failed++
		if st, _ := Status(e.path); st.Poisoned {
			poisoned++
		}
		e.agrees(fmt.Sprintf("after commit %d failed (%v)", id, err))
	}
	e.proxy.Choose(nil)
	e.agrees("at the end")
	stream := e.streamIDs()
	for _, id := range acked {
		if _, found := slices.BinarySearch(stream, id); !found {
			t.Fatalf("acknowledged commit %d is not on the stream", id)
		}
	}
	t.Logf("%d commits acknowledged, %d failed (%d poisoned); faults: %s", len(acked)-1, failed, poisoned, e.proxy.Counts())
}

// TestLostWALWriteBackPoisonsBeforeTheNextCommit (checklist-vfs I72, T9): when the local WAL loses the commit
// frame an acknowledged commit wrote (a page-cache write-back the disk never took), the
// next commit poisons the file instead of building on it; reopening gives the stream's rows.
func TestLostWALWriteBackPoisonsBeforeTheNextCommit(t *testing.T) {
	e := newProofEnv(t, "writeback")
	e.mustInsert(2)
	wal, err := os.OpenFile(e.path+"-wal", os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	st, _ := wal.Stat()
	var pageSize int
	if err := e.db.QueryRow(`PRAGMA page_size`).Scan(&pageSize); err != nil {
		t.Fatal(err)
	}
	frame := int64(replicator.WALFrameHeaderSize + pageSize)
	if st.Size() < int64(replicator.WALHeaderSize)+frame {
		t.Fatalf("the WAL holds %d bytes, no frame", st.Size())
	}
	// The last frame is the acknowledged commit frame: its header never reached the disk.
	if _, err := wal.WriteAt(make([]byte, replicator.WALFrameHeaderSize), st.Size()-frame); err != nil {
		t.Fatal(err)
	}
	wal.Close()
	err = e.insert(3)
	if errKind(err) != replicator.KindLocalDamage || !strings.Contains(err.Error(), "lost the write-back") {
		t.Fatalf("the commit after a lost write-back: %v", err)
	}
	if s, _ := Status(e.path); !s.Poisoned {
		t.Fatal("not poisoned")
	}
	e.agrees("after the poison")
	if got := e.streamIDs(); !slices.Equal(got, []int{1, 2}) {
		t.Fatalf("the stream holds %v", got)
	}
}

// TestWarmConnectionStopsAtThePoisonAndTheFence (checklist-vfs 108, 197): a connection
// whose page cache is warm from before the owner was poisoned or fenced reads nothing
// afterwards. In WAL mode it would start a read transaction without reading the file (the
// WAL index never changes again), so the file's read check alone would let it answer from
// its cache: stale rows of an owner the stream has moved past.
func TestWarmConnectionStopsAtThePoisonAndTheFence(t *testing.T) {
	t.Setenv("URSULA_VFS_RETRY_MS", "150")
	warm := func(e *proofEnv) *sql.Conn {
		c, err := e.db.Conn(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		var n int
		if err := c.QueryRowContext(context.Background(), `SELECT count(*) FROM t`).Scan(&n); err != nil || n != 1 {
			t.Fatalf("warm-up read: %d %v", n, err)
		}
		return c
	}
	refused := func(c *sql.Conn, kind replicator.Kind) {
		t.Helper()
		var n int
		err := c.QueryRowContext(context.Background(), `SELECT count(*) FROM t`).Scan(&n)
		if err == nil {
			t.Fatalf("the warm connection still reads (%d rows)", n)
		}
		if errKind(err) != kind || !errors.Is(err, sqlite3.IOERR_READ) {
			t.Fatalf("the warm connection's read: %v", err)
		}
		if _, err := c.ExecContext(context.Background(), `INSERT INTO t VALUES (99, NULL)`); errKind(err) != kind {
			t.Fatalf("the warm connection's write: %v", err)
		}
	}
	t.Run("poisoned", func(t *testing.T) {
		e := newProofEnv(t, "warmpoison")
		c := warm(e)
		e.proxy.Choose(func(*http.Request) faultproxy.Fault { return faultproxy.Fault{Kind: faultproxy.DropAfter} })
		if err := e.insert(2); errKind(err) != replicator.KindOutcomeUnknown {
			t.Fatalf("the commit whose answers are all lost: %v", err)
		}
		refused(c, replicator.KindOutcomeUnknown)
	})
	t.Run("fenced", func(t *testing.T) {
		e := newProofEnv(t, "warmfence")
		c := warm(e)
		second, err := Open(e.direct, Options{Path: filepath.Join(t.TempDir(), "second.db")})
		if err != nil {
			t.Fatal(err)
		}
		defer second.Close()
		if _, err := second.Exec(`INSERT INTO t VALUES (2, NULL)`); err != nil {
			t.Fatal(err)
		}
		// The first owner learns of the fence at its next commit.
		if err := e.insert(3); errKind(err) != replicator.KindFenced {
			t.Fatalf("the fenced owner's commit: %v", err)
		}
		refused(c, replicator.KindFenced)
	})
}

// TestReadsDoNotWaitForACommitInFlight: the check that stops a fenced or poisoned owner's
// statements does not wait for a commit under way (which holds the replica for its whole
// round trip): another connection reads the last committed state while the commit is
// held in the proxy.
func TestReadsDoNotWaitForACommitInFlight(t *testing.T) {
	e := newProofEnv(t, "inflight")
	ctx := context.Background()
	reader, err := e.db.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer reader.Close()
	e.proxy.Choose(func(r *http.Request) faultproxy.Fault {
		if faultproxy.IsCommit(r) {
			return faultproxy.Fault{Kind: faultproxy.Delay, Delay: 3 * time.Second}
		}
		return faultproxy.Fault{}
	})
	committed := make(chan error, 1)
	go func() { committed <- e.insert(2) }()
	// Wait until the commit reached the proxy (it is held there from then on).
	for deadline := time.Now().Add(10 * time.Second); e.proxy.Count(faultproxy.Delay) == 0; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the commit never reached the proxy")
		}
	}
	var n int
	if err := reader.QueryRowContext(ctx, `SELECT count(*) FROM t`).Scan(&n); err != nil || n != 1 {
		t.Fatalf("read during the commit: %d rows, %v", n, err)
	}
	select {
	case err := <-committed:
		t.Fatalf("the read waited for the commit to end (%v)", err)
	default:
	}
	if err := <-committed; err != nil {
		t.Fatalf("the delayed commit: %v", err)
	}
}
