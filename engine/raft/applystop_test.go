package raftengine

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/raft"

	"github.com/ursula-go/ursula/server"
	"github.com/ursula-go/ursula/streamcore"
)

// keysInTwoGroups returns two keys of different groups.
func keysInTwoGroups(e *Engine) (string, string) {
	a := "bkts/a"
	for i := 0; ; i++ {
		k := fmt.Sprintf("bkts/k%d", i)
		if e.GroupOf(k) != e.GroupOf(a) {
			return a, k
		}
	}
}

// poison refuses (or panics on) every entry that carries "poison" while on.
func poison(on *atomic.Bool, panics bool) ApplyFault {
	return func(_ uint64, l *raft.Log) error {
		if on.Load() && bytes.Contains(l.Data, []byte("poison")) {
			if panics {
				panic("invariant violated by the poison entry")
			}
			return errors.New("the poison entry cannot apply")
		}
		return nil
	}
}

func codeOf(err error) string {
	var e *streamcore.Error
	if errors.As(err, &e) {
		return e.Code
	}
	return ""
}

// An entry that fails to apply stops its group only: the write that carried it answers
// APPLY_STOPPED without the not-applied marker (it is in the log), later requests on the
// group answer APPLY_STOPPED with it, the other group keeps serving, the node stays
// ready, status names the failure, and no snapshot covers the unapplied entry. A restart
// while the fault persists stops at the same entry again; after the fix it replays the
// entry (never skipped) and the group serves again. Both a returned failure and a panic.
func TestApplyFailureStopsOneGroup(t *testing.T) {
	for _, panics := range []bool{false, true} {
		t.Run(fmt.Sprintf("panic=%v", panics), func(t *testing.T) {
			dir := t.TempDir()
			stores, l := nodelogStores(t, dir+"/wal")
			defer l.Close()
			e, err := Open(Config{NodeID: 1, GroupCount: 4, Dir: dir + "/raft", Stores: stores, RaftLog: io.Discard})
			if err != nil {
				t.Fatal(err)
			}
			defer e.Close()
			waitReady(t, e)
			var on atomic.Bool
			on.Store(true)
			e.SetApplyFault(poison(&on, panics))
			ctx := context.Background()
			a, b := keysInTwoGroups(e)
			for _, k := range []string{a, b} {
				if _, err := e.Propose(ctx, create(k)); err != nil {
					t.Fatal(err)
				}
				if _, err := e.Propose(ctx, appendCmd(k, "one,")); err != nil {
					t.Fatal(err)
				}
			}
			_, err = e.Propose(ctx, appendCmd(a, "poison,"))
			var se *streamcore.Error
			if !errors.As(err, &se) || se.Code != CodeApplyStopped || se.Status != http.StatusServiceUnavailable || se.Headers[streamcore.HdrNotApplied] != "" {
				t.Fatalf("failing write: %v %#v", err, se)
			}
			_, err = e.Propose(ctx, appendCmd(a, "two,"))
			if !errors.As(err, &se) || se.Code != CodeApplyStopped || se.Headers[streamcore.HdrNotApplied] != MarkerApplyStopped {
				t.Fatalf("write to a stopped group: %v", err)
			}
			if codeOf(e.StreamRefusal(a)) != CodeApplyStopped || e.StreamRefusal(b) != nil {
				t.Fatal("stream refusal of the stopped and the running group")
			}
			if _, err := e.Propose(ctx, appendCmd(b, "two,")); err != nil {
				t.Fatalf("the other group stopped too: %v", err)
			}
			if ok, why := e.Ready(); !ok {
				t.Fatalf("a stopped group made the node unready: %s", why)
			}
			ga := e.GroupOf(a)
			st := e.RaftStatus().(Status)
			f := st.Groups[ga].ApplyFailure
			if f == nil || f.Group != ga || f.Index == 0 || (panics && f.Kind != "panic") || (!panics && f.Kind != "fault") {
				t.Fatalf("status apply_failure: %+v", f)
			}
			if st.Groups[e.GroupOf(b)].ApplyFailure != nil {
				t.Fatal("the running group reports a failure")
			}
			if err := e.groups[ga].r.Snapshot().Error(); err == nil {
				t.Fatal("a stopped group took a snapshot (raft could compact the unapplied entry away)")
			}
			// Still broken: the restart stops at the same entry.
			r, err := e.RestartGroup(ga)
			if err != nil || r.Outcome != "still_stopped" || r.Failure == nil || r.Failure.Index != f.Index {
				t.Fatalf("restart while broken: %+v %v", r, err)
			}
			// Fixed: the restart replays the failed entry and the group serves again.
			on.Store(false)
			r, err = e.RestartGroup(ga)
			if err != nil || r.Outcome != "resumed" {
				t.Fatalf("restart after the fix: %+v %v", r, err)
			}
			if got := read(e, a); got != "one,poison," {
				t.Fatalf("after the restart the stream holds %q", got)
			}
			if e.StreamRefusal(a) != nil {
				t.Fatal("still refused after the restart")
			}
			if _, err := e.Propose(ctx, appendCmd(a, "three,")); err != nil {
				t.Fatal(err)
			}
			if got := read(e, a); got != "one,poison,three," {
				t.Fatalf("stream holds %q", got)
			}
			if _, err := e.RestartGroup(ga); !errors.Is(err, ErrGroupNotStopped) {
				t.Fatalf("restart of a running group: %v", err)
			}
			if err := e.groups[ga].r.Snapshot().Error(); err != nil {
				t.Fatalf("snapshot after the restart: %v", err)
			}
		})
	}
}

// A node restarted after a fix applies the entry its group stopped at.
func TestApplyFailureNodeRestartResumes(t *testing.T) {
	dir := t.TempDir()
	open := func() (*Engine, io.Closer) {
		stores, l := nodelogStores(t, dir+"/wal")
		e, err := Open(Config{NodeID: 1, GroupCount: 2, Dir: dir + "/raft", Stores: stores, RaftLog: io.Discard})
		if err != nil {
			t.Fatal(err)
		}
		waitReady(t, e)
		return e, l
	}
	e, l := open()
	var on atomic.Bool
	on.Store(true)
	e.SetApplyFault(poison(&on, false))
	ctx := context.Background()
	key := "b/x"
	for _, c := range []*streamcore.Command{create(key), appendCmd(key, "a,"), appendCmd(key, "poison,")} {
		e.Propose(ctx, c)
	}
	if codeOf(e.StreamRefusal(key)) != CodeApplyStopped {
		t.Fatal("group not stopped")
	}
	e.Close()
	l.Close()
	e, l = open() // the fixed build: no fault
	defer l.Close()
	defer e.Close()
	deadline := time.Now().Add(10 * time.Second)
	for read(e, key) != "a,poison," {
		if time.Now().After(deadline) {
			t.Fatalf("after the restart the stream holds %q", read(e, key))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Over HTTP: a stopped group's streams answer 503 APPLY_STOPPED with the marker, another
// group's streams answer, the admin route restarts the group (409 when it runs), and a
// mutation pinned to another process incarnation is refused with 412 and changes nothing.
func TestApplyStoppedHTTP(t *testing.T) {
	e, err := Open(Config{NodeID: 1, GroupCount: 4, RaftLog: io.Discard})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	waitReady(t, e)
	srv := server.New(e, server.Config{ClusterID: "apply-stop"})
	ts := httptest.NewServer(srv)
	defer ts.Close()
	adm := httptest.NewServer(srv.AdminHandler())
	defer adm.Close()
	var on atomic.Bool
	on.Store(true)
	e.SetApplyFault(poison(&on, false))
	a, b := keysInTwoGroups(e)
	for _, k := range []string{a, b} {
		if res, body := doH(t, http.MethodPut, ts.URL+"/"+k, nil, "Content-Type", "text/plain"); res.StatusCode != http.StatusCreated {
			t.Fatalf("create %s: %d %s", k, res.StatusCode, body)
		}
	}
	if res, body := doH(t, http.MethodPost, ts.URL+"/"+a, []byte("poison"), "Content-Type", "text/plain"); res.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("poison append: %d %s", res.StatusCode, body)
	}
	res, body := doH(t, http.MethodGet, ts.URL+"/"+a+"?offset=-1", nil)
	if res.StatusCode != http.StatusServiceUnavailable || !bytes.Contains(body, []byte(CodeApplyStopped)) || res.Header.Get(streamcore.HdrNotApplied) != MarkerApplyStopped || res.Header.Get("Retry-After") == "" {
		t.Fatalf("read of a stopped group: %d %s %v", res.StatusCode, body, res.Header)
	}
	if res, body := doH(t, http.MethodPost, ts.URL+"/"+b, []byte("fine"), "Content-Type", "text/plain"); res.StatusCode != http.StatusNoContent {
		t.Fatalf("append to the running group: %d %s", res.StatusCode, body)
	}
	if res, _ := doH(t, http.MethodGet, ts.URL+"/__ursula/ready", nil); res.StatusCode != http.StatusOK {
		t.Fatalf("ready: %d", res.StatusCode)
	}
	ga := e.GroupOf(a)
	restart := fmt.Sprintf("%s/__ursula/raft/%d/restart", adm.URL, ga)
	// A mutation pinned to no run, or to another run, is refused and changes nothing.
	on.Store(false)
	res, body = doH(t, http.MethodPost, restart, nil, "X-Ursula-Admin", "1", server.HdrProcessIncarnation, "")
	if res.StatusCode != http.StatusPreconditionRequired || !bytes.Contains(body, []byte(server.CodeProcessIncarnationRequired)) {
		t.Fatalf("pinned to no incarnation: %d %s", res.StatusCode, body)
	}
	if e.StreamRefusal(a) == nil {
		t.Fatal("a restart without an incarnation restarted the group")
	}
	res, body = doH(t, http.MethodPost, restart, nil, "X-Ursula-Admin", "1", server.HdrProcessIncarnation, "0123")
	if res.StatusCode != http.StatusPreconditionFailed || !bytes.Contains(body, []byte(server.CodeProcessIncarnationMismatch)) {
		t.Fatalf("pinned to another incarnation: %d %s", res.StatusCode, body)
	}
	if e.StreamRefusal(a) == nil {
		t.Fatal("a refused restart restarted the group")
	}
	var ms struct {
		Incarnation string `json:"process_incarnation"`
	}
	res, body = doH(t, http.MethodGet, adm.URL+"/__ursula/metrics", nil)
	if json.Unmarshal(body, &ms) != nil || ms.Incarnation == "" || ms.Incarnation != server.ProcessIncarnation() {
		t.Fatalf("metrics process_incarnation: %s", body)
	}
	res, body = doH(t, http.MethodPost, restart, nil, "X-Ursula-Admin", "1", server.HdrProcessIncarnation, ms.Incarnation)
	if res.StatusCode != http.StatusOK || !bytes.Contains(body, []byte(`"resumed"`)) {
		t.Fatalf("restart: %d %s", res.StatusCode, body)
	}
	res, body = doH(t, http.MethodGet, ts.URL+"/"+a+"?offset=-1", nil)
	if res.StatusCode != http.StatusOK || string(body) != "poison" {
		t.Fatalf("read after the restart: %d %q", res.StatusCode, body)
	}
	if res, body := doH(t, http.MethodPost, restart, nil, "X-Ursula-Admin", "1"); res.StatusCode != http.StatusConflict {
		t.Fatalf("restart of a running group: %d %s", res.StatusCode, body)
	}
}

// On three voters, a fault on one replica stops the group there only: if that replica
// led the group, it hands the leadership to a voter that applies fine, and the group
// keeps serving writes.
func TestApplyFailureOneReplica(t *testing.T) {
	es := threeVoters(t)
	key := "b/x"
	g := es[0].GroupOf(key)
	ctx := context.Background()
	var leader uint64
	var L *Engine
	eventually(t, "the stream's create", func() bool {
		if leader = es[0].LeaderOf(g); leader == 0 {
			return false
		}
		L = es[leader-1]
		_, err := L.Propose(ctx, create(key))
		return err == nil
	})
	var on atomic.Bool
	on.Store(true)
	L.SetApplyFault(poison(&on, false))
	L.Propose(ctx, appendCmd(key, "poison,"))
	eventually(t, "leadership to leave the stopped replica", func() bool {
		n := es[0].LeaderOf(g)
		return n != 0 && n != leader
	})
	eventually(t, "a write through the new leader", func() bool {
		n := es[0].LeaderOf(g)
		if n == 0 || es[n-1] == L {
			return false
		}
		nl := es[n-1]
		_, err := nl.Propose(ctx, appendCmd(key, "after,"))
		return err == nil
	})
	if codeOf(L.StreamRefusal(key)) != CodeApplyStopped {
		t.Fatal("the faulty replica serves")
	}
	on.Store(false)
	if r, err := L.RestartGroup(g); err != nil || r.Outcome != "resumed" {
		t.Fatalf("restart: %+v %v", r, err)
	}
	eventually(t, "the restarted replica to catch up", func() bool {
		return read(L, key) == "poison,after,"
	})
}

// The test-only fault of a real process (URSULA_TEST_APPLY_FAULT): what it parses and
// which entries it refuses.
func TestArmTestApplyFault(t *testing.T) {
	for _, c := range []struct {
		spec    string
		ok      bool
		refuses []bool // indexes 4, 5, 6 of group 2 in turn, then index 9 of group 1
	}{
		{"", true, []bool{false, false, false, false}},
		{"2:5", true, []bool{false, true, true, false}},
		{"2:5:once", true, []bool{false, true, false, false}},
		{"2", false, nil},
		{"2:0", false, nil},
		{"x:5", false, nil},
		{"2:5:twice", false, nil},
		{"2:5:once:x", false, nil},
	} {
		e := &Engine{cfg: Config{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}}
		err := e.armTestApplyFault(c.spec)
		if (err == nil) != c.ok {
			t.Fatalf("%q: err %v", c.spec, err)
		}
		if !c.ok {
			continue
		}
		var got []bool
		for _, at := range []struct{ g, i uint64 }{{2, 4}, {2, 5}, {2, 6}, {1, 9}} {
			refused := false
			if h := e.life.applyFault.Load(); h != nil {
				refused = (*h)(at.g, &raft.Log{Index: at.i}) != nil
			}
			got = append(got, refused)
		}
		if fmt.Sprint(got) != fmt.Sprint(c.refuses) {
			t.Fatalf("%q refuses %v, want %v", c.spec, got, c.refuses)
		}
	}
}
