package replicator

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"

	"github.com/ursula-go/ursula/client"
	"github.com/ursula-go/ursula/streamcore"
)

// Image describes a database file rebuilt from its stream.
type Image struct {
	PageSize uint32
	DBPages  uint32
	Tail     uint64 // stream offset the file reflects: just past the last applied record
	Epoch    uint64 // highest claimed epoch seen (snapshot header and claim records)
	Commits  int    // commit records applied after the snapshot
	// LastCommitUnixNano is the time of the last commit applied (0: none applied after
	// the snapshot, or not recorded).
	LastCommitUnixNano int64
	// SnapshotOffset is the offset of the snapshot the rebuild started from (0: none).
	SnapshotOffset uint64
}

// Progress reports bytes of stream replayed out of the total to replay.
type Progress func(done, total uint64)

// readChunk is how much of the stream one catch-up read asks for (the server cap).
const readChunk = streamcore.MaxReadBytes

// Restore writes the database held by the stream at url, as of stream offset at (0 = the
// tail), to dst: the latest snapshot at or below that offset, then every record up to it.
// The file is written beside dst and renamed over it, so dst is either the old file or the
// whole new one; stale -wal and -shm files of dst are removed. at must be a record
// boundary the stream still retains.
//
// The owner publishes snapshots and moves retention while a restore runs: when the
// snapshot it chose is superseded before it is read (404 SNAPSHOT_NOT_FOUND) or retention
// passes the offset it is replaying from (410), it starts over from a new HEAD (at most
// restoreAttempts times).
func Restore(ctx context.Context, c *client.Client, url, dst string, at uint64, maxFrame int, progress Progress) (*Image, error) {
	tmp := dst + ".ursula-restore"
	f, err := os.OpenFile(tmp, os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return nil, err
	}
	ok := false
	defer func() {
		f.Close()
		if !ok {
			os.Remove(tmp)
		}
	}()
	var img *Image
	for attempt := 1; ; attempt++ {
		info, err := c.Head(ctx, url)
		if err != nil {
			return nil, classifyRead(err, "HEAD of the stream")
		}
		tail, _ := streamcore.ParseOffset(info.NextOffset)
		target := tail
		if at != 0 {
			if at > tail {
				return nil, newError(KindNotFound, ActionFix, nil, "offset %d is beyond the stream tail %d", at, tail)
			}
			target = at
		}
		if err := f.Truncate(0); err != nil {
			return nil, err
		}
		img = &Image{}
		_, err = rebuild(ctx, c, url, f, img, info, target, maxFrame, progress)
		if err == nil {
			break
		}
		if attempt >= restoreAttempts || !superseded(err) {
			return nil, err
		}
	}
	if err := f.Truncate(int64(img.DBPages) * int64(img.PageSize)); err != nil {
		return nil, err
	}
	if err := f.Sync(); err != nil {
		return nil, err
	}
	os.Remove(dst + "-wal")
	os.Remove(dst + "-shm")
	if err := os.Rename(tmp, dst); err != nil {
		return nil, err
	}
	ok = true
	return img, nil
}

// restoreAttempts bounds how often Restore starts over after a snapshot or retention
// move raced it.
const restoreAttempts = 3

// superseded reports a read that failed because the stream's snapshot or retention moved
// on since the HEAD the rebuild started from.
func superseded(err error) bool {
	var ce *client.Error
	if !errors.As(err, &ce) {
		return false
	}
	return ce.Status == http.StatusNotFound && ce.Code == streamcore.CodeSnapshotNotFound || ce.Status == http.StatusGone
}

// maxSnapshotImage is the largest database image a snapshot may hold. A rebuild streams
// the snapshot into the file (readSnapshot) and allocates nothing of the image's size, so
// the bound that matters on the wire is the compressed body (maxSnapshotBody, the server's
// 1 GiB); this one only refuses a declared size no database of ours reaches (64 GiB).
const maxSnapshotImage = 64 << 30

// rebuild writes into f (empty) the stream as of target: the latest snapshot if it is at
// or below target (info is a HEAD of the stream), then the records up to target. It
// returns the size of the snapshot body it installed (0: none).
func rebuild(ctx context.Context, c *client.Client, url string, f *os.File, img *Image, info *client.StreamInfo, target uint64, maxFrame int, progress Progress) (int, error) {
	retained, _ := streamcore.ParseOffset(info.RetainedOffset)
	from, installed := uint64(0), 0
	if info.SnapshotOffset != "" {
		snapOff, _ := streamcore.ParseOffset(info.SnapshotOffset)
		if snapOff <= target {
			body, _, err := openSnapshot(ctx, c, url, info.SnapshotOffset)
			if err != nil {
				return 0, classifyRead(err, "snapshot read")
			}
			h, n, err := readSnapshot(body, f, maxSnapshotBody, maxSnapshotImage)
			body.Close()
			if errors.Is(err, errForeignFormat) {
				return 0, newError(KindUnsupported, ActionFix, err, "snapshot at %d", snapOff)
			}
			if errors.Is(err, errBadSnapshot) {
				return 0, newError(KindDamaged, ActionStop, err, "snapshot at %d", snapOff)
			}
			if err != nil {
				if _, ok := err.(*client.Error); ok {
					return 0, classifyRead(err, "snapshot read")
				}
				return 0, err // the file
			}
			if h.Offset != snapOff {
				return 0, newError(KindDamaged, ActionStop, nil, "snapshot published at %d says it folds the stream up to %d", snapOff, h.Offset)
			}
			img.PageSize, img.DBPages, img.Epoch, from = h.PageSize, h.DBPages, h.Epoch, snapOff
			img.SnapshotOffset = snapOff
			installed = int(n)
		}
	}
	if from < retained {
		return 0, newError(KindNotFound, ActionFix, nil, "offset %d is no longer reconstructible: retention is at %d and the latest snapshot is past it", target, retained)
	}
	img.Tail = from
	return installed, replay(ctx, c, url, f, img, from, target, maxFrame, progress)
}

// catchUp continues an image file that reflects the stream up to img.Tail with the records
// in [img.Tail, to). On error the file may hold records past img.Tail; replaying them again
// is harmless (page images: the last write wins) but callers simply start over.
func catchUp(ctx context.Context, c *client.Client, url string, f *os.File, img *Image, to uint64, maxFrame int) error {
	return replay(ctx, c, url, f, img, img.Tail, to, maxFrame, nil)
}

// replay applies the records in [from, to) to f.
func replay(ctx context.Context, c *client.Client, url string, f *os.File, img *Image, from, to uint64, maxFrame int, progress Progress) error {
	if from >= to {
		img.Tail = from
		return nil
	}
	next, stop := fetchLog(ctx, c, url, from, to)
	defer stop()
	var pending []byte // bytes of a record cut by the read window
	pos := from        // offset of pending[0]
	for read := from; read < to; {
		data, err := next()
		if err != nil {
			if e, ok := err.(*Error); ok {
				return e
			}
			return classifyRead(err, "stream read")
		}
		if data == nil {
			break
		}
		read += uint64(len(data))
		if len(pending) == 0 {
			pending = data // nothing cut from the window before: decode it in place
		} else {
			pending = append(pending, data...)
		}
		recs, used, err := DecodeRecords(pending, pos, maxFrame)
		if errors.Is(err, errForeignFormat) {
			return newError(KindUnsupported, ActionFix, err, "stream record")
		}
		if err != nil {
			return newError(KindDamaged, ActionStop, err, "stream record")
		}
		for _, r := range recs {
			if err := apply(f, img, r); err != nil {
				return err
			}
		}
		pending = append(pending[:0], pending[used:]...)
		pos += uint64(used)
		if progress != nil {
			progress(pos-from, to-from)
		}
	}
	if pos < to {
		return newError(KindNotFound, ActionFix, nil, "offset %d is inside a record, not at a commit boundary", to)
	}
	img.Tail = pos
	return nil
}

func apply(f *os.File, img *Image, r Record) error {
	switch r.Kind {
	case KindClaim:
		img.Epoch = max(img.Epoch, r.Claim.Epoch)
	case KindCommit:
		cm := r.Commit
		if img.PageSize != 0 && cm.PageSize != img.PageSize {
			return newError(KindDamaged, ActionStop, nil, "record at %d changes the page size from %d to %d", r.Offset, img.PageSize, cm.PageSize)
		}
		if img.PageSize != 0 && cm.DBPages < img.DBPages {
			// The format: a commit sets the database size, truncating anything past it.
			// Doing it here (not only at the end of a replay) makes an image continued
			// from any record boundary page-identical to one replayed in one go.
			if err := f.Truncate(int64(cm.DBPages) * int64(cm.PageSize)); err != nil {
				return err
			}
		}
		img.PageSize, img.DBPages = cm.PageSize, cm.DBPages
		for _, p := range cm.Pages {
			if _, err := f.WriteAt(p.Data, int64(p.No-1)*int64(cm.PageSize)); err != nil {
				return err
			}
		}
		img.Commits++
		img.LastCommitUnixNano = cm.UnixNano
	}
	return nil
}

// classifyRead turns a client error of a read into a typed error.
func classifyRead(err error, what string) error {
	var ce *client.Error
	if e, ok := err.(*client.Error); ok {
		ce = e
	}
	if ue := urlRefusal(err); ue != nil {
		return newError(KindInvalidURL, ActionFix, nil, "%s: %s", what, ue.Reason)
	}
	if ce != nil && ce.Status == http.StatusNotFound {
		return newError(KindNotFound, ActionFix, err, "%s: the stream does not exist", what)
	}
	if ce != nil && ce.Status == http.StatusBadRequest {
		return newError(KindInvalidURL, ActionFix, err, "%s refused with 400 %s: %s", what, orUnknown(ce.Code), ce.Message)
	}
	if ce != nil && ce.Status >= 400 && ce.Status < 500 {
		return newError(KindNotApplied, ActionFix, err, "%s refused with %d %s: %s", what, ce.Status, orUnknown(ce.Code), ce.Message)
	}
	return newError(KindUnavailable, ActionRetry, err, "%s failed", what)
}

// orUnknown names a missing error code (an answer without a JSON error body).
func orUnknown(code string) string {
	if code == "" {
		return "(no error code)"
	}
	return code
}

var _ = fmt.Sprintf
