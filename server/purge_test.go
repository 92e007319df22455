package server_test

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	coldstore "github.com/ursula-go/ursula/coldtier/store"
	"github.com/ursula-go/ursula/internal/testserver"
	"github.com/ursula-go/ursula/server"
	"github.com/ursula-go/ursula/streamcore"
)

// filesUnder lists the files below dir (none when it does not exist).
func filesUnder(t *testing.T, dir string) []string {
	t.Helper()
	var out []string
	filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			out = append(out, p)
		}
		return nil
	})
	return out
}

func errCode(t *testing.T, body []byte) string {
	t.Helper()
	var eb streamcore.ErrorBody
	json.Unmarshal(body, &eb)
	return eb.Error.Code
}

func TestBucketPurgeErasesStreamsColdObjectsAndFencesTheBucket(t *testing.T) {
	dir := t.TempDir()
	store, err := coldstore.NewFS(dir)
	if err != nil {
		t.Fatal(err)
	}
	cfg := testserver.DefaultColdConfig("fs", 1<<20)
	cfg.GCGrace = coldstore.Duration(10 * time.Millisecond)
	ts := testserver.Start(t, testserver.Options{Cold: store, ColdConfig: &cfg})
	admin := httptest.NewServer(ts.Server.AdminHandler())
	defer admin.Close()
	do := func(t *testing.T, method, url string, body []byte, hdr ...string) (*http.Response, []byte) {
		// Admin mutations pin this run's process incarnation.
		return testserver.Do(t, method, url, body, append(hdr, server.HdrProcessIncarnation, server.ProcessIncarnation())...)
	}
	ct := []string{"Content-Type", "text/plain"}

	for _, k := range []string{"tenant-a/one", "tenant-a/two", "tenant-b/keep"} {
		if res, b := do(t, "PUT", ts.URL+"/"+k, []byte("hello "+k), ct...); res.StatusCode != http.StatusCreated {
			t.Fatalf("create %s: %d %s", k, res.StatusCode, b)
		}
		if res, b := do(t, "POST", ts.URL+"/"+k, []byte(" more"), ct...); res.StatusCode/100 != 2 {
			t.Fatalf("append %s: %d %s", k, res.StatusCode, b)
		}
		if res, b := do(t, "POST", admin.URL+"/__ursula/flush-cold/"+k, nil, server.HdrAdmin, "1"); res.StatusCode/100 != 2 {
			t.Fatalf("flush %s: %d %s", k, res.StatusCode, b)
		}
	}
	bucketDir := filepath.Join(dir, "root", "test", "tenant-a")
	if len(filesUnder(t, bucketDir)) == 0 {
		t.Fatal("the flush stored no cold object of tenant-a")
	}
	res, body := do(t, "GET", ts.URL+"/tenant-a/one?offset=-1", nil)
	if res.StatusCode != http.StatusOK {
		t.Fatalf("read: %d %s", res.StatusCode, body)
	}

	// Usage moves with appends and reads.
	var u server.Usage
	res, b := do(t, "GET", admin.URL+"/__ursula/usage", nil)
	if res.StatusCode != http.StatusOK || json.Unmarshal(b, &u) != nil {
		t.Fatalf("usage: %d %s", res.StatusCode, b)
	}
	a := u.Buckets["tenant-a"]
	wantIn := uint64(len("hello tenant-a/one") + len("hello tenant-a/two") + 2*len(" more"))
	if u.Version != 1 || a.Appends != 4 || a.BytesIn != wantIn || a.BytesOut != uint64(len(body)) || a.Streams != 2 || a.RetainedBytes != wantIn {
		t.Fatalf("usage of tenant-a: %+v (bytes in want %d, out want %d)", a, wantIn, len(body))
	}

	// The client listener does not serve the admin routes; a purge must be explicit.
	if res, _ := do(t, "DELETE", ts.URL+"/__ursula/purge/tenant-a", nil, server.HdrAdmin, "1"); res.StatusCode != http.StatusNotFound {
		t.Fatalf("purge on the client listener: %d", res.StatusCode)
	}
	// A purge pinned to no process incarnation is refused (428) and purges nothing (the
	// purge below still removes both streams).
	if res, b := testserver.Do(t, "DELETE", admin.URL+"/__ursula/purge/tenant-a", nil); res.StatusCode != http.StatusPreconditionRequired || errCode(t, b) != server.CodeProcessIncarnationRequired {
		t.Fatalf("purge without %s: %d %s", server.HdrProcessIncarnation, res.StatusCode, b)
	}

	var ans server.PurgeAnswer
	res, b = do(t, "DELETE", admin.URL+"/__ursula/purge/tenant-a", nil, server.HdrAdmin, "1")
	if res.StatusCode != http.StatusOK || json.Unmarshal(b, &ans) != nil {
		t.Fatalf("purge: %d %s", res.StatusCode, b)
	}
	if ans.RemovedStreams != 2 || len(ans.GroupsWithStreams) == 0 || ans.ColdObjectsDeleted == 0 || ans.ColdObjectsRemaining != 0 || !ans.Complete || ans.ColdError != nil {
		t.Fatalf("purge answer: %s", b)
	}
	if left := filesUnder(t, bucketDir); len(left) != 0 {
		t.Fatalf("cold objects of the purged bucket remain: %v", left)
	}
	if len(filesUnder(t, filepath.Join(dir, "root", "test", "tenant-b"))) == 0 {
		t.Fatal("the purge deleted another bucket's cold objects")
	}

	// Afterwards the bucket answers 404 BUCKET_ERASED, for reads and for new writes.
	for _, c := range []struct{ method, path string }{
		{"GET", "/tenant-a/one?offset=-1"}, {"HEAD", "/tenant-a/two"}, {"PUT", "/tenant-a/one"}, {"PUT", "/tenant-a/new"}, {"POST", "/tenant-a/two"},
	} {
		res, b := do(t, c.method, ts.URL+c.path, []byte("x"), ct...)
		if res.StatusCode != http.StatusNotFound || c.method != "HEAD" && errCode(t, b) != streamcore.CodeBucketErased {
			t.Fatalf("%s %s after purge: %d %s", c.method, c.path, res.StatusCode, b)
		}
	}
	if res, b := do(t, "GET", ts.URL+"/tenant-b/keep?offset=-1", nil); res.StatusCode != http.StatusOK || string(b) != "hello tenant-b/keep more" {
		t.Fatalf("the other bucket after purge: %d %q", res.StatusCode, b)
	}

	// A repeat removes nothing and still proves erasure.
	res, b = do(t, "DELETE", admin.URL+"/__ursula/purge/tenant-a", nil, server.HdrAdmin, "1")
	ans = server.PurgeAnswer{}
	if res.StatusCode != http.StatusOK || json.Unmarshal(b, &ans) != nil || ans.RemovedStreams != 0 || !ans.Complete {
		t.Fatalf("repeated purge: %d %s", res.StatusCode, b)
	}

	// Counters survive the purge; the gauges drop to zero.
	u = server.Usage{}
	_, b = do(t, "GET", admin.URL+"/__ursula/usage", nil)
	json.Unmarshal(b, &u)
	if a := u.Buckets["tenant-a"]; a.Appends != 4 || a.Streams != 0 || a.RetainedBytes != 0 || !a.Erased {
		t.Fatalf("usage after purge: %+v", a)
	}
	if !strings.Contains(string(b), `"tenant-b"`) {
		t.Fatalf("usage lost tenant-b: %s", b)
	}
}
