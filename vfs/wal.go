package vfs

import (
	"context"
	"encoding/binary"
	"sort"

	"github.com/ncruces/go-sqlite3"
	sqlvfs "github.com/ncruces/go-sqlite3/vfs"

	"github.com/ursula-go/ursula/replicator"
)

// WAL layout (https://sqlite.org/fileformat2.html#walformat): a 32-byte header, then
// frames of a 24-byte header (page number, database size after commit or 0, salts,
// checksums) followed by one page.
const (
	walHeaderSize      = 32
	walFrameHeaderSize = 24
)

// write is one WriteAt held back until its transaction is acknowledged.
type write struct {
	off  int64
	data []byte
}

// walFile intercepts the -wal file of an attached database. Writes go to a
// per-transaction overlay that reads see; the write that completes the commit frame (a
// frame header whose "database size after commit" is non-zero) is the commit point: the
// transaction's final page images become one record appended to the stream, and only
// after the server acknowledged it does the overlay reach the local WAL. A refused commit
// returns an I/O error, SQLite rolls back, and nothing of it stays local.
type walFile struct {
	sqlvfs.File
	db      *database
	overlay []write
	end     int64 // end of the overlay's furthest write
	commit  int64 // offset of the pending commit frame header; -1 when none
}

func newWALFile(f sqlvfs.File, db *database) *walFile {
	return &walFile{File: f, db: db, commit: -1}
}

// Unwrap gives ncruces the OS file behind the overlay.
func (w *walFile) Unwrap() sqlvfs.File { return w.File }

func (w *walFile) pageSize() int64 { return int64(w.db.pageSize) }

func (w *walFile) frameSize() int64 { return walFrameHeaderSize + w.pageSize() }

// ReadAt reads the local WAL with the overlay on top.
func (w *walFile) ReadAt(p []byte, off int64) (int, error) {
	if err := w.db.usable(); err != nil {
		return 0, err
	}
	n, err := w.File.ReadAt(p, off)
	if len(w.overlay) == 0 {
		return n, err
	}
	top := off + int64(len(p))
	for _, wr := range w.overlay {
		lo, hi := max(off, wr.off), min(top, wr.off+int64(len(wr.data)))
		if lo < hi {
			copy(p[lo-off:hi-off], wr.data[lo-wr.off:hi-wr.off])
			n = max(n, int(hi-off))
		}
	}
	if n == len(p) {
		err = nil
	}
	return n, err
}

// Size includes the overlay.
func (w *walFile) Size() (int64, error) {
	n, err := w.File.Size()
	return max(n, w.end), err
}

// WriteAt adds to the overlay and commits at the commit point.
func (w *walFile) WriteAt(p []byte, off int64) (int, error) {
	if err := w.db.usable(); err != nil {
		return 0, err
	}
	w.overlay = append(w.overlay, write{off, append([]byte(nil), p...)})
	w.end = max(w.end, off+int64(len(p)))
	fs := w.frameSize()
	if off >= walHeaderSize && (off-walHeaderSize)%fs == 0 && len(p) >= walFrameHeaderSize &&
		binary.BigEndian.Uint32(p[4:8]) != 0 {
		w.commit = off
	}
	if w.commit >= 0 && w.covered(w.commit, w.commit+fs) {
		if err := w.commitOverlay(); err != nil {
			return 0, err
		}
	}
	return len(p), nil
}

// covered reports whether the overlay holds every byte of [lo, hi).
func (w *walFile) covered(lo, hi int64) bool {
	for lo < hi {
		progressed := false
		for _, wr := range w.overlay {
			if wr.off <= lo && lo < wr.off+int64(len(wr.data)) {
				lo = wr.off + int64(len(wr.data))
				progressed = true
			}
		}
		if !progressed {
			return false
		}
	}
	return true
}

// commitOverlay turns the frames up to the commit frame into one record, appends it, and
// on acknowledgement writes the overlay to the local WAL.
func (w *walFile) commitOverlay() error {
	fs, ps := w.frameSize(), w.pageSize()
	commitEnd := w.commit + fs
	frames := map[int64]bool{} // start offsets of the frames this transaction wrote
	for _, wr := range w.overlay {
		lo, hi := max(wr.off, walHeaderSize), min(wr.off+int64(len(wr.data)), commitEnd)
		for i := (lo - walHeaderSize) / fs; lo < hi && walHeaderSize+i*fs < hi; i++ {
			frames[walHeaderSize+i*fs] = true
		}
	}
	offs := make([]int64, 0, len(frames))
	for off := range frames {
		offs = append(offs, off)
	}
	sort.Slice(offs, func(i, j int) bool { return offs[i] < offs[j] })
	pages := map[uint32][]byte{}
	buf := make([]byte, fs)
	var dbPages uint32
	for _, off := range offs {
		if _, err := w.ReadAt(buf, off); err != nil {
			w.reset()
			return sqlite3.IOERR_READ
		}
		pages[binary.BigEndian.Uint32(buf[0:4])] = append([]byte(nil), buf[walFrameHeaderSize:walFrameHeaderSize+ps]...)
		if off == w.commit {
			dbPages = binary.BigEndian.Uint32(buf[4:8])
		}
	}
	cm := &replicator.Commit{PageSize: uint32(ps), DBPages: dbPages}
	for no, data := range pages {
		if no <= dbPages {
			cm.Pages = append(cm.Pages, replicator.Page{No: no, Data: data})
		}
	}
	sort.Slice(cm.Pages, func(i, j int) bool { return cm.Pages[i].No < cm.Pages[j].No })
	if err := w.db.replica.Commit(context.Background(), cm); err != nil {
		w.reset()
		return sqliteError(err)
	}
	for _, wr := range w.overlay {
		if wr.off >= commitEnd {
			continue // frames of a rolled-back spill beyond this commit
		}
		if _, err := w.File.WriteAt(wr.data, wr.off); err != nil {
			// Acknowledged but not local: the file no longer reflects the stream.
			w.db.replica.Poison("local WAL write failed after the commit was acknowledged")
			w.reset()
			return sqlite3.IOERR_WRITE
		}
	}
	w.reset()
	return nil
}

func (w *walFile) reset() {
	w.overlay, w.end, w.commit = nil, 0, -1
}

// Truncate drops overlay bytes past size too.
func (w *walFile) Truncate(size int64) error {
	if size == 0 {
		w.reset()
	}
	return w.File.Truncate(size)
}

// sqliteError maps a replicator error to the SQLite result code of checklist-vfs V: a
// refused commit is SQLITE_IOERR_AUTH and leaves the file usable.
func sqliteError(err error) error {
	if e, ok := replicator.AsError(err); ok {
		switch e.Kind {
		case replicator.KindNotApplied, replicator.KindTooLarge, replicator.KindFenced:
			return sqlite3.IOERR_AUTH
		}
	}
	return sqlite3.IOERR_WRITE
}
