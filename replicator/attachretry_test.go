package replicator

import (
	"context"
	"net/http"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ursula-go/ursula/client"
)

// An attach that meets a "later" answer (503) on a read runs the read again within the
// retry budget and logs attach_retrying; an attach that cannot resume from local files
// logs attach_rebuilding before it rebuilds from the stream (vfs D 27).
func TestAttachLogsRetryingAndRebuilding(t *testing.T) {
	var heads atomic.Int64
	url := snapServer(t, func(h http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.Method == http.MethodHead && heads.Add(1) <= 2 {
				w.Header().Set("Retry-After", "0")
				w.WriteHeader(http.StatusServiceUnavailable)
				return
			}
			h.ServeHTTP(w, r)
		})
	}) + "/dbs1/retry"
	lb := &logBuf{}
	c, _ := client.New("")
	path := filepath.Join(t.TempDir(), "db")
	r, err := Attach(context.Background(), url, path, Options{Log: lb, Client: c, RetryBudget: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	r.Close()
	retries := lb.events("attach_retrying")
	if len(retries) != 2 || retries[0]["step"] != "HEAD of the stream" || retries[0]["attempt"] != "1" {
		t.Fatalf("attach_retrying events: %v", retries)
	}
	if rb := lb.events("attach_rebuilding"); len(rb) != 1 || rb[0]["reason"] != "no sidecar" {
		t.Fatalf("attach_rebuilding events: %v", rb)
	}
	// Within a budget too short for a wait, the 503 fails the attach at once.
	heads.Store(0)
	lb2 := &logBuf{}
	_, err = Attach(context.Background(), url, filepath.Join(t.TempDir(), "db"), Options{Log: lb2, Client: c, RetryBudget: time.Millisecond})
	if e, ok := AsError(err); !ok || e.Kind != KindUnavailable || len(lb2.events("attach_retrying")) != 0 {
		t.Fatalf("attach without budget: %v, events %v", err, lb2.events("attach_retrying"))
	}
}
