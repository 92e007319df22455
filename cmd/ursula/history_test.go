package main

import (
	"bytes"
	"context"
	"database/sql"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ursula-go/ursula/internal/testserver"

	"github.com/ursula-go/ursula/client"
	"github.com/ursula-go/ursula/replicator"
	"github.com/ursula-go/ursula/streamcore"
	"github.com/ursula-go/ursula/vfs"
)

// historyServer starts an in-process server over real HTTP and a replicated database
// on it with n committed rows; offsets[i] is the offset after the commit of row i.
func historyServer(t *testing.T, n int) (base string, url string, owner *sql.DB, ownerPath string, offsets []uint64) {
	t.Helper()
	ts := testserver.Start(t, testserver.Options{ClusterID: "history-test"})
	url = ts.URL + "/hist/db"
	ownerPath = filepath.Join(t.TempDir(), "owner.db")
	owner, err := vfs.Open(url, vfs.Options{Path: ownerPath})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { owner.Close() })
	if _, err := owner.Exec(`CREATE TABLE t(x INTEGER, pad BLOB)`); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < n; i++ {
		if _, err := owner.Exec(`INSERT INTO t VALUES (?, randomblob(300))`, i); err != nil {
			t.Fatal(err)
		}
		st, _ := vfs.Status(ownerPath)
		offsets = append(offsets, st.Offset)
	}
	return ts.URL, url, owner, ownerPath, offsets
}

// countRows opens a plain SQLite file and counts the rows of t (and checks integrity).
func countRows(t *testing.T, path string) int {
	t.Helper()
	db, err := sql.Open("sqlite3", "file:"+path+"?mode=ro")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var n int
	var ok string
	if err := db.QueryRow(`SELECT count(*) FROM t`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if db.QueryRow(`PRAGMA integrity_check`).Scan(&ok); ok != "ok" {
		t.Errorf("%s: integrity %s", path, ok)
	}
	return n
}

// TestLogAndExportAtTime: ursula log lists every commit with its offset and time, and
// export --at a time between two commits gives the earlier one; times and offsets the
// stream cannot serve are refused naming the earliest restorable commit.
func TestLogAndExportAtTime(t *testing.T) {
	_, url, _, _, offsets := historyServer(t, 8)
	var out, errb bytes.Buffer
	if err := runLog([]string{url}, &out, &errb); err != nil {
		t.Fatalf("log: %v (%s)", err, errb.String())
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) != 9 { // CREATE TABLE and 8 inserts
		t.Fatalf("log printed %d lines, want 9:\n%s", len(lines), out.String())
	}
	times := make([]time.Time, len(lines))
	for i, l := range lines {
		f := strings.Fields(l)
		tm, err := time.Parse(time.RFC3339Nano, f[1])
		if err != nil || f[2] != "commit" {
			t.Fatalf("line %q: want offset, RFC 3339 time, commit (%v)", l, err)
		}
		times[i] = tm
		if i > 0 && f[0] != streamcore.FormatOffset(offsets[i-1]) {
			t.Fatalf("line %d offset %s, want %s", i, f[0], streamcore.FormatOffset(offsets[i-1]))
		}
	}
	out.Reset()
	if err := runLog([]string{url, "--json"}, &out, &errb); err != nil || strings.Count(out.String(), `"kind":"commit"`) != 9 {
		t.Fatalf("log --json: %v\n%s", err, out.String())
	}

	dir := t.TempDir()
	// Line k+1 is the commit that inserted row k; a time between it and the next commit
	// must resolve to it: k+1 rows.
	for _, k := range []int{0, 3, 6} {
		a, b := times[k+1], times[k+2]
		if !a.Before(b) {
			t.Fatalf("commit times do not increase: %v, %v", a, b)
		}
		mid := a.Add(b.Sub(a) / 2).Format(time.RFC3339Nano)
		p := filepath.Join(dir, "at.db")
		out.Reset()
		if err := runExport([]string{url, p, "--at", mid}, &out, &errb); err != nil {
			t.Fatalf("export --at %s: %v", mid, err)
		}
		if n := countRows(t, p); n != k+1 {
			t.Errorf("export --at %s (between commits %d and %d) has %d rows, want %d", mid, k+1, k+2, n, k+1)
		}
		if !strings.Contains(out.String(), streamcore.FormatOffset(offsets[k])) {
			t.Errorf("export does not say which commit it used: %s", out.String())
		}
	}
	// A relative time after every commit is the tail.
	p := filepath.Join(dir, "rel.db")
	if err := runExport([]string{url, p, "--at", "-0s"}, &out, &errb); err != nil || countRows(t, p) != 8 {
		t.Fatalf("export --at -0s: %v", err)
	}
	for _, at := range []string{"-1h", times[0].Add(-time.Millisecond).Format(time.RFC3339Nano), streamcore.FormatOffset(offsets[2] + 5)} {
		err := runExport([]string{url, p, "--at", at}, &out, &errb)
		if err == nil || !strings.Contains(err.Error(), "earliest restorable point is the commit at offset") {
			t.Errorf("--at %s: %v, want a refusal naming the earliest commit", at, err)
		}
	}
}

// TestBranch: a branch made at an earlier commit diverges from its source without touching
// it; the source's owner keeps committing; both rebuild page-identical to a replay of their
// own histories.
func TestBranch(t *testing.T) {
	base, url, owner, ownerPath, offsets := historyServer(t, 10)
	dst := base + "/hist/branch"
	var out, errb bytes.Buffer
	if err := runBranch([]string{url + "@" + streamcore.FormatOffset(offsets[4]), dst}, &out, &errb); err != nil {
		t.Fatalf("branch: %v", err)
	}
	if !strings.Contains(out.String(), streamcore.FormatOffset(offsets[4])) {
		t.Errorf("branch does not say where it branched: %s", out.String())
	}
	if err := runBranch([]string{url, dst}, &out, &errb); err == nil {
		t.Error("a second branch onto an existing stream was accepted")
	}
	srcBefore := readAll(t, url)

	branch, err := vfs.Open(dst, vfs.Options{Path: filepath.Join(t.TempDir(), "branch.db")})
	if err != nil {
		t.Fatal(err)
	}
	defer branch.Close()
	var n int
	if err := branch.QueryRow(`SELECT count(*) FROM t`).Scan(&n); err != nil || n != 5 {
		t.Fatalf("branch holds %d rows (%v), want 5", n, err)
	}
	if _, err := branch.Exec(`DELETE FROM t WHERE x < 3; INSERT INTO t VALUES (100, NULL)`); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(readAll(t, url), srcBefore) {
		t.Fatal("writing the branch changed the source stream")
	}
	// The source's owner was not fenced by the branch's claim.
	if _, err := owner.Exec(`INSERT INTO t VALUES (11, NULL)`); err != nil {
		t.Fatalf("source owner after the branch: %v", err)
	}
	if st, _ := vfs.Status(ownerPath); st.Offset <= offsets[9] {
		t.Fatalf("source offset %d did not move", st.Offset)
	}

	ctx := context.Background()
	c, _ := client.New("")
	dir := t.TempDir()
	for _, tc := range []struct {
		url  string
		rows int
	}{{url, 11}, {dst, 3}} {
		rebuilt, replayed := filepath.Join(dir, "rebuilt.db"), filepath.Join(dir, "replayed.db")
		img, err := replicator.Restore(ctx, c, tc.url, rebuilt, 0, streamcore.MaxRequestBytes, nil)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := replicator.ReplayLog(ctx, c, tc.url, replayed, img.Tail, streamcore.MaxRequestBytes); err != nil {
			t.Fatal(err)
		}
		a, _ := os.ReadFile(rebuilt)
		b, _ := os.ReadFile(replayed)
		if len(a) == 0 || !bytes.Equal(a, b) {
			t.Fatalf("%s: the rebuild (%d bytes) is not page-identical to a replay of its history (%d bytes)", tc.url, len(a), len(b))
		}
		if err := rollbackJournalMode(rebuilt); err != nil {
			t.Fatal(err)
		}
		if got := countRows(t, rebuilt); got != tc.rows {
			t.Errorf("%s rebuilds with %d rows, want %d", tc.url, got, tc.rows)
		}
	}
}

func readAll(t *testing.T, url string) []byte {
	t.Helper()
	c, _ := client.New("")
	rr, err := c.Read(context.Background(), url, client.ReadOptions{Offset: streamcore.FormatOffset(0), MaxBytes: 16 << 20})
	if err != nil {
		t.Fatal(err)
	}
	return rr.Data
}

// TestVerify: verify passes on a healthy database, compares a real snapshot with a replay
// of the whole log, and catches a snapshot planted with a well-formed blob (right crc,
// right digest) whose image is not what the log says, exiting non-zero.
func TestVerify(t *testing.T) {
	_, url, owner, ownerPath, _ := historyServer(t, 6)
	metrics := filepath.Join(t.TempDir(), "verify.prom")
	var out, errb bytes.Buffer
	if err := runVerify([]string{url, "--metrics-file", metrics}, &out, &errb); err != nil {
		t.Fatalf("verify of a healthy database: %v", err)
	}
	if !strings.Contains(out.String(), "integrity ok") {
		t.Errorf("verify output: %s", out.String())
	}
	ctx := context.Background()
	c, _ := client.New("")
	dir := t.TempDir()
	// A genuine snapshot of the tail: verify compares it with a replay and agrees.
	st, _ := vfs.Status(ownerPath)
	good := snapshotOf(t, c, url, filepath.Join(dir, "good.db"), st.Offset, st.Offset)
	if _, err := c.PublishSnapshot(ctx, url, streamcore.FormatOffset(st.Offset), "application/octet-stream", good); err != nil {
		t.Fatal(err)
	}
	out.Reset()
	if err := runVerify([]string{url, "--metrics-file", metrics}, &out, &errb); err != nil || !strings.Contains(out.String(), "agrees with a replay") {
		t.Fatalf("verify with a genuine snapshot: %v: %s", err, out.String())
	}
	prom, _ := os.ReadFile(metrics)
	if !strings.Contains(string(prom), "ursula_verify_last_ok_offset{stream=\""+url+"\"} "+strings.TrimLeft(streamcore.FormatOffset(st.Offset), "0")) {
		t.Errorf("metrics do not report the verified offset %d:\n%s", st.Offset, prom)
	}

	// More commits, then a planted snapshot at the new tail holding an older image.
	for i := 0; i < 3; i++ {
		if _, err := owner.Exec(`INSERT INTO t VALUES (?, NULL)`, 50+i); err != nil {
			t.Fatal(err)
		}
	}
	st2, _ := vfs.Status(ownerPath)
	planted := snapshotOf(t, c, url, filepath.Join(dir, "old.db"), st.Offset, st2.Offset)
	if _, err := c.PublishSnapshot(ctx, url, streamcore.FormatOffset(st2.Offset), "application/octet-stream", planted); err != nil {
		t.Fatal(err)
	}
	out.Reset()
	err := runVerify([]string{url, "--metrics-file", metrics}, &out, &errb)
	if err == nil || !strings.Contains(err.Error(), "page") || !strings.Contains(err.Error(), streamcore.FormatOffset(st2.Offset)) {
		t.Fatalf("verify of a planted snapshot: %v (%s)", err, out.String())
	}
	t.Logf("verify refused the planted snapshot: %v", err)
	if code := run([]string{"verify", url}, &out, &errb); code == 0 {
		t.Error("ursula verify exited 0 on damage")
	}
	prom, _ = os.ReadFile(metrics)
	if !strings.Contains(string(prom), "ursula_verify_failures_total{stream=\""+url+"\"} 1") {
		t.Errorf("metrics do not count the failure:\n%s", prom)
	}
}

// snapshotOf returns a well-formed snapshot blob of the database rebuilt at offset at,
// whose header says it folds the stream up to claim.
func snapshotOf(t *testing.T, c *client.Client, url, path string, at, claim uint64) []byte {
	t.Helper()
	img, err := replicator.Restore(context.Background(), c, url, path, at, streamcore.MaxRequestBytes, nil)
	if err != nil {
		t.Fatal(err)
	}
	image, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	blob, err := replicator.EncodeSnapshot(replicator.SnapshotHeader{PageSize: img.PageSize, DBPages: img.DBPages, Epoch: img.Epoch, Offset: claim}, image)
	if err != nil {
		t.Fatal(err)
	}
	return blob
}

// TestBranchAfterRetention: when the source dropped its log below a snapshot, a branch
// still opens (the snapshot goes with it), and points before the snapshot are refused
// naming it as the earliest restorable point.
func TestBranchAfterRetention(t *testing.T) {
	base, url, _, _, offsets := historyServer(t, 10)
	ctx := context.Background()
	c, _ := client.New("")
	snap := snapshotOf(t, c, url, filepath.Join(t.TempDir(), "snap.db"), offsets[6], offsets[6])
	at := streamcore.FormatOffset(offsets[6])
	if _, err := c.PublishSnapshot(ctx, url, at, "application/octet-stream", snap); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Retain(ctx, url, at); err != nil {
		t.Fatal(err)
	}
	var out, errb bytes.Buffer
	err := runBranch([]string{url + "@" + streamcore.FormatOffset(offsets[2]), base + "/hist/early"}, &out, &errb)
	if err == nil || !strings.Contains(err.Error(), "earliest restorable point is the snapshot at offset "+at) {
		t.Fatalf("branch before retention: %v", err)
	}
	err = runExport([]string{url, filepath.Join(t.TempDir(), "x.db"), "--at", "-1h"}, &out, &errb)
	if err == nil || !strings.Contains(err.Error(), "earliest restorable point is the snapshot at offset "+at) {
		t.Fatalf("export before retention: %v", err)
	}
	dst := base + "/hist/late"
	if err := runBranch([]string{url + "@" + streamcore.FormatOffset(offsets[8]), dst}, &out, &errb); err != nil {
		t.Fatal(err)
	}
	db, err := vfs.Open(dst, vfs.Options{Path: filepath.Join(t.TempDir(), "late.db")})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var n int
	if err := db.QueryRow(`SELECT count(*) FROM t`).Scan(&n); err != nil || n != 9 {
		t.Fatalf("branch holds %d rows (%v), want 9", n, err)
	}
	if _, err := db.Exec(`INSERT INTO t VALUES (1000, NULL)`); err != nil {
		t.Fatal(err)
	}
}
