//go:build cgo

package mattnvfs

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"sync"

	_ "github.com/mattn/go-sqlite3" // the SQLite the VFS registers with
	"github.com/psanford/sqlite3vfs"

	"github.com/ursula-go/ursula/client"
	"github.com/ursula-go/ursula/lazy"
)

var (
	regMu   sync.Mutex
	regPool *lazy.Pool
)

// Register registers the "ursula-lazy" VFS with the process's SQLite (once; later calls
// do nothing and return nil). c is the client every lazy open uses (nil: a default one).
func Register(c *client.Client) error {
	regMu.Lock()
	defer regMu.Unlock()
	if regPool != nil {
		return nil
	}
	p := &lazy.Pool{Client: c}
	if err := sqlite3vfs.RegisterVFS(lazy.VFSName, &lazyVFS{pool: p}); err != nil {
		return fmt.Errorf("ursula: register the %s VFS: %w", lazy.VFSName, err)
	}
	regPool = p
	return nil
}

// DSN returns the mattn data source name that opens streamURL lazily and read-only: at
// the tail when at is "" (else at that offset), following the stream when follow is set.
func DSN(streamURL, at string, follow bool) string {
	q := "vfs=" + lazy.VFSName + "&mode=ro&url=" + escape(streamURL)
	if at != "" {
		q += "&at=" + escape(at)
	}
	if follow {
		q += "&follow=1"
	}
	return "file:ursula-lazy.db?" + q
}

// escape percent-encodes what SQLite's URI parser would otherwise take apart.
func escape(s string) string {
	return strings.NewReplacer("%", "%25", "&", "%26", "#", "%23", "?", "%3F", "=", "%3D", " ", "%20").Replace(s)
}

// lazyVFS is the "ursula-lazy" VFS: its main databases are lazy Files; anything else
// SQLite opens through it (temporary files of sorts) is a local temporary file.
type lazyVFS struct {
	pool *lazy.Pool
}

func (v *lazyVFS) Open(name string, flags sqlite3vfs.OpenFlag) (sqlite3vfs.File, sqlite3vfs.OpenFlag, error) {
	return v.OpenURI(name, nil, flags)
}

func (v *lazyVFS) OpenURI(name string, params map[string]string, flags sqlite3vfs.OpenFlag) (sqlite3vfs.File, sqlite3vfs.OpenFlag, error) {
	if flags&sqlite3vfs.OpenMainDB == 0 {
		if flags&(sqlite3vfs.OpenTempDB|sqlite3vfs.OpenTempJournal|sqlite3vfs.OpenSubJournal|sqlite3vfs.OpenTransientDB) == 0 {
			// A journal or WAL of the main database: it has none and writes none.
			return nil, flags, sqlite3vfs.CantOpenError
		}
		f, err := os.CreateTemp("", "ursula-lazy-tmp-*")
		if err != nil {
			return nil, flags, sqlite3vfs.CantOpenError
		}
		os.Remove(f.Name())
		return &tempFile{f: f}, flags, nil
	}
	streamURL, opts, err := lazy.ParseURI(func(k string) string { return params[k] })
	if err != nil {
		fmt.Fprintf(os.Stderr, "ursula: lazy open of %s refused: %v\n", name, err)
		return nil, flags, sqlite3vfs.CantOpenError
	}
	src, err := v.pool.Acquire(context.Background(), streamURL, opts)
	if err != nil {
		fmt.Fprintf(os.Stderr, "ursula: lazy open of %s failed: %v\n", streamURL, err)
		return nil, flags, sqlite3vfs.CantOpenError
	}
	// Read-only whatever was asked: SQLite then refuses writes itself.
	out := flags&^(sqlite3vfs.OpenReadWrite|sqlite3vfs.OpenCreate) | sqlite3vfs.OpenReadOnly
	return &mainFile{f: src.NewFile(), src: src, pool: v.pool}, out, nil
}

func (v *lazyVFS) Delete(name string, dirSync bool) error {
	return sqlite3vfs.ReadOnlyError
}

// Access answers that no journal or WAL exists beside a lazy database.
func (v *lazyVFS) Access(name string, flags sqlite3vfs.AccessFlag) (bool, error) {
	return false, nil
}

func (v *lazyVFS) FullPathname(name string) string { return name }

// mainFile is a lazy database's main file.
type mainFile struct {
	f     *lazy.File
	src   *lazy.Source
	pool  *lazy.Pool
	lock  sqlite3vfs.LockType
	close sync.Once
}

func (m *mainFile) Close() error {
	m.close.Do(func() { m.pool.Release(m.src) })
	return nil
}

func (m *mainFile) ReadAt(p []byte, off int64) (int, error) {
	n, err := m.f.ReadAt(p, off)
	if err != nil && !errors.Is(err, io.EOF) {
		fmt.Fprintf(os.Stderr, "ursula: lazy read at %d: %v\n", off, err)
		return n, sqlite3vfs.IOErrorRead
	}
	if n < len(p) {
		return n, sqlite3vfs.IOErrorShortRead
	}
	return n, nil
}

func (m *mainFile) WriteAt(p []byte, off int64) (int, error) { return 0, sqlite3vfs.ReadOnlyError }
func (m *mainFile) Truncate(size int64) error                { return sqlite3vfs.ReadOnlyError }
func (m *mainFile) Sync(flag sqlite3vfs.SyncType) error      { return nil }
func (m *mainFile) FileSize() (int64, error)                 { return m.f.Size(), nil }
func (m *mainFile) CheckReservedLock() (bool, error)         { return false, nil }
func (m *mainFile) SectorSize() int64                        { return 4096 }

func (m *mainFile) Lock(l sqlite3vfs.LockType) error {
	if l > sqlite3vfs.LockShared {
		return sqlite3vfs.ReadOnlyError
	}
	if m.lock == sqlite3vfs.LockNone && l == sqlite3vfs.LockShared {
		m.f.LockShared()
	}
	m.lock = max(m.lock, l)
	return nil
}

func (m *mainFile) Unlock(l sqlite3vfs.LockType) error {
	m.lock = min(m.lock, l)
	if l == sqlite3vfs.LockNone {
		m.f.Unlock()
	}
	return nil
}

func (m *mainFile) DeviceCharacteristics() sqlite3vfs.DeviceCharacteristic {
	if !m.f.Live() {
		// Nothing changes under a fixed view: SQLite may skip re-checking page 1.
		return sqlite3vfs.IocapImmutable
	}
	return 0
}

// tempFile is a temporary file SQLite opens through the VFS (a sort's spill).
type tempFile struct{ f *os.File }

func (t *tempFile) Close() error { return t.f.Close() }
func (t *tempFile) ReadAt(p []byte, off int64) (int, error) {
	n, err := t.f.ReadAt(p, off)
	if n < len(p) && errors.Is(err, io.EOF) {
		return n, sqlite3vfs.IOErrorShortRead
	}
	return n, err
}
func (t *tempFile) WriteAt(p []byte, off int64) (int, error)               { return t.f.WriteAt(p, off) }
func (t *tempFile) Truncate(size int64) error                              { return t.f.Truncate(size) }
func (t *tempFile) Sync(flag sqlite3vfs.SyncType) error                    { return nil }
func (t *tempFile) Lock(l sqlite3vfs.LockType) error                       { return nil }
func (t *tempFile) Unlock(l sqlite3vfs.LockType) error                     { return nil }
func (t *tempFile) CheckReservedLock() (bool, error)                       { return false, nil }
func (t *tempFile) SectorSize() int64                                      { return 4096 }
func (t *tempFile) DeviceCharacteristics() sqlite3vfs.DeviceCharacteristic { return 0 }
func (t *tempFile) FileSize() (int64, error) {
	fi, err := t.f.Stat()
	if err != nil {
		return 0, err
	}
	return fi.Size(), nil
}
