package main

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/raft"

	raftengine "github.com/ursula-go/ursula/engine/raft"
	"github.com/ursula-go/ursula/server"
	"github.com/ursula-go/ursula/streamcore"
)

// ursula ctl against a real admin listener: status shows a stopped group, a restart
// pinned to another process incarnation is refused (exit 1, one line with the code) and
// changes nothing, restart-group after the fix resumes the group.
func TestCtlRestartGroup(t *testing.T) {
	e, err := raftengine.Open(raftengine.Config{NodeID: 1, GroupCount: 2, RaftLog: io.Discard})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	deadline := time.Now().Add(15 * time.Second)
	for ok, _ := e.Ready(); !ok; ok, _ = e.Ready() {
		if time.Now().After(deadline) {
			t.Fatal("not ready")
		}
		time.Sleep(20 * time.Millisecond)
	}
	srv := server.New(e, server.Config{ClusterID: "ctl"})
	adm := httptest.NewServer(srv.AdminHandler())
	defer adm.Close()
	var broken atomic.Bool
	broken.Store(true)
	e.SetApplyFault(func(_ uint64, l *raft.Log) error {
		if broken.Load() && bytes.Contains(l.Data, []byte("poison")) {
			return errors.New("cannot apply the poison")
		}
		return nil
	})
	ctx := context.Background()
	key := "ctlb/s"
	now := time.Now().UnixMilli()
	e.Propose(ctx, &streamcore.Command{Op: streamcore.OpCreate, Key: key, Now: now, ContentType: "text/plain", TTL: -1, NewIncarnation: 9})
	e.Propose(ctx, &streamcore.Command{Op: streamcore.OpAppend, Key: key, Now: now, ContentType: "text/plain", Body: []byte("poison")})
	g := strconv.FormatUint(e.GroupOf(key), 10)
	run := func(args ...string) (int, string, string) {
		var out, errb bytes.Buffer
		code := runCtl(append([]string{"--node", adm.URL}, args...), &out, &errb)
		return code, out.String(), errb.String()
	}
	if code, out, _ := run("status"); code != 0 || !strings.Contains(out, "STOPPED at") {
		t.Fatalf("status: %d\n%s", code, out)
	}
	broken.Store(false)
	code, _, stderr := run("--incarnation", "another-run", "restart-group", g)
	if code != 1 || !strings.Contains(stderr, server.CodeProcessIncarnationMismatch) || strings.Count(strings.TrimSpace(stderr), "\n") != 0 {
		t.Fatalf("pinned to another run: %d %q", code, stderr)
	}
	if e.StreamRefusal(key) == nil {
		t.Fatal("the refused restart changed something")
	}
	if code, out, stderr := run("restart-group", g); code != 0 || !strings.Contains(out, "resumed") {
		t.Fatalf("restart-group: %d %s %s", code, out, stderr)
	}
	if e.StreamRefusal(key) != nil {
		t.Fatal("still stopped")
	}
	if code, _, stderr := run("restart-group", g); code != 1 || !strings.Contains(stderr, "GROUP_NOT_STOPPED") {
		t.Fatalf("restart of a running group: %d %q", code, stderr)
	}
}
