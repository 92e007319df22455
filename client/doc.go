// Package client is the Go HTTP client of the Durable Streams protocol with the Ursula
// extensions (create, append with idempotent producers, close, delete, reads and long
// polls, SSE, snapshots and staged parts, retention, bootstrap), used by the replicator,
// the ursula command and the tests.
//
// Its other job is to say what an answer proves about a write: every write answer is
// classified as Applied, NotApplied or Unknown (OutcomePolicy.Classify). A caller may
// repeat an Unknown write with the same producer key and body, and may treat a NotApplied
// one as never having happened. Failures come back as *Error, which carries the outcome,
// the HTTP status and the server's error code.
package client
