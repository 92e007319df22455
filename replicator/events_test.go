package replicator

import (
	"context"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/ursula-go/ursula/streamcore"
)

// refuseCommits answers the next n commit appends (Producer-Seq above 0) with status and
// a body of the layer's own, applying nothing.
type refuseCommits struct {
	n      atomic.Int64
	status atomic.Int64
	text   atomic.Value // string
}

func (rc *refuseCommits) wrap(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		seq := r.Header.Get(streamcore.HdrProducerSeq)
		if r.Method == http.MethodPost && seq != "" && seq != "0" && rc.n.Add(-1) >= 0 {
			w.Header().Set(streamcore.HdrNotApplied, "Quota")
			w.Header().Set(streamcore.HdrNotAppliedChecked, "true")
			w.WriteHeader(int(rc.status.Load()))
			w.Write([]byte(rc.text.Load().(string)))
			return
		}
		next.ServeHTTP(w, r)
	})
}

// TestRefusalStatusAndEvents (checklist-vfs Q158, I69-I70, J93, S167-S172, T24): while a
// layer in front of the stream refuses commits with 402, status says payment_required
// with the layer's text cut to 256 bytes plus "...", and the log says payment_required
// and writes_refused once when the refusals start (level warn), not once per commit. A
// too_large commit in between changes neither. The next successful commit clears both
// and logs writes_resumed. local is the offset the file reflects; installed is "-1" when
// the attach installed no snapshot.
func TestRefusalStatusAndEvents(t *testing.T) {
	rc := &refuseCommits{}
	rc.status.Store(http.StatusPaymentRequired)
	rc.text.Store(strings.Repeat("quota exhausted ", 40))
	base := snapServer(t, rc.wrap)
	r, _, lb := snapAttach(t, base+"/events/pay", Options{MaxFrameBytes: 64 << 10})
	m := newModel()
	m.commit(t, r, 4, 4)
	st := r.Status()
	if st.PaymentRequired || st.PaymentReason != "" || st.Installed != "-1" || st.Local != streamcore.FormatOffset(st.Offset) {
		t.Fatalf("status before any refusal: %+v", st)
	}

	rc.n.Store(2)
	for i := 0; i < 2; i++ {
		err := r.Commit(context.Background(), m.next(4, 1))
		if e, ok := AsError(err); !ok || e.Kind != KindPaymentRequired || e.Action != ActionRetry {
			t.Fatalf("refused commit %d: %v", i, err)
		}
	}
	st = r.Status()
	want := strings.Repeat("quota exhausted ", 40)[:256] + "..."
	if !st.PaymentRequired || st.PaymentReason != want || !st.WritesRefused || st.Poisoned {
		t.Fatalf("status while refused: payment_required=%t reason=%q writes_refused=%t", st.PaymentRequired, st.PaymentReason, st.WritesRefused)
	}
	for _, ev := range []string{"payment_required", "writes_refused"} {
		if got := lb.events(ev); len(got) != 1 || got[0]["level"] != "warn" {
			t.Fatalf("%s events: %v", ev, got)
		}
	}
	if got := lb.events("payment_required"); got[0]["reason"] != want {
		t.Fatalf("payment_required reason %q", got[0]["reason"])
	}

	// A commit over the frame limit is refused on its own account and says nothing
	// about payment.
	big := &Commit{PageSize: snapPage, DBPages: 40}
	for no := uint32(1); no <= 40; no++ {
		big.Pages = append(big.Pages, Page{No: no, Data: randomPage(uint64(no))})
	}
	if e, ok := AsError(r.Commit(context.Background(), big)); !ok || e.Kind != KindTooLarge {
		t.Fatalf("big commit: %v", e)
	}
	if st := r.Status(); !st.PaymentRequired || st.RefusedKind != KindTooLarge {
		t.Fatalf("after too_large: %+v", st)
	}

	m.commit(t, r, 4, 1)
	st = r.Status()
	if st.PaymentRequired || st.PaymentReason != "" || st.WritesRefused || st.Error != nil || st.Local != streamcore.FormatOffset(st.Offset) {
		t.Fatalf("status after a successful commit: %+v", st)
	}
	if got := lb.events("writes_resumed"); len(got) != 1 || got[0]["level"] != "info" {
		t.Fatalf("writes_resumed events: %v", got)
	}
}

// randomPage is a page that does not compress.
func randomPage(seed uint64) []byte {
	b := make([]byte, snapPage)
	x := seed*0x9E3779B97F4A7C15 + 1
	for i := range b {
		x ^= x << 13
		x ^= x >> 7
		x ^= x << 17
		b[i] = byte(x)
	}
	return b
}
