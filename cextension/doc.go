// Command cextension is the loadable SQLite extension (bin/libursula_vfs.so, built with
// -buildmode=c-shared): a thin C VFS over SQLite's unix VFS (shim.c) that hands the WAL
// writes of attached databases to the binding-independent Go core (package sqlitewal),
// and the SQL functions ursula_attach, ursula_status, ursula_stats, ursula_set_token and ursula_lazy_open.
//
// The Go side answers at xOpen (is this file attached? which fence flag?), takes every
// -wal write and truncate of an owner's database, and runs the SQL functions. Reads,
// locks and shared memory never call Go: each attached database has a fence flag in C
// memory that Go sets once the database is fenced or poisoned, and the C read path checks
// only that flag.
//
// A second VFS, "ursula-lazy" (lazy.go, the LFile part of shim.c), opens a stream lazily
// and read-only from a URI: file:NAME?vfs=ursula-lazy&url=STREAM_URL[&at=OFFSET]
// [&follow=1][&cache_mb=N] reads pages on demand through package lazy. Here the
// existing shim fits better than psanford/sqlite3vfs's loadable-module mode: the shim
// already owns the extension's entry point and its SQLite API routines, and that mode
// would bring a second copy of both. For programs that cannot name a VFS in a URI
// (better-sqlite3), ursula_lazy_open(path, url, ...) registers a plain path as such a
// database: the default ursula VFS's xOpen hands a main-file open of it to the lazy side
// (URSULA_FILE_LAZY) and refuses a -wal or -journal beside it.
package main
