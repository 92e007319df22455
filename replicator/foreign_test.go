package replicator

import (
	"bytes"
	"context"
	"errors"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ursula-go/ursula/client"
)

// Bytes in the original implementation's formats (commit frames USQ1, snapshot bodies USS1
// and USS2) are refused by the name of their format, never reported as damage: their
// layouts differ from ours and are not read (vfs T18, and the wire-format departure).
func TestForeignFormatsAreRefusedByName(t *testing.T) {
	for _, magic := range []string{"USQ1", "USS1", "USS2"} {
		b := append([]byte(magic), bytes.Repeat([]byte{0}, 60)...)
		_, _, err := DecodeRecords(b, 7, 0)
		if !errors.Is(err, errForeignFormat) || !strings.Contains(err.Error(), magic) || strings.Contains(err.Error(), "damaged") {
			t.Fatalf("record %s: %v", magic, err)
		}
		_, _, err = decodeSnapshot(b, 1<<20)
		if !errors.Is(err, errForeignFormat) || !strings.Contains(err.Error(), magic) {
			t.Fatalf("snapshot %s: %v", magic, err)
		}
	}
	// Our own magic with damage after it is still damage.
	if _, _, err := DecodeRecords([]byte("URSQ\x09"), 0, 0); err == nil || errors.Is(err, errForeignFormat) {
		t.Fatalf("damaged record: %v", err)
	}

	base := snapServer(t, nil)
	c, _ := client.New("")
	ctx := context.Background()
	attach := func(url string) error {
		_, err := Attach(ctx, url, filepath.Join(t.TempDir(), "db"), Options{Log: &logBuf{}, Client: c})
		return err
	}
	// A stream of foreign commit frames.
	frames := base + "/dbs1/usq"
	if _, err := c.Create(ctx, frames, client.CreateOptions{ContentType: "application/octet-stream", Body: append([]byte("USQ1"), make([]byte, 40)...)}); err != nil {
		t.Fatal(err)
	}
	if e, ok := AsError(attach(frames)); !ok || e.Kind != KindUnsupported || !strings.Contains(e.Error(), "USQ1") {
		t.Fatalf("attach of USQ1 frames: %v", e)
	}
	// A stream whose latest snapshot body is USS1 (of ours otherwise).
	snaps := base + "/dbs1/uss"
	wr, err := c.Create(ctx, snaps, client.CreateOptions{ContentType: "application/octet-stream", Body: encodeClaim(Claim{Epoch: 1})})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.PublishSnapshot(ctx, snaps, wr.NextOffset, "application/octet-stream", append([]byte("USS1"), make([]byte, 60)...)); err != nil {
		t.Fatal(err)
	}
	if e, ok := AsError(attach(snaps)); !ok || e.Kind != KindUnsupported || !strings.Contains(e.Error(), "USS1") {
		t.Fatalf("attach of a USS1 snapshot: %v", e)
	}
}
