package vfs

import (
	"database/sql"
	"fmt"
	"net/url"
	"path/filepath"
	"strings"
	"time"

	"github.com/ncruces/go-sqlite3"
	"github.com/ncruces/go-sqlite3/driver"

	"github.com/ursula-go/ursula/client"
	"github.com/ursula-go/ursula/replicator"
	"github.com/ursula-go/ursula/sqlitewal"
)

// Error is the typed error of a replicated database: errors.As(err, &e) with e a
// *vfs.Error gives its Kind and Action (retry, reattach, stop, fix).
type Error = replicator.Error

// Options configure Open.
type Options struct {
	// Path of the local database file. Empty: <label>-<hash>.db in the user's cache
	// directory, named after the stream URL.
	Path string
	// ReadOnly rebuilds the file from the stream and opens it without claiming it.
	ReadOnly bool
	// Client overrides the HTTP client (tokens, transport).
	Client *client.Client
	// Follow makes a read-only replica that follows the stream live: the file is rebuilt
	// from the stream, then a background applier applies each new commit between read
	// transactions (a read transaction keeps its snapshot), until the *sql.DB is closed.
	// It implies ReadOnly: it claims nothing and never writes the stream. FollowStatus
	// (and Status) report how far it got and why it stopped, if it did.
	Follow bool

	// Lazy (with ReadOnly) opens the database without a local copy: pages are fetched
	// from the stream's latest snapshot and log on demand (package lazy), into a page
	// cache of LazyCacheBytes (0: 64 MiB). With Follow it reads the live tail; a read
	// transaction keeps the offset it began at.
	Lazy bool
	// At (with Lazy) reads the database as of this stream offset, a record boundary;
	// 0: the tail.
	At uint64
	// LazyCacheBytes bounds the page cache of a lazy open; 0: 64 MiB.
	LazyCacheBytes int64

	followReadBytes int           // how much one read of a follower asks for; 0: the server's cap (tests lower it)
	attemptLimit    time.Duration // bound of one commit attempt; 0: 10 s (tests shorten it)
}

// Open attaches the database at opts.Path to the stream at streamURL and returns it as a
// *sql.DB. Attaching rebuilds the local file from the stream (the local file is a cache)
// and, unless ReadOnly, claims the stream: from then on a commit returns only after the
// server acknowledged it, and an older owner is fenced. A second process on the same file
// gets an in_use error. Only WAL mode with 4 KiB pages is supported.
func Open(streamURL string, opts Options) (*sql.DB, error) {
	if opts.Lazy {
		if !opts.ReadOnly {
			return nil, &Error{Kind: replicator.KindInvalidArg, Action: replicator.ActionFix, Message: "a lazy open is read-only: set ReadOnly too"}
		}
		return openLazy(streamURL, opts)
	}
	if opts.At != 0 {
		return nil, &Error{Kind: replicator.KindInvalidArg, Action: replicator.ActionFix, Message: "At needs Lazy (a full read-only copy is rebuilt at the tail)"}
	}
	if opts.Follow {
		return openFollower(streamURL, opts)
	}
	if err := replicator.CheckURL(streamURL); err != nil {
		return nil, err
	}
	path, err := localPath(streamURL, opts.Path)
	if err != nil {
		return nil, err
	}
	register()
	var db *sqlitewal.Database
	if opts.ReadOnly && opts.Path == "" {
		path, db, err = attachReadOnlySlot(path, streamURL, opts)
	} else {
		db, err = sqlitewal.Attach(path, streamURL, sqlitewal.AttachOptions{ReadOnly: opts.ReadOnly, Client: opts.Client, AttemptLimit: opts.attemptLimit})
	}
	noteAttach(path, err)
	if err != nil {
		return nil, err
	}
	dsn := "file:" + (&url.URL{Path: path}).EscapedPath() + "?vfs=" + vfsName
	if opts.ReadOnly {
		dsn += "&mode=ro"
	}
	inner, err := (&driver.SQLite{}).OpenConnector(dsn)
	if err != nil {
		db.Detach()
		return nil, err
	}
	sdb := sql.OpenDB(&connector{inner: inner, db: db, readOnly: opts.ReadOnly})
	if err := sdb.Ping(); err != nil {
		sdb.Close()
		db.Detach()
		return nil, err
	}
	return sdb, nil
}

// setupConn enforces WAL mode and 4 KiB pages on every connection.
func setupConn(c *sqlite3.Conn, readOnly bool) error {
	if readOnly {
		return nil
	}
	if err := c.Exec(`PRAGMA page_size=4096; PRAGMA journal_mode=WAL`); err != nil {
		return err
	}
	stmt, _, err := c.Prepare(`SELECT * FROM pragma_page_size, pragma_journal_mode`)
	if err != nil {
		return err
	}
	defer stmt.Close()
	if !stmt.Step() {
		return stmt.Err()
	}
	if ps, mode := stmt.ColumnInt(0), stmt.ColumnText(1); ps != 4096 || mode != "wal" {
		return &Error{Kind: replicator.KindUnsupported, Action: replicator.ActionFix,
			Message: fmt.Sprintf("replicated databases need WAL mode and 4096-byte pages; this one has %s mode and %d-byte pages", mode, ps)}
	}
	return nil
}

// Status reports the replication state of an attached database file of this process.
func Status(path string) (replicator.Status, error) {
	abs, err := filepath.Abs(path)
	if err != nil {
		return replicator.Status{}, err
	}
	if f := lookupFollower(abs); f != nil {
		return f.status(), nil
	}
	db := sqlitewal.Lookup(abs)
	if db == nil {
		if why := attachFailed(abs); why != "" {
			return replicator.Status{}, lockedOut(abs, why)
		}
		return replicator.Status{}, &Error{Kind: replicator.KindNotFound, Action: replicator.ActionFix, Message: fmt.Sprintf("%s is not attached in this process", path)}
	}
	if db.ReadOnly() {
		return replicator.Status{URL: db.URL()}, nil
	}
	return db.Replica().Status(), nil
}

// Stats drains the measurements of an attached database file of this process
// (checklist-vfs R): see replicator.Stats. A read-only or following file has none.
func Stats(path string) (replicator.Stats, error) {
	abs, err := filepath.Abs(path)
	if err != nil {
		return replicator.Stats{}, err
	}
	if lookupFollower(abs) != nil {
		return replicator.Stats{}, nil
	}
	db := sqlitewal.Lookup(abs)
	if db == nil {
		return replicator.Stats{}, &Error{Kind: replicator.KindNotFound, Action: replicator.ActionFix, Message: fmt.Sprintf("%s is not attached in this process", path)}
	}
	if db.ReadOnly() {
		return replicator.Stats{}, nil
	}
	return db.Replica().DrainStats(), nil
}

// attachReadOnlySlot attaches a read-only copy under the default name: <name>-ro1.db up
// to -ro8.db, the first not held by another reader (checklist-vfs H59), so readers run
// beside the owner and each other.
func attachReadOnlySlot(ownerPath, streamURL string, opts Options) (string, *sqlitewal.Database, error) {
	stem := strings.TrimSuffix(ownerPath, ".db")
	for n := 1; n <= 8; n++ {
		p := fmt.Sprintf("%s-ro%d.db", stem, n)
		if sqlitewal.Lookup(p) != nil {
			continue // a reader of this process holds it
		}
		db, err := sqlitewal.Attach(p, streamURL, sqlitewal.AttachOptions{ReadOnly: true, Client: opts.Client})
		if e, ok := replicator.AsError(err); ok && e.Kind == replicator.KindInUse {
			continue
		}
		return p, db, err
	}
	return "", nil, &Error{Kind: replicator.KindInUse, Action: replicator.ActionFix,
		Message: fmt.Sprintf("8 read-only copies of %s are open already (%s-ro1.db .. -ro8.db); give Options.Path to open another", streamURL, filepath.Base(stem))}
}

// SetToken sets the bearer token every replicated database of this process sends, over
// URSULA_VFS_TOKEN_FILE, from its next request on; "" clears it.
func SetToken(token string) { replicator.SetToken(token) }
