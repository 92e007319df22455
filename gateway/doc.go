// Package gateway is the reverse proxy that puts one front door before a cluster of
// nodes (ursula gateway): it authenticates clients, applies per-bucket quotas, forwards
// each request to an upstream node, follows leader redirects itself within its upstream
// list, vouches for the nodes' "nothing was applied" marks when it can, and writes one
// usage line per request.
//
// The vouch: every answer the gateway returns carries x-ursula-not-applied-checked: 1.
// A client counts a refusal as never applied only with both that header and
// x-ursula-not-applied, so the gateway drops a node's x-ursula-not-applied whenever it
// cannot stand behind it: after following a redirect that carried no mark, since the
// node that sent that redirect may have proposed the write first. Its own refusals,
// decided before it forwards anything, carry the mark themselves.
package gateway
