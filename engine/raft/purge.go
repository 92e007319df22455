package raftengine

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/hashicorp/raft"

	"github.com/ursula-go/ursula/engine"
	"github.com/ursula-go/ursula/streamcore"
)

// peerPurge asks a group's leader to purge a bucket in that group. Payload: uvarint
// group, then the bucket. Answer: uvarint count of streams held by forks, then one line
// "incarnation key" per removed stream.
const peerPurge byte = 'P'

var _ engine.Purger = (*Engine)(nil)

// PurgeBucket implements engine.Purger: the purge is one command per group, proposed by
// the group's leader (this node, or the leader it is forwarded to through the peer
// channel), so every replica applies it. Groups are purged in order; a group without a
// reachable leader stops the purge with ErrNoLeader, and a retry finishes the rest.
func (e *Engine) PurgeBucket(ctx context.Context, bucket string, now int64) (engine.PurgeReport, error) {
	var rep engine.PurgeReport
	for _, g := range e.groups {
		removed, held, err := e.purgeGroup(ctx, g, bucket, now)
		if err != nil {
			return engine.PurgeReport{}, err
		}
		rep.AddGroup(g.id, removed, held)
	}
	return rep, nil
}

func (e *Engine) purgeGroup(ctx context.Context, g *group, bucket string, now int64) ([]streamcore.PurgedStream, int, error) {
	if g.r.State() == raft.Leader {
		return e.purgeAsLeader(ctx, g, bucket, now)
	}
	_, lid := g.r.LeaderWithID()
	leader, ok := e.peerByID(lid)
	if lid == "" || !ok || leader.ID == e.cfg.NodeID {
		return nil, 0, engine.ErrNoLeader
	}
	p := binary.AppendUvarint(nil, g.id)
	p = append(p, bucket...)
	b, err := e.ask(ctx, leader, peerPurge, p)
	if err != nil {
		if strings.HasPrefix(err.Error(), "refused:") {
			return nil, 0, fmt.Errorf("%w: group %d: %v", engine.ErrNoLeader, g.id, err)
		}
		return nil, 0, fmt.Errorf("%w: leader node %d of group %d is unreachable: %v", engine.ErrNoLeader, leader.ID, g.id, err)
	}
	return decodePurgeAnswer(b)
}

func (e *Engine) purgeAsLeader(ctx context.Context, g *group, bucket string, now int64) ([]streamcore.PurgedStream, int, error) {
	data := []byte{entryCommand}
	data = streamcore.AppendCommand(data, &streamcore.Command{Op: streamcore.OpPurgeBucket, Key: bucket, Now: now})
	res, err := g.apply(ctx, data)
	if err != nil {
		return nil, 0, err
	}
	if res.Err != nil {
		return nil, 0, res.Err
	}
	g.RLock()
	held := g.StateLocked().HeldByForks(bucket)
	g.RUnlock()
	return res.Purged, held, nil
}

// servePurge answers peerPurge on the group's leader.
func (e *Engine) servePurge(payload []byte) (byte, []byte) {
	gid, n := binary.Uvarint(payload)
	if n <= 0 || gid >= uint64(len(e.groups)) {
		return 1, []byte("no such group")
	}
	g := e.groups[gid]
	if g.r.State() != raft.Leader {
		return 1, []byte("not the leader of the group")
	}
	ctx, cancel := context.WithTimeout(context.Background(), peerTimeout/2)
	defer cancel()
	removed, held, err := e.purgeAsLeader(ctx, g, string(payload[n:]), time.Now().UnixMilli())
	if err != nil {
		return 1, []byte(err.Error())
	}
	out := binary.AppendUvarint(nil, uint64(held))
	for _, p := range removed {
		out = strconv.AppendUint(out, p.Incarnation, 10)
		out = append(append(append(out, ' '), p.Key...), '\n')
	}
	return 0, out
}

func decodePurgeAnswer(b []byte) ([]streamcore.PurgedStream, int, error) {
	held, n := binary.Uvarint(b)
	if n <= 0 {
		return nil, 0, errors.New("raftengine: malformed purge answer")
	}
	var out []streamcore.PurgedStream
	for _, line := range strings.Split(string(b[n:]), "\n") {
		if line == "" {
			continue
		}
		inc, key, ok := strings.Cut(line, " ")
		v, err := strconv.ParseUint(inc, 10, 64)
		if !ok || err != nil {
			return nil, 0, errors.New("raftengine: malformed purge answer")
		}
		out = append(out, streamcore.PurgedStream{Key: key, Incarnation: v})
	}
	return out, int(held), nil
}

var _ engine.UsageSource = (*Engine)(nil)

// BucketUsage implements engine.UsageSource over every local replica.
func (e *Engine) BucketUsage() map[string]engine.BucketGauge {
	return engine.BucketUsageOf(e.partitions())
}
