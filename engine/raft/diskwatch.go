package raftengine

import (
	"errors"
	"sync/atomic"
	"time"

	"github.com/hashicorp/raft"
)

// The engine's side of the journal's disk (issue: the node bends, never breaks).
//
// Pressure. Config.WriteAdmission is the node's write admission (raftlog.DiskGuard): while
// it refuses writes (the journal's disk is under its floor or met ENOSPC), a leader here
// cannot store new entries for long, so every group this node leads hands its leadership
// to another voter (LeadershipTransfer picks the follower whose log is most up to date,
// which a voter with a full disk is not). A single voter has no one to hand to. The
// reason shows in GET /__ursula/raft/status and in the metrics (disk_pressure,
// pressure_transfers); readiness already reports the admission's refusal first.
//
// Trim. Once a group's hot bytes fall (a cold flush recorded a chunk, or data was
// deleted), the entries that carried those bytes are only needed by followers that lag:
// the group takes a snapshot, keeping only trimTrailingLogs entries, instead of waiting
// for SnapshotThreshold, so the journal releases them. The node log rolls its active
// segment when compaction leaves it mostly dead (raftlog), so the disk space itself comes
// back. A snapshot writes every hot byte of the group again, so a trim waits until the
// log it releases is worth it: at least Config.TrimLogRatio times the snapshot's
// expected size (the group's hot bytes plus what the last snapshot held beyond them).
// Under disk pressure, and after a trim that failed or ran under pressure, it does not
// wait. Before issue 20 every flush snapshotted: under a steady 64-writer load that was a
// snapshot of a few MiB per group every ~2,300 entries, a tenth of the node's CPU.

// diskWatchTick is how often pressure and hot bytes are looked at.
const diskWatchTick = 250 * time.Millisecond

// trimTrailingLogs is the number of entries a group of a cluster keeps after a snapshot
// taken because its data reached the cold tier; a follower further behind gets the (small)
// snapshot. A single voter keeps none.
const trimTrailingLogs = 8

// trimMinEvery bounds how often one group snapshots for trimming.
const trimMinEvery = time.Second

// DefaultTrimLogRatio is Config.TrimLogRatio when it is 0: a trim releases at least four
// times the bytes its snapshot writes, so trims rewrite at most a quarter of the bytes
// appended, and a group's journal holds at most about four times its hot bytes (which
// storage.cold.max_hot_size_per_group bounds) between trims.
const DefaultTrimLogRatio = 4

// trimWorthIt reports whether a trim of g releases enough log against the snapshot it
// writes (ratio <= 0: always).
func (g *group) trimWorthIt(ratio float64) bool {
	if ratio <= 0 {
		return true
	}
	snap := g.HotBytes() + g.snapMeta.Load()
	return float64(g.logs.heldBytes()) >= ratio*float64(snap)
}

// diskWatch is the state of the loop (owned by it, read by status through atomics).
type diskWatch struct {
	pressure  atomic.Pointer[string] // the admission's reason while it refuses, nil otherwise
	transfers atomic.Uint64          // leaderships handed off because of disk pressure
	trims     atomic.Uint64          // snapshots taken to trim the log after hot bytes fell
}

func (e *Engine) startDiskWatch() {
	e.wg.Add(1)
	go e.diskWatchLoop()
}

func (e *Engine) diskWatchLoop() {
	defer e.wg.Done()
	t := time.NewTicker(diskWatchTick)
	defer t.Stop()
	// freed: each group's HotFreed as last seen. Hot bytes that arrived and were flushed
	// between two ticks leave HotBytes where it was, but not HotFreed.
	freed := make([]uint64, len(e.groups))
	owed := make([]bool, len(e.groups)) // hot bytes fell and no trim succeeded since
	// dirty: a trim failed or ran while the disk was under pressure (its compaction may
	// have freed nothing), so "nothing new to snapshot" does not end the debt: the next
	// entry gives a snapshot whose compaction has room.
	dirty := make([]bool, len(e.groups))
	lastTrim := make([]time.Time, len(e.groups))
	lastMove := make([]time.Time, len(e.groups))
	for i, g := range e.groups {
		freed[i] = g.HotFreed()
	}
	for {
		select {
		case <-e.stop:
			return
		case <-t.C:
		}
		e.checkPressure(lastMove)
		for i, g := range e.groups {
			if f := g.HotFreed(); f != freed[i] {
				owed[i], freed[i] = true, f
			}
			if owed[i] && time.Since(lastTrim[i]) >= trimMinEvery {
				pressure := e.DiskPressure() != ""
				if !pressure && !dirty[i] && !g.trimWorthIt(e.cfg.TrimLogRatio) {
					continue // still owed: looked at again as the log grows or hot bytes fall
				}
				lastTrim[i] = time.Now()
				switch err := e.trimGroup(g); {
				case err == nil:
					dirty[i], owed[i] = pressure, pressure
				case errors.Is(err, raft.ErrNothingNewToSnapshot):
					owed[i] = dirty[i]
				default:
					dirty[i], owed[i] = true, true
				}
			}
		}
	}
}

// checkPressure hands off the leaderships of this node while its journal's disk refuses
// writes. A group is handed off at most every two seconds (a transfer takes a round trip
// and an election; retrying sooner only adds churn).
func (e *Engine) checkPressure(lastMove []time.Time) {
	if e.cfg.WriteAdmission == nil {
		return
	}
	token, why := e.cfg.WriteAdmission()
	if token == "" {
		e.disk.pressure.Store(nil)
		return
	}
	reason := token + ": " + why
	e.disk.pressure.Store(&reason)
	if e.life.single {
		return
	}
	for i, g := range e.groups {
		if g.r.State() != raft.Leader || time.Since(lastMove[i]) < 2*time.Second {
			continue
		}
		lastMove[i] = time.Now()
		go func() {
			if g.r.LeadershipTransfer().Error() == nil {
				e.disk.transfers.Add(1)
				e.cfg.Logger.Warn("handed leadership off: the journal's disk takes no writes", "group", g.id, "reason", reason)
			}
		}()
	}
}

// trimGroup snapshots g keeping only trimTrailingLogs entries, then restores the
// configured number for the snapshots that follow. It returns the snapshot's error
// (raft.ErrNothingNewToSnapshot when there was nothing new to take).
func (e *Engine) trimGroup(g *group) error {
	rc := g.r.ReloadableConfig()
	short := rc
	keep := uint64(trimTrailingLogs)
	if e.life.single {
		// No follower to serve them to. Kept entries would also pin the journal segment
		// they sit in (with the quiet groups' few entries there) until the next trim.
		keep = 0
	}
	short.TrailingLogs = min(rc.TrailingLogs, keep)
	if short != rc {
		if err := g.r.ReloadConfig(short); err != nil {
			e.cfg.Logger.Warn("log trim: cannot shorten the trailing logs", "group", g.id, "err", err)
			return err
		}
		defer g.r.ReloadConfig(rc)
	}
	err := g.r.Snapshot().Error()
	switch {
	case err == nil:
		e.disk.trims.Add(1)
		return nil
	case errors.Is(err, raft.ErrNothingNewToSnapshot):
		return err
	}
	e.cfg.Logger.Info("log trim: snapshot failed, will retry", "group", g.id, "err", err)
	return err
}

// DiskPressure is the admission's refusal while the journal's disk takes no writes, "".
func (e *Engine) DiskPressure() string {
	if p := e.disk.pressure.Load(); p != nil {
		return *p
	}
	return ""
}
