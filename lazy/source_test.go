package lazy_test

import (
	"bytes"
	"context"
	"database/sql"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ursula-go/ursula/client"
	"github.com/ursula-go/ursula/internal/testserver"
	"github.com/ursula-go/ursula/lazy"
	"github.com/ursula-go/ursula/replicator"
	"github.com/ursula-go/ursula/streamcore"
	"github.com/ursula-go/ursula/vfs"
)

var ctx = context.Background()

func newClient(t *testing.T) *client.Client {
	t.Helper()
	c, err := client.New("")
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func exec(t *testing.T, db *sql.DB, q string, args ...any) {
	t.Helper()
	if _, err := db.Exec(q, args...); err != nil {
		t.Fatalf("%s: %v", q, err)
	}
}

func tailOf(t *testing.T, streamURL string) uint64 {
	t.Helper()
	info, err := newClient(t).Head(ctx, streamURL)
	if err != nil {
		t.Fatal(err)
	}
	off, _ := streamcore.ParseOffset(info.NextOffset)
	return off
}

// image restores the stream as of at (0: the tail) and returns the database file.
func image(t *testing.T, streamURL string, at uint64) []byte {
	t.Helper()
	path := filepath.Join(t.TempDir(), "full.db")
	if _, err := replicator.Restore(ctx, newClient(t), streamURL, path, at, streamcore.MaxRequestBytes, nil); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// publish publishes a snapshot of the stream's tail, as an owner's cycle would, and
// returns its offset.
func publish(t *testing.T, streamURL string) uint64 {
	t.Helper()
	c := newClient(t)
	path := filepath.Join(t.TempDir(), "snap.db")
	img, err := replicator.Restore(ctx, c, streamURL, path, 0, streamcore.MaxRequestBytes, nil)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(path)
	blob, err := replicator.EncodeSnapshot(replicator.SnapshotHeader{PageSize: img.PageSize, DBPages: img.DBPages, Epoch: img.Epoch, Offset: img.Tail}, b)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.PublishSnapshot(ctx, streamURL, streamcore.FormatOffset(img.Tail), "application/octet-stream", blob); err != nil {
		t.Fatal(err)
	}
	return img.Tail
}

// readAll reads every page of v; it stops at the first error.
func readAll(v *lazy.View) ([]byte, error) {
	var out []byte
	for no := uint32(1); no <= v.DBPages(); no++ {
		p, err := v.ReadPage(ctx, no)
		if err != nil {
			return out, fmt.Errorf("page %d: %w", no, err)
		}
		out = append(out, p...)
	}
	return out, nil
}

// TestMovesToNewerSnapshotAfterRetention: the owner replaces the snapshot a lazy source
// reads from and retention trims the log below the new one. A view at or past the new
// snapshot (a long read transaction, a new transaction, a follower) goes on reading
// the same bytes as a full download, from the new snapshot; a view below it gets a
// clear error, never other bytes.
func TestMovesToNewerSnapshotAfterRetention(t *testing.T) {
	streamURL := testserver.Start(t, testserver.Options{ClusterID: "lazy-test"}).URL + "/dbs1/rebase"
	owner, err := vfs.Open(streamURL, vfs.Options{Path: filepath.Join(t.TempDir(), "owner.db")})
	if err != nil {
		t.Fatal(err)
	}
	defer owner.Close()
	exec(t, owner, `CREATE TABLE notes(id INTEGER PRIMARY KEY, body TEXT)`)
	exec(t, owner, `INSERT INTO notes SELECT value, hex(randomblob(300)) FROM generate_series(1, 600)`)
	publish(t, streamURL)
	exec(t, owner, `UPDATE notes SET body = 'changed' WHERE id % 3 = 0`)
	mid := tailOf(t, streamURL)
	exec(t, owner, `INSERT INTO notes SELECT value, hex(randomblob(300)) FROM generate_series(601, 900)`)
	tail := tailOf(t, streamURL)
	wantMid, wantTail := image(t, streamURL, mid), image(t, streamURL, tail)

	// A cache of a few pages: almost every read goes to the server.
	small := lazy.Options{CacheBytes: 16 << 10}
	atTail, err := lazy.Open(ctx, streamURL, small)
	if err != nil {
		t.Fatal(err)
	}
	defer atTail.Close()
	atMid, err := lazy.Open(ctx, streamURL, lazy.Options{At: mid, CacheBytes: 16 << 10})
	if err != nil {
		t.Fatal(err)
	}
	defer atMid.Close()
	follower, err := lazy.Open(ctx, streamURL, lazy.Options{Follow: true, CacheBytes: 16 << 10})
	if err != nil {
		t.Fatal(err)
	}
	defer follower.Close()
	long := atTail.View() // a read transaction begun before the snapshot moved
	if p, err := long.ReadPage(ctx, 2); err != nil || !bytes.Equal(p, wantTail[4096:8192]) {
		t.Fatalf("before the new snapshot: %v", err)
	}

	if s2 := publish(t, streamURL); s2 != tail {
		t.Fatalf("the new snapshot is at %d, want the tail %d", s2, tail)
	}
	if _, err := newClient(t).Retain(ctx, streamURL, streamcore.FormatOffset(tail)); err != nil {
		t.Fatal(err)
	}
	if _, err := newClient(t).Read(ctx, streamURL, client.ReadOptions{Offset: streamcore.FormatOffset(mid)}); err == nil {
		t.Fatal("the log below the new snapshot is still readable: the test proves nothing")
	}

	for name, v := range map[string]*lazy.View{"a long transaction": long, "a new transaction": atTail.View()} {
		got, err := readAll(v)
		if err != nil {
			t.Fatalf("%s at the tail after the snapshot moved: %v", name, err)
		}
		if !bytes.Equal(got, wantTail) {
			t.Fatalf("%s reads other bytes than a full download at the tail", name)
		}
	}
	// Below the new snapshot: the pages not cached are gone, and saying so is the answer.
	got, err := readAll(atMid.View())
	if err == nil || !strings.Contains(err.Error(), "no longer readable") {
		t.Fatalf("a view below the new snapshot: %v, want a clear error", err)
	}
	if !bytes.Equal(got, wantMid[:len(got)]) {
		t.Fatal("a view below the new snapshot read other bytes than a full download there")
	}

	// The follower moves on past the new snapshot with the owner's next commits.
	exec(t, owner, `DELETE FROM notes WHERE id > 800`)
	newTail := tailOf(t, streamURL)
	for deadline := time.Now().Add(20 * time.Second); follower.View().Offset() != newTail; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the follower is at %d, the tail at %d (err %v)", follower.View().Offset(), newTail, follower.Err())
		}
	}
	got, err = readAll(follower.View())
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, image(t, streamURL, newTail)) {
		t.Fatal("the follower reads other bytes than a full download at the new tail")
	}
}
