package raftengine

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/raft"

	"github.com/ursula-go/ursula/engine"
	"github.com/ursula-go/ursula/streamcore"
)

// The peer channel: what this engine asks of the other voters, over the same cluster
// listener as Raft (Mux; a connection whose preamble is peerMagic). One request per
// connection: an op byte, a uvarint length, the payload; the answer is a status byte
// (0 ok, 1 refused), a uvarint length and the payload.
//
//	peerRenew     payload: a stream key. The leader renews the stream's sliding TTL when a
//	              read made it due (a follower's read cannot propose). Empty answer.
//	peerColdRefs  payload: object keys, one a line. The answer lists those a local replica
//	              references or a read or upload of this node pins.
//	peerPurge     a bucket purge in one group, for its leader (purge.go).
const (
	peerRenew    byte = 'T'
	peerColdRefs byte = 'R'

	maxPeerPayload  = 64 << 20
	peerTimeout     = 15 * time.Second
	renewTimeout    = 2 * time.Second
	coldRefsBatch   = 1000
	renewForwardGap = time.Second // at most one forwarded renewal per stream per gap
)

var peerMagic = [4]byte{'U', 'R', 'P', '1'}

// peerChannel holds the engine's peer-request state.
type peerChannel struct {
	pins atomic.Pointer[func(string) bool] // the cold tier's pins (SetColdPins)

	renewMu   sync.Mutex
	renewLast map[string]time.Time // key -> last renewal forwarded
}

// RenewRead implements engine.Engine: the group's leader proposes the renewal; a follower
// forwards it to the leader in the background.
func (e *Engine) RenewRead(ctx context.Context, key string, now int64) {
	_, err := e.Propose(ctx, &streamcore.Command{Op: streamcore.OpTouch, Key: key, Now: now})
	var nl *engine.NotLeaderError
	if err == nil || !errors.As(err, &nl) || nl.LeaderURL == "" {
		return
	}
	_, id := e.groupOf(key).r.LeaderWithID()
	leader, ok := e.peerByID(id)
	if !ok || leader.ID == e.cfg.NodeID || !e.renewDue(key) {
		return
	}
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), renewTimeout)
		defer cancel()
		e.ask(ctx, leader, peerRenew, []byte(key))
	}()
}

// renewDue rate-limits forwarded renewals per stream.
func (e *Engine) renewDue(key string) bool {
	p := &e.peers
	now := time.Now()
	p.renewMu.Lock()
	defer p.renewMu.Unlock()
	if p.renewLast == nil || len(p.renewLast) > 10000 {
		p.renewLast = map[string]time.Time{}
	}
	if last, ok := p.renewLast[key]; ok && now.Sub(last) < renewForwardGap {
		return false
	}
	p.renewLast[key] = now
	return true
}

// SetColdPins implements engine.ColdPeers.
func (e *Engine) SetColdPins(pinned func(key string) bool) {
	if pinned == nil {
		e.peers.pins.Store(nil)
		return
	}
	e.peers.pins.Store(&pinned)
}

// PeersColdRefs implements engine.ColdPeers.
func (e *Engine) PeersColdRefs(ctx context.Context, keys []string) (map[string]bool, error) {
	needed := map[string]bool{}
	for _, p := range e.knownPeers() {
		if p.ID == e.cfg.NodeID {
			continue
		}
		for i := 0; i < len(keys); i += coldRefsBatch {
			batch := keys[i:min(i+coldRefsBatch, len(keys))]
			b, err := e.ask(ctx, p, peerColdRefs, []byte(strings.Join(batch, "\n")))
			if err != nil {
				return nil, fmt.Errorf("node %d: cold refs: %w", p.ID, err)
			}
			for _, k := range strings.Split(string(b), "\n") {
				if k != "" {
					needed[k] = true
				}
			}
		}
	}
	return needed, nil
}

// ask sends one request to peer p and returns its answer.
func (e *Engine) ask(ctx context.Context, p Peer, op byte, payload []byte) ([]byte, error) {
	if e.mux == nil {
		return nil, errors.New("raftengine: no cluster listener")
	}
	deadline, ok := ctx.Deadline()
	if !ok {
		deadline = time.Now().Add(peerTimeout)
	}
	dctx, cancel := context.WithDeadline(ctx, deadline)
	c, err := e.mux.dial(dctx, p.RaftAddr)
	cancel()
	if err != nil {
		return nil, err
	}
	defer c.Close()
	c.SetDeadline(deadline)
	msg := make([]byte, 0, 8+1+binary.MaxVarintLen64+len(payload))
	msg = append(msg, peerMagic[:]...)
	msg = append(msg, 0, 0, 0, 0, op)
	msg = binary.AppendUvarint(msg, uint64(len(payload)))
	msg = append(msg, payload...)
	if _, err := c.Write(msg); err != nil {
		return nil, err
	}
	status, answer, err := readFrame(c)
	if err != nil {
		return nil, err
	}
	if status != 0 {
		return nil, fmt.Errorf("refused: %s", answer)
	}
	return answer, nil
}

// readFrame reads a type byte, a uvarint length and the payload.
func readFrame(c net.Conn) (byte, []byte, error) {
	r := &byteReader{c: c}
	kind, err := r.ReadByte()
	if err != nil {
		return 0, nil, err
	}
	n, err := binary.ReadUvarint(r)
	if err != nil {
		return 0, nil, err
	}
	if n > maxPeerPayload {
		return 0, nil, fmt.Errorf("peer message of %d bytes is too long", n)
	}
	b := make([]byte, n)
	if _, err := io.ReadFull(c, b); err != nil {
		return 0, nil, err
	}
	return kind, b, nil
}

// byteReader reads single bytes unbuffered, so the payload after a header stays on c.
type byteReader struct{ c net.Conn }

func (r *byteReader) ReadByte() (byte, error) {
	var b [1]byte
	_, err := io.ReadFull(r.c, b[:])
	return b[0], err
}

// servePeer answers one peer request (the Mux hands over a connection past its preamble).
func (e *Engine) servePeer(c net.Conn) {
	defer c.Close()
	c.SetDeadline(time.Now().Add(peerTimeout))
	op, payload, err := readFrame(c)
	if err != nil {
		return
	}
	status, answer := byte(0), []byte(nil)
	switch op {
	case peerRenew:
		e.renewAsLeader(string(payload))
	case peerColdRefs:
		answer = e.localColdRefs(payload)
	case peerPurge:
		status, answer = e.servePurge(payload)
	case peerMember, peerCommitIndex, peerDrainState, peerIsMember:
		status, answer = e.serveLifecyclePeer(op, payload)
	default:
		status, answer = 1, []byte("unknown peer request")
	}
	msg := append([]byte{status}, binary.AppendUvarint(nil, uint64(len(answer)))...)
	c.Write(append(msg, answer...))
}

// renewAsLeader proposes a read renewal another voter asked for, when this node leads the
// stream's group and the renewal is due here too (never forwarded further).
func (e *Engine) renewAsLeader(key string) {
	g := e.groupOf(key)
	if g.r.State() != raft.Leader {
		return
	}
	now := time.Now().UnixMilli()
	due := false
	g.View(key, now, func(_ *streamcore.State, s *streamcore.Stream) {
		due = s != nil && !s.SoftDeleted && s.ReadRenewalDue(now)
	})
	if due {
		ctx, cancel := context.WithTimeout(context.Background(), renewTimeout)
		defer cancel()
		e.Propose(ctx, &streamcore.Command{Op: streamcore.OpTouch, Key: key, Now: now})
	}
}

// localColdRefs answers peerColdRefs.
func (e *Engine) localColdRefs(payload []byte) []byte {
	asked := map[string]bool{}
	for _, k := range strings.Split(string(payload), "\n") {
		if k != "" {
			asked[k] = true
		}
	}
	var out []byte
	e.ColdRefs(func(k string) {
		if asked[k] {
			delete(asked, k)
			out = append(append(out, k...), '\n')
		}
	})
	if pinned := e.peers.pins.Load(); pinned != nil {
		for k := range asked {
			if (*pinned)(k) {
				out = append(append(out, k...), '\n')
			}
		}
	}
	return out
}
