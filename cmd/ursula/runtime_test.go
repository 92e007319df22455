package main

import (
	"bytes"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/BurntSushi/toml"
)

// runtime.live_read_max_waiters_per_core sets the node's live-reader bound per CPU; 0
// lifts the bound, absent keeps the server default, negative is refused at startup.
func TestLiveReadWaitersConfigKey(t *testing.T) {
	for _, c := range []struct {
		text string
		want int
	}{
		{"", 0},
		{"[runtime]\nlive_read_max_waiters_per_core = 0\n", -1},
		{"[runtime]\nlive_read_max_waiters_per_core = 3\n", 3 * runtime.GOMAXPROCS(0)},
	} {
		var fc fileConfig
		if _, err := toml.Decode(c.text, &fc); err != nil {
			t.Fatal(err)
		}
		if got, err := fc.Runtime.maxLiveReaders(); err != nil || got != c.want {
			t.Fatalf("%q: %d %v, want %d", c.text, got, err, c.want)
		}
	}
	cfg := filepath.Join(t.TempDir(), "c.toml")
	os.WriteFile(cfg, []byte("[runtime]\nlive_read_max_waiters_per_core = -1\n"), 0o644)
	var out, errb bytes.Buffer
	if code := run([]string{"server", "--config", cfg, "--data", t.TempDir()}, &out, &errb); code != 1 || !strings.Contains(errb.String(), "live_read_max_waiters_per_core") {
		t.Fatalf("negative bound: %d %q", code, errb.String())
	}
}

// runtime.adaptive_procs: a node without peers sizes its Ps to the load (idle: one P,
// shown by the ursula_gomaxprocs gauge); false, or a GOMAXPROCS in the environment, keeps
// the runtime's count; a cluster member has it off unless the key turns it on.
func TestAdaptiveProcs(t *testing.T) {
	max := runtime.GOMAXPROCS(0)
	if max < 2 {
		t.Skip("one CPU: nothing to size")
	}
	bin := filepath.Join(t.TempDir(), "ursula")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	metric := func(t *testing.T, base, name string) int { return int(metricValue(t, base, name)) }
	serve := func(t *testing.T, config string) string { return serveConfig(t, bin, config) }
	// settles reports the gauge once it reads want, or the last reading after 3 s.
	settles := func(t *testing.T, base string, want int) int {
		got := 0
		for deadline := time.Now().Add(3 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
			if got = metric(t, base, "ursula_gomaxprocs"); got == want {
				break
			}
		}
		return got
	}

	t.Run("default", func(t *testing.T) {
		base := serve(t, "")
		if got := settles(t, base, 1); got != 1 {
			t.Errorf("default, idle: ursula_gomaxprocs %d, want 1", got)
		}
		if n := metric(t, base, "ursula_gomaxprocs_changes_total"); n < 1 {
			t.Errorf("default, idle: ursula_gomaxprocs_changes_total %d, want at least 1", n)
		}
	})
	for _, c := range []struct {
		name, config string
		env          string
	}{
		{"adaptive_procs = false", "[runtime]\nadaptive_procs = false\n", ""},
		{"GOMAXPROCS set", "", strconv.Itoa(max)},
		{"fsync = always", "[raft.wal]\nfsync = \"always\"\n", ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			if c.env != "" {
				t.Setenv("GOMAXPROCS", c.env) // the server inherits it
			}
			base := serve(t, c.config)
			if got := settles(t, base, 1); got != max {
				t.Errorf("%s, idle: ursula_gomaxprocs %d, want %d", c.name, got, max)
			}
			if n := metric(t, base, "ursula_gomaxprocs_changes_total"); n != 0 {
				t.Errorf("%s: ursula_gomaxprocs_changes_total %d, want 0", c.name, n)
			}
		})
	}
	var on, off fileConfig
	toml.Decode("[runtime]\nadaptive_procs = true\n", &on)
	if pc := off.Runtime.startProcs(false); pc != nil {
		pc.Stop()
		t.Error("the controller started where it is off by default, without the key")
	}
	pc := on.Runtime.startProcs(false)
	if pc == nil {
		t.Error("adaptive_procs = true did not start the controller where it is off by default")
	}
	pc.Stop()
}

// runtime.gc_heap_floor_mib: an idle node keeps the runtime's GC percent; once it
// allocates at gc_heap_floor_rate_mib (here 1 MiB/s, so a small append load does) the
// floor raises the percent (ursula_gc_percent above 100) so the goal is about the floor
// (ursula_memory_heap_goal_bytes). gc_heap_floor_mib = 0 or a GOGC in the environment keep
// the runtime's percent under the same load; bad values are refused at startup.
func TestGCHeapFloor(t *testing.T) {
	for _, c := range []struct {
		text        string
		floor, rate uint64
		bad         bool
	}{
		{"", 64 << 20, 128 << 20, false},
		{"[runtime]\ngc_heap_floor_mib = 0\n", 0, 128 << 20, false},
		{"[runtime]\ngc_heap_floor_mib = 256\ngc_heap_floor_rate_mib = 10\n", 256 << 20, 10 << 20, false},
		{"[runtime]\ngc_heap_floor_mib = -1\n", 0, 0, true},
		{"[runtime]\ngc_heap_floor_mib = 2000000\n", 0, 0, true},
		{"[runtime]\ngc_heap_floor_rate_mib = 0\n", 0, 0, true},
	} {
		var fc fileConfig
		if _, err := toml.Decode(c.text, &fc); err != nil {
			t.Fatal(err)
		}
		got, err := fc.Runtime.gcHeapFloor()
		if (err != nil) != c.bad || got.floor != c.floor || got.rate != c.rate {
			t.Fatalf("%q: %+v %v, want floor %d rate %d (error: %v)", c.text, got, err, c.floor, c.rate, c.bad)
		}
	}
	bin := filepath.Join(t.TempDir(), "ursula")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	metric := metricValue
	serve := func(t *testing.T, config string) string { return serveConfig(t, bin, config) }
	// load appends 64 KiB bodies until percent reads true (checked every 50 appends)
	// or 5 s pass, and returns the last reading.
	load := func(t *testing.T, base string, done func(p float64) bool) float64 {
		url := base + "/bkt1/gcfloor"
		req, _ := http.NewRequest("PUT", url, nil)
		req.Header.Set("Content-Type", "application/octet-stream")
		res, err := http.DefaultClient.Do(req)
		if err != nil || res.StatusCode != http.StatusCreated {
			t.Fatalf("create: %v %v", res, err)
		}
		res.Body.Close()
		body := bytes.Repeat([]byte("x"), 64<<10)
		p := metric(t, base, "ursula_gc_percent")
		for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline) && !done(p); {
			for range 50 {
				res, err := http.Post(url, "application/octet-stream", bytes.NewReader(body))
				if err != nil {
					t.Fatal(err)
				}
				io.Copy(io.Discard, res.Body)
				res.Body.Close()
				if res.StatusCode != http.StatusNoContent {
					t.Fatalf("append: %s", res.Status)
				}
			}
			p = metric(t, base, "ursula_gc_percent")
		}
		return p
	}
	fast := "[runtime]\ngc_heap_floor_rate_mib = 1\n"
	t.Run("default", func(t *testing.T) {
		t.Setenv("GOGC", "") // unset for the server: the floor runs
		base := serve(t, fast)
		if p := metric(t, base, "ursula_gc_percent"); p != 100 {
			t.Errorf("idle: ursula_gc_percent %v, want 100", p)
		}
		if p := load(t, base, func(p float64) bool { return p > 100 }); p <= 100 {
			t.Fatalf("under load: ursula_gc_percent %v, want above 100", p)
		}
		if g := metric(t, base, "ursula_memory_heap_goal_bytes"); g < 60<<20 {
			t.Errorf("under load: ursula_memory_heap_goal_bytes %v, want about 64 MiB", g)
		}
	})
	for _, c := range []struct{ name, config, env string }{
		{"gc_heap_floor_mib = 0", fast + "gc_heap_floor_mib = 0\n", ""},
		{"GOGC set", fast, "100"},
	} {
		t.Run(c.name, func(t *testing.T) {
			if c.env != "" {
				t.Setenv("GOGC", c.env) // the server inherits it
			}
			base := serve(t, c.config)
			if p := load(t, base, func(float64) bool { return false }); p != 100 {
				t.Errorf("%s, under load: ursula_gc_percent %v, want 100", c.name, p)
			}
		})
	}
	cfg := filepath.Join(t.TempDir(), "c.toml")
	os.WriteFile(cfg, []byte("[runtime]\ngc_heap_floor_mib = -5\n"), 0o644)
	var out, errb bytes.Buffer
	if code := run([]string{"server", "--config", cfg, "--data", t.TempDir()}, &out, &errb); code != 1 || !strings.Contains(errb.String(), "gc_heap_floor_mib") {
		t.Fatalf("negative floor: %d %q", code, errb.String())
	}
}

// metricValue reads the gauge or counter name from base's /metrics (Prometheus text).
func metricValue(t *testing.T, base, name string) float64 {
	t.Helper()
	res, err := http.Get(base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, name+" "); ok {
			n, err := strconv.ParseFloat(v, 64)
			if err != nil {
				t.Fatalf("%s %q", name, v)
			}
			return n
		}
	}
	t.Fatalf("no %s in /metrics:\n%s", name, b)
	return 0
}

// serveConfig starts bin as a server with the TOML config (admin listener off, a fresh
// data directory) and returns its base URL.
func serveConfig(t *testing.T, bin, config string) string {
	dir := t.TempDir()
	cfg := filepath.Join(dir, "c.toml")
	os.WriteFile(cfg, []byte(config), 0o644)
	return startLogged(t, bin, "ursula listening", "server", "--config", cfg, "--listen", "127.0.0.1:0", "--admin-listen", "off", "--data", filepath.Join(dir, "data"))
}
