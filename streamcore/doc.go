// Package streamcore is the Durable Streams protocol core shared by the stream server, its
// engines and the client. It does no I/O: offsets, bucket and stream ids, header names,
// content-type normalisation, the JSON message text rule, the producer and snapshot
// digests, the per-stream state machine driven by deterministic commands (create, append,
// close, delete, TTL, producers, Stream-Seq, incarnations, snapshots, retention, forks)
// and the wire codecs (SSE events, multipart/mixed bootstrap, JSON error bodies). The Go
// client of the protocol is package client.
//
// Determinism: every command carries the time it was proposed at (Now, Unix milliseconds)
// and apply never reads the clock, so the memory engine, a Raft follower and a restart
// replay reach the same state from the same commands.
package streamcore
