// Command bench measures commit latency through the loadable SQLite extension (Python's
// sqlite3 module, /usr/bin/python3) next to the pure-Go adapter (vfs.Open), both against
// one local ursula server (the binary, memory engine), and next to plain local SQLite (no
// VFS) in each language, all in WAL mode with synchronous=NORMAL and the same one-row
// INSERT per commit. It prints p50/p99 per variant and the ratios to plain SQLite.
//
//	go run ./cextension/bench -n 2000 -ursula bin/ursula -extension bin/libursula_vfs.so
package main

import (
	"database/sql"
	"encoding/json"
	"flag"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"

	_ "github.com/ncruces/go-sqlite3/driver"

	"github.com/ursula-go/ursula/vfs"
)

const insert = `INSERT INTO t(body) VALUES ('a row of about sixty bytes, a typical small commit ....')`

const pyScript = `
import sqlite3, sys, time, json
so, url, path, local, n = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5])
def run(c):
    c.execute("PRAGMA journal_mode=WAL")
    c.execute("PRAGMA synchronous=NORMAL")
    c.execute("CREATE TABLE IF NOT EXISTS t(id INTEGER PRIMARY KEY, body TEXT)")
    for _ in range(50):
        c.execute(` + "`" + `INSERT` + "`" + `)
    out = []
    for _ in range(n):
        t0 = time.perf_counter_ns()
        c.execute(` + "`" + `INSERT` + "`" + `)
        out.append(time.perf_counter_ns() - t0)
    return out
# plain local SQLite first, before the extension makes "ursula" the default VFS
plain = run(sqlite3.connect(local, isolation_level=None))
l = sqlite3.connect(":memory:", isolation_level=None)
l.enable_load_extension(True)
l.load_extension(so)
l.execute("SELECT ursula_attach(?, ?)", (path, url))
ext = run(sqlite3.connect(path, isolation_level=None))
print(json.dumps({"python_plain": plain, "python_extension": ext}))
`

func main() {
	n := flag.Int("n", 2000, "commits per variant")
	ursula := flag.String("ursula", "bin/ursula", "the ursula binary")
	so := flag.String("extension", "bin/libursula_vfs.so", "the extension")
	flag.Parse()
	if err := run(*n, *ursula, *so); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

func run(n int, ursula, so string) error {
	dir, err := os.MkdirTemp("", "ursula-ext-bench")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	addr := ln.Addr().String()
	ln.Close()
	srv := exec.Command(ursula, "server", "--engine", "memory", "--listen", addr, "--admin-listen", "127.0.0.1:0", "--data", filepath.Join(dir, "data"))
	if err := srv.Start(); err != nil {
		return err
	}
	defer func() { srv.Process.Kill(); srv.Wait() }()
	for i := 0; ; i++ {
		if c, err := net.Dial("tcp", addr); err == nil {
			c.Close()
			break
		}
		if i > 200 {
			return fmt.Errorf("server did not start")
		}
		time.Sleep(50 * time.Millisecond)
	}
	base := "http://" + addr
	res := map[string][]int64{}

	// Python: plain sqlite3, then through the extension (another process).
	script := strings.ReplaceAll(pyScript, "`INSERT`", fmt.Sprintf("%q", insert))
	out, err := exec.Command("/usr/bin/python3", "-c", script, so, base+"/bench/python",
		filepath.Join(dir, "py.db"), filepath.Join(dir, "py-plain.db"), fmt.Sprint(n)).Output()
	if err != nil {
		return fmt.Errorf("python: %v", err)
	}
	var py map[string][]int64
	if err := json.Unmarshal(out, &py); err != nil {
		return fmt.Errorf("python output: %v", err)
	}
	for k, v := range py {
		res[k] = v
	}

	// Go: plain SQLite (ncruces, no VFS), then the pure-Go adapter.
	plain, err := sql.Open("sqlite3", "file:"+filepath.Join(dir, "go-plain.db")+"?_pragma=journal_mode(wal)&_pragma=synchronous(normal)")
	if err != nil {
		return err
	}
	if res["go_plain"], err = goCommits(plain, n); err != nil {
		return err
	}
	plain.Close()
	db, err := vfs.Open(base+"/bench/go", vfs.Options{Path: filepath.Join(dir, "go.db")})
	if err != nil {
		return err
	}
	if _, err := db.Exec(`PRAGMA synchronous=NORMAL`); err != nil {
		return err
	}
	if res["go_vfs"], err = goCommits(db, n); err != nil {
		return err
	}
	db.Close()

	p := func(k string, q float64) float64 {
		v := slices.Clone(res[k])
		slices.Sort(v)
		return float64(v[min(len(v)-1, int(q*float64(len(v))))]) / 1e3
	}
	fmt.Printf("commit latency, %d one-row commits each, WAL + synchronous=NORMAL, server %s (memory engine)\n", n, addr)
	fmt.Printf("%-34s %10s %10s %12s %12s\n", "variant", "p50 us", "p99 us", "p50/plain", "p99/plain")
	for _, row := range []struct{ name, key, plain string }{
		{"python sqlite3, plain (unix VFS)", "python_plain", "python_plain"},
		{"python sqlite3 + extension", "python_extension", "python_plain"},
		{"go ncruces, plain", "go_plain", "go_plain"},
		{"go vfs.Open (pure-Go adapter)", "go_vfs", "go_plain"},
	} {
		fmt.Printf("%-34s %10.1f %10.1f %11.1fx %11.1fx\n", row.name, p(row.key, .5), p(row.key, .99),
			p(row.key, .5)/p(row.plain, .5), p(row.key, .99)/p(row.plain, .99))
	}
	fmt.Printf("extension / pure-Go adapter: p50 %.2fx, p99 %.2fx\n",
		p("python_extension", .5)/p("go_vfs", .5), p("python_extension", .99)/p("go_vfs", .99))
	return nil
}

func goCommits(db *sql.DB, n int) ([]int64, error) {
	db.SetMaxOpenConns(1)
	if _, err := db.Exec(`CREATE TABLE IF NOT EXISTS t(id INTEGER PRIMARY KEY, body TEXT)`); err != nil {
		return nil, err
	}
	for range 50 {
		if _, err := db.Exec(insert); err != nil {
			return nil, err
		}
	}
	out := make([]int64, 0, n)
	for range n {
		t0 := time.Now()
		if _, err := db.Exec(insert); err != nil {
			return nil, err
		}
		out = append(out, time.Since(t0).Nanoseconds())
	}
	return out, nil
}
