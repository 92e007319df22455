package replicator

import (
	"context"
	"testing"
	"time"

	"github.com/ursula-go/ursula/internal/testserver"

	coldstore "github.com/ursula-go/ursula/coldtier/store"
	"github.com/ursula-go/ursula/coldtier/store/s3test"
)

// coldServer starts a real server (memory engine) whose cold tier (fs, or s3 on versitygw)
// takes snapshots in parts.
func coldServer(t *testing.T, backend string) string {
	t.Helper()
	var store coldstore.Store
	var err error
	var s3cfg coldstore.S3Config
	if backend == "s3" {
		gw := s3test.Start(t)
		s3cfg = gw.Config("snapshot-parts")
		store, err = coldstore.NewS3(context.Background(), s3cfg)
	} else {
		store, err = coldstore.NewFS(t.TempDir())
	}
	if err != nil {
		t.Fatal(err)
	}
	cfg := testserver.DefaultColdConfig(backend, 1<<20)
	cfg.S3 = s3cfg
	return testserver.Start(t, testserver.Options{ClusterID: "snapshot-parts", Cold: store, ColdConfig: &cfg}).URL
}

// TestSnapshotInPartsOnColdTier: against the real server with a cold tier, a snapshot body
// of many parts (SnapshotPartBytes lowered to 64 KiB) is staged, committed, read back and
// installed by a fresh restore page-identical to the owner's image; on an fs and an s3
// (versitygw) cold tier.
func TestSnapshotInPartsOnColdTier(t *testing.T) {
	for _, backend := range []string{"fs", "s3"} {
		t.Run(backend, func(t *testing.T) { snapshotInParts(t, backend) })
	}
}

func snapshotInParts(t *testing.T, backend string) {
	base := coldServer(t, backend)
	url := base + "/snap/coldparts"
	r, _, lb := snapAttach(t, url, Options{SnapshotPartBytes: 64 << 10})
	info, err := r.opts.Client.Head(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	if info.MaxSnapshotBytes <= 0 {
		t.Fatal("the server's HEAD sends no Ursula-Max-Snapshot-Bytes with a cold tier (no upload in parts)")
	}
	m := newModel()
	for r.Status().Snapshot == "-1" {
		m.commit(t, r, 512, 64)
		if st := r.Status(); st.LogBytes > st.SnapshotDueBytes {
			waitFor(t, "a snapshot", 30*time.Second, func() bool { return r.Status().Snapshot != "-1" || len(lb.events("snapshot_failed")) > 0 })
		}
		if ev := lb.events("snapshot_failed"); len(ev) > 0 {
			t.Fatalf("snapshot failed: %v", ev)
		}
	}
	x := parseOff(t, r.Status().Snapshot)
	if b := *r.Status().SnapshotBytes; b < 4*(64<<10) {
		t.Fatalf("snapshot body of %d bytes: under 4 parts, the test proves little", b)
	}
	checkSnapshot(t, r.opts.Client, url, x, m)
}
