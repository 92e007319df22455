// Package sqlitewal is the binding-independent core of replicated SQLite: the registry of
// the databases this process has attached (Attach, Lookup), the interception of their
// -wal writes that turns each SQLite commit into one commit record appended through the
// replicator before the commit frame reaches the file (WAL), and the one mapping from its
// errors to SQLite result codes (ResultCode).
//
// An adapter plugs a SQLite binding into it: package vfs for github.com/ncruces/go-sqlite3
// (pure Go), and the C extension (cextension) for SQLite's own unix VFS. Each forwards
// the -wal writes and truncates of an attached database here and keeps reads, locks and
// shared memory to itself.
package sqlitewal
