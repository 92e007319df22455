package vfs

import (
	"context"
	"path/filepath"
	"testing"
)

// TestBranchAPI: Branch at a relative time of "now" copies the current database into a
// new stream that opens writable beside its source, each with its own owner.
func TestBranchAPI(t *testing.T) {
	base := startServer(t)
	src, dst := base+"/vbranch/src", base+"/vbranch/dst"
	dir := t.TempDir()
	owner, err := Open(src, Options{Path: filepath.Join(dir, "src.db")})
	if err != nil {
		t.Fatal(err)
	}
	defer owner.Close()
	mustExec(t, owner, `CREATE TABLE t(x)`)
	mustExec(t, owner, `INSERT INTO t VALUES (1), (2)`)
	p, err := Branch(context.Background(), src, "-0s", dst)
	if err != nil {
		t.Fatal(err)
	}
	if p.Entry.UnixNano == 0 || p.Offset == 0 {
		t.Errorf("branch point %+v has no offset or time", p)
	}
	br, err := Open(dst, Options{Path: filepath.Join(dir, "dst.db")})
	if err != nil {
		t.Fatal(err)
	}
	defer br.Close()
	mustExec(t, br, `INSERT INTO t VALUES (3)`)
	mustExec(t, owner, `DELETE FROM t`)
	if n, m := count(t, br, `SELECT count(*) FROM t`), count(t, owner, `SELECT count(*) FROM t`); n != 3 || m != 0 {
		t.Fatalf("branch has %d rows, source %d; want 3 and 0", n, m)
	}
	if _, err := Branch(context.Background(), src, "", dst); err == nil {
		t.Error("branching onto an existing stream was accepted")
	}
}
