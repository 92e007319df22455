package vfs

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"

	"github.com/ncruces/go-sqlite3"
	sqlvfs "github.com/ncruces/go-sqlite3/vfs"

	"github.com/ursula-go/ursula/sqlitewal"
)

// vfsName is the VFS name registered with ncruces/go-sqlite3.
const vfsName = "ursula"

var registerOnce sync.Once

// ursulaVFS wraps the OS VFS: files of attached databases get the interception, every
// other file is the OS VFS's own.
type ursulaVFS struct{ os sqlvfs.VFSFilename }

func register() {
	registerOnce.Do(func() {
		sqlvfs.Register(vfsName, ursulaVFS{os: sqlvfs.Find("os").(sqlvfs.VFSFilename)})
	})
}

func (v ursulaVFS) Open(name string, flags sqlvfs.OpenFlag) (sqlvfs.File, sqlvfs.OpenFlag, error) {
	return v.os.Open(name, flags)
}

func (v ursulaVFS) OpenFilename(name *sqlvfs.Filename, flags sqlvfs.OpenFlag) (sqlvfs.File, sqlvfs.OpenFlag, error) {
	f, out, err := v.os.OpenFilename(name, flags)
	if err != nil || name == nil {
		return f, out, err
	}
	path := name.String()
	switch {
	case flags&sqlvfs.OPEN_WAL != 0:
		if db := sqlitewal.Lookup(strings.TrimSuffix(path, "-wal")); db != nil && !db.ReadOnly() {
			return &walFile{File: f, db: db, wal: db.NewWAL(f)}, out, nil
		}
	case flags&sqlvfs.OPEN_MAIN_DB != 0:
		if db := sqlitewal.Lookup(path); db != nil {
			return &dbFile{File: f, db: db}, out, nil
		}
		if why := attachFailed(path); why != "" {
			f.Close()
			logOpenRefused(path, why)
			return nil, 0, sqlite3.CANTOPEN
		}
	case flags&sqlvfs.OPEN_MAIN_JOURNAL != 0:
		db := strings.TrimSuffix(path, "-journal")
		if d := sqlitewal.Lookup(db); d != nil && !d.ReadOnly() {
			if fi, err := os.Stat(db); err == nil && fi.Size() > 0 {
				// A rollback journal means writes straight into the database file, past
				// the WAL and so past the stream: a journal_mode other than WAL.
				f.Close()
				logJournalRefused(db, "a rollback journal would write past the WAL: a replicated database must stay in WAL mode")
				return nil, 0, sqlite3.CANTOPEN
			}
		}
	}
	return f, out, nil
}

func (v ursulaVFS) Delete(name string, syncDir bool) error { return v.os.Delete(name, syncDir) }

func (v ursulaVFS) Access(name string, flags sqlvfs.AccessFlag) (bool, error) {
	return v.os.Access(name, flags)
}

func (v ursulaVFS) FullPathname(name string) (string, error) { return v.os.FullPathname(name) }

// dbFile is the main database file of an attached database: reads fail once the replica
// is fenced or poisoned; everything else is the OS file's, shared memory included. It
// offers no memory mapping, so every read of the file passes the check; a connection that
// answers from its page cache without reading is stopped by the driver (refuseStopped).
type dbFile struct {
	sqlvfs.File
	db *sqlitewal.Database
}

func (f *dbFile) ReadAt(p []byte, off int64) (int, error) {
	if err := f.db.Usable(); err != nil {
		return 0, sqlite3.IOERR_READ // fenced or poisoned: SQLITE_IOERR_READ (266)
	}
	return f.File.ReadAt(p, off)
}

func (f *dbFile) Unwrap() sqlvfs.File { return f.File }

// Pragma refuses, on an owner's file, the pragmas that would take writes past the WAL
// and so past the stream: a journal_mode other than WAL, and locking_mode=EXCLUSIVE
// (whose WAL index lives in one connection's memory). The refusal comes before SQLite
// changes anything, and is logged as journal_refused.
func (f *dbFile) Pragma(name, value string) (string, error) {
	if !f.db.ReadOnly() && value != "" {
		v := strings.ToLower(strings.Trim(value, `'"`))
		if (name == "journal_mode" && v != "wal") || (name == "locking_mode" && v == "exclusive") {
			reason := fmt.Sprintf("PRAGMA %s=%s refused: a replicated database stays in WAL mode with shared locking", name, v)
			logJournalRefused(f.db.Path(), reason)
			return "", errors.New(reason)
		}
	}
	if p, ok := f.File.(sqlvfs.FilePragma); ok {
		return p.Pragma(name, value)
	}
	return "", sqlite3.NOTFOUND
}

func (f *dbFile) SharedMemory() sqlvfs.SharedMemory {
	if s, ok := f.File.(sqlvfs.FileSharedMemory); ok {
		return s.SharedMemory()
	}
	return nil
}

func (f *dbFile) LockState() sqlvfs.LockLevel {
	if s, ok := f.File.(sqlvfs.FileLockState); ok {
		return s.LockState()
	}
	return sqlvfs.LOCK_EXCLUSIVE + 1
}

func (f *dbFile) PersistWAL() bool {
	s, ok := f.File.(sqlvfs.FilePersistWAL)
	return ok && s.PersistWAL()
}

func (f *dbFile) SetPersistWAL(keep bool) {
	if s, ok := f.File.(sqlvfs.FilePersistWAL); ok {
		s.SetPersistWAL(keep)
	}
}

func (f *dbFile) PowersafeOverwrite() bool {
	s, ok := f.File.(sqlvfs.FilePowersafeOverwrite)
	return ok && s.PowersafeOverwrite()
}

func (f *dbFile) SetPowersafeOverwrite(psow bool) {
	if s, ok := f.File.(sqlvfs.FilePowersafeOverwrite); ok {
		s.SetPowersafeOverwrite(psow)
	}
}

// walFile is the -wal file of an attached database: writes go through the
// binding-independent WAL interception, reads check that the database is still usable.
type walFile struct {
	sqlvfs.File
	db  *sqlitewal.Database
	wal *sqlitewal.WAL
}

func (w *walFile) Unwrap() sqlvfs.File { return w.File }

func (w *walFile) ReadAt(p []byte, off int64) (int, error) {
	if err := w.db.Usable(); err != nil {
		return 0, sqlite3.IOERR_READ
	}
	return w.File.ReadAt(p, off)
}

func (w *walFile) WriteAt(p []byte, off int64) (int, error) {
	n, err := w.wal.WriteAt(p, off)
	if err != nil {
		return 0, sqlite3.ExtendedErrorCode(sqlitewal.ResultCode(err))
	}
	return n, nil
}

// Sync does not reach the disk: the stream, not the -wal file, makes a commit durable
// (README, "Local files are a cache"). On the same boot a crashed process finds its
// writes in the page cache; after a reboot or power loss the sidecar's boot id no longer
// matches and the local files are rebuilt from the stream. This binding's SQLite syncs
// the WAL only before a checkpoint (WAL mode defaults to synchronous=NORMAL here); the
// extension's twin (cextension/shim.c) spares most SQLite builds, whose default FULL
// syncs it on every commit. The database file keeps its syncs (a checkpoint's).
func (w *walFile) Sync(flags sqlvfs.SyncFlag) error { return nil }

func (w *walFile) Truncate(size int64) error {
	w.wal.Truncate()
	return w.File.Truncate(size)
}

// logJournalRefused writes the journal_refused event of an owner's file a connection
// tried to take out of WAL mode.
func logJournalRefused(path, reason string) {
	fmt.Fprintf(os.Stderr, "sqlite-ursula-vfs level=warn event=journal_refused file=%q reason=%q\n", path, reason)
}
