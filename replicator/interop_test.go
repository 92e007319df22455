package replicator

import (
	"bytes"
	"context"
	"errors"
	"os"
	"strings"
	"testing"

	"github.com/ursula-go/ursula/client"
	"github.com/ursula-go/ursula/streamcore"
)

// otherBuild writes to a stream as another build of the VFS would: records it frames
// itself (version, Producer-Id), appended under a producer key and with Stream-Seq at the
// tail it last saw, as every owner does.
type otherBuild struct {
	t          *testing.T
	c          *client.Client
	url        string
	producerID string
	epoch, seq uint64
	tail       uint64
}

func (o *otherBuild) append(rec []byte) error {
	o.t.Helper()
	wr, err := o.c.Append(context.Background(), o.url, rec, client.AppendOptions{
		ContentType: "application/octet-stream",
		Producer:    &client.ProducerKey{ID: o.producerID, Epoch: o.epoch, Seq: o.seq},
		StreamSeq:   streamcore.FormatOffset(o.tail),
	})
	if err != nil {
		return err
	}
	o.seq++
	o.tail, _ = streamcore.ParseOffset(wr.NextOffset)
	return nil
}

func streamTail(t *testing.T, c *client.Client, url string) (uint64, string) {
	t.Helper()
	info, err := c.Head(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	tail, _ := streamcore.ParseOffset(info.NextOffset)
	return tail, info.Incarnation
}

// TestVersionInterop (checklist-vfs T60, AB233-234): owners on two builds of one minor
// fence each other, and a stream a newer minor wrote is refused, never dual-written.
//   - Another build of this minor (simulated by writing its records directly: version 1,
//     as the build before the commit time was added writes them, under the incarnation's
//     Producer-Id) claims the stream with the next epoch and commits: this owner's next
//     commit is fenced (stop) and writes nothing. An owner of this build attaching next
//     reads the other build's records, takes the stream over, and the other build's next
//     append is fenced in turn.
//   - A newer minor (record version 3, its own Producer-Id) appends a claim at the tail:
//     this owner's next commit meets the Stream-Seq conflict and is fenced, writing
//     nothing; an attach of this build refuses the stream by name (unsupported, fix: a
//     newer version wrote it), not as damage, and claims nothing.
func TestVersionInterop(t *testing.T) {
	base := snapServer(t, nil)
	c, _ := client.New("")
	ctx := context.Background()

	t.Run("same minor", func(t *testing.T) {
		url := base + "/interop/minor"
		a, _, _ := snapAttach(t, url, Options{})
		m := newModel()
		m.commit(t, a, 4, 4)
		tail, inc := streamTail(t, c, url)
		other := &otherBuild{t: t, c: c, url: url, producerID: ProducerIDFor(inc), epoch: a.Status().Epoch + 1, tail: tail}
		claim := append(le.AppendUint64(nil, other.epoch), bytes.Repeat([]byte{7}, 16)...)
		if err := other.append(bodyRecord(KindClaim, claim)); err != nil {
			t.Fatalf("the other build's claim: %v", err)
		}
		page := testPage(snapPage, 2)
		if err := other.append(bodyRecord(KindCommit, commitBody(snapPage, 4, []uint32{2}, snapPage))); err != nil {
			t.Fatalf("the other build's commit: %v", err)
		}
		before, _ := streamTail(t, c, url)
		err := a.Commit(ctx, m.next(4, 1))
		if e, ok := AsError(err); !ok || e.Kind != KindFenced || e.Action != ActionStop {
			t.Fatalf("this build's commit after the other build's claim: %v, want fenced (stop)", err)
		}
		if after, _ := streamTail(t, c, url); after != before {
			t.Fatalf("the fenced commit moved the stream from %d to %d", before, after)
		}

		// This build takes the stream back: it reads the other build's records.
		b, path, _ := snapAttach(t, url, Options{})
		if got := b.Status().Epoch; got != other.epoch+1 {
			t.Fatalf("the new owner's epoch %d, want %d", got, other.epoch+1)
		}
		f, err := os.ReadFile(path)
		if err != nil || len(f) < 2*snapPage || !bytes.Equal(f[snapPage:2*snapPage], page) {
			t.Fatalf("the new owner's page 2 is not the other build's commit (%d bytes, %v)", len(f), err)
		}
		// At the tail it sees now, so only its epoch can refuse it.
		other.tail, _ = streamTail(t, c, url)
		err = other.append(bodyRecord(KindCommit, commitBody(snapPage, 4, []uint32{3}, snapPage)))
		var ce *client.Error
		if !errors.As(err, &ce) || !ce.Fenced() {
			t.Fatalf("the other build's append after this build's claim: %v, want fenced", err)
		}
	})

	t.Run("cross minor", func(t *testing.T) {
		url := base + "/interop/newer"
		a, _, _ := snapAttach(t, url, Options{})
		m := newModel()
		m.commit(t, a, 4, 4)
		tail, inc := streamTail(t, c, url)
		newer := &otherBuild{t: t, c: c, url: url, producerID: "sqlite-ursula-vfs-next/" + inc, epoch: 1, tail: tail}
		claim := append(le.AppendUint64(make([]byte, 8), 9), bytes.Repeat([]byte{9}, 16)...)
		if err := newer.append(rawRecord(3, byte(KindClaim), 0, encoder.EncodeAll(claim, nil))); err != nil {
			t.Fatalf("the newer build's claim: %v", err)
		}
		before, _ := streamTail(t, c, url)
		err := a.Commit(ctx, m.next(4, 1))
		if e, ok := AsError(err); !ok || e.Kind != KindFenced {
			t.Fatalf("this build's commit after the newer build's claim: %v, want fenced", err)
		}
		if after, _ := streamTail(t, c, url); after != before {
			t.Fatalf("this build's commit moved the stream from %d to %d: dual-written", before, after)
		}

		_, err = Attach(ctx, url, t.TempDir()+"/db", Options{Log: &logBuf{}, Client: c})
		e, ok := AsError(err)
		if !ok || e.Kind != KindUnsupported || e.Action != ActionFix || !strings.Contains(err.Error(), "newer version") || strings.Contains(err.Error(), "damaged") {
			t.Fatalf("attaching a stream a newer minor wrote: %v, want unsupported (fix) naming the newer version", err)
		}
		if after, _ := streamTail(t, c, url); after != before {
			t.Fatalf("the refused attach moved the stream from %d to %d", before, after)
		}
	})
}
