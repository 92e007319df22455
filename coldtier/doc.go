// Package coldtier is the cold tier: stream bytes and snapshot bodies in an object store
// (package coldtier/store), run by a Tier with a narrow seam to the engine (Engine).
//
// Appends land in the engine's hot buffers; a background flusher (flush.go) writes
// contiguous old ranges of a stream to the object store as chunk objects and then
// proposes streamcore.OpRecordChunk, which records the chunk and trims the hot range, so
// every replica reaches the same state. Reads plan over both tiers under the engine's
// View and fetch cold ranges afterwards, outside any lock (read.go). Snapshot bodies of
// at least storage.cold.snapshot_min_size are stored as objects (snapshot.go). A
// collector (gc.go) deletes objects nothing references any more after a grace period,
// never one a read in flight has pinned.
//
// Object keys (all under storage.cold.root, then the s3 prefix for the s3 backend):
//
//	{cluster}/{bucket}/{h}-{stream}/{incarnation}/c/{start:020d}-{end:020d}-{random}  chunk: bytes [start, end)
//	{cluster}/{bucket}/{h}-{stream}/{incarnation}/s/{offset:020d}-{random}    snapshot body
//	{cluster}/__parts/{bucket}/{h}-{stream}/{incarnation}/{part id}          staged snapshot part
//
// {bucket} and {stream} are path-escaped ('/' in compat stream names becomes %2F), the
// stream name is cut to 120 bytes, and {h} is the first 16 hex digits of SHA-256(key), so
// keys stay unique and below S3's 1024-byte limit. No bucket id starts with "__", so the
// parts tree never meets a bucket's. The key of every object is recorded in
// the replicated state: readers never derive keys, so a naming change never strands data.
//
// Snapshot upload in parts (parts.go) stages parts as objects and assembles them into one
// snapshot object at commit. The HTTP handlers of these features live in package server
// and call the Tier; a nil *Tier is a server without cold store.
package coldtier
