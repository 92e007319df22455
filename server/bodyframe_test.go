package server

import (
	"bytes"
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/ursula-go/ursula/engine"
	"github.com/ursula-go/ursula/streamcore"
)

// framingEngine is the memory engine, recording for each proposal whether its command
// could be encoded around its body in place (what the raft engine does with it).
type framingEngine struct {
	engine.Engine
	mu      sync.Mutex
	inPlace map[string]bool // key -> the last proposal's outcome
}

func (f *framingEngine) Propose(ctx context.Context, c *streamcore.Command) (streamcore.Result, error) {
	entry, ok := streamcore.AppendCommandAround([]byte{0}, c)
	if ok && !bytes.Equal(entry, streamcore.AppendCommand([]byte{0}, c)) {
		panic("AppendCommandAround differs from AppendCommand")
	}
	f.mu.Lock()
	f.inPlace[c.Key] = ok
	f.mu.Unlock()
	return f.Engine.Propose(ctx, c)
}

// A large body read with a declared length comes with its frame, so the raft engine writes
// its log entry around it instead of copying it; a small body (a pooled buffer) and a
// JSON body (normalised into new memory) do not. The streams hold what was sent either way.
func TestLargeBodyCarriesItsFrame(t *testing.T) {
	mem := engine.NewMemory(0)
	eng := &framingEngine{Engine: mem, inPlace: map[string]bool{}}
	ts := httptest.NewServer(New(eng, Config{ClusterID: "test-cluster"}))
	t.Cleanup(func() { ts.Close(); mem.Close() })

	large := strings.Repeat("0123456789abcdef", 16<<10) // 256 KiB
	json := "[" + strings.Repeat(`{"k":"0123456789"},`, 10000) + `{"k":0}]`
	cases := []struct {
		name, method, ct, body string
		inPlace                bool
	}{
		{"large append", http.MethodPost, "application/octet-stream", large, true},
		{"large create", http.MethodPut, "application/octet-stream", large, true},
		{"just over one chunk", http.MethodPost, "application/octet-stream", large[:64<<10+1], true},
		{"small append", http.MethodPost, "application/octet-stream", large[:4096], false},
		{"large JSON append", http.MethodPost, "application/json", json, false},
	}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			key := "frames/s" + string(rune('a'+i))
			url := ts.URL + "/" + key
			if tc.method == http.MethodPost {
				expect(t, do(t, http.MethodPut, url, "", "Content-Type", tc.ct), http.StatusCreated, "")
			}
			a := do(t, tc.method, url, tc.body, "Content-Type", tc.ct)
			if a.status/100 != 2 {
				t.Fatalf("%s: %d %s", tc.method, a.status, a.body)
			}
			eng.mu.Lock()
			got := eng.inPlace[key]
			eng.mu.Unlock()
			if got != tc.inPlace {
				t.Fatalf("encoded in place: %v, want %v", got, tc.inPlace)
			}
			read := do(t, http.MethodGet, url+"?offset=-1", "")
			if read.status != http.StatusOK {
				t.Fatalf("read back: %d %s", read.status, read.body)
			}
			if tc.ct == "application/json" {
				if n := strings.Count(read.body, `"k":`); n != 10001 {
					t.Fatalf("read back %d messages, sent 10001", n)
				}
			} else if read.body != tc.body {
				t.Fatalf("read back %d bytes, sent %d", len(read.body), len(tc.body))
			}
		})
	}
}
