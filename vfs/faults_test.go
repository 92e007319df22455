package vfs

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	neturl "net/url"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/ursula-go/ursula/client"
	"github.com/ursula-go/ursula/replicator"
	"github.com/ursula-go/ursula/streamcore"
)

// faultProxy sits between the replicator and the real server and answers commit appends
// (POSTs carrying a Producer-Seq above 0) with scripted faults, forwarding or not.
type faultProxy struct {
	*httptest.Server
	mu      sync.Mutex
	script  []fault // one per commit attempt; empty: forward
	appends atomic.Int64
}

type fault struct {
	forward bool // forward to the server first (the write is applied), then answer
	status  int
	header  map[string]string
}

func newFaultProxy(t *testing.T, target string) *faultProxy {
	u, _ := neturl.Parse(target)
	rp := httputil.NewSingleHostReverseProxy(u)
	fp := &faultProxy{}
	fp.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost || r.Header.Get(streamcore.HdrProducerSeq) == "" || r.Header.Get(streamcore.HdrProducerSeq) == "0" {
			rp.ServeHTTP(w, r)
			return
		}
		fp.appends.Add(1)
		fp.mu.Lock()
		var f *fault
		if len(fp.script) > 0 {
			f = &fp.script[0]
			fp.script = fp.script[1:]
		}
		fp.mu.Unlock()
		if f == nil {
			rp.ServeHTTP(w, r)
			return
		}
		if f.forward {
			rec := httptest.NewRecorder()
			rp.ServeHTTP(rec, r)
		}
		for k, v := range f.header {
			w.Header().Set(k, v)
		}
		w.WriteHeader(f.status)
		fmt.Fprintf(w, `{"error":{"code":"INJECTED","message":"injected %d"}}`, f.status)
	}))
	t.Cleanup(fp.Close)
	return fp
}

func (fp *faultProxy) set(fs ...fault) {
	fp.mu.Lock()
	fp.script = fs
	fp.mu.Unlock()
}

func repeat(f fault, n int) []fault {
	out := make([]fault, n)
	for i := range out {
		out[i] = f
	}
	return out
}

var marked = map[string]string{streamcore.HdrNotApplied: "RaftLogPressure", streamcore.HdrNotAppliedChecked: "true"}

// TestCommitOutcomes: the verdict of a commit for each kind of answer (checklist-vfs J,
// T20, T21, T29, T25): refusals that prove nothing was applied fail the commit alone and
// leave the file usable; answers that prove nothing poison it; a retry after an unknown
// outcome that the server deduplicates is the commit's acknowledgement. After every case
// a rebuild from the stream equals the owner's database.
func TestCommitOutcomes(t *testing.T) {
	// 2 s: long enough for one attempt on a loaded machine, short enough for the cases that
	// wait for the budget to end.
	t.Setenv("URSULA_VFS_RETRY_MS", "2000")
	base := startServer(t)
	cases := []struct {
		name     string
		script   []fault
		wantErr  replicator.Kind // "" = the commit succeeds
		action   replicator.Action
		poisoned bool
		applied  bool
	}{
		{name: "marked 503 until the budget ends: fails alone", script: repeat(fault{status: 503, header: marked}, 100),
			wantErr: replicator.KindNotApplied, action: replicator.ActionRetry},
		{name: "402: fails alone at once", script: []fault{{status: 402}},
			wantErr: replicator.KindPaymentRequired, action: replicator.ActionRetry},
		{name: "marked 413: fails alone", script: []fault{{status: 413, header: marked}},
			wantErr: replicator.KindTooLarge, action: replicator.ActionRetry},
		{name: "429 then success", script: []fault{{status: 429}},
			applied: true},
		{name: "applied but answered 500: the retry is deduplicated", script: []fault{{forward: true, status: 500}},
			applied: true},
		{name: "307: resent to the same URL", script: []fault{{status: 307, header: map[string]string{"Location": "http://127.0.0.1:1/elsewhere"}}},
			applied: true},
		{name: "unmarked 502 until the budget ends: poison", script: repeat(fault{status: 502}, 100),
			wantErr: replicator.KindOutcomeUnknown, action: replicator.ActionReattach, poisoned: true},
		{name: "unknown then refused: poison", script: append([]fault{{status: 500}}, repeat(fault{status: 503, header: marked}, 100)...),
			wantErr: replicator.KindOutcomeUnknown, action: replicator.ActionReattach, poisoned: true},
		{name: "301: invalid_url, poison", script: []fault{{status: 301, header: map[string]string{"Location": "https://127.0.0.1:1/x"}}},
			wantErr: replicator.KindInvalidURL, action: replicator.ActionFix, poisoned: true},
		{name: "unmarked 403 the stream did not apply: fails alone after a check", script: []fault{{status: 403}},
			wantErr: replicator.KindForbidden, action: replicator.ActionRetry},
		{name: "unmarked 402 after the stream applied: acknowledged after all", script: []fault{{forward: true, status: 402}},
			applied: true},
	}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			fp := newFaultProxy(t, base)
			url := fp.URL + fmt.Sprintf("/faults/db%d", i)
			path := filepath.Join(t.TempDir(), "f.db")
			db, err := Open(url, Options{Path: path})
			if err != nil {
				t.Fatal(err)
			}
			defer db.Close()
			mustExec(t, db, `CREATE TABLE t(x)`)
			mustExec(t, db, `INSERT INTO t VALUES (1)`)
			fp.set(tc.script...)
			_, err = db.Exec(`INSERT INTO t VALUES (2)`)
			fp.set()
			if tc.wantErr == "" {
				if err != nil {
					t.Fatalf("commit failed: %v", err)
				}
			} else {
				var e *Error
				if !errors.As(err, &e) || e.Kind != tc.wantErr || e.Action != tc.action {
					t.Fatalf("got %v, want kind %s action %s", err, tc.wantErr, tc.action)
				}
			}
			st, _ := Status(path)
			if st.Poisoned != tc.poisoned {
				t.Errorf("poisoned=%v, want %v", st.Poisoned, tc.poisoned)
			}
			want := 2
			if tc.wantErr != "" {
				want = 1
			}
			if tc.poisoned {
				// Reads and writes fail until re-attached; re-attaching replays the stream.
				var n int
				if err := db.QueryRow(`SELECT count(*) FROM t`).Scan(&n); err == nil {
					t.Errorf("a poisoned file still reads (%d rows)", n)
				}
				db.Close()
				db, err = Open(url, Options{Path: path})
				if err != nil {
					t.Fatal(err)
				}
				defer db.Close()
				want = count(t, db, `SELECT count(*) FROM t`) // the stream decides
			} else {
				if n := count(t, db, `SELECT count(*) FROM t`); n != want {
					t.Errorf("owner has %d rows, want %d", n, want)
				}
				// The file stays usable: the next commit goes through.
				mustExec(t, db, `INSERT INTO t VALUES (3)`)
				want++
			}
			if n := rebuiltCount(t, base+fmt.Sprintf("/faults/db%d", i)); n != want {
				t.Errorf("a rebuild from the stream has %d rows, the owner %d", n, want)
			}
		})
	}
}

// rebuiltCount rebuilds the stream into a fresh file and counts the rows of t.
func rebuiltCount(t *testing.T, url string) int {
	t.Helper()
	c, _ := client.New("")
	p := filepath.Join(t.TempDir(), "rebuilt.db")
	if _, err := replicator.Restore(context.Background(), c, url, p, 0, streamcore.MaxRequestBytes, nil); err != nil {
		t.Fatal(err)
	}
	db, err := sql.Open("sqlite3", "file:"+p+"?mode=ro")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	return count(t, db, `SELECT count(*) FROM t`)
}

// TestTooLarge: a commit frame over URSULA_VFS_MAX_FRAME_BYTES is never sent, fails alone
// with too_large, and the next small commit goes through (checklist-vfs I65, T25).
func TestTooLarge(t *testing.T) {
	t.Setenv("URSULA_VFS_MAX_FRAME_BYTES", "65536")
	base := startServer(t)
	path := filepath.Join(t.TempDir(), "big.db")
	db, err := Open(base+"/faults/big", Options{Path: path})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	mustExec(t, db, `CREATE TABLE t(x)`)
	_, err = db.Exec(`INSERT INTO t SELECT randomblob(1000) FROM generate_series(1, 500)`)
	if err != nil && strings.Contains(err.Error(), "generate_series") {
		_, err = db.Exec(`WITH RECURSIVE s(i) AS (SELECT 1 UNION ALL SELECT i+1 FROM s WHERE i < 500) INSERT INTO t SELECT randomblob(1000) FROM s`)
	}
	var e *Error
	if !errors.As(err, &e) || e.Kind != replicator.KindTooLarge || e.Action != replicator.ActionFix {
		t.Fatalf("big commit: %v", err)
	}
	if n := count(t, db, `SELECT count(*) FROM t`); n != 0 {
		t.Fatalf("the refused commit left %d rows", n)
	}
	mustExec(t, db, `INSERT INTO t VALUES (1)`)
	if st, _ := Status(path); st.Error != nil || st.Poisoned {
		t.Fatalf("status after recovery: %+v", st)
	}
	if n := rebuiltCount(t, base+"/faults/big"); n != 1 {
		t.Fatalf("rebuild has %d rows", n)
	}
}

// TestTokenAndStatus: SetToken takes effect on the next commit; a 401 that persists
// through the budget fails the commit alone as unauthorized, with the status fields of
// checklist-vfs Q (writes_refused, refused_kind, error) set, and cleared by the next
// successful commit (checklist-vfs X, T34, T53).
func TestTokenAndStatus(t *testing.T) {
	t.Setenv("URSULA_VFS_RETRY_MS", "1500") // one attempt must fit in it on a loaded machine
	base := startServer(t)
	u, _ := neturl.Parse(base)
	rp := httputil.NewSingleHostReverseProxy(u)
	var unauthorized atomic.Int64
	gate := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer good" {
			unauthorized.Add(1)
			w.WriteHeader(http.StatusUnauthorized)
			return
		}
		rp.ServeHTTP(w, r)
	}))
	defer gate.Close()
	SetToken("good")
	defer SetToken("")
	path := filepath.Join(t.TempDir(), "tok.db")
	db, err := Open(gate.URL+"/tokens/db", Options{Path: path})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	mustExec(t, db, `CREATE TABLE t(x)`)
	st, _ := Status(path)
	if st.Error != nil || st.WritesRefused || st.Commits != 1 || st.AttachMs < 0 {
		t.Fatalf("status after a commit: %+v", st)
	}
	SetToken("bad")
	_, err = db.Exec(`INSERT INTO t VALUES (1)`)
	var e *Error
	if !errors.As(err, &e) || e.Kind != replicator.KindUnauthorized || e.Action != replicator.ActionRetry {
		t.Fatalf("commit with a bad token: %v", err)
	}
	if unauthorized.Load() < 2 {
		t.Errorf("the 401 was not retried (%d attempts)", unauthorized.Load())
	}
	st, _ = Status(path)
	if !st.WritesRefused || st.RefusedKind != replicator.KindUnauthorized || st.Error == nil || st.Poisoned || st.AppendRetries == 0 {
		t.Fatalf("status after a refused commit: %+v", st)
	}
	SetToken("good")
	mustExec(t, db, `INSERT INTO t VALUES (2)`)
	st, _ = Status(path)
	if st.WritesRefused || st.Error != nil || count(t, db, `SELECT count(*) FROM t`) != 1 {
		t.Fatalf("status after recovery: %+v", st)
	}
}
