package raftengine

import (
	"bytes"
	"io"
	"net/http"
	"testing"
	"time"

	coldstore "github.com/ursula-go/ursula/coldtier/store"
	"github.com/ursula-go/ursula/server"
	"github.com/ursula-go/ursula/streamcore"
)

func doH(t *testing.T, method, url string, body []byte, hdr ...string) (*http.Response, []byte) {
	t.Helper()
	req, err := http.NewRequest(method, url, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	// Admin mutations pin this run's process incarnation unless the test sets the header
	// itself (an empty value sends none).
	if _, pinned := req.Header[server.HdrProcessIncarnation]; !pinned && req.Header.Get(server.HdrAdmin) != "" &&
		method != http.MethodGet && method != http.MethodHead {
		req.Header.Set(server.HdrProcessIncarnation, server.ProcessIncarnation())
	}
	if v, ok := req.Header[server.HdrProcessIncarnation]; ok && len(v) == 1 && v[0] == "" {
		req.Header.Del(server.HdrProcessIncarnation)
	}
	cl := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	res, err := cl.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return res, b
}

// TestColdSnapshotPartsThreeVoters (checklist-protocol 22): a follower redirects parts
// requests to the leader; parts staged on one leader commit on the next (the parts live
// in the shared store); every replica records the assembled snapshot's object.
func TestColdSnapshotPartsThreeVoters(t *testing.T) {
	store, err := coldstore.NewFS(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	cfg := coldstore.Config{Backend: "fs", Dir: "unused", Root: "root", FlushInterval: coldstore.Duration(time.Hour),
		FlushSize: 64 << 10, FlushMaxConcurrency: 2, CacheSize: 1 << 20,
		GCInterval: coldstore.Duration(time.Hour), GCGrace: coldstore.Duration(time.Hour)}
	nodes := coldCluster(t, 3, store, cfg)
	key := "coldb/parts"
	g := nodes[0].e.GroupOf(key)
	lid := nodes[0].e.LeaderOf(g)
	L, F := nodes[lid-1], nodes[lid%3]
	if res, b := doH(t, http.MethodPut, L.ts.URL+"/"+key, bytes.Repeat([]byte("x"), 4096), "Content-Type", "application/octet-stream"); res.StatusCode != http.StatusCreated {
		t.Fatalf("create: %d %s", res.StatusCode, b)
	}
	res, _ := doH(t, http.MethodHead, F.ts.URL+"/"+key, nil)
	if res.StatusCode != http.StatusTemporaryRedirect {
		// HEAD is leader-confirmed; on the leader it advertises the parts bound.
		t.Fatalf("HEAD on a follower: %d", res.StatusCode)
	}
	if res, _ := doH(t, http.MethodHead, L.ts.URL+"/"+key, nil); res.Header.Get(streamcore.HdrMaxSnapshotBytes) != "1073741824" {
		t.Fatalf("HEAD on the leader: %v", res.Header)
	}
	off := streamcore.FormatOffset(4096)
	res, _ = doH(t, http.MethodPost, F.ts.URL+"/"+key+"/snapshot/"+off+"/parts", []byte("part"))
	if res.StatusCode != http.StatusTemporaryRedirect {
		t.Fatalf("part on a follower: %d", res.StatusCode)
	}
	whole := bytes.Repeat([]byte("snapshot body "), 100<<10)
	var ids []string
	for _, p := range [][]byte{whole[:1<<20], whole[1<<20:]} {
		res, b := doH(t, http.MethodPost, L.ts.URL+"/"+key+"/snapshot/"+off+"/parts", p)
		if res.StatusCode != http.StatusCreated {
			t.Fatalf("part: %d %s", res.StatusCode, b)
		}
		ids = append(ids, res.Header.Get(streamcore.HdrSnapshotPart))
	}
	if err := L.e.TransferLeadership(g, F.e.cfg.NodeID); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the transfer", func() bool { return F.e.LeaderHint(key) == nil })
	ct := "application/x-sqlite3"
	digest := server.SnapshotDigest(ct, whole)
	commit := func(url string) (*http.Response, []byte) {
		return doH(t, http.MethodPut, url+"/"+key+"/snapshot/"+off, []byte(ids[0]+"\n"+ids[1]+"\n"),
			"Content-Type", ct, streamcore.HdrSnapshotParts, "2", streamcore.HdrSnapshotDigest, digest)
	}
	// Until the old leader hears from the new one it knows no leader to redirect to: a
	// 503 (not applied) meanwhile, then the redirect.
	last := 0
	eventually(t, "the old leader redirects the commit", func() bool {
		res, _ := commit(L.ts.URL)
		last = res.StatusCode
		return last != http.StatusServiceUnavailable
	})
	if last != http.StatusTemporaryRedirect {
		t.Fatalf("commit on the old leader: %d", last)
	}
	if res, b := commit(F.ts.URL); res.StatusCode != http.StatusNoContent || res.Header.Get(streamcore.HdrSnapshotDigest) != digest {
		t.Fatalf("commit on the new leader: %d %s", res.StatusCode, b)
	}
	res, b := doH(t, http.MethodGet, F.ts.URL+"/"+key+"/snapshot/"+off, nil)
	if res.StatusCode != http.StatusOK || !bytes.Equal(b, whole) {
		t.Fatalf("snapshot read on the leader: %d, %d bytes", res.StatusCode, len(b))
	}
	for _, nd := range nodes {
		eventually(t, "every replica applies the publish", func() bool {
			ok := false
			nd.e.View(key, time.Now().UnixMilli(), func(_ *streamcore.State, s *streamcore.Stream) {
				ok = s != nil && s.Snapshot != nil && s.Snapshot.ColdKey != "" && s.Snapshot.Size == uint64(len(whole))
			})
			return ok
		})
	}
}
