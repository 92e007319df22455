package replicator

import (
	"bytes"
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"sync"
	"time"

	"github.com/ursula-go/ursula/client"
	"github.com/ursula-go/ursula/streamcore"
)

// A snapshot body is built into a file beside the database (<db>-ursula-snap-blob, removed
// after the cycle) by streaming the shadow image through writeSnapshot, then sent from that
// file: in one PUT when it fits one request, else in parts (POST .../parts, then a commit)
// where the server's HEAD announces Ursula-Max-Snapshot-Bytes. Nothing of the image's or
// the body's size is held in memory: a few parts in flight at most.

// blobSuffix names the snapshot body file beside the database.
const blobSuffix = "-ursula-snap-blob"

const (
	partsInFlight     = 2
	commitAttempts    = 8 // a 503 or a lost answer repeats the same commit (its parts are kept)
	commitRetryCap    = 30 * time.Second
	maxSnapshotParts  = 4096
	verifyChunk       = 1 << 20
	discardTimeout    = 10 * time.Second
	defaultPartBytes  = streamcore.MaxRequestBytes
	reasonTooLarge    = "too_large"
	reasonNoPartsHead = "the server announces no Ursula-Max-Snapshot-Bytes (no upload in parts)"
)

// errSnapshotTooLarge: the body is larger than one request and the server takes no parts
// (or fewer bytes than the body).
var errSnapshotTooLarge = errors.New("snapshot body is too large to publish")

// snapBlob is a snapshot body in its file.
type snapBlob struct {
	f    *os.File
	path string
	size int64
}

func (b *snapBlob) len() int {
	if b == nil {
		return 0
	}
	return int(b.size)
}

// remove closes and deletes the file; safe on nil.
func (b *snapBlob) remove() {
	if b == nil {
		return
	}
	b.f.Close()
	os.Remove(b.path)
}

// zeros reads as endless zero bytes: the shadow file may be shorter than the image (its
// tail pages never written), and those pages are zero.
type zeros struct{}

func (zeros) Read(p []byte) (int, error) {
	clear(p)
	return len(p), nil
}

// writeBlob streams the first size bytes of the shadow image into a new blob file.
func (s *snapshotter) writeBlob(h SnapshotHeader, size int64) (*snapBlob, error) {
	path := s.r.path + blobSuffix
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return nil, newError(KindLocalSetup, ActionFix, err, "creating the snapshot body file")
	}
	b := &snapBlob{f: f, path: path}
	image := io.MultiReader(io.NewSectionReader(s.f, 0, size), zeros{})
	if b.size, err = writeSnapshot(f, h, image); err != nil {
		b.remove()
		return nil, newError(KindLocalSetup, ActionFix, err, "writing the snapshot body")
	}
	return b, nil
}

// noteHead keeps the limits a HEAD announced.
func (s *snapshotter) noteHead(info *client.StreamInfo) {
	if info != nil {
		s.maxReqBytes, s.maxSnapBytes = info.MaxRequestBytes, info.MaxSnapshotBytes
	}
}

// partBytes is the size of one part (and the largest body sent in one PUT).
func (s *snapshotter) partBytes() int64 {
	if n := s.r.opts.SnapshotPartBytes; n > 0 {
		return int64(n)
	}
	if s.maxReqBytes > 0 {
		return min(s.maxReqBytes, defaultPartBytes)
	}
	return defaultPartBytes
}

// publish sends the body (one PUT, or in parts), then reads it back and compares: a 2xx
// alone proves nothing.
func (s *snapshotter) publish(ctx context.Context, x uint64, blob *snapBlob) error {
	off, part := streamcore.FormatOffset(x), s.partBytes()
	var err error
	if blob.size <= part {
		err = s.publishWhole(ctx, off, blob)
	} else {
		err = s.publishParts(ctx, off, blob, part)
	}
	if err != nil {
		return err
	}
	return s.readBack(ctx, x, blob)
}

// publishWhole sends the body in one PUT (at most twice: a second time only when the first
// got no answer, P142).
func (s *snapshotter) publishWhole(ctx context.Context, off string, blob *snapBlob) error {
	body := make([]byte, blob.size)
	if _, err := blob.f.ReadAt(body, 0); err != nil {
		return newError(KindLocalSetup, ActionFix, err, "reading the snapshot body file")
	}
	c := s.r.opts.Client
	for send := 1; ; send++ {
		if s.r.snapView().refused {
			return errRefused
		}
		_, err := c.PublishSnapshot(ctx, s.r.url, off, snapshotContentType, body)
		if err == nil {
			return nil
		}
		ce := s.learnConflict(err)
		if send >= 2 || ce == nil || ce.Status != 0 || ctx.Err() != nil {
			return err
		}
	}
}

// learnConflict notes the latest snapshot a 409 names and returns the client error.
func (s *snapshotter) learnConflict(err error) *client.Error {
	var ce *client.Error
	if errors.As(err, &ce) && ce.Status == http.StatusConflict && ce.SnapshotOffset != "" {
		// A newer snapshot (or other bytes at X) is the latest: learn where it is.
		if n, perr := streamcore.ParseOffset(ce.SnapshotOffset); perr == nil {
			s.mu.Lock()
			s.snapOff = max(s.snapOff, int64(n))
			s.mu.Unlock()
		}
	}
	return ce
}

// publishParts stages the body in parts (partsInFlight at a time) and commits them. Any
// failure discards the staged parts (best effort): the next cycle stages anew.
func (s *snapshotter) publishParts(ctx context.Context, off string, blob *snapBlob, part int64) (err error) {
	if s.maxSnapBytes < blob.size {
		// The limits may have changed since the HEAD we know (an upgraded server).
		if info, herr := s.r.opts.Client.Head(ctx, s.r.url); herr == nil {
			s.noteHead(info)
		}
	}
	if s.maxSnapBytes < blob.size {
		why := reasonNoPartsHead
		if s.maxSnapBytes >= 0 {
			why = fmt.Sprintf("the server takes snapshots of at most %d bytes", s.maxSnapBytes)
		}
		return fmt.Errorf("%w: %d bytes, over one request (%d bytes), and %s", errSnapshotTooLarge, blob.size, part, why)
	}
	n := (blob.size + part - 1) / part
	if n > maxSnapshotParts {
		return fmt.Errorf("%w: %d parts of %d bytes, over the %d a commit may name", errSnapshotTooLarge, n, part, maxSnapshotParts)
	}
	c, url := s.r.opts.Client, s.r.url
	defer func() {
		// Also when closing: the parts would otherwise wait for the server's sweep. A
		// discard while the commit still runs is refused (503) and logged only if not closing.
		if err != nil {
			dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), discardTimeout)
			defer cancel()
			if _, derr := c.DiscardSnapshotParts(dctx, url); derr != nil && ctx.Err() == nil {
				s.r.logAt("warn", "snapshot_parts_discard_failed", "err=%q", derr.Error())
			}
		}
	}()
	ids, digest, err := s.stageParts(ctx, off, blob, part, int(n))
	if err != nil {
		return err
	}
	for attempt := 1; ; attempt++ {
		if s.r.snapView().refused {
			return errRefused
		}
		_, err := c.CommitSnapshotParts(ctx, url, off, snapshotContentType, digest, ids)
		if err == nil {
			return nil
		}
		ce := s.learnConflict(err)
		if ce == nil || (ce.Status != 0 && ce.Status != http.StatusServiceUnavailable) || attempt >= commitAttempts || ctx.Err() != nil {
			return err
		}
		wait := ce.RetryAfter
		if wait <= 0 {
			wait = backoff(attempt, FailOther)
		}
		t := time.NewTimer(min(wait, commitRetryCap))
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
		}
	}
}

// stageParts reads the body file in order (digesting it on the way) and stages each part,
// partsInFlight at a time. It returns the part ids in order and the body's digest.
func (s *snapshotter) stageParts(ctx context.Context, off string, blob *snapBlob, part int64, n int) ([]string, string, error) {
	c, url := s.r.opts.Client, s.r.url
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		wg       sync.WaitGroup
		mu       sync.Mutex
		firstErr error
	)
	setErr := func(err error) {
		mu.Lock()
		if firstErr == nil {
			firstErr = err
		}
		mu.Unlock()
		cancel()
	}
	ids := make([]string, n)
	sum := streamcore.NewSnapshotDigest(snapshotContentType)
	sem := make(chan struct{}, partsInFlight)
	for i := range n {
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
		}
		if ctx.Err() != nil {
			break
		}
		lo := int64(i) * part
		buf := make([]byte, min(part, blob.size-lo))
		if _, err := blob.f.ReadAt(buf, lo); err != nil {
			<-sem
			setErr(newError(KindLocalSetup, ActionFix, err, "reading the snapshot body file"))
			break
		}
		sum.Write(buf)
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			wr, err := c.StageSnapshotPart(ctx, url, off, buf)
			if err == nil && wr.SnapshotPart == "" {
				err = fmt.Errorf("part %d of the snapshot at %s staged without a part id", i, off)
			}
			if err != nil {
				setErr(err)
				return
			}
			ids[i] = wr.SnapshotPart
		}()
	}
	wg.Wait()
	if firstErr == nil && ctx.Err() != nil {
		firstErr = ctx.Err()
	}
	if firstErr != nil {
		return nil, "", firstErr
	}
	return ids, hex.EncodeToString(sum.Sum(nil)), nil
}

// readBack reads the snapshot at x by ranges and compares it with the body file.
func (s *snapshotter) readBack(ctx context.Context, x uint64, blob *snapBlob) error {
	body, total, err := openSnapshot(ctx, s.r.opts.Client, s.r.url, streamcore.FormatOffset(x))
	if err != nil {
		return classifyRead(err, "reading the snapshot back")
	}
	defer body.Close()
	if total != blob.size {
		return fmt.Errorf("the snapshot read back from %d is %d bytes, not the %d published", x, total, blob.size)
	}
	got, want := make([]byte, verifyChunk), make([]byte, verifyChunk)
	for pos := int64(0); pos < total; {
		n := int(min(verifyChunk, total-pos))
		if _, err := io.ReadFull(body, got[:n]); err != nil {
			var ce *client.Error
			if errors.As(err, &ce) {
				return classifyRead(ce, "reading the snapshot back")
			}
			return fmt.Errorf("reading the snapshot back from %d: %w", x, err)
		}
		if _, err := blob.f.ReadAt(want[:n], pos); err != nil {
			return newError(KindLocalSetup, ActionFix, err, "reading the snapshot body file")
		}
		if !bytes.Equal(got[:n], want[:n]) {
			return fmt.Errorf("the snapshot read back from %d differs from the %d bytes published at byte %d", x, total, pos)
		}
		pos += int64(n)
	}
	return nil
}
