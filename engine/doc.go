// Package engine is where stream state lives, behind one seam. Engine is what the HTTP
// server asks of any engine: propose a deterministic streamcore command, view a stream
// under a lock, watch a key for changes. Replicated engines add LeaderVerifier (reads
// that must see every acknowledged write), RaftAdmin (operator endpoints) and ColdPeers
// (the cold collector's question to the other voters); everything peers say to each
// other goes through the engine.
//
// Both engines split their streams over Partitions: a lock, the streamcore.State of the
// streams in it, their watchers and their hot (not yet flushed) byte count. Memory, the
// engine of tests and throwaway runs, keeps 64 partitions in process memory; the
// multi-Raft engine (package engine/raft) makes each Raft group's FSM one partition.
// Groups is the view of those partitions that the cold tier (package coldtier) needs.
package engine
