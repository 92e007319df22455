package main

import (
	"bytes"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

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
