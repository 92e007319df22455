package engine

import (
	"context"
	"errors"

	"github.com/ursula-go/ursula/streamcore"
)

// Engine is the seam between the HTTP handlers and where stream state lives. The memory
// engine keeps it in this process; the raft engine replicates the same commands through
// multi-Raft groups. Handlers never know which one runs.
type Engine interface {
	// Propose applies a command once it is committed and returns its answer. It keeps no
	// reference to c.Body of an append once it returns, even early (the server reads
	// append bodies into pooled buffers it reuses after the request).
	Propose(ctx context.Context, c *streamcore.Command) (streamcore.Result, error)
	// View runs fn under the engine's read lock with the state holding key and the live
	// stream at key (nil when missing or expired at now). fn must not keep *Stream; byte
	// slices taken from its Buffer are immutable and may be kept.
	View(key string, now int64, fn func(st *streamcore.State, s *streamcore.Stream))
	// Watch returns a channel closed at the next change of key. Take it before looking at
	// the state, so a change between the look and the wait is not lost.
	Watch(key string) <-chan struct{}
	// BucketKnown reports whether a stream was ever created in bucket.
	BucketKnown(bucket string) bool
	// RenewRead renews the sliding TTL of key, which a read at now made due. A
	// replicated engine's follower cannot propose: it asks the stream's leader, in the
	// background and at most once a second per stream.
	RenewRead(ctx context.Context, key string, now int64)
	// Stats reports engine-wide counts for the admin endpoints.
	Stats() EngineStats
	// Close stops background work.
	Close() error
}

// BucketCounter is an engine that counts the live streams of a bucket (for the optional
// [limits] max_streams_per_bucket, checked before a create is proposed).
type BucketCounter interface {
	BucketStreams(bucket string) int
}

// EngineStats are engine-wide counts.
type EngineStats struct {
	Engine  string `json:"engine"`
	Streams int    `json:"streams"`
	Bytes   uint64 `json:"bytes"`
}

// ErrNoLeader is returned by a replicated engine when the stream's group has no known
// leader and nothing was proposed. Handlers answer 503 + Retry-After: 1, marked
// x-ursula-not-applied: NotLeader.
var ErrNoLeader = errors.New("no leader known for the stream's group")

// NotLeaderError is returned by a replicated engine when this node does not lead the
// stream's group. LeaderURL is the leader's HTTP base URL ("" when no leader is known).
// Proposed reports that the command may have been proposed (leadership was lost after
// it was handed to Raft): its outcome is then unknown and the answer carries no
// not-applied marker.
//
// LeaderID, Group and Term name the leader, the group and the leader's term, so a
// redirect lets a router cache the leader per group and drop a hint of an older term.
// NoPeers reports a node configured without peers: no other node can take the write, so
// its refusal is a server fault (500), not a routing answer.
type NotLeaderError struct {
	LeaderURL string
	Proposed  bool
	LeaderID  uint64
	Group     uint64
	Term      uint64
	NoPeers   bool
}

// Is makes a refusal that knows no leader and proposed nothing match ErrNoLeader.
func (e *NotLeaderError) Is(target error) bool {
	return target == ErrNoLeader && e.LeaderURL == "" && !e.Proposed
}

func (e *NotLeaderError) Error() string {
	if e.LeaderURL == "" {
		return "this node does not lead the stream's group and knows no leader"
	}
	return "this node does not lead the stream's group; the leader is " + e.LeaderURL
}

// LeaderVerifier is implemented by replicated engines. VerifyLeader confirms that this node
// leads the group holding key and has applied everything committed before the call (a
// Raft barrier / ReadIndex), so a read that follows sees every acknowledged write. It
// returns ErrNoLeader or a *NotLeaderError otherwise.
type LeaderVerifier interface {
	VerifyLeader(ctx context.Context, key string) error
	// LeaderHint is the cheap local check: nil when this node believes it leads key's
	// group (no quorum round), else ErrNoLeader or a *NotLeaderError naming the leader.
	// Catch-up reads that reach the tail use it.
	LeaderHint(key string) error
}

// RaftAdmin is implemented by replicated engines for the /__ursula/raft/ endpoints and
// readiness.
type RaftAdmin interface {
	// Ready reports whether every local group knows a leader (reason when not).
	Ready() (bool, string)
	// RaftStatus is the JSON document of GET /__ursula/raft/status.
	RaftStatus() any
	// TransferLeadership moves the leadership of group to node to (0 = any other voter).
	TransferLeadership(group uint64, to uint64) error
	// Drain moves every leadership this node holds to other voters.
	Drain() error
}

// HotStream is a stream with unflushed bytes [HotStart, Tail).
type HotStream struct {
	Key         string
	Incarnation uint64
	HotStart    uint64
	Tail        uint64
}

// Groups is what the cold tier needs of an engine beyond Engine. A group is a unit of
// hot accounting and admission: a Raft group, or a partition of the memory engine. Group
// ids are uint64 on every engine.
type Groups interface {
	// FlushGroups lists the groups whose streams this node may flush (for a replicated
	// engine: the groups it leads).
	FlushGroups() []uint64
	// GroupOf returns the group of a stream key.
	GroupOf(key string) uint64
	// GroupHotBytes is the group's unflushed payload (cheap: called on every append).
	GroupHotBytes(g uint64) int64
	// HotStreams lists the streams of group g with hot bytes, most hot bytes first.
	HotStreams(g uint64) []HotStream
	// ColdRefs calls fn with the key of every cold object any local stream references
	// (every local replica, led or followed).
	ColdRefs(fn func(key string))
}

// ColdPeers is implemented by a replicated engine. The cold collector then runs only
// where CollectHere says (one node at a time), and deletes an object only after every
// other voter answered, through the engine's peer channel, that none of its replicas
// references it and none of its reads or uploads pins it.
type ColdPeers interface {
	CollectHere() bool
	// PeersColdRefs returns the keys some other voter still needs; an error when any
	// voter did not answer.
	PeersColdRefs(ctx context.Context, keys []string) (map[string]bool, error)
	// SetColdPins gives the engine this node's pins, for its answers to the other
	// voters' collectors (nil: answer with the replicas' references only).
	SetColdPins(pinned func(key string) bool)
}
