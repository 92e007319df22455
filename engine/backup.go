package engine

import (
	"context"
	"fmt"

	"github.com/ursula-go/ursula/streamcore"
)

// Backup is implemented by engines whose groups can be exported one at a time for a
// backup, while writes go on.
type Backup interface {
	// BackupGroups lists every group of the engine.
	BackupGroups() []uint64
	// CaptureGroup returns a copy of group g's state (streamcore.CaptureState) that holds
	// every write acknowledged before the call: a replicated engine captures it on the
	// group's leader after a barrier, else returns ErrNoLeader or a *NotLeaderError. hold,
	// when not nil, runs with the live state under the group's lock first (to pin the cold
	// objects the copy references before anything may drop them).
	CaptureGroup(ctx context.Context, g uint64, hold func(*streamcore.State)) (*streamcore.State, error)
}

var _ Backup = (*Memory)(nil)

// BackupGroups implements Backup: every partition is a group.
func (e *Memory) BackupGroups() []uint64 { return e.FlushGroups() }

// CaptureGroup implements Backup.
func (e *Memory) CaptureGroup(_ context.Context, g uint64, hold func(*streamcore.State)) (*streamcore.State, error) {
	if g >= uint64(len(e.parts)) {
		return nil, fmt.Errorf("no group %d", g)
	}
	return e.parts[g].Capture(hold), nil
}

// Capture returns a copy of the partition's state taken under its read lock, after hold
// (when not nil) saw the live state.
func (p *Partition) Capture(hold func(*streamcore.State)) *streamcore.State {
	p.mu.RLock()
	defer p.mu.RUnlock()
	if hold != nil {
		hold(p.state)
	}
	return streamcore.CaptureState(p.state)
}
