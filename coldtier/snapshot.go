package coldtier

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"time"

	"github.com/ursula-go/ursula/streamcore"
)

// StageSnapshot stores a snapshot body of at least storage.cold.snapshot_min_size as an
// object before the publish is proposed, so the command (and every replica's state)
// carries only its key. It also settles the JSON boundary check of an offset below the
// hot buffer. It returns the staged key ("" when the body stays inline), pinned until
// UnstageSnapshot. Without a tier it does nothing.
func (ct *Tier) StageSnapshot(key string, c *streamcore.Command) (string, *streamcore.Error) {
	if ct == nil {
		return "", nil
	}
	ct.CheckBoundary(key, c)
	if int64(len(c.Body)) < int64(ct.cfg.SnapshotMinSize) {
		return "", nil
	}
	if ct.leader != nil && ct.leader.LeaderHint(key) != nil {
		return "", nil // not the leader: the publish answers the redirect, nothing staged
	}
	var inc uint64
	ct.eng.View(key, clockMs(), func(_ *streamcore.State, str *streamcore.Stream) {
		if str != nil {
			inc = str.Incarnation
		}
	})
	if inc == 0 {
		return "", nil // the publish will answer 404
	}
	if c.IfIncarnation != 0 && c.IfIncarnation != inc {
		return "", nil // the publish will answer 412
	}
	k := ct.snapshotKey(key, inc, c.Offset)
	ct.Pin(k)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := ct.store.Put(ctx, k, bytes.NewReader(c.Body), int64(len(c.Body))); err != nil {
		ct.Unpin(k)
		return "", coldStoreFailed(err)
	}
	c.SnapshotColdKey, c.SnapshotSize, c.Body = k, uint64(len(c.Body)), nil
	return k, nil
}

// UnstageSnapshot drops the pin of a staged body, deleting the object at once when the
// publish did not make it the latest snapshot (refused, or a repeat of the current one).
// An unknown outcome keeps it: the collector removes it later if it is unreferenced.
func (ct *Tier) UnstageSnapshot(k string, res streamcore.Result, e *streamcore.Error) {
	if k == "" {
		return
	}
	defer ct.Unpin(k)
	if e == nil && (res.Err != nil || !res.Changed) {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		ct.store.Delete(ctx, k)
	}
}

// OpenSnapshot opens the bytes [off, off+n) of a cold snapshot body (n < 0: to the end);
// it is streamed, since a snapshot assembled from parts may be up to 1 GiB. The caller
// pins sn.ColdKey while it reads.
func (ct *Tier) OpenSnapshot(ctx context.Context, sn *streamcore.Snapshot, off, n int64) (io.ReadCloser, *streamcore.Error) {
	if ct == nil {
		return nil, Unconfigured()
	}
	rc, err := ct.store.GetRange(ctx, sn.ColdKey, off, n)
	if err != nil {
		return nil, coldStoreFailed(err)
	}
	return rc, nil
}

// Unconfigured is the answer to a read of a snapshot body that lies in a cold store on a
// server without one.
func Unconfigured() *streamcore.Error {
	return streamcore.Errorf(http.StatusBadGateway, CodeColdStoreFailed, "the snapshot body is in a cold store this server has not configured")
}
