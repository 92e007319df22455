package server

import (
	"bytes"
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"

	"github.com/ursula-go/ursula/engine"
)

// BenchmarkAppendHandler measures the handler cost of a 4 KiB producer append, without
// the network (the load benchmark with the network is cmd/ursula-bench).
func BenchmarkAppendHandler(b *testing.B) {
	eng := engine.NewMemory(0)
	srv := New(eng, Config{ClusterID: "bench"})
	req := httptest.NewRequest("PUT", "/bench/s", nil)
	srv.ServeHTTP(httptest.NewRecorder(), req)
	body := bytes.Repeat([]byte("x"), 4096)
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		r := httptest.NewRequest("POST", "/bench/s", bytes.NewReader(body))
		r.Header.Set("Content-Type", "application/octet-stream")
		r.Header.Set("Producer-Id", "p")
		r.Header.Set("Producer-Epoch", "0")
		r.Header.Set("Producer-Seq", strconv.Itoa(i))
		w := httptest.NewRecorder()
		srv.ServeHTTP(w, r)
		if w.Code != http.StatusOK {
			b.Fatal(w.Code, w.Body.String())
		}
	}
}
