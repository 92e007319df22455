package main

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"strings"

	raftengine "github.com/ursula-go/ursula/engine/raft"
)

// checkPeerURL checks a [[raft.peers]] url: a client URL, which also carries the peer's
// Raft traffic unless the peer has a raft_addr.
func checkPeerURL(id uint64, u string) error {
	p, err := url.Parse(u)
	if u == "" || err != nil || (p.Scheme != "http" && p.Scheme != "https") || p.Host == "" {
		return fmt.Errorf("raft.peers: node %d needs url, its client URL (such as http://10.0.0.1:4437), not %q", id, u)
	}
	return nil
}

// clusterListener is where this node takes its peers' Raft traffic. With
// server.cluster_listen or a raft_addr of its own, a separate TCP listener (mutual TLS
// when raft.tls_* are set). Otherwise the client listener at httpAddr carries it through
// the upgrade route: peers dial this node's url. With auth on, that needs mutual TLS
// between peers, since a peer has no bearer token to show.
func clusterListener(fc *fileConfig, self raftengine.Peer, sec *security, httpAddr net.Addr, logger *slog.Logger) (net.Listener, error) {
	viaURL := strings.HasPrefix(self.RaftAddr, "http://") || strings.HasPrefix(self.RaftAddr, "https://")
	if !viaURL {
		bind := pickStr(fc.Server.ClusterListen, self.RaftAddr)
		if err := sec.checkClusterListener(bind, fc.Server.Insecure, logger); err != nil {
			return nil, err
		}
		ln, err := net.Listen("tcp", bind)
		if err != nil {
			return nil, fmt.Errorf("cluster listener %s: %w", bind, err)
		}
		return ln, nil
	}
	if fc.Server.ClusterListen != "" {
		return nil, fmt.Errorf("server.cluster_listen is set but raft.peers gives node %d no raft_addr: its peers would dial its client URL, which then carries no Raft; set its raft_addr to the cluster listener's address, or remove server.cluster_listen", self.ID)
	}
	if sec.auth != nil && sec.peer == nil {
		return nil, errors.New("with auth on, Raft on the client listener needs peer identity: set raft.tls_ca_file, raft.tls_cert_file and raft.tls_key_file (mutual TLS between peers), or give the peers a separate cluster network (server.cluster_listen and raft_addr)")
	}
	return raftengine.NewUpgradeListener(httpAddr), nil
}
