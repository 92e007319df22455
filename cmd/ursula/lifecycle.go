package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/ursula-go/ursula/server"
)

// defaultAdminAddr derives the admin listener from the client listener: loopback, on the
// next port (4437 -> 4438), so nodes sharing a host with distinct client ports get distinct
// admin ports unless those ports are adjacent. Port 0 stays 0 (any free port).
func defaultAdminAddr(clientAddr string) (string, error) {
	_, port, err := net.SplitHostPort(clientAddr)
	if err != nil {
		return "", fmt.Errorf("listen address %q: %w", clientAddr, err)
	}
	p, err := strconv.Atoi(port)
	if err != nil {
		return "", fmt.Errorf("listen address %q: the port must be a number to derive the admin port; set server.admin_listen", clientAddr)
	}
	if p != 0 {
		p++
	}
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(p)), nil
}

// serveAdmin starts the admin listener ("off": none). The returned server is closed at
// shutdown; admin calls in flight are cut, they are retried by operators and tools.
// It has the client listener's limits (timeouts, a connection cap of its own, JSON
// refusals) and TLS.
func serveAdmin(addr, clientAddr string, srv *server.Server, sec *security, lim resolvedLimits, logger *slog.Logger) (*http.Server, error) {
	if addr == "off" {
		return &http.Server{}, nil
	}
	if addr == "" {
		var err error
		if addr, err = defaultAdminAddr(clientAddr); err != nil {
			return nil, err
		}
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("admin listener %s: %w (set server.admin_listen, or \"off\")", addr, err)
	}
	logger.Info("admin listening", "addr", ln.Addr().String(), "scheme", sec.scheme(), "max_connections", adminMaxConnections)
	hs, sln := lim.httpServer(srv.AdminHandler(), ln, adminMaxConnections, sec.serverTLS()) // the same TLS as the client listener
	go hs.Serve(sln)
	return hs, nil
}

// joinRecord is DATA/joined: written when a node first starts with --join, so a restart
// (with or without the flag) keeps waiting to be added instead of initialising a cluster
// of its own.
type joinRecord struct {
	URL        string `json:"url"`
	GroupCount int    `json:"group_count"`
	ClusterID  string `json:"cluster_id"`
}

// prepareJoin reports whether the node joins a running cluster. With --join it asks the
// member for the cluster id and group count (taken over when not configured, refused when
// they differ) and records both.
func prepareJoin(joinURL, dataDir string, fc *fileConfig, clusterID string) (bool, error) {
	path := filepath.Join(dataDir, "joined")
	var rec joinRecord
	had := false
	if b, err := os.ReadFile(path); err == nil {
		if err := json.Unmarshal(b, &rec); err != nil {
			return false, fmt.Errorf("%s: %w", path, err)
		}
		had = true
	}
	if joinURL == "" && !had {
		return false, nil
	}
	if len(fc.Raft.Peers) > 0 {
		return false, errors.New("--join is for a new node without raft.peers (the cluster tells it its members)")
	}
	if fc.Raft.NodeID == 0 {
		return false, errors.New("a joining node needs its own non-zero node id (--node-id or raft.node_id)")
	}
	if joinURL != "" {
		joinURL = strings.TrimRight(joinURL, "/")
		id, groups, err := askMember(joinURL)
		switch {
		case err == nil:
			rec = joinRecord{URL: joinURL, GroupCount: groups, ClusterID: id}
		case !had:
			return false, fmt.Errorf("--join %s: %w", joinURL, err)
		}
	}
	if fc.Raft.GroupCount == 0 {
		fc.Raft.GroupCount = rec.GroupCount
	} else if rec.GroupCount != 0 && fc.Raft.GroupCount != rec.GroupCount {
		return false, fmt.Errorf("raft.group_count is %d but the cluster at %s has %d groups", fc.Raft.GroupCount, rec.URL, rec.GroupCount)
	}
	if clusterID == "" && rec.ClusterID != "" && validClusterID(rec.ClusterID) {
		if err := os.MkdirAll(dataDir, 0o755); err != nil {
			return false, err
		}
		p := filepath.Join(dataDir, "cluster-id")
		if _, err := os.Stat(p); errors.Is(err, os.ErrNotExist) {
			if err := os.WriteFile(p, []byte(rec.ClusterID+"\n"), 0o644); err != nil {
				return false, err
			}
		}
	}
	if err := os.MkdirAll(dataDir, 0o755); err != nil {
		return false, err
	}
	b, _ := json.Marshal(rec)
	return true, os.WriteFile(path, append(b, '\n'), 0o644)
}

// askMember reads a member's cluster id and group count from its client listener's metrics.
func askMember(url string) (string, int, error) {
	cl := &http.Client{Timeout: 10 * time.Second}
	res, err := cl.Get(url + "/__ursula/metrics")
	if err != nil {
		return "", 0, err
	}
	defer res.Body.Close()
	if res.StatusCode != 200 {
		return "", 0, fmt.Errorf("metrics answered %s", res.Status)
	}
	var m struct {
		ClusterID string `json:"cluster_id"`
		Raft      struct {
			GroupCount int `json:"group_count"`
		} `json:"raft"`
	}
	if err := json.NewDecoder(res.Body).Decode(&m); err != nil {
		return "", 0, err
	}
	if m.Raft.GroupCount == 0 {
		return "", 0, errors.New("the member does not run raft")
	}
	return m.ClusterID, m.Raft.GroupCount, nil
}

// clusterSize is the voter count the cold tier's defaults see: a joining node belongs to
// a cluster although it lists no peers.
func clusterSize(peers int, joining bool) int {
	if joining {
		return max(peers, 2)
	}
	return peers
}
