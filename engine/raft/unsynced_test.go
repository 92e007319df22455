package raftengine

import (
	"bytes"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/ursula-go/ursula/server"
	"github.com/ursula-go/ursula/streamcore"
)

// Accepting a single node's possible unsynced loss rewrites every stream's history: a new
// incarnation token, Stream-Previous-Incarnation and Stream-Inherited-Offset on HEAD, and
// the stream's producers closed for their epoch (403 epoch-closed;by=history; a later
// epoch writes again). Without a reported loss the accept answers 409 and changes nothing.
func TestAcceptUnsyncedLossRewritesHistory(t *testing.T) {
	e, err := Open(Config{NodeID: 1, GroupCount: 2, RaftLog: io.Discard})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	waitReady(t, e)
	srv := server.New(e, server.Config{ClusterID: "unsynced"})
	ts := httptest.NewServer(srv)
	defer ts.Close()
	adm := httptest.NewServer(srv.AdminHandler())
	defer adm.Close()
	u := ts.URL + "/lossb/s"
	if res, body := doH(t, http.MethodPut, u, nil, "Content-Type", "text/plain"); res.StatusCode != http.StatusCreated {
		t.Fatalf("create: %d %s", res.StatusCode, body)
	}
	prod := func(epoch, seq, body string) *http.Response {
		res, _ := doH(t, http.MethodPost, u, []byte(body), "Content-Type", "text/plain",
			streamcore.HdrProducerID, "p1", streamcore.HdrProducerEpoch, epoch, streamcore.HdrProducerSeq, seq)
		return res
	}
	if res := prod("1", "0", "hello "); res.StatusCode/100 != 2 {
		t.Fatalf("producer append: %d", res.StatusCode)
	}
	head := func() http.Header {
		res, _ := doH(t, http.MethodHead, u, nil)
		return res.Header
	}
	before := head()
	accept := adm.URL + "/__ursula/recovery/accept-unsynced-loss"
	if res, body := doH(t, http.MethodPost, accept, nil, "X-Ursula-Admin", "1"); res.StatusCode != http.StatusConflict {
		t.Fatalf("accept with nothing reported: %d %s", res.StatusCode, body)
	}
	if h := head(); h.Get(streamcore.HdrIncarnation) != before.Get(streamcore.HdrIncarnation) {
		t.Fatal("a refused accept changed the stream")
	}
	// What the gate reports after an unclean stop across a host restart.
	for _, g := range e.groups {
		g.hadState = true
	}
	e.life.lossPossible.Store(true)
	res, body := doH(t, http.MethodPost, accept, nil, "X-Ursula-Admin", "1")
	if res.StatusCode != http.StatusOK || !bytes.Contains(body, []byte(`"rewritten_streams":1`)) {
		t.Fatalf("accept: %d %s", res.StatusCode, body)
	}
	after := head()
	if after.Get(streamcore.HdrIncarnation) == before.Get(streamcore.HdrIncarnation) || after.Get(streamcore.HdrIncarnation) == "" ||
		after.Get(streamcore.HdrPreviousIncarnation) != before.Get(streamcore.HdrIncarnation) ||
		after.Get(streamcore.HdrInheritedOffset) != before.Get(streamcore.HdrStreamNextOff) {
		t.Fatalf("history headers: before %v after %v", before, after)
	}
	if res := prod("1", "1", "lost? "); res.StatusCode != http.StatusForbidden || res.Header.Get(streamcore.HdrProducerOutcome) != "epoch-closed;by=history" {
		t.Fatalf("producer in its old epoch: %d %v", res.StatusCode, res.Header)
	}
	if res := prod("2", "0", "again"); res.StatusCode/100 != 2 {
		t.Fatalf("producer in a new epoch: %d", res.StatusCode)
	}
	if res, body := doH(t, http.MethodGet, u+"?offset=-1", nil); string(body) != "hello again" {
		t.Fatalf("stream holds %d %q", res.StatusCode, body)
	}
}
