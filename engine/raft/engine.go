// Package raftengine is the replicated engine behind engine.Engine: multi-Raft on
// hashicorp/raft. Every stream hashes to one of GroupCount groups; each group is one
// raft.Raft whose FSM holds the streamcore.State of all its streams and applies the same
// deterministic streamcore commands as the memory engine (commands carry their timestamp,
// apply never reads the clock).
//
// Forks. A fork create touches two streams (the fork and its source: ForkRefs, soft
// deletes and their cascade). Rather than coordinate two groups, a fork lives in the group
// of its source: the create is routed to the source's group, and every node keeps an
// alias index (key -> group) derived from what its FSMs hold, so later requests on the fork
// key go to that group. Every fork family therefore lives in one group and every command
// applies within one group. The index is rebuilt from the FSM on apply and restore, so it
// is the same on every replica once it has applied the same entries. Limitation: a node
// whose replica of the source's group lags the leader routes the brand-new fork key to its
// hash group until it has applied the create (a brief window on followers only; the
// leader that acknowledged the create routes correctly at once).
//
// Peers. Every group's Raft traffic and the engine's own peer requests share one cluster
// listener (transport.go, peer.go): a follower hands the leader a read renewal it cannot
// propose, and the cold collector asks the other voters which objects they still need.
//
// The directory is engine/raft but the package is named raftengine: its files use
// hashicorp/raft throughout, whose package is raft, and callers read raftengine.Open.
//
// Lifecycle (lifecycle.go): the recovery gate that keeps a node which may have lost
// acknowledged entries under fsync=never from voting until it caught up, learners and
// membership changes. Not implemented yet (docs/cluster.md): forwarding of reads from
// followers to the leader (followers redirect instead).
package raftengine

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"

	"github.com/ursula-go/ursula/engine"
	"github.com/ursula-go/ursula/streamcore"
)

// Peer is one voter of every group.
type Peer struct {
	ID       uint64
	URL      string // HTTP base URL (Location of leader redirects)
	RaftAddr string // cluster listener address
}

// StoreFactory returns the log and stable store of a group.
type StoreFactory func(group uint64) (raft.LogStore, raft.StableStore, error)

// InmemStores keeps every group's log in memory (tests; nothing survives a restart).
func InmemStores(uint64) (raft.LogStore, raft.StableStore, error) {
	s := raft.NewInmemStore()
	return s, s, nil
}

// Config configures the engine.
type Config struct {
	NodeID     uint64
	GroupCount int    // default 16
	Peers      []Peer // every voter including this node; empty = single voter
	// Listener is the cluster listener carrying every group's Raft traffic. Required with
	// more than one peer; with a single voter and no listener, an in-memory transport is
	// used.
	Listener net.Listener
	// PeerTLS, when set, runs every peer connection over mutual TLS: the cluster listener
	// accepts only clients whose certificate the cluster CA signed, and this node dials
	// its peers presenting its own certificate and verifying theirs.
	PeerTLS *PeerTLS
	Dir     string       // raft snapshots live under Dir/g<N>/snapshots
	Stores  StoreFactory // default InmemStores
	// InitMembership: initialise a group that has no local state with the static voter set
	// (every node does it with the same configuration, which hashicorp/raft allows).
	// A single voter always initialises.
	InitMembership bool
	// Join: this node is new to a running cluster. Its groups start empty, never
	// initialise, and wait for the leaders to add it (lifecycle.go).
	Join bool
	// JournalDamaged: the node log cut a damaged tail when it opened. With an unclean
	// stop, it closes the recovery gate as a host restart does (lifecycle.go).
	JournalDamaged bool

	HeartbeatTimeout  time.Duration
	ElectionTimeout   time.Duration
	CommitTimeout     time.Duration
	SnapshotThreshold uint64        // log entries since the last snapshot that trigger one
	TrailingLogs      uint64        // entries kept after a snapshot (follower catch-up)
	SnapshotInterval  time.Duration // how often the threshold is checked
	ApplyTimeout      time.Duration
	SweepEvery        time.Duration // expired-stream collection (leader proposes a sweep)
	Logger            *slog.Logger
	RaftLog           io.Writer // hashicorp/raft's own log (default stderr, WARN level)
	// WriteAdmission is the node's write admission (raftlog.DiskGuard.WriteRefusal):
	// while it refuses, this node hands its leaderships off (diskwatch.go). nil: never.
	WriteAdmission func() (token, reason string)
	// TrimLogRatio: once hot bytes fall (a cold flush), a group snapshots to trim its log
	// only when the log it holds is at least this many times the snapshot's expected size
	// (diskwatch.go). 0: DefaultTrimLogRatio; negative: at every fall of the hot bytes.
	TrimLogRatio float64
	// BatchProposals: concurrent proposals to a group share log entries (batch.go).
	// Measured a gain only with a journal that fsyncs every append; off, every command
	// is its own entry.
	BatchProposals bool
	// SharedPeerConnection: every group's Raft connections and the peer channel to a peer
	// ride one multiplexed connection with coalesced writes (session.go). Off: one
	// connection per group and stream, as hashicorp/raft pools them.
	SharedPeerConnection bool
}

// Engine implements engine.Engine on multi-Raft.
type Engine struct {
	cfg    Config
	self   Peer
	groups []*group
	mux    *Mux
	byID   map[raft.ServerID]Peer

	aliasMu sync.RWMutex
	alias   map[string]uint64 // key -> group, for streams held outside their hash group

	peers peerChannel // requests to the other voters (peer.go)
	life  lifecycle   // address book, drain mark, recovery gate (lifecycle.go)
	disk  diskWatch   // disk pressure hand-off and log trim (diskwatch.go)

	stop chan struct{}
	wg   sync.WaitGroup
	once sync.Once

	replayTurn chan struct{} // single voter: one group replays its log at a time (startscan.go)
}

var (
	_ engine.Engine         = (*Engine)(nil)
	_ engine.LeaderVerifier = (*Engine)(nil)
	_ engine.RaftAdmin      = (*Engine)(nil)
	_ engine.Groups         = (*Engine)(nil)
	_ engine.ColdPeers      = (*Engine)(nil)
)

// Open starts every group. It returns once the groups run (leaders are elected in the
// background; Ready reports when every group has one).
func Open(cfg Config) (*Engine, error) {
	if cfg.NodeID == 0 {
		return nil, errors.New("raftengine: node id must be non-zero")
	}
	if cfg.GroupCount <= 0 {
		cfg.GroupCount = 16
	}
	if cfg.Stores == nil {
		cfg.Stores = InmemStores
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.RaftLog == nil {
		cfg.RaftLog = os.Stderr
	}
	single := len(cfg.Peers) <= 1 && !cfg.Join
	if cfg.HeartbeatTimeout == 0 {
		cfg.HeartbeatTimeout = time.Second
		if single {
			cfg.HeartbeatTimeout = 100 * time.Millisecond
		}
	}
	if cfg.ElectionTimeout == 0 {
		cfg.ElectionTimeout = cfg.HeartbeatTimeout
	}
	if cfg.CommitTimeout == 0 {
		cfg.CommitTimeout = 50 * time.Millisecond
	}
	if cfg.SnapshotThreshold == 0 {
		cfg.SnapshotThreshold = 8192
	}
	if cfg.TrailingLogs == 0 {
		cfg.TrailingLogs = 4096
	}
	if cfg.SnapshotInterval == 0 {
		cfg.SnapshotInterval = 30 * time.Second
	}
	if cfg.TrimLogRatio == 0 {
		cfg.TrimLogRatio = DefaultTrimLogRatio
	}
	if cfg.ApplyTimeout == 0 {
		cfg.ApplyTimeout = 10 * time.Second
	}
	if cfg.SweepEvery == 0 {
		cfg.SweepEvery = 10 * time.Second
	}
	e := &Engine{cfg: cfg, byID: map[raft.ServerID]Peer{}, alias: map[string]uint64{}, stop: make(chan struct{})}
	if single {
		// A follower's replay must not wait (its leader would time it out): turns only
		// where no other voter is.
		e.replayTurn = make(chan struct{}, 1)
	}
	if err := e.armTestApplyFault(os.Getenv(EnvTestApplyFault)); err != nil {
		return nil, err
	}
	if len(cfg.Peers) == 0 {
		cfg.Peers = []Peer{{ID: cfg.NodeID}}
		e.cfg.Peers = cfg.Peers
	}
	for _, p := range cfg.Peers {
		if p.ID == 0 {
			return nil, errors.New("raftengine: peer node ids must be non-zero")
		}
		if _, dup := e.byID[serverID(p.ID)]; dup {
			return nil, fmt.Errorf("raftengine: node id %d listed twice", p.ID)
		}
		e.byID[serverID(p.ID)] = p
		if p.ID == cfg.NodeID {
			e.self = p
		}
	}
	if e.self.ID == 0 {
		return nil, fmt.Errorf("raftengine: the peers do not include this node (%d)", cfg.NodeID)
	}
	if cfg.Listener != nil {
		ln := cfg.Listener
		if cfg.PeerTLS != nil {
			ln = tls.NewListener(ln, cfg.PeerTLS.Server)
		}
		e.mux = NewMux(ln, e.self.RaftAddr)
		e.mux.shared = cfg.SharedPeerConnection
		if cfg.PeerTLS != nil {
			e.mux.clientTLS = cfg.PeerTLS.Client
		}
		e.mux.HandlePeers(e.servePeer)
		e.mux.SetLog(cfg.RaftLog)
	} else if !single {
		return nil, errors.New("raftengine: a cluster listener is required with more than one peer")
	}
	if err := e.openLifecycle(single); err != nil {
		return nil, err
	}
	if err := e.openGroups(); err != nil {
		return nil, err
	}
	e.afterOpen()
	e.wg.Add(2)
	go e.sweeper()
	go e.lifecycleLoop()
	e.startDiskWatch()
	return e, nil
}

// openGroups opens every group, as many at once as the process has CPUs: opening a
// group restores its newest snapshot inside raft.NewRaft (read, check, decode into
// stream memory), which is CPU work of the group alone, and on a node holding gigabytes
// one group after the other left all but one core idle for most of a restart. The
// replays of logged entries that follow still take turns (startscan.go).
func (e *Engine) openGroups() error {
	n := e.cfg.GroupCount
	if e.cfg.Dir != "" {
		// Before any group opens: one opened on a data directory of another count would
		// bootstrap groups its journal then keeps for good.
		if err := checkGroupCount(e.cfg.Dir, n); err != nil {
			e.Close()
			return fmt.Errorf("raftengine: group 0: %w", err)
		}
	}
	groups := make([]*group, n)
	errs := make([]error, n)
	next := make(chan int, n)
	for i := range n {
		next <- i
	}
	close(next)
	var wg sync.WaitGroup
	for range min(n, max(1, runtime.GOMAXPROCS(0))) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				if groups[i], errs[i] = e.openGroup(uint64(i)); errs[i] != nil {
					return // the others finish theirs; the engine closes below
				}
			}
		}()
	}
	wg.Wait()
	for _, g := range groups {
		if g != nil {
			e.groups = append(e.groups, g) // all of them, in order, unless one failed
		}
	}
	for i, err := range errs {
		if err != nil {
			e.Close()
			return fmt.Errorf("raftengine: group %d: %w", i, err)
		}
	}
	return nil
}

func serverID(id uint64) raft.ServerID { return raft.ServerID(strconv.FormatUint(id, 10)) }

func (e *Engine) openGroup(id uint64) (*group, error) {
	g := &group{Partition: engine.NewPartition(streamcore.NewState()), id: id, e: e, aliases: map[string]bool{}}
	rawLogs, stable, err := e.cfg.Stores(id)
	if err != nil {
		return nil, err
	}
	ji := journalIndexOf(rawLogs, stable) // start-up reads without bodies (startscan.go)
	logs, err := newSizedLog(rawLogs, ji) // Raft-log pressure (logpressure.go)
	if err != nil {
		return nil, err
	}
	g.logs = logs
	var snaps raft.SnapshotStore
	if e.cfg.Dir != "" {
		dir := filepath.Join(e.cfg.Dir, fmt.Sprintf("g%04d", id))
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return nil, err
		}
		if snaps, err = newSnapshotStore(dir, 2, e.cfg.RaftLog); err != nil {
			return nil, err
		}
	} else {
		snaps = raft.NewInmemSnapshotStore()
	}
	var trans raft.Transport
	if e.mux != nil {
		trans = raft.NewNetworkTransportWithConfig(&raft.NetworkTransportConfig{
			Stream: e.mux.Layer(uint32(id)), MaxPool: 3, Timeout: 10 * time.Second,
			Logger: hclog.New(&hclog.LoggerOptions{Name: "raft-net", Output: e.cfg.RaftLog, Level: hclog.Warn}),
		})
	} else {
		_, trans = raft.NewInmemTransport(raft.ServerAddress(fmt.Sprintf("node-%d", e.cfg.NodeID)))
	}
	g.trans, g.snaps = trans, snaps
	trans = &gateTransport{Transport: trans, g: g}
	if e.mux != nil {
		trans = e.mux.Framed(uint32(id), trans, e.stop) // pipelines on one link per peer
	}
	rc := raft.DefaultConfig()
	rc.LocalID = serverID(e.cfg.NodeID)
	rc.HeartbeatTimeout = e.cfg.HeartbeatTimeout
	rc.ElectionTimeout = e.cfg.ElectionTimeout
	rc.LeaderLeaseTimeout = min(e.cfg.HeartbeatTimeout/2, 500*time.Millisecond)
	rc.CommitTimeout = e.cfg.CommitTimeout
	rc.SnapshotThreshold = e.cfg.SnapshotThreshold
	rc.TrailingLogs = e.cfg.TrailingLogs
	rc.SnapshotInterval = e.cfg.SnapshotInterval
	rc.MaxAppendEntries = 256
	rc.BatchApplyCh = true
	rc.LogOutput = e.cfg.RaftLog
	rc.LogLevel = "WARN"
	if len(e.cfg.Peers) == 1 && !e.cfg.Join {
		rc.LogLevel = "ERROR" // a single voter's routine elections are not news
	}
	rc.Logger = nil
	has, err := raft.HasExistingState(logs, stable, snaps)
	if err != nil {
		return nil, err
	}
	g.hadState = has
	if has && e.life.mayHaveLost(e.cfg.JournalDamaged) && !e.life.single {
		g.gated.Store(true)
	}
	scanLogs, err := newStartScanLog(logs, ji, snaps, e.replayTurn, e.stop)
	if err != nil {
		return nil, err
	}
	if metas, err := snaps.List(); err == nil && len(metas) > 0 {
		g.restoreHint.Store(metas[0].Size) // the snapshot NewRaft restores, unless it fails to open
	}
	r, err := raft.NewRaft(rc, g, scanLogs, stable, snaps, trans)
	g.restoreHint.Store(0)
	scanLogs.disarm()
	if err != nil {
		return nil, err
	}
	g.r = r
	if !has && !e.cfg.Join && (e.cfg.InitMembership || len(e.cfg.Peers) == 1) {
		var servers []raft.Server
		for _, p := range e.cfg.Peers {
			addr := raft.ServerAddress(p.RaftAddr)
			if e.mux == nil {
				addr = trans.LocalAddr()
			}
			servers = append(servers, raft.Server{Suffrage: raft.Voter, ID: serverID(p.ID), Address: addr})
		}
		if err := r.BootstrapCluster(raft.Configuration{Servers: servers}).Error(); err != nil && !errors.Is(err, raft.ErrCantBootstrap) {
			return nil, err
		}
	}
	return g, nil
}

// checkGroupCount records the group count on first start and refuses another one later:
// streams are placed by hash mod the count, so changing it would strand them.
func checkGroupCount(dir string, n int) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	p := filepath.Join(dir, "group_count")
	if b, err := os.ReadFile(p); err == nil {
		if have, _ := strconv.Atoi(string(bytes.TrimSpace(b))); have != n {
			return fmt.Errorf("raft.group_count is %d but the data in %s was written with %d; the count cannot change", n, dir, have)
		}
		return nil
	}
	return os.WriteFile(p, []byte(strconv.Itoa(n)+"\n"), 0o644)
}

// groupOf is the group holding key: its alias when it lives outside its hash group.
func (e *Engine) groupOf(key string) *group {
	e.aliasMu.RLock()
	id, ok := e.alias[key]
	e.aliasMu.RUnlock()
	if ok {
		return e.groups[id]
	}
	return e.groups[e.home(key)]
}

// home is the stable hash group of key: FNV-1a 64 of "bucket/stream" mod GroupCount.
func (e *Engine) home(key string) uint64 {
	h := fnv.New64a()
	h.Write([]byte(key))
	return h.Sum64() % uint64(e.cfg.GroupCount)
}

// route picks the group a command applies in (see the package comment for forks).
func (e *Engine) route(c *streamcore.Command) *group {
	if c.Op != streamcore.OpCreate || c.Fork == nil {
		return e.groupOf(c.Key)
	}
	e.aliasMu.RLock()
	id, ok := e.alias[c.Key]
	e.aliasMu.RUnlock()
	if ok {
		return e.groups[id]
	}
	h := e.groups[e.home(c.Key)]
	h.RLock()
	exists := h.StateLocked().Streams[c.Key] != nil
	h.RUnlock()
	if exists {
		return h // the existing stream answers (409 for a different configuration)
	}
	return e.groupOf(c.Fork.Source)
}

func (e *Engine) leaderErr(g *group, proposed bool) error {
	_, id := g.r.LeaderWithID()
	nl := &engine.NotLeaderError{Proposed: proposed, Group: g.id, NoPeers: len(e.cfg.Peers) == 1}
	if id == "" || id == serverID(e.cfg.NodeID) {
		return nl // no leader known: matches engine.ErrNoLeader unless proposed
	}
	p, _ := e.peerByID(id)
	nl.LeaderURL, nl.LeaderID, nl.Term = p.URL, p.ID, g.r.CurrentTerm()
	return nl
}

// proposalCap is room for an entry holding c: the entry kind, c's body and strings, and
// a bound on its fixed fields, so AppendCommand never grows the slice (for a 1 MiB body
// that growth was a second allocation, clearing and copy of the body per append).
func proposalCap(c *streamcore.Command) int {
	return 1 + streamcore.CommandSizeHint(c)
}

// commandEntry encodes c as an entryCommand log entry: written around its body when the
// body came in a frame (a large body: no copy of it), else into one new buffer.
func commandEntry(c *streamcore.Command) []byte {
	if data, ok := streamcore.AppendCommandAround([]byte{entryCommand}, c); ok {
		return data
	}
	data := make([]byte, 1, proposalCap(c))
	data[0] = entryCommand
	return streamcore.AppendCommand(data, c)
}

// Propose implements engine.Engine.
func (e *Engine) Propose(ctx context.Context, c *streamcore.Command) (streamcore.Result, error) {
	g := e.route(c)
	if err := g.admit(c); err != nil {
		return streamcore.Result{}, err // stopped group, log pressure (applystop.go)
	}
	if g.r.State() != raft.Leader {
		return streamcore.Result{}, e.leaderErr(g, false)
	}
	data := commandEntry(c)
	if !e.cfg.BatchProposals {
		return g.apply(ctx, data)
	}
	return g.propose(ctx, data)
}

// apply proposes one entry on its own (not batched) and returns its outcome.
func (g *group) apply(ctx context.Context, data []byte) (streamcore.Result, error) {
	resp, err := g.applyRaw(ctx, data)
	if err != nil {
		return streamcore.Result{}, err
	}
	return answer(resp)
}

// applyRaw proposes one entry and returns the FSM's response.
func (g *group) applyRaw(ctx context.Context, data []byte) (any, error) {
	return g.outcome(g.enqueue(ctx, data))
}

// enqueue hands one entry to Raft without waiting for it.
func (g *group) enqueue(ctx context.Context, data []byte) raft.ApplyFuture {
	timeout := g.e.cfg.ApplyTimeout
	if dl, ok := ctx.Deadline(); ok {
		timeout = min(timeout, time.Until(dl))
	}
	return g.r.Apply(data, timeout)
}

// outcome waits for an enqueued entry and returns the FSM's response.
func (g *group) outcome(f raft.ApplyFuture) (any, error) {
	if err := f.Error(); err != nil {
		switch {
		case errors.Is(err, raft.ErrNotLeader), errors.Is(err, raft.ErrLeadershipTransferInProgress), errors.Is(err, raft.ErrEnqueueTimeout):
			// Refused before the entry reached the log: nothing was proposed.
			return nil, g.e.leaderErr(g, false)
		case errors.Is(err, raft.ErrLeadershipLost):
			return nil, g.e.leaderErr(g, true)
		}
		return nil, err // outcome unknown (shutdown, timeout while in flight)
	}
	return f.Response(), nil
}

// View implements engine.Engine.
func (e *Engine) View(key string, now int64, fn func(*streamcore.State, *streamcore.Stream)) {
	e.groupOf(key).View(key, now, fn)
}

// Watch implements engine.Engine. Watchers wake when their group applies a change of key,
// on every node (followers too), so long-poll and SSE work anywhere.
func (e *Engine) Watch(key string) <-chan struct{} { return e.groupOf(key).Watch(key) }

// BucketKnown implements engine.Engine.
func (e *Engine) BucketKnown(bucket string) bool { return engine.BucketKnownIn(e.partitions(), bucket) }

// BucketStreams implements engine.BucketCounter: the streams of bucket in this node's
// applied state of every group.
func (e *Engine) BucketStreams(bucket string) int {
	return engine.BucketStreamsIn(e.partitions(), bucket)
}

// Stats implements engine.Engine.
func (e *Engine) Stats() engine.EngineStats { return engine.Stats("raft", e.partitions()) }

func (e *Engine) partitions() []*engine.Partition {
	out := make([]*engine.Partition, len(e.groups))
	for i, g := range e.groups {
		out[i] = g.Partition
	}
	return out
}

// VerifyLeader implements engine.LeaderVerifier: a ReadIndex. A leader first commits and
// applies a barrier of its own term (once per term), so its FSM holds every entry earlier
// leaders committed; then it confirms it still leads (a heartbeat round to a quorum). Its
// FSM then holds every acknowledged write: a write is acknowledged only after this FSM
// applied it, or by an earlier leader whose entries the barrier covered.
func (e *Engine) VerifyLeader(ctx context.Context, key string) error {
	return e.groupOf(key).readIndex(ctx)
}

// LeaderHint implements engine.LeaderVerifier.
func (e *Engine) LeaderHint(key string) error {
	g := e.groupOf(key)
	if g.r.State() == raft.Leader {
		return nil
	}
	return e.leaderErr(g, false)
}

func (g *group) readIndex(ctx context.Context) error {
	if g.r.State() != raft.Leader {
		return g.e.leaderErr(g, false)
	}
	term := g.r.CurrentTerm()
	if g.barrierTerm.Load() != term {
		timeout := g.e.cfg.ApplyTimeout
		if dl, ok := ctx.Deadline(); ok {
			timeout = min(timeout, time.Until(dl))
		}
		if err := g.r.Barrier(timeout).Error(); err != nil {
			return g.e.leaderErr(g, false)
		}
		g.barrierTerm.Store(term)
	}
	if err := g.r.VerifyLeader().Error(); err != nil {
		return g.e.leaderErr(g, false)
	}
	return nil
}

// maxApplyLag is how many committed entries a ready follower may trail by.
const maxApplyLag = 1024

// Ready implements engine.RaftAdmin: every group knows a leader and has applied what it
// knows to be committed (a leader after its term's barrier).
func (e *Engine) Ready() (bool, string) {
	if ok, why := e.lifecycleReady(); !ok {
		return false, why
	}
	for _, g := range e.groups {
		addr, _ := g.r.LeaderWithID()
		if addr == "" {
			return false, fmt.Sprintf("group %d has no leader", g.id)
		}
		if g.r.State() == raft.Leader {
			if g.barrierTerm.Load() != g.r.CurrentTerm() {
				g.kickBarrier()
				return false, fmt.Sprintf("group %d: leader has not applied its term's barrier", g.id)
			}
		} else {
			// A follower is ready once it has applied everything it knew to be committed
			// (after a start or restore), and stays ready under write load unless it falls
			// far behind (apply_lag).
			applied, commit := g.r.AppliedIndex(), g.r.CommitIndex()
			if !g.caughtUp.Load() {
				if applied < commit {
					return false, fmt.Sprintf("group %d is applying committed entries", g.id)
				}
				g.caughtUp.Store(true)
			} else if commit > applied+maxApplyLag {
				return false, fmt.Sprintf("group %d apply lag %d entries", g.id, commit-applied)
			}
		}
	}
	return true, ""
}

func (g *group) kickBarrier() {
	if !g.barrierRunning.CompareAndSwap(false, true) {
		return
	}
	go func() {
		defer g.barrierRunning.Store(false)
		term := g.r.CurrentTerm()
		if g.r.Barrier(g.e.cfg.ApplyTimeout).Error() == nil {
			g.barrierTerm.Store(term)
		}
	}()
}

// GroupStatus is one group in GET /__ursula/raft/status.
type GroupStatus struct {
	Group        uint64 `json:"group"`
	State        string `json:"state"`
	LeaderID     string `json:"leader_id"`
	LeaderURL    string `json:"leader_url,omitempty"`
	Term         uint64 `json:"term"`
	LastIndex    uint64 `json:"last_index"`
	CommitIndex  uint64 `json:"commit_index"`
	AppliedIndex uint64 `json:"applied_index"`
	Streams      int    `json:"streams"`
	// RecoveryGate is "closed" while the replica may lack acknowledged entries after an
	// unclean stop (it neither votes nor campaigns), else "open".
	RecoveryGate     string `json:"recovery_gate"`
	GateRefusedVotes uint64 `json:"gate_refused_votes,omitempty"`
	// ApplyFailure: the group stopped applying at this entry (applystop.go).
	ApplyFailure *ApplyFailure `json:"apply_failure,omitempty"`
}

// Status is GET /__ursula/raft/status.
type Status struct {
	NodeID     uint64 `json:"node_id"`
	URL        string `json:"url,omitempty"`       // this node's client URL
	RaftAddr   string `json:"raft_addr,omitempty"` // this node's cluster address
	DrainMark  bool   `json:"drain_mark"`
	GroupCount int    `json:"group_count"`
	Leading    int    `json:"leading"`
	// Raft-log pressure (logpressure.go) and the leadership balancer (balance.go).
	RaftLogBytes    int64         `json:"raft_log_bytes"`
	RaftLogBudget   int64         `json:"raft_log_budget"`
	RaftLogPressure bool          `json:"raft_log_pressure"`
	Balancer        bool          `json:"balancer"`
	Groups          []GroupStatus `json:"groups"`

	// DiskPressure says why this node's journal takes no writes ("" when it does);
	// PressureTransfers counts leaderships it handed off for that, LogTrims the snapshots
	// taken to trim a group's log after its data reached the cold tier (diskwatch.go).
	DiskPressure      string `json:"disk_pressure,omitempty"`
	PressureTransfers uint64 `json:"pressure_transfers"`
	LogTrims          uint64 `json:"log_trims"`
}

// RaftStatus implements engine.RaftAdmin.
func (e *Engine) RaftStatus() any {
	st := Status{NodeID: e.cfg.NodeID, URL: e.self.URL, RaftAddr: e.selfRaftAddr(), DrainMark: e.life.drainMark.Load(), GroupCount: len(e.groups),
		DiskPressure: e.DiskPressure(), PressureTransfers: e.disk.transfers.Load(), LogTrims: e.disk.trims.Load()}
	st.RaftLogBytes, st.RaftLogBudget, st.RaftLogPressure = e.RaftLogPressure()
	st.Balancer = e.balancerOn()
	for _, g := range e.groups {
		_, id := g.r.LeaderWithID()
		lp, _ := e.peerByID(id)
		gs := GroupStatus{Group: g.id, State: g.r.State().String(), LeaderID: string(id), LeaderURL: lp.URL,
			Term: g.r.CurrentTerm(), LastIndex: g.r.LastIndex(), CommitIndex: g.r.CommitIndex(), AppliedIndex: g.r.AppliedIndex(),
			RecoveryGate: gateName(g.gated.Load()), GateRefusedVotes: g.gateRefusedVotes.Load(), ApplyFailure: g.stop.Load()}
		gs.Streams, _ = g.Count()
		if g.r.State() == raft.Leader {
			st.Leading++
		}
		st.Groups = append(st.Groups, gs)
	}
	return st
}

// ErrUnknownGroup and ErrUnknownNode are refusals of the admin calls.
var (
	ErrUnknownGroup = errors.New("no such raft group")
	ErrUnknownNode  = errors.New("no such voter")
)

// TransferLeadership implements engine.RaftAdmin.
func (e *Engine) TransferLeadership(group, to uint64) error {
	if group >= uint64(len(e.groups)) {
		return ErrUnknownGroup
	}
	g := e.groups[group]
	if g.r.State() != raft.Leader {
		return e.leaderErr(g, false)
	}
	if to == 0 {
		return g.r.LeadershipTransfer().Error()
	}
	p, ok := e.peerByID(serverID(to))
	if !ok {
		return ErrUnknownNode
	}
	if to == e.cfg.NodeID {
		return nil // already the leader
	}
	return g.r.LeadershipTransferToServer(serverID(to), raft.ServerAddress(p.RaftAddr)).Error()
}

// Drain implements engine.RaftAdmin: every group this node leads hands leadership to
// another voter (at most 4 transfers at a time). It repeats for a few seconds while
// leaderships keep arriving (an election or a transfer to this node that was in flight),
// and returns once a pass finds nothing to hand off.
func (e *Engine) Drain() error {
	if e.life.single {
		return errors.New("a single voter cannot hand leadership to anyone")
	}
	deadline := time.Now().Add(5 * time.Second)
	var errs []error
	for quiet := 0; quiet < 3 && time.Now().Before(deadline); {
		var mu sync.Mutex
		errs = errs[:0]
		sem := make(chan struct{}, 4)
		var wg sync.WaitGroup
		moved := 0
		for _, g := range e.groups {
			if g.r.State() != raft.Leader {
				continue
			}
			moved++
			wg.Add(1)
			sem <- struct{}{}
			go func() {
				defer wg.Done()
				defer func() { <-sem }()
				if err := g.r.LeadershipTransfer().Error(); err != nil {
					mu.Lock()
					errs = append(errs, fmt.Errorf("group %d: %w", g.id, err))
					mu.Unlock()
				}
			}()
		}
		wg.Wait()
		if moved == 0 {
			quiet++
		} else {
			quiet = 0
		}
		time.Sleep(100 * time.Millisecond)
	}
	return errors.Join(errs...)
}

// LeaderOf reports the leader's node id of group (0 if unknown); for tests and tools.
func (e *Engine) LeaderOf(group uint64) uint64 {
	_, id := e.groups[group].r.LeaderWithID()
	n, _ := strconv.ParseUint(string(id), 10, 64)
	return n
}

// GroupCount is the number of groups.
func (e *Engine) GroupCount() int { return len(e.groups) }

// GroupOf implements engine.Groups: the group holding key.
func (e *Engine) GroupOf(key string) uint64 { return e.groupOf(key).id }

// Close implements engine.Engine: shuts every group down.
func (e *Engine) Close() error {
	var err error
	e.once.Do(func() {
		close(e.stop)
		var wg sync.WaitGroup
		for _, g := range e.groups {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if g.r != nil {
					g.r.Shutdown().Error()
				}
				if c, ok := g.trans.(io.Closer); ok {
					c.Close()
				}
			}()
		}
		wg.Wait()
		if e.mux != nil {
			err = e.mux.Close()
		}
		e.wg.Wait()
	})
	return err
}

// sweeper proposes, on each group this node leads, the collection of expired streams.
func (e *Engine) sweeper() {
	defer e.wg.Done()
	t := time.NewTicker(e.cfg.SweepEvery)
	defer t.Stop()
	for {
		select {
		case <-e.stop:
			return
		case now := <-t.C:
			for _, g := range e.groups {
				if g.r.State() != raft.Leader || !g.hasExpired(now.UnixMilli()) {
					continue
				}
				data := appendSweep(nil, now.UnixMilli())
				g.apply(context.Background(), data)
			}
		}
	}
}

func (g *group) hasExpired(now int64) bool {
	g.RLock()
	defer g.RUnlock()
	for _, s := range g.StateLocked().Streams {
		if s.Expired(now) && s.ForkRefs <= 0 {
			return true
		}
	}
	return false
}

// setAliases replaces the aliases of group g (keys it holds whose hash group differs).
func (e *Engine) setAliases(g *group, add, remove []string) {
	if len(add) == 0 && len(remove) == 0 {
		return
	}
	e.aliasMu.Lock()
	for _, k := range remove {
		if e.alias[k] == g.id {
			delete(e.alias, k)
		}
	}
	for _, k := range add {
		e.alias[k] = g.id
	}
	e.aliasMu.Unlock()
}

func sortedKeys(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
