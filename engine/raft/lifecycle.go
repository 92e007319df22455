package raftengine

// The node's lifecycle in the cluster: the address book of members added at run time,
// membership changes, the persistent drain mark, the recovery gate and the clean-shutdown
// record.
//
// Address book. The configured peers are known from the start. A member added at run time
// travels inside every group's Raft configuration: its server address is
// "RAFT_ADDR#CLIENT_URL" (the transport dials only the part before '#'). The configuration
// lives in the log and in snapshots, so every replica, a restarted one and a new one
// catching up from a snapshot, learns the member's client URL with no other state.
//
// Recovery gate. Under fsync=never a host crash can drop the unsynced tail of a replica's
// journal. Such a replica must not help elect a leader that lacks entries it had
// acknowledged, so after an unclean stop (no clean-shutdown record) across a host restart
// (the kernel's boot id changed) or with a damaged journal tail, every group that held
// state starts gated: the transport refuses its vote requests and pre-votes, answers
// vote requests of others with "not granted" and refuses leadership transfers to it. The
// gate of a group opens once the replica has applied the commit index its leader reports
// after a fresh ReadIndex. A single voter has no one to catch up with: it opens at once
// and reports the possible loss until an operator accepts it.

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/raft"

	"github.com/ursula-go/ursula/engine"
	"github.com/ursula-go/ursula/streamcore"
)

// Peer-channel ops of this file (peer.go): a membership change forwarded to the group's
// leader, and the leader's commit index after a fresh ReadIndex (the recovery gate).
const (
	peerMember      byte = 'M'
	peerCommitIndex byte = 'C'
	peerIsMember    byte = 'W' // does the group's leader list this node? (removal while down)
)

const (
	runStateFile  = "run-state"  // "clean BOOT_ID" after a clean stop, "running BOOT_ID" otherwise
	drainMarkFile = "drain-mark" // present while the node is drained
	removedFile   = "removed"    // this node saw itself removed from the cluster
	memberTimeout = 30 * time.Second
	lifecycleTick = 250 * time.Millisecond
)

type lifecycle struct {
	single       bool // one voter, no cluster: nothing to catch up with
	unclean      bool // the previous run did not record a clean stop
	hostRestart  bool // ... and the host rebooted since (the page cache is gone)
	lossPossible atomic.Bool
	accepted     atomic.Bool
	drainMark    atomic.Bool
	removed      atomic.Bool
	bootID       string

	bookMu sync.Mutex
	book   map[raft.ServerID]Peer // members learned from Raft configurations

	memberMu sync.Mutex
	member   map[uint64]bool // groups whose configuration listed this node

	applyFault atomic.Pointer[ApplyFault] // tests: refuse to apply entries (applystop.go)
	press      logPressure                // the node's Raft-log budget (logpressure.go)
	balance    balancer                   // leadership balancer (balance.go)
}

func (e *Engine) lifePath(name string) string { return filepath.Join(e.cfg.Dir, name) }

// openLifecycle reads the node's lifecycle records before the groups open.
func (e *Engine) openLifecycle(single bool) error {
	l := &e.life
	l.single = single
	l.book = map[raft.ServerID]Peer{}
	l.member = map[uint64]bool{}
	l.bootID = bootID()
	if l.press.budget.Load() == 0 {
		l.press.budget.Store(DefaultRaftLogBudget)
	}
	if e.cfg.Dir == "" {
		return nil
	}
	if err := os.MkdirAll(e.cfg.Dir, 0o755); err != nil {
		return err
	}
	if b, err := os.ReadFile(e.lifePath(removedFile)); err == nil {
		return fmt.Errorf("raftengine: node %d was removed from the cluster (%s); it cannot start as a member again: start a new node with an empty data directory and a new node id", e.cfg.NodeID, strings.TrimSpace(string(b)))
	}
	if _, err := os.Stat(e.lifePath(drainMarkFile)); err == nil {
		l.drainMark.Store(true)
	}
	fields := []string{}
	if b, err := os.ReadFile(e.lifePath(runStateFile)); err == nil {
		fields = strings.Fields(string(b))
	}
	l.unclean = len(fields) == 0 || fields[0] != "clean"
	l.hostRestart = len(fields) < 2 || l.bootID == "" || fields[1] != l.bootID
	// A gate that was still closed at the last stop stays closed: the record stays
	// "running" until a clean stop with every gate open.
	return writeFileSync(e.lifePath(runStateFile), "running "+l.bootID+"\n")
}

// mayHaveLost: the replica may lack entries it acknowledged. A process crash under
// fsync=never loses nothing (the page cache survives it); a host restart or a damaged
// journal tail after an unclean stop may have.
func (l *lifecycle) mayHaveLost(journalDamaged bool) bool {
	return l.unclean && (l.hostRestart || journalDamaged)
}

// afterOpen runs once every group is open.
func (e *Engine) afterOpen() {
	l := &e.life
	if !l.single || !l.mayHaveLost(e.cfg.JournalDamaged) {
		return
	}
	for _, g := range e.groups {
		if g.hadState {
			l.lossPossible.Store(true)
			e.cfg.Logger.Warn("unclean stop after a host restart: this single voter may have lost writes acknowledged from the page cache (fsync=never); inspect with `ursula ctl observe-unsynced-loss`, then `ursula ctl accept-unsynced-loss`")
			return
		}
	}
}

// RecordCleanShutdown writes the clean-stop record. Call it after Close and after the
// node log has been synced and closed: the record vouches that nothing was lost. It is
// not written while a recovery gate is closed, so the gate survives the restart.
func (e *Engine) RecordCleanShutdown() error {
	if e.cfg.Dir == "" {
		return nil
	}
	for _, g := range e.groups {
		if g.gated.Load() {
			return nil
		}
	}
	return writeFileSync(e.lifePath(runStateFile), "clean "+e.life.bootID+"\n")
}

func writeFileSync(path, content string) error {
	tmp := path + ".tmp"
	f, err := os.Create(tmp)
	if err != nil {
		return err
	}
	if _, err := f.WriteString(content); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	if err := os.Rename(tmp, path); err != nil {
		return err
	}
	if d, err := os.Open(filepath.Dir(path)); err == nil {
		d.Sync()
		d.Close()
	}
	return nil
}

// bootID identifies the running kernel boot ("" where unknown).
func bootID() string {
	b, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}

func gateName(closed bool) string {
	if closed {
		return "closed"
	}
	return "open"
}

// encodeAddr and splitAddr carry a run-time member's client URL in its Raft address.
func encodeAddr(raftAddr, url string) string {
	if url == "" {
		return raftAddr
	}
	return raftAddr + "#" + url
}

func splitAddr(a string) (raftAddr, url string) {
	raftAddr, url, _ = strings.Cut(a, "#")
	return raftAddr, url
}

func (e *Engine) selfRaftAddr() string {
	if e.self.RaftAddr != "" {
		return e.self.RaftAddr
	}
	if e.mux != nil {
		return e.mux.Addr().String()
	}
	return ""
}

// peerByID finds a member: a configured peer, or one learned from a Raft configuration.
func (e *Engine) peerByID(id raft.ServerID) (Peer, bool) {
	if id == "" {
		return Peer{}, false
	}
	if p, ok := e.byID[id]; ok {
		return p, true
	}
	e.life.bookMu.Lock()
	p, ok := e.life.book[id]
	e.life.bookMu.Unlock()
	if ok {
		return p, true
	}
	for _, g := range e.groups {
		if g.r == nil {
			continue
		}
		f := g.r.GetConfiguration()
		if f.Error() != nil {
			continue
		}
		for _, s := range f.Configuration().Servers {
			if s.ID == id {
				return e.learnPeer(s), true
			}
		}
	}
	return Peer{}, false
}

func (e *Engine) learnPeer(s raft.Server) Peer {
	n, _ := strconv.ParseUint(string(s.ID), 10, 64)
	ra, url := splitAddr(string(s.Address))
	p := Peer{ID: n, URL: url, RaftAddr: ra}
	if old, ok := e.byID[s.ID]; ok {
		return old
	}
	e.life.bookMu.Lock()
	e.life.book[s.ID] = p
	e.life.bookMu.Unlock()
	return p
}

// knownPeers is every member this node knows of: configured and learned.
func (e *Engine) knownPeers() []Peer {
	out := append([]Peer(nil), e.cfg.Peers...)
	e.life.bookMu.Lock()
	defer e.life.bookMu.Unlock()
	for id, p := range e.life.book {
		if _, ok := e.byID[id]; !ok {
			out = append(out, p)
		}
	}
	return out
}

// lifecycleReady is the part of readiness this file owns. Reasons start with a token
// the server reports as the readiness reason.
func (e *Engine) lifecycleReady() (bool, string) {
	if e.life.removed.Load() {
		return false, "removed: this node was removed from the cluster"
	}
	for _, g := range e.groups {
		if g.gated.Load() {
			return false, fmt.Sprintf("recovery_gate_closed: group %d waits to apply its leader's commit index after an unclean stop", g.id)
		}
	}
	if e.cfg.Join {
		for _, g := range e.groups {
			if !e.isVoter(g) {
				return false, fmt.Sprintf("local_replica_not_voter: group %d does not list this node as a voter yet (add it with `ursula ctl members add`)", g.id)
			}
		}
	}
	return true, ""
}

func (e *Engine) isVoter(g *group) bool {
	f := g.r.GetConfiguration()
	if f.Error() != nil {
		return false
	}
	for _, s := range f.Configuration().Servers {
		if s.ID == serverID(e.cfg.NodeID) {
			return s.Suffrage == raft.Voter
		}
	}
	return false
}

// lifecycleLoop opens recovery gates, sheds leaderships while drained, learns members and
// notices this node's removal.
func (e *Engine) lifecycleLoop() {
	defer e.wg.Done()
	t := time.NewTicker(lifecycleTick)
	defer t.Stop()
	for tick := 0; ; tick++ {
		select {
		case <-e.stop:
			return
		case <-t.C:
		}
		for _, g := range e.groups {
			if g.gated.Load() {
				e.tryOpenGate(g)
			}
		}
		if e.life.drainMark.Load() && !e.life.single {
			for _, g := range e.groups {
				if g.r.State() == raft.Leader {
					e.Drain()
					break
				}
			}
		}
		e.checkLogPressure()
		if !e.life.single {
			for _, g := range e.groups {
				// A group stopped here may apply fine on the other replicas: let one of
				// them lead it.
				if g.stop.Load() != nil && g.r.State() == raft.Leader {
					g.r.LeadershipTransfer()
				}
			}
		}
		if tick%4 == 0 {
			e.watchMembership()
		}
		if tick%20 == 19 && !e.life.single && !e.life.removed.Load() && !e.cfg.Join {
			e.askMembership()
		}
		e.balanceTick(tick)
	}
}

// tryOpenGate opens g's gate once it applied what its leader reports committed.
func (e *Engine) tryOpenGate(g *group) {
	_, lid := g.r.LeaderWithID()
	if lid == "" || lid == serverID(e.cfg.NodeID) {
		return
	}
	leader, ok := e.peerByID(lid)
	if !ok {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	ans, err := e.ask(ctx, leader, peerCommitIndex, binary.AppendUvarint(nil, g.id))
	if err != nil {
		return
	}
	commit, n := binary.Uvarint(ans)
	if n <= 0 {
		return
	}
	if applied := g.r.AppliedIndex(); applied >= commit {
		g.gated.Store(false)
		e.cfg.Logger.Info("recovery gate opened", "group", g.id, "applied", applied, "leader_commit", commit, "refused_votes", g.gateRefusedVotes.Load())
	}
}

// watchMembership learns members from the configurations and records this node's removal.
func (e *Engine) watchMembership() {
	self := serverID(e.cfg.NodeID)
	for _, g := range e.groups {
		f := g.r.GetConfiguration()
		if f.Error() != nil {
			continue
		}
		servers := f.Configuration().Servers
		listed := false
		for _, s := range servers {
			if s.ID == self {
				listed = true
			} else if _, ok := e.byID[s.ID]; !ok {
				e.learnPeer(s)
			}
		}
		e.life.memberMu.Lock()
		was := e.life.member[g.id]
		if listed {
			e.life.member[g.id] = true
		}
		e.life.memberMu.Unlock()
		if was && !listed && len(servers) > 0 && !e.life.removed.Load() {
			e.markRemoved(g.id, "its configuration no longer lists this node")
		}
	}
}

// askMembership finds out whether this node was removed while it was down: a removed
// replica hears from no leader (the leaders no longer send to it), so for a group without
// a known leader it asks the other members whether the group's leader still lists it.
func (e *Engine) askMembership() {
	for _, g := range e.groups {
		if addr, _ := g.r.LeaderWithID(); addr != "" {
			continue
		}
		for _, p := range e.knownPeers() {
			if p.ID == e.cfg.NodeID {
				continue
			}
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			ans, err := e.ask(ctx, p, peerIsMember, binary.AppendUvarint(binary.AppendUvarint(nil, g.id), e.cfg.NodeID))
			cancel()
			if err != nil || len(ans) != 1 {
				continue
			}
			if ans[0] == 0 {
				e.markRemoved(g.id, fmt.Sprintf("the leader of group %d (node %d) no longer lists this node", g.id, p.ID))
				return
			}
			break
		}
	}
}

func (e *Engine) markRemoved(group uint64, why string) {
	if e.life.removed.Swap(true) {
		return
	}
	e.cfg.Logger.Error("this node was removed from the cluster; it refuses to act as a member (start a new node with an empty data directory and a new node id)", "group", group, "why", why)
	if e.cfg.Dir != "" {
		writeFileSync(e.lifePath(removedFile), fmt.Sprintf("removed from group %d at %s: %s", group, time.Now().UTC().Format(time.RFC3339), why))
	}
}

// ChangeMember implements engine.Lifecycle.
func (e *Engine) ChangeMember(ctx context.Context, group uint64, c engine.MemberChange) error {
	if group >= uint64(len(e.groups)) {
		return ErrUnknownGroup
	}
	g := e.groups[group]
	if g.r.State() == raft.Leader {
		return e.changeLocal(g, c)
	}
	_, lid := g.r.LeaderWithID()
	leader, ok := e.peerByID(lid)
	if !ok {
		return engine.ErrNoLeader
	}
	p := []byte{byte(c.Op)}
	p = binary.AppendUvarint(p, group)
	p = binary.AppendUvarint(p, c.NodeID)
	p = binary.AppendUvarint(p, uint64(len(c.URL)))
	p = append(p, c.URL...)
	p = append(p, c.RaftAddr...)
	_, err := e.ask(ctx, leader, peerMember, p)
	if err != nil && !strings.HasPrefix(err.Error(), "refused:") {
		// The leader this node knows is unreachable (it may have died): retry later.
		return fmt.Errorf("%w: leader node %d is unreachable: %v", engine.ErrNoLeader, leader.ID, err)
	}
	return err
}

func decodeMemberChange(p []byte) (uint64, engine.MemberChange, error) {
	bad := errors.New("malformed membership change")
	if len(p) < 1 {
		return 0, engine.MemberChange{}, bad
	}
	c := engine.MemberChange{Op: engine.MemberOp(p[0])}
	p = p[1:]
	group, n := binary.Uvarint(p)
	if n <= 0 {
		return 0, c, bad
	}
	p = p[n:]
	if c.NodeID, n = binary.Uvarint(p); n <= 0 {
		return 0, c, bad
	}
	p = p[n:]
	ul, n := binary.Uvarint(p)
	if n <= 0 || uint64(len(p)-n) < ul {
		return 0, c, bad
	}
	p = p[n:]
	c.URL, c.RaftAddr = string(p[:ul]), string(p[ul:])
	return group, c, nil
}

// changeLocal applies a membership change on the group's leader. Every change is
// idempotent, so a retried call after a lost answer is harmless.
func (e *Engine) changeLocal(g *group, c engine.MemberChange) error {
	f := g.r.GetConfiguration()
	if err := f.Error(); err != nil {
		return err
	}
	id := serverID(c.NodeID)
	var cur *raft.Server
	for _, s := range f.Configuration().Servers {
		if s.ID == id {
			cur = &s
			break
		}
	}
	switch c.Op {
	case engine.AddLearner:
		if cur != nil {
			return nil
		}
		if c.RaftAddr == "" {
			return errors.New("a learner needs its cluster address")
		}
		s := raft.Server{ID: id, Address: raft.ServerAddress(encodeAddr(c.RaftAddr, c.URL))}
		if err := g.r.AddNonvoter(s.ID, s.Address, 0, memberTimeout).Error(); err != nil {
			return err
		}
		e.learnPeer(s)
		return nil
	case engine.PromoteVoter:
		if cur == nil {
			return fmt.Errorf("%w: node %d is not a member of group %d; add it as a learner first", ErrUnknownNode, c.NodeID, g.id)
		}
		if cur.Suffrage == raft.Voter {
			return nil
		}
		return g.r.AddVoter(id, cur.Address, 0, memberTimeout).Error()
	case engine.RemoveMember:
		if cur == nil {
			return nil
		}
		return g.r.RemoveServer(id, 0, memberTimeout).Error()
	}
	return fmt.Errorf("unknown membership change %q", c.Op)
}

// serveLifecyclePeer answers this file's peer-channel requests.
func (e *Engine) serveLifecyclePeer(op byte, payload []byte) (byte, []byte) {
	switch op {
	case peerMember:
		group, c, err := decodeMemberChange(payload)
		if err == nil && group >= uint64(len(e.groups)) {
			err = ErrUnknownGroup
		}
		if err == nil && e.groups[group].r.State() != raft.Leader {
			err = errors.New("not the leader of the group")
		}
		if err == nil {
			err = e.changeLocal(e.groups[group], c)
		}
		if err != nil {
			return 1, []byte(err.Error())
		}
		return 0, nil
	case peerDrainState:
		return 0, []byte{e.drainState()}
	case peerIsMember:
		group, n := binary.Uvarint(payload)
		if n <= 0 || group >= uint64(len(e.groups)) {
			return 1, []byte("no such group")
		}
		node, m := binary.Uvarint(payload[n:])
		g := e.groups[group]
		if m <= 0 || g.r.State() != raft.Leader {
			return 1, []byte("not the leader of the group")
		}
		f := g.r.GetConfiguration()
		if err := f.Error(); err != nil {
			return 1, []byte(err.Error())
		}
		for _, s := range f.Configuration().Servers {
			if s.ID == serverID(node) {
				return 0, []byte{1}
			}
		}
		return 0, []byte{0}
	case peerCommitIndex:
		group, n := binary.Uvarint(payload)
		if n <= 0 || group >= uint64(len(e.groups)) {
			return 1, []byte("no such group")
		}
		g := e.groups[group]
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		if err := g.readIndex(ctx); err != nil {
			return 1, []byte(err.Error())
		}
		return 0, binary.AppendUvarint(nil, g.r.CommitIndex())
	}
	return 1, []byte("unknown peer request")
}

// Member is one server of one group in GET /__ursula/members.
type Member struct {
	NodeID   uint64 `json:"node_id"`
	Suffrage string `json:"suffrage"` // "voter" or "learner"
	URL      string `json:"url,omitempty"`
	RaftAddr string `json:"raft_addr"`
}

// GroupMembers is one group's configuration as this node knows it.
type GroupMembers struct {
	Group    uint64   `json:"group"`
	LeaderID string   `json:"leader_id"`
	Servers  []Member `json:"servers"`
}

// NodeMembership sums up one node over every group.
type NodeMembership struct {
	NodeID        uint64 `json:"node_id"`
	URL           string `json:"url,omitempty"`
	RaftAddr      string `json:"raft_addr"`
	VoterGroups   int    `json:"voter_groups"`
	LearnerGroups int    `json:"learner_groups"`
}

// Membership is GET /__ursula/members.
type Membership struct {
	NodeID     uint64           `json:"node_id"`
	GroupCount int              `json:"group_count"`
	Nodes      []NodeMembership `json:"nodes"`
	Groups     []GroupMembers   `json:"groups"`
}

// Members implements engine.Lifecycle.
func (e *Engine) Members() any {
	m := Membership{NodeID: e.cfg.NodeID, GroupCount: len(e.groups)}
	nodes := map[uint64]*NodeMembership{}
	var order []uint64
	for _, g := range e.groups {
		_, lid := g.r.LeaderWithID()
		gm := GroupMembers{Group: g.id, LeaderID: string(lid), Servers: []Member{}}
		if f := g.r.GetConfiguration(); f.Error() == nil {
			for _, s := range f.Configuration().Servers {
				p := e.learnPeer(s)
				mb := Member{NodeID: p.ID, Suffrage: "voter", URL: p.URL, RaftAddr: p.RaftAddr}
				nm := nodes[p.ID]
				if nm == nil {
					nm = &NodeMembership{NodeID: p.ID, URL: p.URL, RaftAddr: p.RaftAddr}
					nodes[p.ID] = nm
					order = append(order, p.ID)
				}
				if s.Suffrage == raft.Voter {
					nm.VoterGroups++
				} else {
					mb.Suffrage = "learner"
					nm.LearnerGroups++
				}
				gm.Servers = append(gm.Servers, mb)
			}
		}
		m.Groups = append(m.Groups, gm)
	}
	for _, id := range order {
		m.Nodes = append(m.Nodes, *nodes[id])
	}
	return m
}

// SetDrainMark implements engine.Lifecycle.
func (e *Engine) SetDrainMark(on bool) error {
	if e.cfg.Dir != "" {
		p := e.lifePath(drainMarkFile)
		if on {
			if err := writeFileSync(p, "drained\n"); err != nil {
				return err
			}
		} else if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
	}
	e.life.drainMark.Store(on)
	return nil
}

// GroupRecovery is one group in GET /__ursula/recovery.
type GroupRecovery struct {
	Group        uint64 `json:"group"`
	Gate         string `json:"recovery_gate"`
	LastLogIndex uint64 `json:"last_log_index"`
	LastLogTerm  uint64 `json:"last_log_term"`
	CurrentTerm  uint64 `json:"current_term"`
	AppliedIndex uint64 `json:"applied_index"`
	RefusedVotes uint64 `json:"gate_refused_votes"`
}

// Recovery is GET /__ursula/recovery.
type Recovery struct {
	NodeID      uint64 `json:"node_id"`
	UncleanStop bool   `json:"unclean_stop"`
	HostRestart bool   `json:"host_restarted"`
	// UnsyncedLossPossible: a single voter stopped uncleanly across a host restart (or with
	// a damaged journal tail), so
	// writes acknowledged from the page cache (fsync=never) may be gone.
	UnsyncedLossPossible bool            `json:"unsynced_loss_possible"`
	Outcome              string          `json:"outcome,omitempty"`
	Rewrite              *HistoryRewrite `json:"history_rewrite,omitempty"`
	Groups               []GroupRecovery `json:"groups"`
}

// RecoveryReport implements engine.Lifecycle.
func (e *Engine) RecoveryReport() any {
	r := Recovery{NodeID: e.cfg.NodeID, UncleanStop: e.life.unclean, HostRestart: e.life.hostRestart, UnsyncedLossPossible: e.life.lossPossible.Load()}
	for _, g := range e.groups {
		st := g.r.Stats()
		lt, _ := strconv.ParseUint(st["last_log_term"], 10, 64)
		r.Groups = append(r.Groups, GroupRecovery{Group: g.id, Gate: gateName(g.gated.Load()), LastLogIndex: g.r.LastIndex(), LastLogTerm: lt,
			CurrentTerm: g.r.CurrentTerm(), AppliedIndex: g.r.AppliedIndex(), RefusedVotes: g.gateRefusedVotes.Load()})
	}
	return r
}

// ErrNothingToAccept refuses accept-unsynced-loss when no loss is reported.
var ErrNothingToAccept = errors.New("no unsynced loss is reported: nothing to accept (a closed recovery gate of a cluster member opens by itself once the replica caught up with its leader)")

// AcceptUnsyncedLoss implements engine.Lifecycle.
func (e *Engine) AcceptUnsyncedLoss() (any, error) {
	if !e.life.lossPossible.Load() {
		return nil, ErrNothingToAccept
	}
	rw := e.rewriteHistories()
	e.life.lossPossible.Store(false)
	e.life.accepted.Store(true)
	e.cfg.Logger.Warn("possible unsynced loss accepted by the operator: stream histories rewritten", "rewritten", rw.Rewritten, "refused", len(rw.Refused))
	r := e.RecoveryReport().(Recovery)
	r.Outcome = "accepted"
	r.Rewrite = &rw
	return r, nil
}

// HistoryRewrite is what accept-unsynced-loss did to the streams.
type HistoryRewrite struct {
	Rewritten int               `json:"rewritten_streams"`
	Refused   map[string]string `json:"refused,omitempty"` // key -> why
}

// rewriteHistories gives every stream of every group that held state before the unclean
// stop a history rewrite (extensions spec 2.4, 5.3): a new incarnation token,
// Stream-Previous-Incarnation and Stream-Inherited-Offset, and its producers closed with
// epoch-closed;by=history, so a reader or a producer that saw bytes the host crash took
// learns the history changed instead of silently diverging. One OpRestoreStream per
// stream (in place: IfIncarnation names its current token).
func (e *Engine) rewriteHistories() HistoryRewrite {
	out := HistoryRewrite{Refused: map[string]string{}}
	for _, g := range e.groups {
		if !g.hadState {
			continue
		}
		type cur struct {
			key string
			inc uint64
		}
		var todo []cur
		g.RLock()
		for k, s := range g.StateLocked().Streams {
			if !s.SoftDeleted {
				todo = append(todo, cur{k, s.Incarnation})
			}
		}
		g.RUnlock()
		for _, c := range todo {
			ctx, cancel := context.WithTimeout(context.Background(), e.cfg.ApplyTimeout)
			res, err := e.Propose(ctx, &streamcore.Command{Op: streamcore.OpRestoreStream, Key: c.key, Now: time.Now().UnixMilli(),
				IfIncarnation: c.inc, NewIncarnation: newIncarnation()})
			cancel()
			switch {
			case err != nil:
				out.Refused[c.key] = err.Error()
			case res.Err != nil:
				out.Refused[c.key] = res.Err.Error()
			default:
				out.Rewritten++
			}
		}
	}
	return out
}

// newIncarnation is a random incarnation token of the form the server issues (a safe
// JSON integer with bit 52 set).
func newIncarnation() uint64 {
	var b [8]byte
	rand.Read(b[:])
	return 1<<52 | binary.LittleEndian.Uint64(b[:])&(1<<52-1)
}

// gateTransport is a group's Raft transport behind its recovery gate (see the file
// comment): while the gate is closed, votes in both directions and leadership transfers
// to this node are refused here, before hashicorp/raft sees them.
type gateTransport struct {
	raft.Transport
	g    *group
	once sync.Once
	ch   chan raft.RPC
}

var errGateClosed = errors.New("recovery gate closed: this replica is catching up after an unclean stop")

func (t *gateTransport) Consumer() <-chan raft.RPC {
	t.once.Do(func() {
		t.ch = make(chan raft.RPC)
		go t.filter(t.Transport.Consumer())
	})
	return t.ch
}

func (t *gateTransport) filter(in <-chan raft.RPC) {
	stop := t.g.e.stop
	for {
		var rpc raft.RPC
		select {
		case rpc = <-in:
		case <-stop:
			return
		}
		if t.g.gated.Load() {
			switch req := rpc.Command.(type) {
			case *raft.RequestVoteRequest:
				t.g.gateRefusedVotes.Add(1)
				rpc.Respond(&raft.RequestVoteResponse{RPCHeader: t.header(), Term: req.Term}, nil)
				continue
			case *raft.RequestPreVoteRequest:
				t.g.gateRefusedVotes.Add(1)
				rpc.Respond(&raft.RequestPreVoteResponse{RPCHeader: t.header(), Term: req.Term}, nil)
				continue
			case *raft.TimeoutNowRequest:
				rpc.Respond(nil, errGateClosed)
				continue
			}
		}
		select {
		case t.ch <- rpc:
		case <-stop:
			return
		}
	}
}

func (t *gateTransport) header() raft.RPCHeader {
	return raft.RPCHeader{ProtocolVersion: raft.ProtocolVersionMax, ID: []byte(serverID(t.g.e.cfg.NodeID)), Addr: []byte(t.LocalAddr())}
}

// RequestVote does not ask for votes while the gate is closed: the candidate loses.
func (t *gateTransport) RequestVote(id raft.ServerID, target raft.ServerAddress, args *raft.RequestVoteRequest, resp *raft.RequestVoteResponse) error {
	if t.g.gated.Load() {
		*resp = raft.RequestVoteResponse{Term: args.Term}
		return nil
	}
	return t.Transport.RequestVote(id, target, args, resp)
}

// RequestPreVote does not ask for pre-votes while the gate is closed.
func (t *gateTransport) RequestPreVote(id raft.ServerID, target raft.ServerAddress, args *raft.RequestPreVoteRequest, resp *raft.RequestPreVoteResponse) error {
	if t.g.gated.Load() {
		*resp = raft.RequestPreVoteResponse{Term: args.Term}
		return nil
	}
	pv, ok := t.Transport.(raft.WithPreVote)
	if !ok {
		return errors.New("transport without pre-vote")
	}
	return pv.RequestPreVote(id, target, args, resp)
}
