package main

import (
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ursula-go/ursula/vfs"
)

// These tests build the extension (-buildmode=c-shared) and the ursula binary into a
// temp dir, start a real server (memory engine) and drive the extension from the
// Debian sqlite3 CLI and /usr/bin/python3's sqlite3 module, in separate processes.

type env struct {
	dir, so, ursula, base string
}

func need(t *testing.T, bins ...string) {
	for _, b := range bins {
		if _, err := exec.LookPath(b); err != nil {
			t.Skipf("%s not installed", b)
		}
	}
}

var (
	shared    *env
	sharedErr error
	setupOnce sync.Once
	stopSrv   func()
)

func TestMain(m *testing.M) {
	code := m.Run()
	if stopSrv != nil {
		stopSrv()
	}
	if shared != nil {
		os.RemoveAll(shared.dir)
	}
	os.Exit(code)
}

// setup builds the extension and ursula once per test binary and starts one server;
// each test uses its own streams and files.
func setup(t *testing.T) *env {
	t.Helper()
	need(t, "sqlite3", "/usr/bin/python3")
	setupOnce.Do(func() { shared, sharedErr = build() })
	if sharedErr != nil {
		t.Fatal(sharedErr)
	}
	e := *shared
	e.dir = t.TempDir()
	return &e
}

func build() (*env, error) {
	dir, err := os.MkdirTemp("", "cextension-test")
	if err != nil {
		return nil, err
	}
	e := &env{dir: dir, so: filepath.Join(dir, "libursula_vfs.so"), ursula: filepath.Join(dir, "ursula")}
	if p := os.Getenv("URSULA_VFS_EXTENSION"); p != "" {
		e.so = p // prebuilt by make extension
	} else if out, err := runErr("", nil, "go", "build", "-buildmode=c-shared", "-o", e.so, "."); err != nil {
		return e, fmt.Errorf("building the extension: %v\n%s", err, out)
	}
	if out, err := runErr("", nil, "go", "build", "-o", e.ursula, "../cmd/ursula"); err != nil {
		return e, fmt.Errorf("building ursula: %v\n%s", err, out)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return e, err
	}
	addr := ln.Addr().String()
	ln.Close()
	srv := exec.Command(e.ursula, "server", "--engine", "memory", "--listen", addr, "--admin-listen", "127.0.0.1:0", "--data", filepath.Join(dir, "data"))
	if err := srv.Start(); err != nil {
		return e, err
	}
	stopSrv = func() { srv.Process.Kill(); srv.Wait() }
	for i := 0; ; i++ {
		if c, err := net.Dial("tcp", addr); err == nil {
			c.Close()
			break
		}
		if i > 200 {
			return e, fmt.Errorf("server did not start on %s", addr)
		}
		time.Sleep(50 * time.Millisecond)
	}
	e.base = "http://" + addr
	return e, nil
}

func run(t *testing.T, stdin string, extraEnv []string, name string, args ...string) string {
	t.Helper()
	out, err := runErr(stdin, extraEnv, name, args...)
	if err != nil {
		t.Fatalf("%s %v: %v\n%s", name, args, err, out)
	}
	return out
}

func runErr(stdin string, extraEnv []string, name string, args ...string) (string, error) {
	cmd := exec.Command(name, args...)
	cmd.Stdin = strings.NewReader(stdin)
	cmd.Env = append(os.Environ(), extraEnv...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	return out.String(), err
}

// sqliteRows runs SQL with the plain sqlite3 CLI (no extension) and returns its output.
func sqliteRows(t *testing.T, db, sql string) string {
	t.Helper()
	return strings.TrimSpace(run(t, "", nil, "sqlite3", db, sql))
}

// TestCLI: .load without naming the entry point, attach, WAL + 4 KiB enforced, commits,
// a refused journal mode, and a fresh-host export equal to the local file's rows.
func TestCLI(t *testing.T) {
	e := setup(t)
	db := filepath.Join(e.dir, "cli.db")
	url := e.base + "/clitest/notes"
	script := fmt.Sprintf(`.bail off
.load %[1]s
SELECT 'offset=' || ursula_attach('%[2]s', '%[3]s');
.open %[4]s
SELECT 'mode=' || (SELECT journal_mode FROM pragma_journal_mode) || ' page=' || (SELECT page_size FROM pragma_page_size);
CREATE TABLE notes(id INTEGER PRIMARY KEY, body TEXT);
INSERT INTO notes(body) VALUES ('one'), ('two');
BEGIN; INSERT INTO notes(body) SELECT 'bulk ' || value FROM generate_series(1, 500); COMMIT;
PRAGMA journal_mode=DELETE;
PRAGMA wal_checkpoint(TRUNCATE);
INSERT INTO notes(body) VALUES ('after truncate');
PRAGMA wal_checkpoint(PASSIVE);
INSERT INTO notes(body) VALUES ('after checkpoint');
CREATE VIEW st AS SELECT ursula_status('%[4]s') AS s;
SELECT * FROM st;
DROP VIEW st;
SELECT 'rows=' || count(*) FROM notes;
SELECT 'commits=' || json_extract(ursula_status('%[4]s'), '$.commits');
`, strings.TrimSuffix(e.so, ".so"), db, url, db)
	out, _ := runErr(script, nil, "sqlite3")
	for _, want := range []string{"offset=0000", "mode=wal page=4096", "rows=504", "commits=7", "unsafe use of ursula_status()",
		"PRAGMA journal_mode=DELETE refused: a replicated database stays in WAL mode"} {
		if !strings.Contains(out, want) {
			t.Fatalf("missing %q in:\n%s", want, out)
		}
	}
	exp := filepath.Join(e.dir, "export.db")
	run(t, "", nil, e.ursula, "export", url, exp)
	if got, want := sqliteRows(t, exp, "SELECT count(*), sum(length(body)) FROM notes"), sqliteRows(t, db, "SELECT count(*), sum(length(body)) FROM notes"); got != want || got == "" {
		t.Fatalf("export %q, local %q", got, want)
	}
	if got := sqliteRows(t, exp, "PRAGMA integrity_check"); got != "ok" {
		t.Fatal(got)
	}
}

const pyPrelude = `
import sqlite3, sys, os, json
SO, BASE, DIR = sys.argv[1], sys.argv[2], sys.argv[3]
loader = sqlite3.connect(":memory:", isolation_level=None)
loader.enable_load_extension(True)
loader.load_extension(SO)
def q(sql, *a):
    return loader.execute(sql, a).fetchone()[0]
def code(fn):
    try:
        fn()
    except sqlite3.Error as e:
        return e.sqlite_errorcode, str(e)
    return 0, ""
`

func python(t *testing.T, e *env, extraEnv []string, script string) string {
	t.Helper()
	return run(t, "", extraEnv, "/usr/bin/python3", "-c", pyPrelude+script, e.so, e.base, e.dir)
}

// TestPythonConnectionsAndFencing: several connections of one process in WAL mode see
// each other's commits; a second process attaching the stream at another path fences
// the first, whose next commit fails with 7178 and whose reads fail with 266, on a warm
// connection and a fresh one; the fenced file is usable again after a re-attach.
func TestPythonConnectionsAndFencing(t *testing.T) {
	e := setup(t)
	out := python(t, e, nil, `
import subprocess
url = BASE + "/pytest/fence"
p1 = os.path.join(DIR, "first.db")
q("SELECT ursula_attach(?, ?)", p1, url)
a = sqlite3.connect(p1, isolation_level=None)
b = sqlite3.connect(p1, isolation_level=None)
a.execute("CREATE TABLE t(x)")
for i in range(20):
    (a if i % 2 else b).execute("INSERT INTO t VALUES (?)", (i,))
print("mode", a.execute("PRAGMA journal_mode").fetchone()[0])
print("seen", b.execute("SELECT count(*) FROM t").fetchone()[0])
print("auto", json.loads(b.execute("SELECT ursula_status(?)", (p1,)).fetchone()[0])["commits"])
plain = os.path.join(DIR, "opened-first.db")
early = sqlite3.connect(plain); early.execute("CREATE TABLE x(y)"); early.commit()
print("early", *code(lambda: q("SELECT ursula_attach(?, ?)", plain, BASE + "/pytest/early")))
# another process takes the stream over at another path
p2 = os.path.join(DIR, "second.db")
other = "import sqlite3,sys\nl=sqlite3.connect(':memory:')\nl.enable_load_extension(True)\nl.load_extension(sys.argv[1])\nl.execute('SELECT ursula_attach(?,?)',(sys.argv[2],sys.argv[3]))\nc=sqlite3.connect(sys.argv[2])\nprint('other', c.execute('SELECT count(*) FROM t').fetchone()[0])\n"
print(subprocess.run([sys.executable, "-c", other, SO, p2, url], capture_output=True, text=True).stdout.strip())
print("commit", *code(lambda: a.execute("INSERT INTO t VALUES (99)")))
print("read", *code(lambda: b.execute("SELECT count(*) FROM t").fetchone()))
print("fresh", *code(lambda: sqlite3.connect(p1).execute("SELECT count(*) FROM t").fetchone()))
st = json.loads(q("SELECT ursula_status(?)", p1))
print("status", st["fenced"], st["error"]["kind"], st["error"]["action"])
print("busy", *code(lambda: q("SELECT ursula_attach(?, ?)", p1, url)))
a.close(); b.close()
q("SELECT ursula_attach(?, ?)", p1, url)
c = sqlite3.connect(p1, isolation_level=None)
c.execute("INSERT INTO t VALUES (100)")
print("again", c.execute("SELECT count(*) FROM t").fetchone()[0])
`)
	for _, want := range []string{"mode wal", "seen 20", "auto 21", "early 1 ursula_attach: in_use:", "other 20",
		"commit 7178", "read 266", "fresh 266", "status True fenced stop",
		"busy 1 ursula_attach: in_use:", "again 21"} {
		if !strings.Contains(out, want) {
			t.Fatalf("missing %q in:\n%s", want, out)
		}
	}
}

// TestPythonRefusedCommit: a transaction over URSULA_VFS_MAX_FRAME_BYTES fails alone
// with SQLITE_IOERR_AUTH (7178), nothing of it stays, and the file stays usable.
func TestPythonRefusedCommit(t *testing.T) {
	e := setup(t)
	out := python(t, e, []string{"URSULA_VFS_MAX_FRAME_BYTES=65536"}, `
url = BASE + "/pytest/big"
p = os.path.join(DIR, "big.db")
q("SELECT ursula_attach(?, ?)", p, url)
c = sqlite3.connect(p, isolation_level=None)
c.execute("CREATE TABLE t(x)")
c.execute("INSERT INTO t VALUES ('small')")
def big():
    c.execute("BEGIN")
    c.execute("WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i+1 FROM n WHERE i<200) INSERT INTO t SELECT randomblob(4000) FROM n")
    c.execute("COMMIT")
print("big", *code(big))
if c.in_transaction:
    c.execute("ROLLBACK")
st = json.loads(q("SELECT ursula_status(?)", p))
print("status", st["fenced"], st["poisoned"], st["error"]["kind"])
print("rows", c.execute("SELECT count(*) FROM t").fetchone()[0])
c.execute("INSERT INTO t VALUES ('after')")
print("rows", c.execute("SELECT count(*) FROM t").fetchone()[0])
ro = json.loads(q("SELECT ursula_stats(?)", p))
print("stats", ro["commits"])
print("measured", len(ro["commit"]), all(isinstance(m["offset"], str) and m["bytes"] > 0 for m in ro["commit"]), ro["dropped"]["commit"])
print("drained", len(json.loads(q("SELECT ursula_stats(?)", p))["commit"]))
`)
	for _, want := range []string{"big 7178", "status False False too_large", "rows 1", "rows 2", "stats 3", "measured 3 True 0", "drained 0"} {
		if !strings.Contains(out, want) {
			t.Fatalf("missing %q in:\n%s", want, out)
		}
	}
}

// TestPythonReadOnlyAndErrors: a read-only attach reads and refuses writes with
// SQLITE_READONLY; errors read "<function>: <kind>: <message>".
func TestPythonReadOnlyAndErrors(t *testing.T) {
	e := setup(t)
	out := python(t, e, nil, `
url = BASE + "/pytest/ro"
p = os.path.join(DIR, "owner.db")
q("SELECT ursula_attach(?, ?)", p, url)
c = sqlite3.connect(p, isolation_level=None)
c.execute("CREATE TABLE t(x)"); c.execute("INSERT INTO t VALUES (1)")
r = os.path.join(DIR, "reader.db")
print("ro", q("SELECT ursula_attach(?, ?, 'read_only')", r, url) == q("SELECT json_extract(ursula_status(?), '$.offset')", p) == q("SELECT json_extract(ursula_status(?), '$.offset')", r))
rc = sqlite3.connect("file:" + r + "?mode=ro", uri=True, isolation_level=None)
print("rows", rc.execute("SELECT count(*) FROM t").fetchone()[0])
rw = sqlite3.connect(r, isolation_level=None)
print("write", *code(lambda: rw.execute("INSERT INTO t VALUES (2)")))
print("badurl", *code(lambda: q("SELECT ursula_attach(?, ?)", os.path.join(DIR, "x.db"), url + "?a=b")))
print("mem", *code(lambda: q("SELECT ursula_attach(':memory:', ?)", url)))
print("other", *code(lambda: q("SELECT ursula_attach(?, ?)", p, url + "2")))
print("notatt", *code(lambda: q("SELECT ursula_status(?)", os.path.join(DIR, "none.db"))))
q("SELECT ursula_set_token('secret')"); q("SELECT ursula_set_token(NULL)")
print("token ok")
`)
	for _, want := range []string{"ro True", "rows 1", "write 8 ", "badurl 1 ursula_attach: invalid_url:",
		"mem 1 ursula_attach: invalid_argument:", "other 1 ursula_attach: other_stream:",
		"notatt 1 ursula_status: not_attached:", "token ok"} {
		if !strings.Contains(out, want) {
			t.Fatalf("missing %q in:\n%s", want, out)
		}
	}
}

// TestPythonNamingMatchesGo: the Python binding names local files exactly as
// vfs.DefaultFileName does.
func TestPythonNamingMatchesGo(t *testing.T) {
	need(t, "/usr/bin/python3")
	urls := []string{"http://127.0.0.1:4437/demo/notes", "HTTP://Example.COM:80/a/b/../c/", "https://h:443/x%2fy/Z%20z",
		"http://user:pw@h:8080/one", "http://h/", "http://h/-lead/%E2%9C%93ok", "http://h/a/./b//c%7e"}
	var script strings.Builder
	script.WriteString("import sys\nsys.path.insert(0, '../bindings/python')\nimport sqlite_ursula as su\n")
	for _, u := range urls {
		fmt.Fprintf(&script, "print(su.default_file_name(%q))\n", u)
	}
	got := strings.Fields(run(t, "", nil, "/usr/bin/python3", "-c", script.String()))
	for i, u := range urls {
		want, err := vfs.DefaultFileName(u)
		if err != nil {
			t.Fatal(err)
		}
		if i >= len(got) || got[i] != want {
			t.Errorf("%s: python %v, go %s", u, got, want)
		}
	}
}

// TestPythonRefusals: through a proxy in front of the real server that answers writes
// with 402 on demand, a commit fails alone with 7178 (status: payment_required, retry)
// and the next one goes through; a claim refused with 402 fails ursula_attach with
// SQLITE_AUTH (23). A commit whose answer never comes poisons the file once the retry
// budget is spent: the commit fails, reads fail with 266, until it is attached again.
func TestPythonRefusals(t *testing.T) {
	e := setup(t)
	target, _ := url.Parse(e.base)
	rp := httputil.NewSingleHostReverseProxy(target)
	var refuse, drop atomic.Bool
	proxy := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/__refuse":
			refuse.Store(true)
			return
		case "/__accept":
			refuse.Store(false)
			drop.Store(false)
			return
		case "/__drop":
			drop.Store(true)
			return
		}
		if drop.Load() && r.Method == http.MethodPost {
			// The request arrived and no answer comes: an unknown outcome.
			io.Copy(io.Discard, r.Body)
			if c, _, err := w.(http.Hijacker).Hijack(); err == nil {
				c.Close()
			}
			return
		}
		if refuse.Load() && r.Method == http.MethodPost {
			w.WriteHeader(http.StatusPaymentRequired)
			io.WriteString(w, "quota exhausted")
			return
		}
		rp.ServeHTTP(w, r)
	}))
	defer proxy.Close()
	out := run(t, "", []string{"URSULA_VFS_RETRY_MS=1500"}, "/usr/bin/python3", "-c", pyPrelude+`
import urllib.request
def mode(m): urllib.request.urlopen(BASE + "/__" + m).read()
url = BASE + "/pytest/pay"
p = os.path.join(DIR, "pay.db")
q("SELECT ursula_attach(?, ?)", p, url)
c = sqlite3.connect(p, isolation_level=None)
c.execute("CREATE TABLE t(x)")
mode("refuse")
print("commit", *code(lambda: c.execute("INSERT INTO t VALUES (1)")))
st = json.loads(q("SELECT ursula_status(?)", p))
print("status", st["fenced"], st["poisoned"], st["error"]["kind"], st["error"]["action"])
print("claim", *code(lambda: q("SELECT ursula_attach(?, ?)", os.path.join(DIR, "pay2.db"), BASE + "/pytest/pay2")))
mode("accept")
c.execute("INSERT INTO t VALUES (2)")
print("rows", c.execute("SELECT group_concat(x) FROM t").fetchone()[0])
mode("drop")
print("unknown", *code(lambda: c.execute("INSERT INTO t VALUES (3)")))
st = json.loads(q("SELECT ursula_status(?)", p))
print("poisoned", st["poisoned"], st["error"]["kind"], st["error"]["action"])
print("read", *code(lambda: c.execute("SELECT count(*) FROM t").fetchone()))
mode("accept")
c.close()
q("SELECT ursula_attach(?, ?)", p, url)
c = sqlite3.connect(p, isolation_level=None)
c.execute("INSERT INTO t VALUES (4)")
print("reattached", c.execute("SELECT group_concat(x) FROM t").fetchone()[0])
`, e.so, proxy.URL, e.dir)
	for _, want := range []string{"commit 7178", "status False False payment_required retry",
		"claim 23 ursula_attach: payment_required:", "rows 2",
		"unknown 778", "poisoned True outcome_unknown reattach", "read 266", "reattached 2,4"} {
		if !strings.Contains(out, want) {
			t.Fatalf("missing %q in:\n%s", want, out)
		}
	}
}

// TestPythonTokenFileRotation: against a node with auth on, a token rotated by writing
// URSULA_VFS_TOKEN_FILE (and the node's token file, reloaded on SIGHUP) is picked up
// after the node's first 401, without a restart: the next commit succeeds.
func TestPythonTokenFileRotation(t *testing.T) {
	e := setup(t)
	nodeTokens := filepath.Join(e.dir, "node-tokens")
	os.WriteFile(nodeTokens, []byte("tok-1 *\n"), 0o600)
	conf := filepath.Join(e.dir, "node.toml")
	os.WriteFile(conf, []byte("[auth]\ntoken_file = \""+nodeTokens+"\"\n"), 0o600)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	srv := exec.Command(e.ursula, "server", "--engine", "memory", "--config", conf, "--listen", addr, "--admin-listen", "off", "--data", filepath.Join(e.dir, "data"))
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Process.Kill(); srv.Wait() })
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if res, err := http.Get("http://" + addr + "/__ursula/ready"); err == nil {
			res.Body.Close()
			if res.StatusCode == 200 {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatal("auth node not ready")
		}
	}
	clientTok := filepath.Join(e.dir, "client-token")
	os.WriteFile(clientTok, []byte("tok-1\n"), 0o600)
	e.base = "http://" + addr
	out := python(t, e, []string{"URSULA_VFS_TOKEN_FILE=" + clientTok, "NODE_TOKENS=" + nodeTokens, "NODE_PID=" + strconv.Itoa(srv.Process.Pid)}, `
import signal, time, urllib.request, urllib.error
p = os.path.join(DIR, "rot.db")
url = BASE + "/pytest/rotate"
q("SELECT ursula_attach(?, ?)", p, url)
c = sqlite3.connect(p, isolation_level=None)
c.execute("CREATE TABLE t(x)")
c.execute("INSERT INTO t VALUES (1)")
# rotate: the node drops tok-1 for tok-2, and the client's file says tok-2
open(os.environ["NODE_TOKENS"], "w").write("tok-2 *\n")
os.kill(int(os.environ["NODE_PID"]), signal.SIGHUP)
def refused():
    try:
        urllib.request.urlopen(urllib.request.Request(url, method="HEAD", headers={"Authorization": "Bearer tok-1"}))
        return False
    except urllib.error.HTTPError as e:
        return e.code == 401
deadline = time.time() + 20
while not refused() and time.time() < deadline:
    time.sleep(0.05)
print("old refused", refused())
open(os.environ["URSULA_VFS_TOKEN_FILE"], "w").write("tok-2\n")
print("commit", *code(lambda: c.execute("INSERT INTO t VALUES (2)")))
print("rows", c.execute("SELECT count(*) FROM t").fetchone()[0])
`)
	for _, want := range []string{"old refused True", "commit 0", "rows 2"} {
		if !strings.Contains(out, want) {
			t.Fatalf("missing %q in:\n%s", want, out)
		}
	}
}

// TestPythonSettingEvents (checklist-vfs S178, S179, S181, T25, T34, T35): the extension
// logs the settings events the pure-Go adapter logs, from the same code
// (replicator.NewClient and the replica's defaults), at their levels:
//   - URSULA_VFS_MAX_FRAME_BYTES that is not a number: setting_adjusted (warn) once, with
//     the value used instead;
//   - a token about to go over plain http to a host that is not this machine:
//     token_in_clear (warn) once. The host is a name only the outbound proxy (HTTP_PROXY,
//     on loopback, forwarding to the real server) knows, so nothing leaves the machine;
//   - URSULA_VFS_CA_FILE unreadable: ca_file_unreadable (error), and without a
//     certificate ca_file_without_certificates (error); the attach fails (local_setup)
//     rather than trust the system roots.
//
// dns_stale comes from the same client (replicator.NewClient wires the transport's
// stale-address report, TestDNSStaleEvent and client's TestDNSRules check it); a failing
// resolver cannot be injected into another process without a DNS server.
func TestPythonSettingEvents(t *testing.T) {
	e := setup(t)
	target, _ := url.Parse(e.base)
	var proxied atomic.Int64
	rp := &httputil.ReverseProxy{Rewrite: func(r *httputil.ProxyRequest) {
		r.SetURL(target)
		r.Out.Host = r.In.Host
	}}
	fwd := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		proxied.Add(1)
		rp.ServeHTTP(w, r)
	}))
	defer fwd.Close()
	events := func(out, name string) []string {
		var lines []string
		for _, l := range strings.Split(out, "\n") {
			if strings.HasPrefix(l, "sqlite-ursula-vfs ") && strings.Contains(l, " event="+name+" ") {
				lines = append(lines, l)
			}
		}
		return lines
	}
	out := python(t, e, []string{"HTTP_PROXY=" + fwd.URL, "http_proxy=" + fwd.URL, "NO_PROXY=", "no_proxy=", "URSULA_VFS_MAX_FRAME_BYTES=lots"}, `
q("SELECT ursula_set_token('secret')")
p = os.path.join(DIR, "clear.db")
q("SELECT ursula_attach(?, ?)", p, "http://db.example.test/pyevents/clear")
c = sqlite3.connect(p, isolation_level=None)
c.execute("CREATE TABLE t(x)")
for i in range(3):
    c.execute("INSERT INTO t VALUES (?)", (i,))
print("rows", c.execute("SELECT count(*) FROM t").fetchone()[0])
`)
	if !strings.Contains(out, "rows 3") || proxied.Load() == 0 {
		t.Fatalf("the commits did not go through the proxy (%d requests):\n%s", proxied.Load(), out)
	}
	if ev := events(out, "token_in_clear"); len(ev) != 1 || !strings.Contains(ev[0], "level=warn") {
		t.Fatalf("token_in_clear events %q in:\n%s", ev, out)
	}
	if ev := events(out, "setting_adjusted"); len(ev) != 1 || !strings.Contains(ev[0], "level=warn") ||
		!strings.Contains(ev[0], "setting=URSULA_VFS_MAX_FRAME_BYTES") || !strings.Contains(ev[0], "used=33554432") {
		t.Fatalf("setting_adjusted events %q in:\n%s", ev, out)
	}
	// Over loopback the same token is not in the clear.
	out = python(t, e, nil, `
q("SELECT ursula_set_token('secret')")
p = os.path.join(DIR, "loop.db")
q("SELECT ursula_attach(?, ?)", p, BASE + "/pyevents/loop")
sqlite3.connect(p, isolation_level=None).execute("CREATE TABLE t(x)")
print("done")
`)
	if ev := events(out, "token_in_clear"); len(ev) != 0 || !strings.Contains(out, "done") {
		t.Fatalf("over loopback: token_in_clear events %q in:\n%s", ev, out)
	}

	junk := filepath.Join(e.dir, "junk.pem")
	os.WriteFile(junk, []byte("not a certificate\n"), 0o600)
	for _, c := range []struct{ file, event string }{
		{filepath.Join(e.dir, "missing.pem"), "ca_file_unreadable"},
		{junk, "ca_file_without_certificates"},
	} {
		out := python(t, e, []string{"URSULA_VFS_CA_FILE=" + c.file}, `
p = os.path.join(DIR, "ca.db")
print("attach", *code(lambda: q("SELECT ursula_attach(?, ?)", p, BASE + "/pyevents/ca")))
print("exists", os.path.exists(p + "-ursula"))
`)
		if ev := events(out, c.event); len(ev) != 1 || !strings.Contains(ev[0], "level=error") {
			t.Fatalf("%s events %q in:\n%s", c.event, ev, out)
		}
		if !strings.Contains(out, "attach 1 ursula_attach: local_setup:") || !strings.Contains(out, "exists False") {
			t.Fatalf("with %s: %s", c.file, out)
		}
	}
}

// TestPythonPanics (checklist-vfs F45, M109-M110, S184, T52): a panic injected once in an
// entry point (URSULA_VFS_TEST_PANIC) fails that call alone, is logged as panic
// (level=error) with its entry, and the process goes on:
//   - x_write: the commit fails and the file is poisoned; it works again once attached again;
//   - xOpen: that open fails (here the attach's own open of a new file: the attach fails),
//     nothing is poisoned, and the next attach and opens work;
//   - ursula_attach: that attach fails; the next attach succeeds and the file opens;
//   - ursula_status: that call fails; the next answers.
func TestPythonPanics(t *testing.T) {
	e := setup(t)
	for _, c := range []struct {
		entry, script string
		want          []string
	}{
		{"x_write", `
p = os.path.join(DIR, "w.db"); url = BASE + "/pypanic/w"
q("SELECT ursula_attach(?, ?)", p, url)
c = sqlite3.connect(p, isolation_level=None)
print("commit", code(lambda: c.execute("CREATE TABLE t(x)"))[0])
print("poisoned", json.loads(q("SELECT ursula_status(?)", p))["poisoned"])
c.close()
q("SELECT ursula_attach(?, ?)", p, url)
c = sqlite3.connect(p, isolation_level=None)
c.execute("CREATE TABLE t(x)"); c.execute("INSERT INTO t VALUES (1)")
print("after", c.execute("SELECT count(*) FROM t").fetchone()[0])
`, []string{"poisoned True", "after 1"}},
		{"xOpen", `
p = os.path.join(DIR, "o.db")
# The first open of the new file is the attach's own (it puts the file in WAL mode).
print("attach", *code(lambda: q("SELECT ursula_attach(?, ?)", p, BASE + "/pypanic/o")))
q("SELECT ursula_attach(?, ?)", p, BASE + "/pypanic/o")
c = sqlite3.connect(p, isolation_level=None)
c.execute("CREATE TABLE t(x)"); c.execute("INSERT INTO t VALUES (1)")
print("after", c.execute("SELECT count(*) FROM t").fetchone()[0])
print("poisoned", json.loads(q("SELECT ursula_status(?)", p))["poisoned"])
`, []string{"attach 1 ursula_attach: local_setup:", "after 1", "poisoned False"}},
		{"ursula_attach", `
p = os.path.join(DIR, "a.db")
print("attach", code(lambda: q("SELECT ursula_attach(?, ?)", p, BASE + "/pypanic/a"))[0])
q("SELECT ursula_attach(?, ?)", p, BASE + "/pypanic/a")
c = sqlite3.connect(p, isolation_level=None)
c.execute("CREATE TABLE t(x)"); c.execute("INSERT INTO t VALUES (1)")
print("after", c.execute("SELECT count(*) FROM t").fetchone()[0])
`, []string{"attach 1", "after 1"}},
		{"ursula_status", `
p = os.path.join(DIR, "s.db")
q("SELECT ursula_attach(?, ?)", p, BASE + "/pypanic/s")
print("status", *code(lambda: q("SELECT ursula_status(?)", p)))
print("again", json.loads(q("SELECT ursula_status(?)", p))["poisoned"])
`, []string{"status 1 ursula_status: internal: panic", "again False"}},
	} {
		t.Run(c.entry, func(t *testing.T) {
			out := python(t, e, []string{"URSULA_VFS_TEST_PANIC=" + c.entry}, c.script+"print(\"alive\")\n")
			want := append(c.want, "alive", "level=error event=panic entry="+c.entry+" ")
			for _, w := range want {
				if !strings.Contains(out, w) {
					t.Fatalf("missing %q in:\n%s", w, out)
				}
			}
		})
	}
}
