package replicator

import (
	"bytes"
	"context"
	"net/http"
	"path/filepath"
	"sync"
	"testing"

	"github.com/ursula-go/ursula/client"
	"github.com/ursula-go/ursula/streamcore"
)

// TestAttachOverLateCommits (checklist-vfs 30, T12): records that land between an
// attach's read of the tail and its claim make the claim's Stream-Seq conflict. When they
// are commits of the owner the claim fences (its attempts still in flight, or simply its
// last commits, acknowledged before the claim), the attach catches up over them and
// claims again: the new owner holds them. When a claim is among them, another owner is
// attaching: fenced, as before.
func TestAttachOverLateCommits(t *testing.T) {
	var mu sync.Mutex
	var beforeClaim func() // runs once, before the next claim reaches the server
	base := snapServer(t, func(h http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.Method == http.MethodPost && r.Header.Get(streamcore.HdrProducerSeq) == "0" {
				mu.Lock()
				hook := beforeClaim
				beforeClaim = nil
				mu.Unlock()
				if hook != nil {
					hook()
				}
			}
			h.ServeHTTP(w, r)
		})
	})
	setHook := func(f func()) { mu.Lock(); beforeClaim = f; mu.Unlock() }

	t.Run("commits of the fenced owner", func(t *testing.T) {
		url := base + "/late/commits"
		a, _, _ := snapAttach(t, url, Options{})
		m := newModel()
		m.commit(t, a, 4, 4)
		setHook(func() { // the old owner commits as the claim goes out
			cm := m.next(6, 3)
			if err := a.Commit(context.Background(), cm); err != nil {
				t.Errorf("the old owner's late commit: %v", err)
				return
			}
			m.apply(cm)
		})
		b, path, lb := snapAttach(t, url, Options{})
		if st := b.Status(); st.Epoch != 2 || st.Fenced || st.Poisoned {
			t.Fatalf("the new owner after the late commit: %+v", st)
		}
		if ev := lb.events("attach_caught_up"); len(ev) != 1 || ev[0]["commits"] != "1" {
			t.Fatalf("attach_caught_up events: %v", ev)
		}
		if got := readFile(t, path); !bytes.Equal(got, m.img) {
			t.Fatalf("the new owner's file (%d bytes) is not the stream's image with the late commit (%d bytes)", len(got), len(m.img))
		}
		err := a.Commit(context.Background(), m.next(6, 1))
		if e, ok := AsError(err); !ok || e.Kind != KindFenced {
			t.Fatalf("the old owner's commit after the claim: %v, want fenced", err)
		}
		m2 := &model{at: map[uint64][]byte{}, img: bytes.Clone(m.img), seed: 100}
		m2.commit(t, b, 6, 2) // and the new owner goes on
	})

	t.Run("a claim of another owner", func(t *testing.T) {
		url := base + "/late/claim"
		a, _, _ := snapAttach(t, url, Options{})
		newModel().commit(t, a, 4, 4)
		c, err := client.New("")
		if err != nil {
			t.Fatal(err)
		}
		setHook(func() {
			// Another owner attaches (its claim passes the hook, now spent) just before ours.
			o, err := Attach(context.Background(), url, filepath.Join(t.TempDir(), "other"), Options{Client: c, Log: &logBuf{}})
			if err != nil {
				t.Errorf("the other owner's attach: %v", err)
				return
			}
			t.Cleanup(func() { o.Close() })
		})
		_, err = Attach(context.Background(), url, filepath.Join(t.TempDir(), "db"), Options{Client: c, Log: &logBuf{}})
		if e, ok := AsError(err); !ok || e.Kind != KindFenced {
			t.Fatalf("attach while another owner claimed: %v, want fenced", err)
		}
	})
}
