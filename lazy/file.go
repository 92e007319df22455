package lazy

import (
	"context"
	"encoding/binary"
	"io"
	"sync"
)

// File is the main database file of a lazy database as a SQLite VFS presents it (the
// cgo adapter lazy/mattnvfs and the loadable extension's ursula-lazy VFS read through
// it): read-only, no journal, no WAL, no shared memory.
//
// A read transaction pins a View when it takes its SHARED lock (LockShared) and drops it
// on the last unlock (Unlock), so it reads one consistent offset however the stream moves
// on. Page 1 reads as a rollback-mode database whose file change counter is the view's
// offset, so a connection starting a new transaction on a newer view drops its page cache.
type File struct {
	src  *Source
	mu   sync.Mutex
	view *View // pinned while a SHARED lock is held
}

// NewFile returns a file reading s; it holds no lock.
func (s *Source) NewFile() *File { return &File{src: s} }

// Live reports whether the views move on between transactions (the source follows the
// stream). A file that is not live never changes: a VFS may call it immutable.
func (f *File) Live() bool { return f.src.opts.Follow }

// current is the pinned view, or the latest one outside a transaction.
func (f *File) current() *View {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.view != nil {
		return f.view
	}
	return f.src.View()
}

// ReadAt reads the database bytes at off. Past the end it returns io.EOF with the bytes
// read so far (SQLite zero-fills a short read).
func (f *File) ReadAt(p []byte, off int64) (int, error) {
	v := f.current()
	ps := int64(v.PageSize())
	size := ps * int64(v.DBPages())
	n := 0
	for n < len(p) {
		pos := off + int64(n)
		if pos >= size {
			return n, io.EOF
		}
		no := uint32(pos/ps) + 1
		page, err := v.ReadPage(context.Background(), no)
		if err != nil {
			return n, err
		}
		in := pos % ps
		c := copy(p[n:], page[in:])
		if no == 1 {
			PatchHeader(p[n:n+c], in, v.Offset(), v.DBPages())
		}
		n += c
	}
	return n, nil
}

// Size is the database size in bytes as of the pinned (or latest) view.
func (f *File) Size() int64 {
	v := f.current()
	return int64(v.PageSize()) * int64(v.DBPages())
}

// LockShared pins the latest view, unless one is pinned already.
func (f *File) LockShared() {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.view == nil {
		f.view = f.src.View()
	}
}

// Unlock drops the pinned view: the next transaction reads the latest one.
func (f *File) Unlock() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.view = nil
}

// PatchHeader makes the bytes of page 1 from byte in on (held in b) read as a
// rollback-mode database whose change counter is derived from offset and whose size is
// dbPages pages.
func PatchHeader(b []byte, in int64, offset uint64, dbPages uint32) {
	var counter [4]byte
	binary.BigEndian.PutUint32(counter[:], uint32(offset)^uint32(offset>>32))
	var size [4]byte
	binary.BigEndian.PutUint32(size[:], dbPages)
	for _, w := range []struct {
		at  int64
		val []byte
	}{{18, []byte{1, 1}}, {24, counter[:]}, {28, size[:]}, {92, counter[:]}} {
		for i, c := range w.val {
			if j := w.at + int64(i) - in; j >= 0 && j < int64(len(b)) {
				b[j] = c
			}
		}
	}
}
