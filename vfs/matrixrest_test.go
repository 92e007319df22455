package vfs

import (
	"net/http"
	"path/filepath"
	"testing"
	"time"

	"github.com/ursula-go/ursula/replicator"
	"github.com/ursula-go/ursula/test/faultproxy"
)

// TestSlowUplinkPoisons (test matrix T27): a large commit whose attempts all outlast the
// per-attempt limit (10 s; shortened here) went out with no answer, so its outcome is
// unknown: at the end of the retry budget the owner is poisoned with outcome_unknown,
// never acknowledged and never rolled back as "not applied". Reopened, the owner equals
// the stream, whichever of the late attempts the stream took.
//
// The fault proxy reads the whole body before it delays the request, so this is the
// answer arriving late rather than the body stalling mid-way; to the owner both are an
// attempt that timed out after sending, the case the row is about.
func TestSlowUplinkPoisons(t *testing.T) {
	t.Setenv("URSULA_VFS_RETRY_MS", "1200")
	base := startServer(t)
	p, err := faultproxy.New(base)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	url := p.URL + "/matrix/slow-uplink"
	path := filepath.Join(t.TempDir(), "slow.db")
	db, err := Open(url, Options{Path: path, attemptLimit: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { db.Close() }()
	mustExec(t, db, `CREATE TABLE t(id INTEGER PRIMARY KEY, v BLOB)`)
	mustExec(t, db, `INSERT INTO t VALUES (1, x'00')`)

	p.Choose(func(*http.Request) faultproxy.Fault {
		return faultproxy.Fault{Kind: faultproxy.Delay, Delay: time.Second}
	})
	_, err = db.Exec(`INSERT INTO t VALUES (2, randomblob(1048576))`)
	if errKind(err) != replicator.KindOutcomeUnknown {
		t.Fatalf("a commit whose attempts all timed out: %v, want outcome_unknown", err)
	}
	st, err := Status(path)
	if err != nil || !st.Poisoned {
		t.Fatalf("status after the unknown outcome: %+v (%v)", st, err)
	}
	if p.Count(faultproxy.Delay) < 2 {
		t.Fatalf("%d delayed attempts: the commit was not retried within its budget", p.Count(faultproxy.Delay))
	}

	p.Choose(nil)
	db.Close()
	db, err = Open(url, Options{Path: path})
	if err != nil {
		t.Fatal(err)
	}
	owner := count(t, db, `SELECT count(*) FROM t`)
	rebuilt, err := Open(base+"/matrix/slow-uplink", Options{Path: filepath.Join(t.TempDir(), "rebuilt.db"), ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer rebuilt.Close()
	if stream := count(t, rebuilt, `SELECT count(*) FROM t`); owner != stream || owner < 1 {
		t.Fatalf("the reopened owner reads %d rows, a rebuild from the stream %d", owner, stream)
	}
}
