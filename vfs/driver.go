package vfs

import (
	"context"
	sqldriver "database/sql/driver"
	"errors"
	"sync"

	"github.com/ncruces/go-sqlite3"
	"github.com/ncruces/go-sqlite3/driver"

	"github.com/ursula-go/ursula/sqlitewal"
)

// The database/sql layer sees SQLite's I/O error codes only. These wrappers of the
// ncruces driver put the replicator's typed error (*vfs.Error, with its Kind and Action)
// in front of the SQLite error of a failed commit or read, so callers can errors.As it.

type connector struct {
	inner    sqldriver.Connector
	db       *sqlitewal.Database
	readOnly bool
	once     sync.Once
}

func (c *connector) Driver() sqldriver.Driver { return c.inner.Driver() }

// Close runs when the *sql.DB closes: it releases the attachment (sidecar saved, lock
// file released), so the file can be attached again, in this process or another.
func (c *connector) Close() error {
	c.once.Do(c.db.Detach)
	return nil
}

func (c *connector) Connect(ctx context.Context) (sqldriver.Conn, error) {
	conn, err := c.inner.Connect(ctx)
	if err != nil {
		return nil, mapErr(c.db, err)
	}
	dc := conn.(driver.Conn)
	if err := setupConn(dc.Raw(), c.readOnly); err != nil {
		dc.Close()
		return nil, err
	}
	return &conn2{Conn: dc, db: c.db}, nil
}

// conn2 wraps the driver's connection.
type conn2 struct {
	driver.Conn
	db *sqlitewal.Database
}

func (c *conn2) Begin() (sqldriver.Tx, error) {
	return c.BeginTx(context.Background(), sqldriver.TxOptions{})
}

func (c *conn2) BeginTx(ctx context.Context, opts sqldriver.TxOptions) (sqldriver.Tx, error) {
	if err := refuseStopped(c.db); err != nil {
		return nil, err
	}
	tx, err := c.Conn.BeginTx(ctx, opts)
	if err != nil {
		return nil, mapErr(c.db, err)
	}
	return &tx2{Tx: tx, db: c.db}, nil
}

func (c *conn2) Prepare(query string) (sqldriver.Stmt, error) {
	return c.PrepareContext(context.Background(), query)
}

func (c *conn2) PrepareContext(ctx context.Context, query string) (sqldriver.Stmt, error) {
	st, err := c.Conn.PrepareContext(ctx, query)
	if err != nil {
		return nil, mapErr(c.db, err)
	}
	return &stmt2{Stmt: st, db: c.db}, nil
}

func (c *conn2) ExecContext(ctx context.Context, query string, args []sqldriver.NamedValue) (sqldriver.Result, error) {
	ex, ok := c.Conn.(sqldriver.ExecerContext)
	if !ok {
		return nil, sqldriver.ErrSkip
	}
	if err := refuseStopped(c.db); err != nil {
		return nil, err
	}
	res, err := ex.ExecContext(ctx, query, args)
	return res, mapErr(c.db, err)
}

func (c *conn2) CheckNamedValue(nv *sqldriver.NamedValue) error {
	if ch, ok := c.Conn.(sqldriver.NamedValueChecker); ok {
		return ch.CheckNamedValue(nv)
	}
	return sqldriver.ErrSkip
}

type tx2 struct {
	sqldriver.Tx
	db *sqlitewal.Database
}

func (t *tx2) Commit() error { return mapErr(t.db, t.Tx.Commit()) }

type stmt2 struct {
	sqldriver.Stmt
	db *sqlitewal.Database
}

func (s *stmt2) ExecContext(ctx context.Context, args []sqldriver.NamedValue) (sqldriver.Result, error) {
	if err := refuseStopped(s.db); err != nil {
		return nil, err
	}
	res, err := s.Stmt.(sqldriver.StmtExecContext).ExecContext(ctx, args)
	return res, mapErr(s.db, err)
}

func (s *stmt2) QueryContext(ctx context.Context, args []sqldriver.NamedValue) (sqldriver.Rows, error) {
	if err := refuseStopped(s.db); err != nil {
		return nil, err
	}
	rows, err := s.Stmt.(sqldriver.StmtQueryContext).QueryContext(ctx, args)
	return rows, mapErr(s.db, err)
}

func (s *stmt2) CheckNamedValue(nv *sqldriver.NamedValue) error {
	if ch, ok := s.Stmt.(sqldriver.NamedValueChecker); ok {
		return ch.CheckNamedValue(nv)
	}
	return sqldriver.ErrSkip
}

// refuseStopped fails a statement of a fenced or poisoned owner before it runs, with the
// error a read of its file gets (SQLITE_IOERR_READ behind the typed error). The file's
// read check alone is not enough: in WAL mode a connection whose page cache is warm
// starts a read transaction without reading the file while the WAL index is unchanged,
// and a fenced or poisoned owner never changes it again, so that connection would go on
// answering from its cache. (The C extension refuses the WAL read mark instead, in its
// xShmLock; this VFS cannot wrap the shared memory of the OS VFS.)
func refuseStopped(d *sqlitewal.Database) error {
	if d.ReadOnly() || d.Usable() == nil {
		return nil
	}
	return mapErr(d, sqlite3.IOERR_READ)
}

// mapErr puts the replicator's error in front of an SQLite I/O error it caused.
func mapErr(d *sqlitewal.Database, err error) error {
	if err == nil || d.ReadOnly() || !errors.Is(err, sqlite3.IOERR) {
		return err
	}
	cause := d.Replica().Usable()
	if cause == nil {
		if le := d.Replica().LastError(); le != nil {
			cause = le
		}
	}
	e, ok := asError(cause)
	if !ok {
		return err
	}
	out := *e
	out.Err = err
	return &out
}

func asError(err error) (*Error, bool) {
	var e *Error
	ok := errors.As(err, &e)
	return e, ok
}
