package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ursula-go/ursula/internal/testserver"

	"github.com/ursula-go/ursula/coldtier"
	coldstore "github.com/ursula-go/ursula/coldtier/store"
	"github.com/ursula-go/ursula/engine"
	"github.com/ursula-go/ursula/server"
	"github.com/ursula-go/ursula/streamcore"
)

// backupNode starts an in-process node over real HTTP; with cold set its old stream
// bytes can be flushed to an fs cold store.
func backupNode(t *testing.T, cold bool) (*server.Server, string) {
	t.Helper()
	eng := engine.NewMemory(0)
	srv := server.New(eng, server.Config{})
	if cold {
		dir := t.TempDir()
		st, err := coldstore.NewFS(dir)
		if err != nil {
			t.Fatal(err)
		}
		if err := srv.EnableCold(st, coldstore.Config{Backend: "fs", Dir: dir}, server.ColdOptions{}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(srv.StopCold)
	}
	ts := httptest.NewServer(srv)
	t.Cleanup(func() { ts.Close(); eng.Close() })
	return srv, ts.URL
}

func do(t *testing.T, method, url string, body []byte, hdr ...string) (*http.Response, []byte) {
	t.Helper()
	return testserver.Do(t, method, url, body, hdr...)
}

func produce(t *testing.T, url string, seq int, body string) *http.Response {
	res, _ := do(t, http.MethodPost, url, []byte(body), "Content-Type", "text/plain",
		"Producer-Id", "p1", "Producer-Epoch", "1", "Producer-Seq", fmt.Sprint(seq))
	return res
}

func runCLI(args ...string) (int, string, string) {
	var out, errb bytes.Buffer
	code := run(args, &out, &errb)
	return code, out.String(), errb.String()
}

func TestBackupRestore(t *testing.T) {
	src, srcURL := backupNode(t, true)
	streams := []string{"/alpha/one", "/alpha/two", "/beta/p"}
	for _, s := range streams {
		if res, _ := do(t, http.MethodPut, srcURL+s, nil, "Content-Type", "text/plain"); res.StatusCode != http.StatusCreated {
			t.Fatalf("create %s: %d", s, res.StatusCode)
		}
	}
	for i := range 20 {
		do(t, http.MethodPost, srcURL+"/alpha/one", []byte(fmt.Sprintf("line %d\n", i)), "Content-Type", "text/plain")
		if res := produce(t, srcURL+"/beta/p", i, fmt.Sprintf("p%02d;", i)); res.StatusCode != http.StatusOK {
			t.Fatalf("producer write %d: %d", i, res.StatusCode)
		}
	}
	// Older bytes move to the cold tier: the backup must carry them.
	if err := src.FlushCold(true); err != nil {
		t.Fatal(err)
	}
	do(t, http.MethodPost, srcURL+"/alpha/one", []byte("hot tail\n"), "Content-Type", "text/plain")
	if h, _ := do(t, http.MethodHead, srcURL+"/alpha/one", nil); h.Header.Get(coldtier.HdrColdHotStart) == streamcore.FormatOffset(0) || h.Header.Get(coldtier.HdrColdHotStart) == "" {
		t.Fatalf("nothing went cold: %v", h.Header)
	}

	// A writer keeps appending while the backup runs.
	stop := testserver.Loop(func(i int) bool {
		req, _ := http.NewRequest(http.MethodPost, srcURL+"/alpha/two", strings.NewReader(fmt.Sprintf("w%d\n", i)))
		req.Header.Set("Content-Type", "text/plain")
		if res, err := http.DefaultClient.Do(req); err == nil {
			res.Body.Close()
		}
		return true
	})
	dir := filepath.Join(t.TempDir(), "bk")
	code, _, stderr := runCLI("backup", "create", "--from", srcURL, "--to", dir)
	stop()
	if code != 0 {
		t.Fatalf("create: %d %s", code, stderr)
	}
	if code, out, stderr := runCLI("backup", "verify", dir); code != 0 || !strings.Contains(out, "intact") {
		t.Fatalf("verify: %d %s %s", code, out, stderr)
	}
	mb, err := os.ReadFile(filepath.Join(dir, manifestName))
	if err != nil {
		t.Fatal(err)
	}
	var m backupManifest
	if err := json.Unmarshal(mb, &m); err != nil {
		t.Fatal(err)
	}
	tails := map[string]uint64{}
	for _, o := range m.Objects {
		for k, v := range o.Tails {
			off, e := streamcore.ParseOffset(v)
			if e != nil {
				t.Fatal(e)
			}
			tails["/"+k] = off
		}
	}
	if len(tails) != len(streams) {
		t.Fatalf("manifest lists %v", tails)
	}

	_, dstURL := backupNode(t, false)
	if code, _, stderr := runCLI("backup", "restore", dir, "--to", dstURL); code != 0 {
		t.Fatalf("restore: %d %s", code, stderr)
	}
	for _, s := range streams {
		_, want := do(t, http.MethodGet, srcURL+s+"?offset=-1", nil)
		_, got := do(t, http.MethodGet, dstURL+s+"?offset=-1", nil)
		if uint64(len(got)) != tails[s] || !bytes.Equal(got, want[:tails[s]]) {
			t.Fatalf("%s: restored %d bytes, want the source's first %d", s, len(got), tails[s])
		}
		srcHead, _ := do(t, http.MethodHead, srcURL+s, nil)
		dstHead, _ := do(t, http.MethodHead, dstURL+s, nil)
		oldInc := srcHead.Header.Get("Stream-Incarnation")
		if dstHead.Header.Get("Stream-Incarnation") == oldInc ||
			dstHead.Header.Get("Stream-Previous-Incarnation") != oldInc ||
			dstHead.Header.Get("Stream-Inherited-Offset") != streamcore.FormatOffset(tails[s]) {
			t.Fatalf("%s: HEAD after restore %v (source token %s)", s, dstHead.Header, oldInc)
		}
		// A write carrying the old token belongs to the old history.
		res, _ := do(t, http.MethodPost, dstURL+s, []byte("x"), "Content-Type", "text/plain", "Stream-Incarnation", oldInc)
		if res.StatusCode != http.StatusPreconditionFailed {
			t.Fatalf("%s: old-token write got %d", s, res.StatusCode)
		}
	}
	// Producer dedup across the restore: a repeat of a surviving write gets its receipt.
	srcRepeat := produce(t, srcURL+"/beta/p", 7, "p07;")
	dstRepeat := produce(t, dstURL+"/beta/p", 7, "p07;")
	if dstRepeat.StatusCode != http.StatusNoContent || dstRepeat.Header.Get("Stream-Offset") == "" ||
		dstRepeat.Header.Get("Stream-Offset") != srcRepeat.Header.Get("Stream-Offset") {
		t.Fatalf("repeat after restore: %d offset %q (source %q)", dstRepeat.StatusCode, dstRepeat.Header.Get("Stream-Offset"), srcRepeat.Header.Get("Stream-Offset"))
	}
	// A new write of the surviving epoch is refused: history closed it.
	res := produce(t, dstURL+"/beta/p", 20, "p20;")
	if res.StatusCode != http.StatusForbidden || res.Header.Get("Producer-Outcome") != "epoch-closed;by=history" || res.Header.Get("Producer-Closed-Seq") != "19" {
		t.Fatalf("new write after restore: %d %v", res.StatusCode, res.Header)
	}
	// A second restore into the same node is a repeat: nothing changes, it succeeds.
	if code, _, stderr := runCLI("backup", "restore", dir, "--to", dstURL); code != 0 {
		t.Fatalf("repeated restore: %d %s", code, stderr)
	}
}

func TestBackupDamageAndVersion(t *testing.T) {
	_, srcURL := backupNode(t, false)
	if res, b := do(t, http.MethodPut, srcURL+"/bkt1/s", []byte("hello"), "Content-Type", "text/plain"); res.StatusCode != http.StatusCreated {
		t.Fatalf("create: %d %s", res.StatusCode, b)
	}
	dir := filepath.Join(t.TempDir(), "bk")
	if code, _, stderr := runCLI("backup", "create", "--from", srcURL, "--to", dir); code != 0 {
		t.Fatalf("create: %s", stderr)
	}
	mb, _ := os.ReadFile(filepath.Join(dir, manifestName))
	var m backupManifest
	json.Unmarshal(mb, &m)
	var victim string
	for _, o := range m.Objects {
		if o.Streams > 0 {
			victim = o.Name
		}
	}
	p := filepath.Join(dir, victim)
	data, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	data[len(data)-2] ^= 1
	os.WriteFile(p, data, 0o644)
	code, _, stderr := runCLI("backup", "verify", dir)
	if code == 0 || !strings.Contains(stderr, victim) {
		t.Fatalf("verify of a flipped byte: %d %q", code, stderr)
	}
	_, dstURL := backupNode(t, false)
	if code, _, _ := runCLI("backup", "restore", dir, "--to", dstURL); code == 0 {
		t.Fatal("restore of a damaged backup succeeded")
	}
	data[len(data)-2] ^= 1
	os.WriteFile(p, data, 0o644)

	// Another format version is refused before anything is written.
	m.FormatVersion = backupFormatVersion + 1
	mb, _ = json.Marshal(m)
	os.WriteFile(filepath.Join(dir, manifestName), mb, 0o644)
	code, _, stderr = runCLI("backup", "restore", dir, "--to", dstURL)
	if code == 0 || !strings.Contains(stderr, "format_version") {
		t.Fatalf("restore of another version: %d %q", code, stderr)
	}
	if res, _ := do(t, http.MethodHead, dstURL+"/bkt1/s", nil); res.StatusCode != http.StatusNotFound {
		t.Fatalf("the refused restore wrote a stream: %d", res.StatusCode)
	}
}
