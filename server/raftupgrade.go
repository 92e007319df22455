package server

// The Raft upgrade route: without a cluster listener of its own, a node carries its
// peers' Raft traffic on this listener. A peer asks GET /__ursula/raft with
// "Connection: Upgrade" and "Upgrade: ursula-raft"; the answer is 101 Switching
// Protocols and the connection (after TLS on an https listener) becomes a Raft
// connection of the engine (engine/raft upgrade.go). Peers authenticate with mutual TLS
// inside the upgraded connection (raft.tls_ca_file); with auth on, a node without it
// refuses the upgrade, since a bearer token is no peer identity.

import (
	"bytes"
	"io"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/ursula-go/ursula/streamcore"
)

const (
	raftUpgradePath  = "/__ursula/raft"
	raftUpgradeProto = "ursula-raft"
	// CodePeerIdentityRequired refuses a Raft upgrade on a node with auth on and no
	// mutual TLS between peers.
	CodePeerIdentityRequired = "PEER_IDENTITY_REQUIRED"
)

// raftUpgrader is the engine that takes upgraded Raft connections.
type raftUpgrader interface {
	ServeRaftUpgrade(c net.Conn) bool
	RaftUpgradeAuthenticated() bool
}

func (s *Server) handleRaftUpgrade(w http.ResponseWriter, r *http.Request) {
	drainBody(r)
	u, ok := s.engine.(raftUpgrader)
	if !ok {
		s.writeError(w, r, streamcore.Errorf(http.StatusNotFound, streamcore.CodeNotFound, "this node takes no Raft traffic"))
		return
	}
	if !s.allow(w, r, http.MethodGet) {
		return
	}
	if !headerHasToken(r.Header, "Connection", "upgrade") || !headerHasToken(r.Header, "Upgrade", raftUpgradeProto) {
		w.Header().Set("Upgrade", raftUpgradeProto)
		w.Header().Set("Connection", "Upgrade")
		s.writeError(w, r, streamcore.Errorf(http.StatusUpgradeRequired, streamcore.CodeInvalidHeader, "this route upgrades a peer's connection: send Connection: Upgrade and Upgrade: %s", raftUpgradeProto))
		return
	}
	if s.cfg.Auth != nil && !u.RaftUpgradeAuthenticated() {
		s.writeError(w, r, streamcore.Errorf(http.StatusForbidden, CodePeerIdentityRequired, "with auth on, Raft on the client listener needs mutual TLS between peers (raft.tls_ca_file, raft.tls_cert_file, raft.tls_key_file)"))
		return
	}
	c, brw, err := http.NewResponseController(w).Hijack()
	if err != nil {
		s.writeError(w, r, streamcore.Errorf(http.StatusInternalServerError, streamcore.CodeInternal, "this connection cannot be upgraded (HTTP/2?): %v", err))
		return
	}
	c.SetDeadline(time.Time{})
	c.SetWriteDeadline(time.Now().Add(10 * time.Second))
	brw.WriteString("HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: " + raftUpgradeProto + "\r\n\r\n")
	if err := brw.Flush(); err != nil {
		c.Close()
		return
	}
	c.SetWriteDeadline(time.Time{})
	if n := brw.Reader.Buffered(); n > 0 {
		b, _ := brw.Reader.Peek(n)
		c = &bufferedConn{Conn: c, r: io.MultiReader(bytes.NewReader(bytes.Clone(b)), c)}
	}
	if !u.ServeRaftUpgrade(c) {
		c.Close()
	}
}

// headerHasToken reports whether the comma-separated header holds token (any case).
func headerHasToken(h http.Header, name, token string) bool {
	for _, v := range h.Values(name) {
		for _, t := range strings.Split(v, ",") {
			if strings.EqualFold(strings.TrimSpace(t), token) {
				return true
			}
		}
	}
	return false
}

type bufferedConn struct {
	net.Conn
	r io.Reader
}

func (c *bufferedConn) Read(p []byte) (int, error) { return c.r.Read(p) }
