// Package replicator moves a SQLite database to and from its durable stream: commit and
// claim records, snapshots, ownership and fencing, the commit path, attach, export.
//
// The bytes on the stream and in snapshots are described in docs/frame-format.md.
package replicator
