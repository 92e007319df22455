package server

import (
	"context"
	"net/http"
	"strings"
	"testing"

	"github.com/ursula-go/ursula/streamcore"
)

// A retention of a JSON stream at an offset whose preceding byte only the cold tier holds
// is decided by reading that byte: not a message boundary answers 400 NOT_JSON_BOUNDARY;
// when the read fails the offset cannot be verified, and the answer is 503
// JSON_BOUNDARY_UNVERIFIED with Retry-After, never 400 and never a retention applied on a
// guess (protocol 21.5 and 24.3). The snapshot publish follows the same rule.
func TestColdJSONBoundaryUnverified(t *testing.T) {
	env := newColdEnv(t, "fs", coldSetup{flushSize: 1, hotCap: 64 << 20})
	msg := `{"a":1}` // stored as 8 bytes with its newline
	for _, s := range []string{"/bkt1/j", "/bkt1/k"} {
		env.create(s, "application/json")
		for i := 0; i < 8; i++ {
			res, body := coldDo(t, "POST", env.url(s), []byte(msg), "Content-Type", "application/json")
			if res.StatusCode != http.StatusNoContent {
				t.Fatalf("append: %d %s", res.StatusCode, body)
			}
		}
	}
	tail := streamcore.FormatOffset(64)
	if res, body := coldDo(t, "PUT", env.url("/bkt1/j/snapshot/"+tail), []byte("s")); res.StatusCode != http.StatusNoContent {
		t.Fatalf("snapshot: %d %s", res.StatusCode, body)
	}
	if err := env.srv.FlushCold(true); err != nil {
		t.Fatal(err)
	}
	if env.hotStart("bkt1/j") < 24 || env.hotStart("bkt1/k") < 24 {
		t.Fatalf("hot start %d: the bytes did not reach the cold tier", env.hotStart("bkt1/j"))
	}
	retained := func() string {
		res, _ := coldDo(t, "HEAD", env.url("/bkt1/j"), nil)
		return res.Header.Get(streamcore.HdrRetainedOffset)
	}
	res, body := coldDo(t, "PUT", env.url("/bkt1/j/retention/"+streamcore.FormatOffset(12)), nil)
	if res.StatusCode != http.StatusBadRequest || !strings.Contains(string(body), streamcore.CodeNotJSONBoundary) {
		t.Fatalf("mid-message cold offset: %d %s", res.StatusCode, body)
	}
	// Take the cold objects away: the byte before offset 16 can no longer be read.
	for _, k := range env.objects("") {
		env.store.Delete(context.Background(), k)
	}
	env.srv.cold.DropCache()
	for _, path := range []string{"/bkt1/j/retention/" + streamcore.FormatOffset(16), "/bkt1/k/snapshot/" + streamcore.FormatOffset(16)} {
		res, body = coldDo(t, "PUT", env.url(path), []byte("x"))
		if res.StatusCode != http.StatusServiceUnavailable || !strings.Contains(string(body), streamcore.CodeJSONBoundaryUnverified) ||
			res.Header.Get("Retry-After") == "" {
			t.Fatalf("%s, unverifiable: %d %v %s", path, res.StatusCode, res.Header, body)
		}
	}
	if got := retained(); got != streamcore.FormatOffset(0) {
		t.Fatalf("retained offset %s after an unverified retention", got)
	}
	if res, _ := coldDo(t, "HEAD", env.url("/bkt1/k"), nil); res.Header.Get(streamcore.HdrSnapshotOffset) != "" {
		t.Fatal("a snapshot was published at an unverified offset")
	}
}
