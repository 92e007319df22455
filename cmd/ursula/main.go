// Command ursula runs the Ursula Durable Streams server.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"runtime/pprof"
	"strings"
	"syscall"
	"time"

	"github.com/BurntSushi/toml"
	"github.com/hashicorp/raft"

	"github.com/ursula-go/ursula/engine"
	raftengine "github.com/ursula-go/ursula/engine/raft"
	"github.com/ursula-go/ursula/raftlog"
	"github.com/ursula-go/ursula/server"
)

const usage = `ursula: a Durable Streams server (HTTP append-only streams with snapshots,
retention, idempotent producers and live reads), the home of replicated SQLite databases.

Usage:
  ursula server [--listen ADDR] [--data DIR] [--config FILE] [--engine raft|memory] [--node-id N]
  ursula export <stream-url> <out.db> [--at OFFSET]
  ursula help

Commands:
  server   Run the stream server until SIGINT or SIGTERM (graceful: in-flight requests finish).
  export   Write a plain SQLite file of a replicated database, at the tail or at an offset.

Server flags (flags override the config file):
  --listen ADDR    address to listen on (config server.listen; default 127.0.0.1:4437)
  --data DIR       data directory: cluster id, Raft snapshots and, by default, the node log
                   (config server.data_dir; default ./ursula-data)
  --config FILE    TOML config file (unknown keys are refused), e.g. one node of a cluster:
                       [server]
                       listen = "127.0.0.1:4437"
                       data_dir = "./ursula-data"
                       engine = "raft"            # or "memory"
                       [raft]
                       node_id = 1
                       group_count = 16           # fixed for the life of the data
                       init_membership_per_group = true
                       [raft.wal]
                       path = "./ursula-data/wal" # default <data_dir>/wal
                       fsync = "never"            # or "always"
                       [[raft.peers]]
                       node_id = 1
                       url = "http://127.0.0.1:4437"
                       raft_addr = "127.0.0.1:5437"
                       # ... one [[raft.peers]] per voter, this node included
                       [storage.cold]
                       backend = "fs"             # or "s3" ([storage.cold.s3]) or "none"
                       dir = "/shared/ursula-cold" # fs: default <data_dir>/cold
  --engine NAME    "raft" (default): persistent, replicated when peers are configured; with
                   no peers a single voter. "memory": streams live in process memory only.
  --node-id N      overrides raft.node_id, so one config file can serve every node
  --cpuprofile F   write a Go CPU profile to F until shutdown (for performance work)

With no config, ursula server runs one persistent node (Raft, a single voter) under
./ursula-data, with the fs cold tier in ./ursula-data/cold (old stream bytes move from
memory to chunk objects there): a restart keeps every acknowledged write. The cold
backend defaults to "fs" for a single raft voter and to "none" for a raft cluster (give
its voters one shared store: s3, or fs on a directory every node mounts) and for the
memory engine. fsync = "never" survives a process crash (kill -9); only fsync = "always"
survives a host crash or power loss.

Try it:
  ursula server &
  curl -X PUT -H 'Content-Type: text/plain' http://127.0.0.1:4437/demo/hello
  curl -X POST -H 'Content-Type: text/plain' --data 'hi' http://127.0.0.1:4437/demo/hello
  curl 'http://127.0.0.1:4437/demo/hello?offset=-1'

Endpoints: streams at /{bucket}/{stream}, the reference-server family at /v1/stream/{path},
readiness at /__ursula/ready, metrics at /__ursula/metrics (JSON) and /metrics (Prometheus),
Raft: GET /__ursula/raft/status, POST /__ursula/raft/transfer?group=N[&to=ID],
POST /__ursula/raft/drain.
`

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return 2
	}
	switch args[0] {
	case "help", "-h", "--help", "-help":
		fmt.Fprint(stdout, usage)
		return 0
	case "export":
		if err := runExport(args[1:], stdout, stderr); err != nil {
			fmt.Fprintf(stderr, "ursula export: %v\n", err)
			return 1
		}
		return 0
	case "server":
		if err := runServer(args[1:], stderr); err != nil {
			fmt.Fprintf(stderr, "ursula server: %v\n", err)
			return 1
		}
		return 0
	}
	fmt.Fprintf(stderr, "ursula: unknown command %q\n\n%s", args[0], usage)
	return 2
}

// fileConfig is the TOML config file.
type fileConfig struct {
	Server struct {
		Listen    string `toml:"listen"`
		ClusterID string `toml:"cluster_id"`
		DataDir   string `toml:"data_dir"`
		Engine    string `toml:"engine"`
		// ClusterListen is the address the cluster listener binds (default: this node's
		// raft_addr in raft.peers; differs when peers reach it through a proxy or NAT).
		ClusterListen string `toml:"cluster_listen"`
	} `toml:"server"`
	Raft struct {
		NodeID                 uint64 `toml:"node_id"`
		GroupCount             int    `toml:"group_count"`
		InitMembershipPerGroup *bool  `toml:"init_membership_per_group"`
		InitMembership         *bool  `toml:"init_membership"` // alias (troubleshooting docs)
		HeartbeatTimeoutMs     int    `toml:"heartbeat_timeout_ms"`
		SnapshotThreshold      uint64 `toml:"snapshot_threshold"`
		TrailingLogs           uint64 `toml:"trailing_logs"`
		WAL                    struct {
			Path        string `toml:"path"`
			Fsync       string `toml:"fsync"`
			SegmentSize int64  `toml:"segment_size"`
		} `toml:"wal"`
		Peers []struct {
			NodeID   uint64 `toml:"node_id"`
			URL      string `toml:"url"`
			RaftAddr string `toml:"raft_addr"`
		} `toml:"peers"`
	} `toml:"raft"`
	Storage storageConfig `toml:"storage"` // [storage.cold], cold.go
	Runtime runtimeConfig `toml:"runtime"` // runtime.go
}

func runServer(args []string, stderr io.Writer) error {
	fs := flag.NewFlagSet("server", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() { fmt.Fprint(stderr, usage) }
	listen := fs.String("listen", "", "address to listen on")
	data := fs.String("data", "", "data directory")
	config := fs.String("config", "", "TOML config file")
	engineFlag := fs.String("engine", "", "storage engine")
	nodeID := fs.Uint64("node-id", 0, "raft node id (overrides raft.node_id)")
	cpuProfile := fs.String("cpuprofile", "", "write a CPU profile to this file until shutdown")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	var fc fileConfig
	if *config != "" {
		md, err := toml.DecodeFile(*config, &fc)
		if err != nil {
			return fmt.Errorf("config %s: %w", *config, err)
		}
		if und := md.Undecoded(); len(und) > 0 {
			keys := make([]string, len(und))
			for i, k := range und {
				keys[i] = k.String()
			}
			return fmt.Errorf("config %s: unknown keys: %s", *config, strings.Join(keys, ", "))
		}
	}
	pick := func(flagVal, fileVal, def string) string {
		if flagVal != "" {
			return flagVal
		}
		if fileVal != "" {
			return fileVal
		}
		return def
	}
	addr := pick(*listen, fc.Server.Listen, "127.0.0.1:4437")
	dataDir := pick(*data, fc.Server.DataDir, "./ursula-data")
	engineName := pick(*engineFlag, fc.Server.Engine, "raft")
	if engineName != "memory" && engineName != "raft" {
		return fmt.Errorf("engine %q is not available; this build has: raft, memory", engineName)
	}
	if *nodeID != 0 {
		fc.Raft.NodeID = *nodeID
	}
	maxLive, err := fc.Runtime.maxLiveReaders()
	if err != nil {
		return err
	}
	logger := slog.New(slog.NewTextHandler(stderr, nil))
	if *cpuProfile != "" {
		f, err := os.Create(*cpuProfile)
		if err != nil {
			return err
		}
		pprof.StartCPUProfile(f)
		defer func() { pprof.StopCPUProfile(); f.Close() }()
	}
	clusterID := fc.Server.ClusterID
	if clusterID != "" && !validClusterID(clusterID) {
		return fmt.Errorf("config server.cluster_id %q: use 1 to 64 characters of A-Z a-z 0-9 . _ -", clusterID)
	}
	if clusterID == "" {
		id, err := loadClusterID(dataDir)
		if err != nil {
			return err
		}
		clusterID = id
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("listen %s: %w", addr, err)
	}
	var eng engine.Engine
	var drain func()
	if engineName == "memory" {
		eng = engine.NewMemory(10 * time.Second)
	} else {
		re, closeLog, err := openRaft(&fc, dataDir, "http://"+ln.Addr().String(), stderr, logger)
		if err != nil {
			ln.Close()
			return err
		}
		defer closeLog()
		eng = re
		if len(fc.Raft.Peers) > 1 {
			drain = func() { re.Drain() }
		} else {
			// A single voter elects itself at once: serve when it has (bounded), so the
			// first requests do not meet 503s.
			for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
				if ok, _ := re.Ready(); ok {
					break
				}
			}
		}
	}
	defer eng.Close()
	srv := server.New(eng, server.Config{ClusterID: clusterID, Logger: logger, MaxLiveReaders: maxLive})
	if err := enableCold(srv, &fc.Storage, dataDir, engineName, len(fc.Raft.Peers), logger); err != nil {
		ln.Close()
		return err
	}
	defer srv.StopCold()
	// Live reads (long-poll, SSE) watch the base context, so a shutdown ends them at once
	// instead of waiting for their timeouts.
	baseCtx, cancelBase := context.WithCancel(context.Background())
	defer cancelBase()
	hs := &http.Server{Handler: srv, ReadHeaderTimeout: 10 * time.Second, MaxHeaderBytes: 64 << 10,
		BaseContext: func(net.Listener) context.Context { return baseCtx }}
	hs.RegisterOnShutdown(cancelBase)
	logger.Info("ursula listening", "addr", ln.Addr().String(), "engine", engineName, "cluster_id", clusterID, "data", dataDir)

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	errc := make(chan error, 1)
	go func() { errc <- hs.Serve(ln) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	logger.Info("shutting down")
	srv.SetReady(false)
	if drain != nil {
		// Hand leaderships to the other voters (bounded), so writes move on at once.
		done := make(chan struct{})
		go func() { drain(); close(done) }()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
		}
	}
	sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := hs.Shutdown(sctx); err != nil && !errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	return nil
}

// openRaft opens the node log and the raft engine as configured.
func openRaft(fc *fileConfig, dataDir, selfURL string, stderr io.Writer, logger *slog.Logger) (*raftengine.Engine, func(), error) {
	rc := &fc.Raft
	if rc.NodeID == 0 {
		if len(rc.Peers) > 0 {
			return nil, nil, errors.New("raft.node_id must be non-zero (or pass --node-id)")
		}
		rc.NodeID = 1
	}
	var peers []raftengine.Peer
	self := -1
	for i, p := range rc.Peers {
		if p.NodeID == 0 {
			return nil, nil, errors.New("raft.peers: node_id must be non-zero")
		}
		if len(rc.Peers) > 1 && (p.URL == "" || p.RaftAddr == "") {
			return nil, nil, fmt.Errorf("raft.peers: node %d needs url and raft_addr", p.NodeID)
		}
		if p.NodeID == rc.NodeID {
			self = i
		}
		peers = append(peers, raftengine.Peer{ID: p.NodeID, URL: strings.TrimRight(p.URL, "/"), RaftAddr: p.RaftAddr})
	}
	if len(rc.Peers) > 0 && self < 0 {
		return nil, nil, fmt.Errorf("raft.peers must include this node (node_id %d)", rc.NodeID)
	}
	if len(peers) == 0 {
		peers = []raftengine.Peer{{ID: rc.NodeID, URL: selfURL}}
	}
	fsync, err := raftlog.ParseFsyncMode(pickStr(rc.WAL.Fsync, "never"))
	if err != nil {
		return nil, nil, fmt.Errorf("raft.wal.fsync: %w", err)
	}
	walDir := pickStr(rc.WAL.Path, filepath.Join(dataDir, "wal"))
	if err := os.MkdirAll(walDir, 0o755); err != nil {
		return nil, nil, fmt.Errorf("raft.wal.path: %w", err)
	}
	nl, err := raftlog.Open(walDir, raftlog.Options{Fsync: fsync, SegmentBytes: rc.WAL.SegmentSize,
		Logf: func(f string, a ...any) { logger.Warn(fmt.Sprintf(f, a...), "component", "nodelog") }})
	if err != nil {
		return nil, nil, fmt.Errorf("node log %s: %w", walDir, err)
	}
	cfg := raftengine.Config{
		NodeID: rc.NodeID, GroupCount: rc.GroupCount, Peers: peers, Dir: filepath.Join(dataDir, "raft"),
		Stores: func(g uint64) (raft.LogStore, raft.StableStore, error) {
			s := nl.Group(g)
			// The last 16 entries of each group stay in memory for replication to
			// followers (the node log preads every GetLog otherwise). Small, because an
			// entry can carry a 32 MiB body that the state machine already holds once.
			c, err := raft.NewLogCache(16, s)
			if err != nil {
				return nil, nil, err
			}
			return c, s, nil
		},
		InitMembership:    true,
		HeartbeatTimeout:  time.Duration(rc.HeartbeatTimeoutMs) * time.Millisecond,
		SnapshotThreshold: rc.SnapshotThreshold, TrailingLogs: rc.TrailingLogs,
		Logger: logger, RaftLog: stderr,
	}
	for _, v := range []*bool{rc.InitMembershipPerGroup, rc.InitMembership} {
		if v != nil {
			cfg.InitMembership = *v
		}
	}
	if len(peers) > 1 {
		bind := pickStr(fc.Server.ClusterListen, peers[self].RaftAddr)
		ln, err := net.Listen("tcp", bind)
		if err != nil {
			nl.Close()
			return nil, nil, fmt.Errorf("cluster listener %s: %w", bind, err)
		}
		cfg.Listener = ln
	}
	e, err := raftengine.Open(cfg)
	if err != nil {
		nl.Close()
		return nil, nil, err
	}
	logger.Info("raft engine", "node_id", rc.NodeID, "groups", e.GroupCount(), "voters", len(peers), "wal", walDir, "fsync", fsync.String())
	return e, func() { e.Close(); nl.Close() }, nil
}

func pickStr(v, def string) string {
	if v != "" {
		return v
	}
	return def
}

func validClusterID(id string) bool {
	if len(id) == 0 || len(id) > 64 {
		return false
	}
	for _, c := range id {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-') {
			return false
		}
	}
	return true
}

// loadClusterID reads DIR/cluster-id, creating it on first start.
func loadClusterID(dir string) (string, error) {
	p := filepath.Join(dir, "cluster-id")
	if b, err := os.ReadFile(p); err == nil {
		id := strings.TrimSpace(string(b))
		if !validClusterID(id) {
			return "", fmt.Errorf("%s holds %q, which is not a valid cluster id; fix or remove the file", p, id)
		}
		return id, nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", fmt.Errorf("data directory: %w", err)
	}
	id := server.NewClusterID()
	tmp := p + ".tmp"
	if err := os.WriteFile(tmp, []byte(id+"\n"), 0o644); err != nil {
		return "", fmt.Errorf("write cluster id: %w", err)
	}
	if err := os.Rename(tmp, p); err != nil {
		return "", fmt.Errorf("write cluster id: %w", err)
	}
	return id, nil
}
