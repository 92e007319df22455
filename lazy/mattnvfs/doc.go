// Package mattnvfs lets programs on github.com/mattn/go-sqlite3 (cgo) open a replicated
// database lazily and read-only: Register adds the SQLite VFS "ursula-lazy" (built on
// github.com/psanford/sqlite3vfs), which reads pages on demand from the stream through
// package lazy, so the first query needs only the pages it touches:
//
//	mattnvfs.Register(nil)
//	db, err := sql.Open("sqlite3", mattnvfs.DSN("http://127.0.0.1:4437/bucket/app.db", "", false))
//	// or by hand: "file:app.db?vfs=ursula-lazy&mode=ro&url=http://127.0.0.1:4437/bucket/app.db"
//
// The URI parameters (url, at, follow, cache_mb) are lazy.URIParams'. Connections of one
// process opening the same stream with the same parameters share one index and page
// cache. Each read transaction reads one consistent stream offset; with follow=1 a new
// transaction sees the latest commits.
//
// The package needs cgo. Built without it (CGO_ENABLED=0) it holds only this
// documentation; the pure-Go path is vfs.Open(url, vfs.Options{ReadOnly: true, Lazy: true}).
package mattnvfs
