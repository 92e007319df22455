// Package replicator moves a SQLite database to and from its durable stream: the commit
// and claim records (frames), ownership by claim and fencing, the commit path (one record
// per transaction, appended with an idempotent producer and retried within a budget),
// attach (resume from the sidecar or rebuild), snapshots and retention, restore and export,
// and the measurements of Stats. It talks to the server through package client and knows
// nothing of SQLite bindings: package sqlitewal feeds it the commits.
//
// The bytes on the stream and in snapshots are described in docs/frame-format.md.
package replicator
