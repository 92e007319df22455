package vfs

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/ncruces/go-sqlite3"

	"github.com/ursula-go/ursula/client"
	"github.com/ursula-go/ursula/replicator"
	"github.com/ursula-go/ursula/streamcore"
)

// VerifyReport says what one verification of a database stream proved.
type VerifyReport struct {
	// Offset is the stream offset verified: the rebuilt database reflects the log up to
	// here and passed PRAGMA integrity_check.
	Offset uint64
	// CommitTime is the time of the last commit at or before Offset (zero: not known).
	CommitTime time.Time
	// SnapshotOffset is the snapshot the rebuild started from (0: none, a plain replay).
	SnapshotOffset uint64
	// Compared is true when a second rebuild, a replay of the whole log that ignores the
	// snapshot, agreed page for page. NotCompared says why there was none.
	Compared    bool
	NotCompared string
	PageSize    uint32
	DBPages     uint32
}

// Verify proves that the database held by the stream at streamURL is restorable: it
// rebuilds it from the latest snapshot plus the log, runs PRAGMA integrity_check on the
// result and, while the stream still retains its whole log, compares it page for page
// with a replay of the log from offset 0 that ignores the snapshot. Any disagreement, a
// damaged snapshot or record, or a failed integrity check is a *Error of kind damaged.
// Scratch files go to a directory under workDir ("" = the system temporary directory)
// and are removed. Nothing is claimed: the owner keeps writing undisturbed.
func Verify(ctx context.Context, streamURL, workDir string) (*VerifyReport, error) {
	if err := replicator.CheckURL(streamURL); err != nil {
		return nil, err
	}
	c, err := client.New("")
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp(workDir, "ursula-verify-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	const maxFrame = streamcore.MaxRequestBytes
	rebuilt := filepath.Join(dir, "rebuilt.db")
	img, err := replicator.Restore(ctx, c, streamURL, rebuilt, 0, maxFrame, nil)
	if err != nil {
		return nil, err
	}
	rep := &VerifyReport{Offset: img.Tail, SnapshotOffset: img.SnapshotOffset, PageSize: img.PageSize, DBPages: img.DBPages}
	when := img.LastCommitUnixNano
	switch {
	case img.SnapshotOffset == 0:
		rep.NotCompared = "no snapshot was used: the rebuild is itself a replay of the whole log"
	default:
		replayed := filepath.Join(dir, "replayed.db")
		other, err := replicator.ReplayLog(ctx, c, streamURL, replayed, img.Tail, maxFrame)
		if e, ok := replicator.AsError(err); ok && e.Kind == replicator.KindNotFound {
			rep.NotCompared = e.Message
			break
		}
		if err != nil {
			return nil, err
		}
		if page, differ, err := firstDifferentPage(rebuilt, replayed, int64(img.PageSize)); err != nil {
			return nil, err
		} else if differ {
			return nil, &Error{Kind: replicator.KindDamaged, Action: replicator.ActionStop,
				Message: fmt.Sprintf("the snapshot at offset %s plus the log does not rebuild the database a replay of the whole log does: page %d differs at offset %s",
					streamcore.FormatOffset(img.SnapshotOffset), page, streamcore.FormatOffset(img.Tail))}
		}
		rep.Compared = true
		if when == 0 {
			when = other.LastCommitUnixNano
		}
	}
	if when != 0 {
		rep.CommitTime = time.Unix(0, when).UTC()
	}
	if img.DBPages == 0 {
		return rep, nil // an empty stream: nothing to check
	}
	if err := integrityCheck(rebuilt); err != nil {
		return nil, &Error{Kind: replicator.KindDamaged, Action: replicator.ActionStop,
			Message: fmt.Sprintf("the database rebuilt at offset %s fails PRAGMA integrity_check: %v", streamcore.FormatOffset(img.Tail), err)}
	}
	return rep, nil
}

// firstDifferentPage compares two database files page by page and returns the first
// (1-based) page that differs; files of different sizes differ at the first page one
// lacks.
func firstDifferentPage(a, b string, pageSize int64) (uint64, bool, error) {
	fa, err := os.Open(a)
	if err != nil {
		return 0, false, err
	}
	defer fa.Close()
	fb, err := os.Open(b)
	if err != nil {
		return 0, false, err
	}
	defer fb.Close()
	pa, pb := make([]byte, pageSize), make([]byte, pageSize)
	for page := uint64(1); ; page++ {
		na, ea := io.ReadFull(fa, pa)
		nb, eb := io.ReadFull(fb, pb)
		if na != nb || !bytes.Equal(pa[:na], pb[:nb]) {
			return page, true, nil
		}
		if ea != nil || eb != nil {
			if (ea == io.EOF || ea == io.ErrUnexpectedEOF) && (eb == io.EOF || eb == io.ErrUnexpectedEOF) {
				return 0, false, nil
			}
			return 0, false, fmt.Errorf("comparing rebuilds: %v / %v", ea, eb)
		}
	}
}

// integrityCheck runs PRAGMA integrity_check on the rebuilt file. The file is marked as a
// rollback-journal database first (file format bytes 18 and 19): a WAL-mode file would
// need a -wal and -shm even to be read.
func integrityCheck(path string) error {
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return err
	}
	_, err = f.WriteAt([]byte{1, 1}, 18)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	conn, err := sqlite3.OpenFlags(path, sqlite3.OPEN_READONLY)
	if err != nil {
		return err
	}
	defer conn.Close()
	stmt, _, err := conn.Prepare(`PRAGMA integrity_check`)
	if err != nil {
		return err
	}
	defer stmt.Close()
	var problems []string
	for stmt.Step() {
		if line := stmt.ColumnText(0); line != "ok" {
			problems = append(problems, line)
		}
	}
	if err := stmt.Err(); err != nil {
		return err
	}
	if len(problems) > 0 {
		return fmt.Errorf("%s", strings.Join(problems, "; "))
	}
	return nil
}
