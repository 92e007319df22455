package raftengine

import (
	"context"
	"fmt"

	"github.com/ursula-go/ursula/engine"
	"github.com/ursula-go/ursula/streamcore"
)

var _ engine.Backup = (*Engine)(nil)

// BackupGroups implements engine.Backup.
func (e *Engine) BackupGroups() []uint64 {
	out := make([]uint64, len(e.groups))
	for i := range out {
		out[i] = uint64(i)
	}
	return out
}

// CaptureGroup implements engine.Backup: on the group's leader, after a ReadIndex (its
// FSM then holds every acknowledged write), a copy of the FSM state taken under its lock.
func (e *Engine) CaptureGroup(ctx context.Context, g uint64, hold func(*streamcore.State)) (*streamcore.State, error) {
	if g >= uint64(len(e.groups)) {
		return nil, fmt.Errorf("no group %d", g)
	}
	grp := e.groups[g]
	if err := grp.readIndex(ctx); err != nil {
		return nil, err
	}
	return grp.Capture(hold), nil
}
