package main

import (
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"testing"
)

// TestPythonAttachInFromClause (checklist-vfs T57) pins a documented hazard: a claim
// refused with 429 (after the short retry budget) fails ursula_attach with SQLITE_IOERR_AUTH (7178), an I/O error
// code, and SQLite rolls back the calling connection's open transaction when a
// statement that reads a table fails with one. So ursula_attach called inside a FROM
// clause while a transaction is open takes the transaction with it; called without a
// FROM clause (SELECT ursula_attach(?, ?)), the same refusal leaves the transaction
// open and its rows in place. The proxy in front of the real server refuses every POST,
// so the claim is refused and nothing is claimed.
func TestPythonAttachInFromClause(t *testing.T) {
	e := setup(t)
	target, _ := url.Parse(e.base)
	rp := httputil.NewSingleHostReverseProxy(target)
	proxy := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost {
			http.Error(w, "slow down", http.StatusTooManyRequests)
			return
		}
		rp.ServeHTTP(w, r)
	}))
	defer proxy.Close()
	out := run(t, "", []string{"URSULA_VFS_RETRY_MS=300"}, "/usr/bin/python3", "-c", pyPrelude+`
loader.execute("CREATE TABLE t(x)")
# Without a FROM clause: the transaction survives the refusal.
loader.execute("BEGIN")
loader.execute("INSERT INTO t VALUES (1)")
print("bare", *code(lambda: q("SELECT ursula_attach(?, ?)", os.path.join(DIR, "bare.db"), BASE + "/pyhazard/bare")))
print("bare in_transaction", loader.in_transaction)
loader.execute("COMMIT")
print("bare rows", q("SELECT count(*) FROM t"))
# Inside a FROM clause: the 7178 rolls the transaction back.
loader.execute("BEGIN")
loader.execute("INSERT INTO t VALUES (2)")
print("from", *code(lambda: q("SELECT ursula_attach(?, ?) FROM t", os.path.join(DIR, "from.db"), BASE + "/pyhazard/from")))
print("from in_transaction", loader.in_transaction)
print("from rows", q("SELECT group_concat(x) FROM t"))
`, e.so, proxy.URL, e.dir)
	for _, want := range []string{
		"bare 7178 ursula_attach: rate_limited:", "bare in_transaction True", "bare rows 1",
		"from 7178 ursula_attach: rate_limited:", "from in_transaction False", "from rows 1\n",
	} {
		if !strings.Contains(out, want) {
			t.Fatalf("missing %q in:\n%s", want, out)
		}
	}
}
