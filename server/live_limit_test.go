package server

import (
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/ursula-go/ursula/engine"
	"github.com/ursula-go/ursula/streamcore"
)

// The bound on live readers a node holds is configurable (protocol 16.8): at the bound a
// further SSE or long-poll reader answers 503 LIVE_READ_BACKPRESSURE with Retry-After,
// and a negative bound means none.
func TestLiveReaderLimitIsConfigurable(t *testing.T) {
	for _, limit := range []int{1, -1} {
		eng := engine.NewMemory(0)
		ts := httptest.NewServer(New(eng, Config{ClusterID: "c", MaxLiveReaders: limit}))
		s := ts.URL + "/bkt1/live"
		expect(t, do(t, "PUT", s, "", "Content-Type", "text/plain"), 201, "")
		// An SSE answer's head is sent once the reader holds its slot.
		first, err := http.Get(s + "?offset=-1&live=sse")
		if err != nil || first.StatusCode != 200 {
			t.Fatalf("first reader: %v %v", err, first)
		}
		a := do(t, "GET", s+"?offset=-1&live=long-poll&timeout_ms=1", "")
		if limit == 1 {
			expect(t, a, http.StatusServiceUnavailable, streamcore.CodeLiveReadBackpressure)
			if a.h.Get("Retry-After") == "" {
				t.Fatal("LIVE_READ_BACKPRESSURE without Retry-After")
			}
		} else if a.status != http.StatusNoContent {
			t.Fatalf("unbounded: second reader answered %d %s", a.status, a.body)
		}
		first.Body.Close()
		ts.Close()
		eng.Close()
	}
}
