package sqlitewal

import "github.com/ursula-go/ursula/replicator"

// SQLite extended result codes an adapter answers a failed -wal write with.
const (
	CodeIOErrRead  = 266  // SQLITE_IOERR_READ: reading the transaction back from the WAL failed
	CodeIOErrWrite = 778  // SQLITE_IOERR_WRITE: any other failure
	CodeIOErrAuth  = 7178 // SQLITE_IOERR_AUTH: the commit was refused and nothing was written
)

// ResultCode is the one mapping from an error of the interception (WAL.WriteAt) to the
// SQLite result code both adapters return for it. A commit the server refused, one over
// the size limit and one of a fenced replica are SQLITE_IOERR_AUTH: SQLite rolls the
// transaction back and the connection stays usable (the application may retry, or learns
// it lost ownership). Anything else is an I/O error of the file.
func ResultCode(err error) int {
	switch err {
	case errIORead:
		return CodeIOErrRead
	case errIOWrite:
		return CodeIOErrWrite
	}
	if e, ok := replicator.AsError(err); ok && (e.Action == replicator.ActionRetry || e.Kind == replicator.KindTooLarge || e.Kind == replicator.KindFenced) {
		return CodeIOErrAuth
	}
	return CodeIOErrWrite
}
