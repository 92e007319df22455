package sqlitewal

import (
	"context"
	"encoding/binary"
	"fmt"
	"sort"

	"github.com/ursula-go/ursula/replicator"
)

// WALFile is the -wal file underneath the interception: the adapter's own OS file
// (ncruces' OS VFS file, or SQLite's unix file behind the C shim).
type WALFile interface {
	ReadAt(p []byte, off int64) (int, error)
	WriteAt(p []byte, off int64) (int, error)
}

// WAL intercepts the writes of one open handle of an attached database's -wal file. It is
// binding-independent: each adapter forwards its WAL writes here and keeps reads, locks
// and shared memory to itself.
//
// Writes pass through to the file except the commit frame (the frame whose "database size
// after commit" field is non-zero). That frame is held: once it is complete, the
// transaction's frames (read back from the file, between the previous commit frame and
// this one, last image of each page winning) become one commit record, and only after the
// server acknowledged it does the commit frame reach the file. Until then the
// transaction's other frames are invisible: SQLite (its recovery, and every other
// connection through the wal-index) only trusts frames up to a valid commit frame. A
// refused commit returns an error; SQLite rolls back and overwrites those frames later.
//
// This departs from a per-transaction overlay held in memory: letting non-commit frames
// through keeps reads of spilled pages inside the adapter (the C shim never calls Go for
// a read) and keeps memory flat for large transactions, with the same guarantee.
type WAL struct {
	file     WALFile
	db       *Database
	held     []write // writes of the pending commit frame
	commit   int64   // offset of the pending commit frame; -1 when none
	pageSize int64

	// Buffers reused from one commit to the next (a commit's record is built from them
	// and nothing keeps them once Commit returns): the held writes' bytes, the assembled
	// commit frame, and the frames read back.
	heldBytes []byte
	frame     []byte
	readBack  [][]byte
}

type write struct {
	off  int64
	data []byte
}

// NewWAL intercepts writes to f, a -wal handle of db.
func (db *Database) NewWAL(f WALFile) *WAL {
	return &WAL{file: f, db: db, commit: -1, pageSize: int64(db.pageSize)}
}

func (w *WAL) frameSize() int64 { return replicator.WALFrameHeaderSize + w.pageSize }

// WriteAt is the adapter's xWrite on the -wal file.
func (w *WAL) WriteAt(p []byte, off int64) (int, error) {
	if err := w.db.Usable(); err != nil {
		return 0, err
	}
	fs := w.frameSize()
	isCommitHeader := off >= replicator.WALHeaderSize && (off-replicator.WALHeaderSize)%fs == 0 &&
		len(p) >= replicator.WALFrameHeaderSize && binary.BigEndian.Uint32(p[4:8]) != 0
	if w.commit < 0 && !isCommitHeader {
		return w.file.WriteAt(p, off)
	}
	if w.commit < 0 {
		w.commit = off
	}
	// The held bytes share one buffer. An append that moves it leaves the earlier writes
	// where they were, in the old array, which nothing else writes to.
	n := len(w.heldBytes)
	w.heldBytes = append(w.heldBytes, p...)
	w.held = append(w.held, write{off, w.heldBytes[n:len(w.heldBytes):len(w.heldBytes)]})
	if w.covered(w.commit, w.commit+fs) {
		if err := w.commitTx(); err != nil {
			return 0, err
		}
	}
	return len(p), nil
}

// Truncate is the adapter's xTruncate: a pending commit frame does not survive it.
func (w *WAL) Truncate() { w.reset() }

// covered reports whether the held writes hold every byte of [lo, hi).
func (w *WAL) covered(lo, hi int64) bool {
	for lo < hi {
		progressed := false
		for _, wr := range w.held {
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

func (w *WAL) reset() {
	w.held, w.heldBytes, w.commit = w.held[:0], w.heldBytes[:0], -1
	if len(w.readBack) > keptReadBack {
		// A large transaction's pages are not kept for the next commit.
		clear(w.readBack[keptReadBack:])
		w.readBack = w.readBack[:keptReadBack]
	}
}

// keptReadBack is how many read-back frame buffers a WAL keeps between commits.
const keptReadBack = 64

// heldFrame assembles the pending commit frame from the held writes.
func (w *WAL) heldFrame() []byte {
	if int64(cap(w.frame)) < w.frameSize() {
		w.frame = make([]byte, w.frameSize())
	}
	frame := w.frame[:w.frameSize()]
	clear(frame)
	for _, wr := range w.held {
		lo, hi := max(wr.off, w.commit), min(wr.off+int64(len(wr.data)), w.commit+int64(len(frame)))
		if lo < hi {
			copy(frame[lo-w.commit:], wr.data[lo-wr.off:hi-wr.off])
		}
	}
	return frame
}

// commitTx appends the transaction ending at the held commit frame and, on
// acknowledgement, writes the held frame.
func (w *WAL) commitTx() error {
	defer w.reset()
	fs, ps := w.frameSize(), w.pageSize
	last := w.heldFrame()
	dbPages := binary.BigEndian.Uint32(last[4:8])
	salt := last[8:16]
	pages := map[uint32][]byte{binary.BigEndian.Uint32(last[0:4]): last[replicator.WALFrameHeaderSize:]}
	// The transaction's other frames lie between the previous commit frame (or the WAL
	// header) and this one; walk back, the first image of a page seen is its last.
	used := 0 // frames of w.readBack that hold a page of this commit
	for off := w.commit - fs; off >= replicator.WALHeaderSize; off -= fs {
		if used == len(w.readBack) {
			w.readBack = append(w.readBack, make([]byte, fs)) // fs is fixed: the page size is the WAL's
		}
		buf := w.readBack[used]
		if n, err := w.file.ReadAt(buf, off); n != len(buf) {
			_ = err
			return errIORead
		}
		if prev := w.db.lastAck.Load(); prev != nil && prev.off == off && string(prev.hdr[8:16]) == string(salt) &&
			string(buf[:replicator.WALFrameHeaderSize]) != string(prev.hdr[:]) {
			// The same WAL generation, but the acknowledged commit frame is gone: the
			// file lost its write-back, and this commit would build on a state the
			// stream does not hold.
			w.db.replica.Poison(fmt.Sprintf("the local WAL lost the write-back of the commit frame acknowledged at WAL offset %d", off))
			return errIOWrite
		}
		if binary.BigEndian.Uint32(buf[4:8]) != 0 || string(buf[8:16]) != string(salt) {
			break // the previous transaction's commit frame, or an older WAL generation
		}
		no := binary.BigEndian.Uint32(buf[0:4])
		if _, seen := pages[no]; !seen {
			pages[no] = buf[replicator.WALFrameHeaderSize:]
			used++
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
		return err
	}
	for _, wr := range w.held {
		if _, err := w.file.WriteAt(wr.data, wr.off); err != nil {
			// Acknowledged but not local: the file no longer reflects the stream.
			w.db.replica.Poison("local WAL write failed after the commit was acknowledged: " + err.Error())
			return errIOWrite
		}
	}
	ack := &ackedFrame{off: w.commit}
	copy(ack.hdr[:], last)
	w.db.lastAck.Store(ack)
	return nil
}

// ackedFrame is the header of an acknowledged commit frame and its WAL offset.
type ackedFrame struct {
	off int64
	hdr [replicator.WALFrameHeaderSize]byte
}
