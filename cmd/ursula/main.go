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
  ursula export <stream-url> <out.db> [--at OFFSET|TIME|-DURATION] [--token-file F] [--ca-file F]
  ursula log <stream-url> [--json]
  ursula branch <src-url>[@OFFSET|@TIME] <dst-url>
  ursula verify <stream-url> [--every 10m] [--metrics-listen ADDR]
  ursula ctl [--node ADMIN_URL] [--json] status|wait-ready|drain|undrain|transfer|members ...
  ursula sql <stream-url> "QUERY" [--at OFFSET|TIME] [--json|--csv]
  ursula backup create --from URL --to DIR|s3://bucket/prefix | verify DIR | restore DIR --to URL
  ursula gateway --listen ADDR --upstream URL[,URL...] [--config FILE]
  ursula help

Commands:
  server   Run the stream server until SIGINT or SIGTERM (graceful: in-flight requests finish).
  export   Write a plain SQLite file of a replicated database, at the tail or as of a commit.
  log      List a database's retained commits and snapshots with their times.
  branch   Make a writable copy of a database as it was, as a fork of its stream.
  verify   Rebuild a database from its stream and check it (integrity, replay agreement).
  ctl      Operate a node through its admin listener (ursula ctl help).
  sql      Query a replicated database without a local copy (pages fetched on demand).
  backup   Back up every stream of a node or cluster, check a backup, restore it elsewhere.
  gateway  One front door to a cluster: auth, leader redirects, quotas, usage log (docs/security.md).

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
                       url = "http://127.0.0.1:4437"  # Raft rides on this listener
                       # raft_addr = "127.0.0.1:5437" # or a separate cluster listener
                       # ... one [[raft.peers]] per voter, this node included
                       [storage.cold]
                       backend = "fs"             # or "s3" ([storage.cold.s3]) or "none"
                       dir = "/mnt/ursula-cold"   # fs: default <data_dir>/cold
                   Security (off by default; docs/security.md): server.tls_cert_file and
                   server.tls_key_file (HTTPS); raft.tls_ca_file, raft.tls_cert_file and
                   raft.tls_key_file (peers over mutual TLS); server.cors_allowed_origins.
                   Bearer tokens, with any [auth] key set:
                       [auth]
                       token_file = "tokens"      # lines "TOKEN SCOPE[,SCOPE...]"
                       issuer = "https://idp.example"   # JWT access tokens (RFC 9068):
                       audience = "ursula"        #   iss and aud they must carry
                       jwks_url = "https://idp.example/jwks.json"  # the issuer's keys
                       jwks_ca_file = "idp-ca.crt"  # CA of an https jwks_url
                       policy_file = "policy.toml"  # bucket owners and public_read
                   A listener beyond loopback without TLS and auth refuses to start
                   unless server.insecure = true. SIGHUP reloads the certificates and
                   the auth files.
  --engine NAME    "raft" (default): persistent, replicated when peers are configured; with
                   no peers a single voter. "memory": streams live in process memory only.
  --node-id N      overrides raft.node_id, so one config file can serve every node
  --admin-listen A admin listener (config server.admin_listen; default 127.0.0.1 and the
                   client listener's port + 1, so 127.0.0.1:4438 by default; "off" disables)
  --join URL       start a new node for a running cluster (any member's client URL); it
                   waits until an operator adds it: ursula ctl members add ID URL
  --cpuprofile F   write a Go CPU profile to F until shutdown (for performance work)
  --memprofile F   write a Go allocation profile to F at shutdown (for performance work)

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
readiness at /__ursula/ready, metrics at /__ursula/metrics (JSON) and /metrics (Prometheus).
The admin listener serves those too, plus every operation (docs/cluster.md):
GET /__ursula/raft/status, POST /__ursula/raft/transfer?group=N[&to=ID], POST /__ursula/raft/drain,
POST|DELETE /__ursula/leadership-shed/maintenance, GET /__ursula/members, membership changes,
GET /__ursula/recovery, POST /__ursula/flush-cold/{bucket}/{stream}.
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
	case "ctl":
		return runCtl(args[1:], stdout, stderr)
	case "gateway":
		return gatewayMain(args[1:], stderr)
	case "sql":
		if err := runSQL(args[1:], stdout, stderr); err != nil {
			fmt.Fprintf(stderr, "ursula sql: %v\n", err)
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
	if cmd, ok := databaseCommands()[args[0]]; ok {
		if err := cmd(args[1:], stdout, stderr); err != nil {
			fmt.Fprintf(stderr, "ursula %s: %v\n", args[0], err)
			return 1
		}
		return 0
	}
	if strings.HasPrefix(args[0], "--") { // the spec's form: ursula --config FILE --node-id N
		return run(append([]string{"server"}, args...), stdout, stderr)
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
		// ClusterListen is the address a separate cluster listener binds (default: this
		// node's raft_addr in raft.peers; differs when peers reach it through a proxy or
		// NAT). Without either, the client listener carries Raft (clusterListener).
		ClusterListen string `toml:"cluster_listen"`
		// AdminListen is the admin listener (lifecycle.go).
		AdminListen string `toml:"admin_listen"`
		// TLS on the client listener (security.go); both or neither.
		TLSCertFile string `toml:"tls_cert_file"`
		TLSKeyFile  string `toml:"tls_key_file"`
		// Insecure allows a non-loopback listener without TLS or auth.
		Insecure bool `toml:"insecure"`
		// CORSAllowedOrigins lists the browser origins allowed to read ("*": all).
		CORSAllowedOrigins []string `toml:"cors_allowed_origins"`
	} `toml:"server"`
	Auth authConfig `toml:"auth"` // security.go
	Raft struct {
		NodeID                 uint64 `toml:"node_id"`
		GroupCount             int    `toml:"group_count"`
		InitMembershipPerGroup *bool  `toml:"init_membership_per_group"`
		InitMembership         *bool  `toml:"init_membership"` // alias (troubleshooting docs)
		HeartbeatTimeoutMs     int    `toml:"heartbeat_timeout_ms"`
		SnapshotThreshold      uint64 `toml:"snapshot_threshold"`
		TrailingLogs           uint64 `toml:"trailing_logs"`
		// Raft-log budget in bytes (default 1 GiB): writes with a body are refused over twice it.
		SnapshotLogBudget int64 `toml:"snapshot_log_budget"`
		// Leadership balancer interval ("30s" by default, "0" turns it off).
		LeaderBalanceInterval string `toml:"leader_balance_interval"`
		// Mutual TLS of the peer transport (security.go): the cluster CA and this node's pair.
		// One multiplexed connection per peer for every group (off: one per group).
		SharedPeerConnection bool   `toml:"shared_peer_connection"`
		TLSCAFile            string `toml:"tls_ca_file"`
		TLSCertFile          string `toml:"tls_cert_file"`
		TLSKeyFile           string `toml:"tls_key_file"`
		WAL                  struct {
			Path        string `toml:"path"`
			Fsync       string `toml:"fsync"`
			SegmentSize int64  `toml:"segment_size"`
		} `toml:"wal"`
		Peers []struct {
			NodeID   uint64 `toml:"node_id"`
			URL      string `toml:"url"`
			RaftAddr string `toml:"raft_addr"` // optional: a separate cluster listener
		} `toml:"peers"`
	} `toml:"raft"`
	Storage storageConfig `toml:"storage"` // [storage.cold], cold.go
	Limits  limitsConfig  `toml:"limits"`  // limits.go
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
	memProfile := fs.String("memprofile", "", "write an allocation profile to this file at shutdown")
	adminListen := fs.String("admin-listen", "", "admin listener address")
	join := fs.String("join", "", "client URL of a member of the cluster to join")
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
	gcFloor, err := fc.Runtime.gcHeapFloor()
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
	if *memProfile != "" {
		f, err := os.Create(*memProfile)
		if err != nil {
			return err
		}
		defer func() { pprof.Lookup("allocs").WriteTo(f, 0); f.Close() }()
	}
	clusterID := fc.Server.ClusterID
	if clusterID != "" && !validClusterID(clusterID) {
		return fmt.Errorf("config server.cluster_id %q: use 1 to 64 characters of A-Z a-z 0-9 . _ -", clusterID)
	}
	joining, err := prepareJoin(*join, dataDir, &fc, clusterID)
	if err != nil {
		return err
	}
	if clusterID == "" {
		id, err := loadClusterID(dataDir)
		if err != nil {
			return err
		}
		clusterID = id
	}
	lim, err := resolveLimits(&fc.Limits)
	if err != nil {
		return err
	}
	secCtx, stopSec := context.WithCancel(context.Background())
	defer stopSec()
	sec, err := loadSecurity(secCtx, &fc, addr, logger)
	if err != nil {
		return err
	}
	sec.reloadOnHUP(secCtx, logger)
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("listen %s: %w", addr, err)
	}
	var eng engine.Engine
	var drain func()
	if engineName == "memory" {
		eng = engine.NewMemory(10 * time.Second)
	} else {
		re, closeLog, err := openRaft(&fc, dataDir, sec.scheme()+"://"+ln.Addr().String(), ln.Addr(), joining, sec, stderr, logger, &lim)
		if err != nil {
			ln.Close()
			return err
		}
		defer closeLog()
		eng = re
		if len(fc.Raft.Peers) > 1 || joining {
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
	// The live-reader bound: [limits] keeps it below the connection cap; the spec's
	// runtime.live_read_max_waiters_per_core may lower it (or, at 0, leave only that cap).
	switch {
	case maxLive > 0:
		lim.maxLive = min(lim.maxLive, maxLive)
	case maxLive < 0:
		lim.maxLive = -1
	}
	srv := server.New(eng, server.Config{ClusterID: clusterID, Logger: logger, MaxLiveReaders: lim.maxLive, Limits: lim.server,
		Auth: sec.auth, CORSAllowedOrigins: fc.Server.CORSAllowedOrigins})
	if lim.guard != nil {
		srv.SetAdmission(lim.guard)
	}
	if err := enableCold(srv, &fc.Storage, dataDir, engineName, clusterSize(len(fc.Raft.Peers), joining), logger); err != nil {
		ln.Close()
		return err
	}
	defer srv.StopCold()
	// Live reads (long-poll, SSE) watch the base context, so a shutdown ends them at once
	// instead of waiting for their timeouts.
	baseCtx, cancelBase := context.WithCancel(context.Background())
	defer cancelBase()
	go server.ReleaseMemory(baseCtx, lim.freeMemEvery, lim.freeMemMin)
	hs, cln := lim.httpServer(srv, ln, lim.maxConns, sec.serverTLS())
	hs.BaseContext = func(net.Listener) context.Context { return baseCtx }
	hs.RegisterOnShutdown(cancelBase)
	adminSrv, err := serveAdmin(pickStr(*adminListen, fc.Server.AdminListen), addr, srv, sec, lim, logger)
	if err != nil {
		ln.Close()
		return err
	}
	defer adminSrv.Close()
	logger.Info("ursula listening", "addr", ln.Addr().String(), "scheme", sec.scheme(), "auth", sec.auth != nil, "engine", engineName,
		"cluster_id", clusterID, "data", dataDir, "max_connections", lim.maxConns, "max_live_readers", lim.maxLive, "nofile", lim.nofile)

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	// Started once the engine is open: a restart restores its groups on every CPU. Off
	// by default where one P was measured slower: a cluster member (followers), and a
	// journal that fsyncs every append (a P held in fdatasync stalls the rest).
	fsyncAll := engineName == "raft" && fc.Raft.WAL.Fsync == "always"
	pc := fc.Runtime.startProcs(clusterSize(len(fc.Raft.Peers), joining) <= 1 && !fsyncAll)
	defer pc.Stop()
	defer gcFloor.start().Stop()
	errc := make(chan error, 1)
	go func() { errc <- hs.Serve(cln) }()
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
func openRaft(fc *fileConfig, dataDir, selfURL string, httpAddr net.Addr, joining bool, sec *security, stderr io.Writer, logger *slog.Logger, lim *resolvedLimits) (*raftengine.Engine, func(), error) {
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
		u := strings.TrimRight(p.URL, "/")
		if len(rc.Peers) > 1 {
			if err := checkPeerURL(p.NodeID, u); err != nil {
				return nil, nil, err
			}
		}
		if p.NodeID == rc.NodeID {
			self = i
		}
		// Without raft_addr, the peer's client listener carries its Raft traffic (an
		// HTTP upgrade): its Raft address is its URL.
		peers = append(peers, raftengine.Peer{ID: p.NodeID, URL: u, RaftAddr: pickStr(p.RaftAddr, u)})
	}
	if len(rc.Peers) > 0 && self < 0 {
		return nil, nil, fmt.Errorf("raft.peers must include this node (node_id %d)", rc.NodeID)
	}
	if len(peers) == 0 {
		peers = []raftengine.Peer{{ID: rc.NodeID, URL: selfURL}}
		if joining {
			// The cluster reaches it at its cluster listener, or through its URL.
			peers[0].RaftAddr = pickStr(fc.Server.ClusterListen, selfURL)
			self = 0
		}
	}
	fsync, err := raftlog.ParseFsyncMode(pickStr(rc.WAL.Fsync, "never"))
	if err != nil {
		return nil, nil, fmt.Errorf("raft.wal.fsync: %w", err)
	}
	walDir := pickStr(rc.WAL.Path, filepath.Join(dataDir, "wal"))
	if err := os.MkdirAll(walDir, 0o755); err != nil {
		return nil, nil, fmt.Errorf("raft.wal.path: %w", err)
	}
	guard, err := raftlog.NewDiskGuard(walDir, lim.walMinFree, lim.walResumeFree)
	if err != nil {
		return nil, nil, fmt.Errorf("limits: %w", err)
	}
	lim.guard = guard
	nl, err := raftlog.Open(walDir, raftlog.Options{Fsync: fsync, SegmentBytes: rc.WAL.SegmentSize, Guard: guard,
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
		Join:              joining,
		JournalDamaged:    nl.Stats().TailDamage != "",
		HeartbeatTimeout:  time.Duration(rc.HeartbeatTimeoutMs) * time.Millisecond,
		SnapshotThreshold: rc.SnapshotThreshold, TrailingLogs: rc.TrailingLogs,
		Logger: logger, RaftLog: stderr, WriteAdmission: guard.WriteRefusal,
		// Shared entries paid off only where every append waits for an fsync.
		BatchProposals:       fsync == raftlog.FsyncAlways,
		SharedPeerConnection: rc.SharedPeerConnection,
	}
	for _, v := range []*bool{rc.InitMembershipPerGroup, rc.InitMembership} {
		if v != nil {
			cfg.InitMembership = *v
		}
	}
	if len(peers) > 1 || joining {
		ln, err := clusterListener(fc, peers[self], sec, httpAddr, logger)
		if err != nil {
			nl.Close()
			return nil, nil, err
		}
		cfg.PeerTLS = sec.peer
		cfg.Listener = ln
	}
	balance := 30 * time.Second
	if v := rc.LeaderBalanceInterval; v == "0" {
		balance = 0
	} else if v != "" {
		if balance, err = time.ParseDuration(v); err != nil || balance < 0 {
			nl.Close()
			return nil, nil, fmt.Errorf("raft.leader_balance_interval: %q is not a duration such as \"30s\" (\"0\": off)", v)
		}
	}
	e, err := raftengine.Open(cfg)
	if err != nil {
		nl.Close()
		return nil, nil, err
	}
	e.SetRaftLogBudget(rc.SnapshotLogBudget)
	e.SetLeaderBalance(balance)
	logger.Info("raft engine", "node_id", rc.NodeID, "groups", e.GroupCount(), "voters", len(peers), "wal", walDir, "fsync", fsync.String())
	return e, func() {
		e.Close()
		// The clean-stop record vouches that the journal is synced: write it only then.
		if err := nl.Close(); err == nil {
			if err := e.RecordCleanShutdown(); err != nil {
				logger.Warn("could not record the clean stop", "err", err)
			}
		}
	}, nil
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
