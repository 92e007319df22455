package server

import (
	"context"

	"github.com/ursula-go/ursula/streamcore"
)

// Engine is the seam between the HTTP handlers and where stream state lives. The memory
// engine keeps it in this process; the raft engine (a later issue) replicates the same
// commands through multi-Raft groups. Handlers never know which one runs.
type Engine interface {
	// Propose applies a command once it is committed and returns its answer.
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
	// Stats reports engine-wide counts for the admin endpoints.
	Stats() EngineStats
	// Close stops background work.
	Close() error
}

// EngineStats are engine-wide counts.
type EngineStats struct {
	Engine  string `json:"engine"`
	Streams int    `json:"streams"`
	Bytes   uint64 `json:"bytes"`
}
