package cluster

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/ursula-go/ursula/internal/testserver"
)

// follow sends a request with the default client, which follows leader redirects.
func follow(t *testing.T, method, url string, body []byte, hdr ...string) (*http.Response, []byte) {
	t.Helper()
	return testserver.Do(t, method, url, body, hdr...)
}

// TestBackupClusterRestoreSingleNode backs up a 3-node cluster while a producer writes and
// restores it into a fresh single node.
func TestBackupClusterRestoreSingleNode(t *testing.T) {
	c := newCluster(t, clusterOpts{nodes: 3, groups: 4})
	c.startAll()
	a := c.nodes[0].url
	streams := []string{"/bkt1/s1", "/bkt1/s2", "/bkt2/s3", "/bkt2/prod"}
	for _, s := range streams {
		if res, b := follow(t, http.MethodPut, a+s, nil, "Content-Type", "text/plain"); res.StatusCode != http.StatusCreated {
			t.Fatalf("create %s: %d %s", s, res.StatusCode, b)
		}
		for i := range 5 {
			follow(t, http.MethodPost, a+s, []byte(fmt.Sprintf("%s %d\n", s, i)), "Content-Type", "text/plain")
		}
	}
	prodWrite := func(base string, seq int) *http.Response {
		res, _ := follow(t, http.MethodPost, base+"/bkt2/prod", []byte(fmt.Sprintf("seq %d\n", seq)), "Content-Type", "text/plain",
			"Producer-Id", "p1", "Producer-Epoch", "1", "Producer-Seq", fmt.Sprint(seq))
		return res
	}
	if res := prodWrite(a, 0); res.StatusCode != http.StatusOK {
		t.Fatalf("claim: %d", res.StatusCode)
	}
	// The producer keeps writing while the backup runs.
	stop := testserver.Loop(func(i int) bool {
		seq := i + 1
		req, _ := http.NewRequest(http.MethodPost, a+"/bkt2/prod", strings.NewReader(fmt.Sprintf("seq %d\n", seq)))
		req.Header.Set("Content-Type", "text/plain")
		req.Header.Set("Producer-Id", "p1")
		req.Header.Set("Producer-Epoch", "1")
		req.Header.Set("Producer-Seq", fmt.Sprint(seq))
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			return false
		}
		res.Body.Close()
		return res.StatusCode == http.StatusOK
	})
	dir := filepath.Join(t.TempDir(), "backup")
	out, err := exec.Command(binPath, "backup", "create", "--from", c.nodes[1].url, "--to", dir).CombinedOutput()
	stop()
	if err != nil {
		t.Fatalf("backup create: %v\n%s", err, out)
	}
	var m struct {
		Objects []struct {
			Tails map[string]string `json:"tails"`
		} `json:"objects"`
	}
	mb, _ := os.ReadFile(filepath.Join(dir, "manifest.json"))
	if err := json.Unmarshal(mb, &m); err != nil || len(m.Objects) != 4 {
		t.Fatalf("manifest: %v %s", err, mb)
	}
	tails := map[string]string{}
	for _, o := range m.Objects {
		for k, v := range o.Tails {
			tails["/"+k] = v
		}
	}

	fresh := newCluster(t, clusterOpts{nodes: 1, groups: 2})
	fresh.startAll()
	b := fresh.nodes[0].url
	if out, err := exec.Command(binPath, "backup", "restore", dir, "--to", b).CombinedOutput(); err != nil {
		t.Fatalf("backup restore: %v\n%s", err, out)
	}
	for _, s := range streams {
		tail, _ := strconv.ParseUint(tails[s], 10, 64)
		_, want := follow(t, http.MethodGet, a+s+"?offset=-1", nil)
		_, got := follow(t, http.MethodGet, b+s+"?offset=-1", nil)
		if tail == 0 || uint64(len(got)) != tail || !bytes.Equal(got, want[:tail]) {
			t.Fatalf("%s: restored %d bytes, want the source's first %s", s, len(got), tails[s])
		}
		h, _ := follow(t, http.MethodHead, b+s, nil)
		sh, _ := follow(t, http.MethodHead, a+s, nil)
		if h.Header.Get("Stream-Previous-Incarnation") != sh.Header.Get("Stream-Incarnation") || h.Header.Get("Stream-Inherited-Offset") != tails[s] {
			t.Fatalf("%s: HEAD %v", s, h.Header)
		}
	}
	// Producer dedup survives: the claim's repeat gets its receipt on both sides.
	src, dst := prodWrite(a, 0), prodWrite(b, 0)
	if dst.StatusCode != http.StatusNoContent || dst.Header.Get("Stream-Offset") != src.Header.Get("Stream-Offset") {
		t.Fatalf("repeat after restore: %d %q, source %q", dst.StatusCode, dst.Header.Get("Stream-Offset"), src.Header.Get("Stream-Offset"))
	}
}
