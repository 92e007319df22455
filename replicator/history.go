package replicator

import (
	"context"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/ursula-go/ursula/client"
	"github.com/ursula-go/ursula/streamcore"
)

// A database's history in human terms: which commits and snapshots the stream still
// holds, when each commit was made, and which stream offset a user's "as of" (an offset,
// a time, or a time relative to now) names.

// HistoryEntry is one commit or snapshot the stream retains.
type HistoryEntry struct {
	Snapshot bool   // a snapshot published beside the stream, not a commit record
	Offset   uint64 // the offset that names it: just past the commit record, or the snapshot's offset
	Start    uint64 // commits: the record's first byte
	// UnixNano is the commit time (0: not recorded). A snapshot has the time of the last
	// commit it folds.
	UnixNano int64
	Size     int64  // bytes: the record, or the snapshot body
	Pages    int    // pages the commit wrote (snapshots: the database size)
	DBPages  uint32 // database size after the commit, in pages
	Epoch    uint64 // the epoch of the owner that wrote it (0: not known, claim not retained)
}

// Time is the commit time (zero time when not recorded).
func (e HistoryEntry) Time() time.Time {
	if e.UnixNano == 0 {
		return time.Time{}
	}
	return time.Unix(0, e.UnixNano).UTC()
}

// History is what a stream retains of a database: its commits in stream order, and its
// latest snapshot.
type History struct {
	Commits  []HistoryEntry
	Snapshot *HistoryEntry // nil: none published
	Retained uint64        // the stream's retention offset: bytes below it are gone
	Tail     uint64
	// Earliest is the smallest offset the database can still be rebuilt at: 0 while the
	// whole log is retained, else the latest snapshot's offset.
	Earliest uint64
}

// ReadHistory reads the retained log of the database stream at url and lists its commits
// and its latest snapshot. It reads the log once, from the retention offset to the tail.
func ReadHistory(ctx context.Context, c *client.Client, url string, maxFrame int, progress Progress) (*History, error) {
	info, err := c.Head(ctx, url)
	if err != nil {
		return nil, classifyRead(err, "HEAD of the stream")
	}
	h := &History{}
	h.Tail, _ = streamcore.ParseOffset(info.NextOffset)
	h.Retained, _ = streamcore.ParseOffset(info.RetainedOffset)
	var epoch uint64
	if info.SnapshotOffset != "" {
		off, _ := streamcore.ParseOffset(info.SnapshotOffset)
		sh, size, err := snapshotHeader(ctx, c, url, info.SnapshotOffset)
		if err != nil {
			return nil, err
		}
		h.Snapshot = &HistoryEntry{Snapshot: true, Offset: off, Start: off, Size: size, Pages: int(sh.DBPages), DBPages: sh.DBPages, Epoch: sh.Epoch}
		if off == h.Retained {
			epoch = sh.Epoch
		}
	}
	if h.Retained > 0 {
		if h.Snapshot == nil || h.Snapshot.Offset < h.Retained {
			return nil, newError(KindDamaged, ActionStop, nil, "retention is at %d but no snapshot at or past it is published: the database cannot be rebuilt", h.Retained)
		}
		h.Earliest = h.Snapshot.Offset
	}
	if h.Retained >= h.Tail {
		h.stampSnapshot()
		return h, nil
	}
	next, stop := fetchLog(ctx, c, url, h.Retained, h.Tail)
	defer stop()
	var pending []byte
	pos := h.Retained
	for read := h.Retained; read < h.Tail; {
		data, err := next()
		if err != nil {
			if e, ok := err.(*Error); ok {
				return nil, e
			}
			return nil, classifyRead(err, "stream read")
		}
		if data == nil {
			break
		}
		read += uint64(len(data))
		pending = append(pending, data...)
		recs, used, err := DecodeRecords(pending, pos, maxFrame)
		if err != nil {
			return nil, newError(KindDamaged, ActionStop, err, "stream record")
		}
		for _, r := range recs {
			switch r.Kind {
			case KindClaim:
				epoch = max(epoch, r.Claim.Epoch)
			case KindCommit:
				h.Commits = append(h.Commits, HistoryEntry{Offset: r.End, Start: r.Offset, UnixNano: r.Commit.UnixNano,
					Size: int64(r.End - r.Offset), Pages: len(r.Commit.Pages), DBPages: r.Commit.DBPages, Epoch: epoch})
			}
		}
		pending = append(pending[:0], pending[used:]...)
		pos += uint64(used)
		if progress != nil {
			progress(pos-h.Retained, h.Tail-h.Retained)
		}
	}
	if pos < h.Tail {
		return nil, newError(KindDamaged, ActionStop, nil, "the stream ends inside a record at %d", pos)
	}
	h.stampSnapshot()
	return h, nil
}

// stampSnapshot gives the snapshot the time of the last retained commit it folds.
func (h *History) stampSnapshot() {
	if h.Snapshot == nil {
		return
	}
	for _, c := range h.Commits {
		if c.Offset <= h.Snapshot.Offset {
			h.Snapshot.UnixNano = c.UnixNano
		}
	}
}

// snapshotHeader reads the header of the snapshot at off and the body's size.
func snapshotHeader(ctx context.Context, c *client.Client, url, off string) (SnapshotHeader, int64, error) {
	body, size, err := openSnapshot(ctx, c, url, off)
	if err != nil {
		return SnapshotHeader{}, 0, classifyRead(err, "snapshot read")
	}
	defer body.Close()
	head := make([]byte, snapshotHeaderSize, snapshotV2HeaderSize)
	if _, err := io.ReadFull(body, head); err != nil {
		return SnapshotHeader{}, 0, newError(KindDamaged, ActionStop, err, "snapshot at %s: header cut short", off)
	}
	var sh SnapshotHeader
	if [4]byte(head[:4]) == snapshotMagic && head[4] == snapshotVersion2 {
		head = head[:snapshotV2HeaderSize] // version 2: a longer header
		if _, err = io.ReadFull(body, head[snapshotHeaderSize:]); err == nil {
			sh, _, _, err = parseV2Header(head)
		}
	} else {
		sh, err = parseSnapshotHeader(head)
	}
	if err != nil {
		return SnapshotHeader{}, 0, newError(KindDamaged, ActionStop, err, "snapshot at %s", off)
	}
	return sh, size, nil
}

// EarliestCommit describes the earliest point the database can be rebuilt at, for errors.
func (h *History) EarliestCommit() string {
	if h.Snapshot != nil && h.Earliest == h.Snapshot.Offset && h.Earliest > 0 {
		return fmt.Sprintf("the snapshot at offset %s%s", streamcore.FormatOffset(h.Earliest), timeSuffix(h.Snapshot.UnixNano))
	}
	for _, c := range h.Commits {
		if c.Offset >= h.Earliest {
			return fmt.Sprintf("the commit at offset %s%s", streamcore.FormatOffset(c.Offset), timeSuffix(c.UnixNano))
		}
	}
	return "none: the stream holds no commit"
}

func timeSuffix(unixNano int64) string {
	if unixNano == 0 {
		return " (time not recorded)"
	}
	return " (" + time.Unix(0, unixNano).UTC().Format(time.RFC3339Nano) + ")"
}

// Point is the commit (or snapshot) an "as of" resolved to.
type Point struct {
	Offset uint64       // the stream offset to rebuild at
	Entry  HistoryEntry // the commit or snapshot at Offset
}

// Resolve turns an "as of" into a restorable offset: "" is the tail; a stream offset
// (20-digit token or plain integer) must be a commit boundary the stream can still be
// rebuilt at; an RFC 3339 time names the last commit at or before it; "-10m" (a negative
// Go duration) is that long before now. Refusals name the earliest restorable commit.
func (h *History) Resolve(at string, now time.Time) (Point, error) {
	if at == "" {
		if len(h.Commits) == 0 {
			if h.Snapshot != nil {
				return Point{Offset: h.Snapshot.Offset, Entry: *h.Snapshot}, nil
			}
			return Point{}, newError(KindNotFound, ActionFix, nil, "the stream holds no commit")
		}
		last := h.Commits[len(h.Commits)-1]
		return Point{Offset: last.Offset, Entry: last}, nil
	}
	if off, ok := parseOffsetArg(at); ok {
		return h.atOffset(off)
	}
	var t time.Time
	if strings.HasPrefix(at, "-") {
		d, err := time.ParseDuration(at[1:])
		if err != nil {
			return Point{}, newError(KindInvalidArg, ActionFix, nil, "%q is neither an offset, an RFC 3339 time nor a relative time like -10m", at)
		}
		t = now.Add(-d)
	} else {
		var err error
		if t, err = time.Parse(time.RFC3339Nano, at); err != nil {
			return Point{}, newError(KindInvalidArg, ActionFix, nil, "%q is neither an offset, an RFC 3339 time nor a relative time like -10m", at)
		}
	}
	return h.atTime(t)
}

func parseOffsetArg(s string) (uint64, bool) {
	if off, err := streamcore.ParseOffset(s); err == nil {
		return off, true
	}
	if s == "" || s[0] < '0' || s[0] > '9' {
		return 0, false
	}
	off, err := strconv.ParseUint(s, 10, 64)
	return off, err == nil
}

func (h *History) atOffset(off uint64) (Point, error) {
	if off < h.Earliest {
		return Point{}, newError(KindNotFound, ActionFix, nil, "offset %d is before what the stream retains; the earliest restorable point is %s", off, h.EarliestCommit())
	}
	if h.Snapshot != nil && off == h.Snapshot.Offset {
		return Point{Offset: off, Entry: *h.Snapshot}, nil
	}
	for _, c := range h.Commits {
		if c.Offset == off {
			return Point{Offset: off, Entry: c}, nil
		}
		if c.Offset > off {
			break
		}
	}
	if off > h.Tail {
		return Point{}, newError(KindNotFound, ActionFix, nil, "offset %d is beyond the stream tail %d", off, h.Tail)
	}
	return Point{}, newError(KindNotFound, ActionFix, nil, "offset %d is not a commit boundary (`ursula log` lists them); the earliest restorable point is %s", off, h.EarliestCommit())
}

func (h *History) atTime(t time.Time) (Point, error) {
	want := t.UnixNano()
	var best *HistoryEntry
	for i := range h.Commits {
		c := &h.Commits[i]
		if c.Offset < h.Earliest || c.UnixNano == 0 {
			continue
		}
		if c.UnixNano <= want {
			best = c
		}
	}
	if best == nil {
		if h.Snapshot != nil && h.Earliest == h.Snapshot.Offset && h.Snapshot.UnixNano != 0 && h.Snapshot.UnixNano <= want {
			return Point{Offset: h.Snapshot.Offset, Entry: *h.Snapshot}, nil
		}
		return Point{}, newError(KindNotFound, ActionFix, nil, "no retained commit was made at or before %s; the earliest restorable point is %s", t.UTC().Format(time.RFC3339Nano), h.EarliestCommit())
	}
	return Point{Offset: best.Offset, Entry: *best}, nil
}
