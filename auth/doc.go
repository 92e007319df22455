// Package auth decides who may do what on a node. It reads the credentials a request
// presents (a static bearer token from a token file, or an RFC 9068 JWT access token
// verified against an issuer's JWKS), the per-bucket tenant policy (owners, public_read),
// and answers one question per request: allow, ask for credentials (401), or conceal
// (the same 404 a missing resource gets). It does no HTTP serving of its own.
package auth
