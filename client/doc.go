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
//
// A stream URL may name several nodes of one cluster (http://n1:4437,n2:4437/bucket/stream,
// nodes.go): the client routes each request to one of them, skips nodes it cannot reach,
// follows NotLeader answers only to nodes of the list, and refuses a list whose nodes
// belong to different clusters.
//
// Requests go out through InlineTransport (internal/inlinehttp): each HTTP/1.1 exchange
// runs in the calling goroutine, on kept-alive connections of its own, over the settings
// of NewTransport.
package client
