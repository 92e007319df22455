package vfs

import (
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/ursula-go/ursula/auth"
	"github.com/ursula-go/ursula/engine"
	"github.com/ursula-go/ursula/server"
)

// A token rotated by writing URSULA_VFS_TOKEN_FILE is used after the node's first 401,
// without reopening the database: the commit that met the 401 succeeds.
func TestTokenFileRotation(t *testing.T) {
	dir := t.TempDir()
	nodeTokens := filepath.Join(dir, "node-tokens")
	os.WriteFile(nodeTokens, []byte("tok-1 *\n"), 0o600)
	a, err := auth.New(t.Context(), auth.Config{TokenFile: nodeTokens})
	if err != nil {
		t.Fatal(err)
	}
	node := httptest.NewServer(server.New(engine.NewMemory(time.Minute), server.Config{Auth: a, ClusterID: "vfs-token"}))
	t.Cleanup(node.Close)
	clientTok := filepath.Join(dir, "client-token")
	os.WriteFile(clientTok, []byte("tok-1\n"), 0o600)
	t.Setenv("URSULA_VFS_TOKEN_FILE", clientTok)
	t.Setenv("URSULA_VFS_RETRY_MS", "200")

	db, err := Open(node.URL+"/vfstok/db1", Options{Path: filepath.Join(dir, "db1.db")})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	mustExec(t, db, "CREATE TABLE t(x)")
	mustExec(t, db, "INSERT INTO t VALUES (1)")
	// Rotate: the node drops tok-1 for tok-2, and the client's file says tok-2.
	os.WriteFile(nodeTokens, []byte("tok-2 *\n"), 0o600)
	if err := a.Reload(); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(clientTok, []byte("tok-2\n"), 0o600)
	mustExec(t, db, "INSERT INTO t VALUES (2)")
	var n int
	if err := db.QueryRow("SELECT count(*) FROM t").Scan(&n); err != nil || n != 2 {
		t.Fatalf("rows after the rotation: %d %v", n, err)
	}
}
