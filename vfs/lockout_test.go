package vfs

import (
	"database/sql"
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ncruces/go-sqlite3"

	"github.com/ursula-go/ursula/replicator"
	"github.com/ursula-go/ursula/streamcore"
	"github.com/ursula-go/ursula/test/faultproxy"
)

// isClaim matches the claim append of an attach (Producer-Seq 0).
func isClaim(r *http.Request) bool {
	return r.Method == http.MethodPost && r.Header.Get(streamcore.HdrProducerSeq) == "0"
}

// plainOpen opens path through the ursula VFS without attaching it, the way any other
// code of the process could.
func plainOpen(path string) error {
	db, err := sql.Open("sqlite3", "file:"+path+"?vfs="+vfsName)
	if err != nil {
		return err
	}
	defer db.Close()
	return db.Ping()
}

// TestFailedAttachLockout (checklist-vfs F39-F43, T47): after an attach that failed once
// it may have changed local files (here: its claim was refused after the rebuild), the
// ursula VFS refuses to open the file with SQLITE_CANTOPEN, and Status says
// attach_failed with the reason, until an attach succeeds. A failed attach that wrote
// nothing into a new file leaves no sidecar behind; one that replayed pages into it keeps
// the sidecar, so the next attach resumes the file instead of refusing it as
// unreplicated. Refusals decided before any file changes lock nothing out.
func TestFailedAttachLockout(t *testing.T) {
	register()
	base := startServer(t)
	p, err := faultproxy.New(base)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	p.Match(isClaim)
	refuse := faultproxy.Fault{Kind: faultproxy.RefuseBefore, Status: http.StatusPaymentRequired, Marked: true}

	t.Run("new file, empty stream", func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "new.db")
		p.Script(refuse)
		if _, err := Open(p.URL+"/lockout/empty", Options{Path: path}); err == nil {
			t.Fatal("the attach succeeded through a refused claim")
		}
		if _, err := os.Stat(replicator.SidecarPath(path)); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("the failed attach left a sidecar: %v", err)
		}
		for _, f := range []string{path + "-wal", path + "-shm"} {
			if _, err := os.Stat(f); !errors.Is(err, os.ErrNotExist) {
				t.Fatalf("the failed attach made %s", f)
			}
		}
		checkLockedOut(t, path)
		db, err := Open(p.URL+"/lockout/empty", Options{Path: path})
		if err != nil {
			t.Fatal(err)
		}
		mustExec(t, db, `CREATE TABLE t(x)`)
		db.Close()
		if _, err := Status(path); err == nil || errKind(err) == replicator.KindAttachFailed {
			t.Fatalf("status after a successful attach and close: %v", err)
		}
	})

	t.Run("new file, replayed pages", func(t *testing.T) {
		url := p.URL + "/lockout/full"
		owner, err := Open(url, Options{Path: filepath.Join(t.TempDir(), "owner.db")})
		if err != nil {
			t.Fatal(err)
		}
		mustExec(t, owner, `CREATE TABLE t(x)`)
		mustExec(t, owner, `INSERT INTO t VALUES (1), (2)`)
		owner.Close()

		path := filepath.Join(t.TempDir(), "copy.db")
		p.Script(refuse)
		if _, err := Open(url, Options{Path: path}); err == nil {
			t.Fatal("the attach succeeded through a refused claim")
		}
		if _, err := os.Stat(replicator.SidecarPath(path)); err != nil {
			t.Fatalf("the attach replayed pages but kept no sidecar: %v", err)
		}
		checkLockedOut(t, path)
		db, err := Open(url, Options{Path: path})
		if err != nil {
			t.Fatalf("the attach after the failed one: %v", err)
		}
		defer db.Close()
		if st, _ := Status(path); st.AttachMode != "resumed" {
			t.Fatalf("attach mode %q, want the replayed file resumed", st.AttachMode)
		}
		if n := count(t, db, `SELECT count(*) FROM t`); n != 2 {
			t.Fatalf("%d rows", n)
		}
	})

	t.Run("refusal that changes nothing", func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "plain.db")
		os.WriteFile(path, []byte("not from a stream"), 0o644)
		if _, err := Open(p.URL+"/lockout/none", Options{Path: path}); errKind(err) != replicator.KindUnreplicated {
			t.Fatalf("got %v, want unreplicated_file", err)
		}
		if attachFailed(path) != "" {
			t.Fatal("a refusal that changed nothing locked the file out")
		}
	})
}

// checkLockedOut fails unless path refuses to open through the ursula VFS and its status
// names the failed attach.
func checkLockedOut(t *testing.T, path string) {
	t.Helper()
	if err := plainOpen(path); !errors.Is(err, sqlite3.CANTOPEN) {
		t.Fatalf("opening a locked-out file: %v, want SQLITE_CANTOPEN", err)
	}
	_, err := Status(path)
	if errKind(err) != replicator.KindAttachFailed || !strings.Contains(err.Error(), "is not attached: its last attach failed (") {
		t.Fatalf("status of a locked-out file: %v", err)
	}
}
