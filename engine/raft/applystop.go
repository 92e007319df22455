package raftengine

// Apply-failure isolation. A committed entry a group cannot apply (its FSM panics, this
// build cannot decode it, a test's fault hook refuses it) stops that group on this replica
// only: it applies neither the entry nor any later one, takes no snapshot (raft would
// compact the unapplied entries away) and installs none, and its streams answer
// 503 APPLY_STOPPED. The other groups keep serving and the node stays ready. No entry is
// ever skipped: RestartGroup (or a restart of the node, after a fix) rebuilds the group's
// state from its latest local snapshot and replays every entry after it from the log,
// the failed one first; if it fails again the group stays stopped.

import (
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/hashicorp/raft"

	"github.com/ursula-go/ursula/engine"
	"github.com/ursula-go/ursula/streamcore"
)

// CodeApplyStopped is the error code of a request to a stopped group; its not-applied
// marker token is MarkerApplyStopped.
const (
	CodeApplyStopped   = "APPLY_STOPPED"
	MarkerApplyStopped = "ApplyStopped"
)

// ApplyFailure says why and where a group stopped applying.
type ApplyFailure struct {
	Group   uint64    `json:"group"`
	Index   uint64    `json:"index"`
	Term    uint64    `json:"term"`
	Kind    string    `json:"kind"` // panic, decode or fault
	Message string    `json:"message"`
	At      time.Time `json:"at"`
}

// ApplyFault is a test hook: a non-nil error refuses to apply the entry (as a failure of
// the FSM would).
type ApplyFault func(group uint64, l *raft.Log) error

// SetApplyFault installs (nil: removes) the fault hook of every group's FSM. For tests.
func (e *Engine) SetApplyFault(f ApplyFault) {
	if f == nil {
		e.life.applyFault.Store(nil)
		return
	}
	e.life.applyFault.Store(&f)
}

// EnvTestApplyFault arms a fault in a real process, for tests only (test/cluster): its
// value "G:N" refuses every command entry of group G from log index N on, "G:N:once"
// only the first one it is asked to apply (a restart of the group then applies it). The
// variable is read once, when the engine opens, and only when set; a node started
// without it has no fault.
const EnvTestApplyFault = "URSULA_TEST_APPLY_FAULT"

// armTestApplyFault installs the fault EnvTestApplyFault describes (none for "").
func (e *Engine) armTestApplyFault(spec string) error {
	if spec == "" {
		return nil
	}
	parts := strings.Split(spec, ":")
	bad := fmt.Errorf("raftengine: %s=%q: want GROUP:INDEX or GROUP:INDEX:once", EnvTestApplyFault, spec)
	if len(parts) < 2 || len(parts) > 3 || len(parts) == 3 && parts[2] != "once" {
		return bad
	}
	group, err1 := strconv.ParseUint(parts[0], 10, 64)
	from, err2 := strconv.ParseUint(parts[1], 10, 64)
	if err1 != nil || err2 != nil || from == 0 {
		return bad
	}
	once := len(parts) == 3
	var fired atomic.Bool
	e.SetApplyFault(func(g uint64, l *raft.Log) error {
		if g != group || l.Index < from || once && fired.Swap(true) {
			return nil
		}
		return fmt.Errorf("test fault %s=%s refuses index %d", EnvTestApplyFault, spec, l.Index)
	})
	e.cfg.Logger.Warn("TEST ONLY: an apply fault is armed; unset "+EnvTestApplyFault+" outside tests", "group", group, "from_index", from, "once", once)
	return nil
}

// stopApply records the failure that stops g. Called from Apply with applyMu held.
func (g *group) stopApply(l *raft.Log, f *ApplyFailure) {
	f.Group, f.Index, f.Term, f.At = g.id, l.Index, l.Term, time.Now().UTC()
	g.stop.Store(f)
	g.e.cfg.Logger.Error("raft group stopped applying: a committed entry failed to apply; the group serves nothing until it is restarted (`ursula ctl restart-group`) after a fix",
		"group", g.id, "index", l.Index, "term", l.Term, "kind", f.Kind, "err", f.Message)
}

// applyStoppedError is the answer of a stopped group. notApplied: refused before anything
// was proposed (reads, and writes checked before proposal), so it carries the marker; a
// write already in the log answers without it, since the restart will apply it.
func applyStoppedError(f *ApplyFailure, notApplied bool) *streamcore.Error {
	e := streamcore.Errorf(http.StatusServiceUnavailable, CodeApplyStopped,
		"raft group %d stopped applying at index %d (%s: %s); an operator must restart it after a fix", f.Group, f.Index, f.Kind, f.Message).
		With(streamcore.HdrRetryAfter, "5").With("x-ursula-raft-group", strconv.FormatUint(f.Group, 10))
	if notApplied {
		e.With(streamcore.HdrNotApplied, MarkerApplyStopped)
	} else {
		e.Message += "; this write is in the log and applies when the group restarts"
	}
	return e
}

// StreamRefusal answers every request on key while its group cannot serve it: nil when
// it can. The server asks it before routing a stream request.
func (e *Engine) StreamRefusal(key string) error {
	if f := e.groupOf(key).stop.Load(); f != nil {
		return applyStoppedError(f, true)
	}
	return nil
}

// admit refuses a command before it is proposed: a stopped group, or a write with a body
// while the node's Raft log is over its budget (logpressure.go).
func (g *group) admit(c *streamcore.Command) error {
	if f := g.stop.Load(); f != nil {
		return applyStoppedError(f, true)
	}
	if len(c.Body) > 0 {
		if err := g.e.logPressureRefusal(); err != nil {
			return err
		}
	}
	return nil
}

// ErrGroupNotStopped refuses a restart of a group that is applying.
var ErrGroupNotStopped = errors.New("the raft group is applying: nothing to restart")

// GroupRestart is the answer of a group restart.
type GroupRestart struct {
	Group        uint64        `json:"group"`
	Outcome      string        `json:"outcome"` // "resumed" or "still_stopped"
	FromSnapshot uint64        `json:"from_snapshot_index"`
	Replayed     uint64        `json:"replayed_entries"`
	AppliedIndex uint64        `json:"applied_index"`
	Failure      *ApplyFailure `json:"apply_failure,omitempty"`
}

// RestartGroup rebuilds a stopped group: its latest local snapshot, then every entry after
// it that raft has handed over, the failed one included. New entries wait meanwhile (Apply
// holds applyMu). If an entry fails again the group stays stopped at it.
func (e *Engine) RestartGroup(id uint64) (GroupRestart, error) {
	if id >= uint64(len(e.groups)) {
		return GroupRestart{}, ErrUnknownGroup
	}
	g := e.groups[id]
	g.applyMu.Lock()
	defer g.applyMu.Unlock()
	old := g.stop.Load()
	if old == nil {
		return GroupRestart{}, ErrGroupNotStopped
	}
	out := GroupRestart{Group: id}
	from := uint64(1)
	fresh := func() {
		g.Lock()
		g.ReplaceStateLocked(streamcore.NewState())
		wakes := g.afterStructural(true)
		g.Unlock()
		engine.Wake(wakes...)
	}
	metas, err := g.snaps.List()
	if err != nil {
		return out, fmt.Errorf("raftengine: group %d: list snapshots: %w", id, err)
	}
	if len(metas) > 0 {
		meta, rc, err := g.snaps.Open(metas[0].ID)
		if err != nil {
			return out, fmt.Errorf("raftengine: group %d: open snapshot: %w", id, err)
		}
		err = g.restoreFrom(rc)
		rc.Close()
		if err != nil {
			return out, err
		}
		from, out.FromSnapshot = meta.Index+1, meta.Index
	} else {
		fresh()
	}
	if first, err := g.logs.FirstIndex(); err != nil {
		return out, err
	} else if first != 0 && first > from {
		return out, fmt.Errorf("raftengine: group %d: the log starts at %d but the latest snapshot ends at %d: cannot replay", id, first, from-1)
	}
	seen := g.seen.Load()
	for i := from; i <= seen; i++ {
		var l raft.Log
		if err := g.logs.GetLog(i, &l); err != nil {
			return out, fmt.Errorf("raftengine: group %d: read entry %d: %w", id, i, err)
		}
		out.Replayed++
		if _, fail := g.applyEntry(&l); fail != nil {
			g.stopApply(&l, fail)
			out.Outcome, out.Failure = "still_stopped", fail
			return out, nil
		}
	}
	g.applied.Store(seen)
	g.stop.Store(nil)
	out.Outcome, out.AppliedIndex = "resumed", seen
	e.cfg.Logger.Warn("raft group restarted: it applies again", "group", id, "failed_index", old.Index, "from_snapshot", out.FromSnapshot, "replayed", out.Replayed)
	return out, nil
}

// stoppedGroups lists the failures of the stopped groups.
func (e *Engine) stoppedGroups() []*ApplyFailure {
	var out []*ApplyFailure
	for _, g := range e.groups {
		if f := g.stop.Load(); f != nil {
			out = append(out, f)
		}
	}
	return out
}

// RestartGroupReport is RestartGroup for the admin plane.
func (e *Engine) RestartGroupReport(id uint64) (any, error) {
	r, err := e.RestartGroup(id)
	if err != nil {
		return nil, err
	}
	return r, nil
}
