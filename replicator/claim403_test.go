package replicator

import (
	"net/http"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/ursula-go/ursula/streamcore"
)

// TestClaimRefusedWith403 (checklist-vfs J84, N, X216): a 403 to the claim is a fence
// only with Producer-Epoch (another owner's newer epoch). A plain 403 may come from a
// layer that answered after the stream applied the claim: the attach fails with an
// unknown outcome (attach again), not as fenced. An authorizer's 403 with both
// not-applied headers is a refusal: nothing was claimed.
func TestClaimRefusedWith403(t *testing.T) {
	var mode atomic.Value
	mode.Store("")
	base := snapServer(t, func(h http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.Method == http.MethodPost {
				switch mode.Load().(string) {
				case "plain":
					http.Error(w, "blocked by policy", http.StatusForbidden)
					return
				case "marked":
					w.Header().Set(streamcore.HdrNotApplied, "Forbidden")
					w.Header().Set(streamcore.HdrNotAppliedChecked, "1")
					http.Error(w, "blocked by policy", http.StatusForbidden)
					return
				}
			}
			h.ServeHTTP(w, r)
		})
	})
	for _, tc := range []struct {
		mode string
		kind Kind
	}{
		{"plain", KindOutcomeUnknown},
		{"marked", KindNotApplied},
	} {
		mode.Store(tc.mode)
		_, err := Attach(t.Context(), base+"/claim403/"+tc.mode, t.TempDir()+"/db", Options{Log: &logBuf{}})
		e, ok := AsError(err)
		if !ok || e.Kind != tc.kind || e.Kind == KindFenced || strings.Contains(err.Error(), "another owner") {
			t.Errorf("%s 403 to the claim: %v, want kind %s", tc.mode, err, tc.kind)
		}
	}
}
