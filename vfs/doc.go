// Package vfs gives Go applications replicated SQLite databases: Open attaches a local
// file to its stream and returns it as a *sql.DB, Status and Stats report how replication
// goes, and a failed commit or read comes back as a typed *Error whose Kind says what
// happened and whose Action says what to do (retry, reattach, stop, fix). With
// Options.Follow the file is instead a read-only replica that follows the stream live
// (FollowStatus).
//
// Underneath, it is the adapter for github.com/ncruces/go-sqlite3 (pure Go, no cgo): a
// SQLite VFS over that library's OS VFS that hands the -wal writes of an attached
// database to the binding-independent interception in package sqlitewal, which appends
// each commit through the replicator before it reaches the local WAL. Reads, locks and
// shared memory stay with the OS VFS, so WAL mode with several connections works.
package vfs
