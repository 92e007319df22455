package vfs

import (
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	neturl "net/url"
	"path/filepath"
	"sync"
	"testing"

	"github.com/ursula-go/ursula/client"
)

// Every request the replication sends, from the Go API as from the extension, names it:
// User-Agent: sqlite-ursula-vfs/<version> (vfs A6).
func TestEveryRequestCarriesTheUserAgent(t *testing.T) {
	base := startServer(t)
	u, _ := neturl.Parse(base)
	rp := httputil.NewSingleHostReverseProxy(u)
	var mu sync.Mutex
	agents := map[string]int{}
	seen := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		agents[r.Header.Get("User-Agent")]++
		mu.Unlock()
		rp.ServeHTTP(w, r)
	}))
	defer seen.Close()
	path := filepath.Join(t.TempDir(), "ua.db")
	db, err := Open(seen.URL+"/agents/db", Options{Path: path})
	if err != nil {
		t.Fatal(err)
	}
	mustExec(t, db, `CREATE TABLE t(x)`)
	mustExec(t, db, `INSERT INTO t VALUES (1)`)
	db.Close()
	mu.Lock()
	defer mu.Unlock()
	if len(agents) != 1 || agents[client.DefaultUserAgent] < 2 || client.DefaultUserAgent != "sqlite-ursula-vfs/"+client.ExtensionVersion {
		t.Fatalf("User-Agents seen: %v", agents)
	}
}
