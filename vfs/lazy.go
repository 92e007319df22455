package vfs

import (
	"context"
	"database/sql"
	sqldriver "database/sql/driver"
	"fmt"
	"io"
	"strings"

	"github.com/ncruces/go-sqlite3"
	"github.com/ncruces/go-sqlite3/driver"
	sqlvfs "github.com/ncruces/go-sqlite3/vfs"

	"github.com/ursula-go/ursula/lazy"
	"github.com/ursula-go/ursula/replicator"
)

// A lazy open (Options{ReadOnly: true, Lazy: true}) reads pages from the stream on demand
// through package lazy: no local copy, the first query needs only the pages it touches.
//
// Each lazy database gets its own registered VFS (named after its source), whose only
// file is the main database; anything else SQLite opens (temporary files for sorts) goes
// to the OS VFS. The file takes no shared memory and no WAL: page 1 reads as rollback
// mode, and a read transaction pins a lazy.View when it takes its SHARED lock and drops it
// on the last unlock, so it reads one consistent offset however the stream moves on. The
// file change counter of page 1 reads as the view's offset, so a connection starting a
// new transaction on a newer view drops its page cache.

// openLazy opens the stream at streamURL lazily, read-only.
func openLazy(streamURL string, opts Options) (*sql.DB, error) {
	if err := replicator.CheckURL(streamURL); err != nil {
		return nil, err
	}
	src, err := lazy.Open(context.Background(), streamURL, lazy.Options{
		Client: opts.Client, At: opts.At, Follow: opts.Follow, CacheBytes: opts.LazyCacheBytes})
	if err != nil {
		return nil, err
	}
	name := fmt.Sprintf("ursula-lazy-%p", src)
	sqlvfs.Register(name, &lazyVFS{src: src, os: sqlvfs.Find("os"), live: opts.Follow})
	dsn := "file:/ursula-lazy.db?mode=ro&vfs=" + name
	inner, err := (&driver.SQLite{}).OpenConnector(dsn)
	if err != nil {
		sqlvfs.Unregister(name)
		src.Close()
		return nil, err
	}
	sdb := sql.OpenDB(&lazyConnector{Connector: inner, src: src, name: name})
	if err := sdb.Ping(); err != nil {
		sdb.Close()
		return nil, err
	}
	return sdb, nil
}

// lazyConnector closes the source and unregisters its VFS when the *sql.DB closes.
type lazyConnector struct {
	sqldriver.Connector
	src  *lazy.Source
	name string
}

func (c *lazyConnector) Close() error {
	sqlvfs.Unregister(c.name)
	return c.src.Close()
}

type lazyVFS struct {
	src  *lazy.Source
	os   sqlvfs.VFS
	live bool // the source follows the stream: views move on between transactions
}

func (v *lazyVFS) Open(name string, flags sqlvfs.OpenFlag) (sqlvfs.File, sqlvfs.OpenFlag, error) {
	if flags&sqlvfs.OPEN_MAIN_DB == 0 {
		return v.os.Open(name, flags)
	}
	if flags&sqlvfs.OPEN_READWRITE != 0 || flags&sqlvfs.OPEN_CREATE != 0 {
		return nil, flags, sqlite3.READONLY
	}
	return &lazyFile{f: v.src.NewFile(), live: v.live}, flags | sqlvfs.OPEN_READONLY, nil
}

func (v *lazyVFS) Delete(name string, syncDir bool) error {
	if strings.HasPrefix(name, "/ursula-lazy.db") {
		return sqlite3.READONLY
	}
	return v.os.Delete(name, syncDir)
}

func (v *lazyVFS) Access(name string, flags sqlvfs.AccessFlag) (bool, error) {
	if strings.HasPrefix(name, "/ursula-lazy.db") {
		return name == "/ursula-lazy.db", nil // no journal, no WAL
	}
	return v.os.Access(name, flags)
}

func (v *lazyVFS) FullPathname(name string) (string, error) {
	if strings.HasPrefix(name, "/ursula-lazy.db") {
		return name, nil
	}
	return v.os.FullPathname(name)
}

// lazyFile is the main database file of a lazy database: lazy.File (the file as SQLite
// sees it, shared with the cgo adapters) plus the lock level and SQLite's error codes.
type lazyFile struct {
	f    *lazy.File
	live bool
	lock sqlvfs.LockLevel
}

func (f *lazyFile) ReadAt(p []byte, off int64) (int, error) {
	n, err := f.f.ReadAt(p, off)
	if err != nil && err != io.EOF {
		return n, sqlite3.IOERR_READ
	}
	return n, err
}

func (f *lazyFile) Size() (int64, error) { return f.f.Size(), nil }

func (f *lazyFile) Lock(l sqlvfs.LockLevel) error {
	if l > sqlvfs.LOCK_SHARED {
		return sqlite3.READONLY
	}
	if f.lock == sqlvfs.LOCK_NONE && l >= sqlvfs.LOCK_SHARED {
		f.f.LockShared()
	}
	f.lock = max(f.lock, l)
	return nil
}

func (f *lazyFile) Unlock(l sqlvfs.LockLevel) error {
	f.lock = min(f.lock, l)
	if l == sqlvfs.LOCK_NONE {
		f.f.Unlock()
	}
	return nil
}

func (f *lazyFile) Close() error                             { return nil }
func (f *lazyFile) WriteAt(p []byte, off int64) (int, error) { return 0, sqlite3.READONLY }
func (f *lazyFile) Truncate(size int64) error                { return sqlite3.READONLY }
func (f *lazyFile) Sync(flags sqlvfs.SyncFlag) error         { return nil }
func (f *lazyFile) CheckReservedLock() (bool, error)         { return false, nil }
func (f *lazyFile) SectorSize() int                          { return 4096 }
func (f *lazyFile) LockState() sqlvfs.LockLevel              { return f.lock }

func (f *lazyFile) DeviceCharacteristics() sqlvfs.DeviceCharacteristic {
	if !f.live {
		// Nothing changes under a fixed view: SQLite may skip re-checking page 1.
		return sqlvfs.IOCAP_IMMUTABLE
	}
	return 0
}
