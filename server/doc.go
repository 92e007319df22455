// Package server is the Durable Streams HTTP layer and nothing else: the route table
// (routes.go), one handler file per resource (stream.go: create, append, read, head,
// delete, retention; live.go: long-poll and SSE; snapshot.go; parts.go: snapshot upload in
// parts; bootstrap.go; immutable.go; admin.go: readiness, metrics, Raft and cold-tier
// operations), the authentication hook and CORS origins (guard.go, deciding through an
// auth.Authorizer) and one error writer (errors.go). Stream state lives behind the
// engine.Engine seam (package engine); the optional cold tier is a coldtier.Tier the
// handlers call.
package server
