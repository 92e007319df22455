package vfs

import (
	"path/filepath"
	"testing"

	"github.com/ursula-go/ursula/replicator"
)

// TestStatsAfterSQLCommits: Stats(path) drains one commit measurement per SQL commit;
// an unattached path is the same not_found error as Status.
func TestStatsAfterSQLCommits(t *testing.T) {
	base := startServer(t)
	path := filepath.Join(t.TempDir(), "stats.db")
	db, err := Open(base+"/stats/vfs", Options{Path: path})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	Stats(path) // whatever the open committed
	mustExec(t, db, `CREATE TABLE t(x)`)
	for i := 0; i < 3; i++ {
		mustExec(t, db, `INSERT INTO t VALUES (?)`, i)
	}
	st, err := Stats(path)
	if err != nil {
		t.Fatal(err)
	}
	if len(st.Commit) != 4 || st.Commits != 4 || st.Dropped.Commit != 0 {
		t.Fatalf("stats after 4 commits: %+v", st)
	}
	stat, _ := Status(path)
	if last := st.Commit[3]; last.Bytes <= 0 || last.Pages <= 0 || last.Offset == "" || last.Attempts != 1 || last.Ms <= 0 || stat.Commits < 4 {
		t.Fatalf("implausible %+v (status %+v)", last, stat)
	}
	if st, _ := Stats(path); len(st.Commit) != 0 {
		t.Fatalf("not drained: %+v", st)
	}
	_, err = Stats(filepath.Join(t.TempDir(), "none.db"))
	if e, ok := replicator.AsError(err); !ok || e.Kind != replicator.KindNotFound {
		t.Fatalf("unattached: %v", err)
	}
}
