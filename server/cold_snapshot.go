package server

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"strconv"
	"time"

	"github.com/ursula-go/ursula/streamcore"
)

// stageSnapshot stores a snapshot body of at least storage.cold.snapshot_min_size as an
// object before the publish is proposed, so the command (and every replica's state)
// carries only its key. It also settles the JSON boundary check of an offset below the
// hot buffer. It returns the staged key ("" when the body stays inline), pinned until
// unstageSnapshot.
func (s *Server) stageSnapshot(key string, c *streamcore.Command) (string, *streamcore.Error) {
	ct := s.cold
	if ct == nil {
		return "", nil
	}
	c.BoundaryChecked = s.coldBoundary(key, c.Offset)
	if int64(len(c.Body)) < int64(ct.cfg.SnapshotMinSize) {
		return "", nil
	}
	if lv, ok := s.engine.(LeaderVerifier); ok && lv.LeaderHint(key) != nil {
		return "", nil // not the leader: the publish answers the redirect, nothing staged
	}
	var inc uint64
	s.engine.View(key, s.now(), func(_ *streamcore.State, str *streamcore.Stream) {
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
	ct.pin(k)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := ct.store.Put(ctx, k, bytes.NewReader(c.Body), int64(len(c.Body))); err != nil {
		ct.unpin(k)
		return "", coldStoreFailed(err)
	}
	c.SnapshotColdKey, c.SnapshotSize, c.Body = k, uint64(len(c.Body)), nil
	return k, nil
}

// unstageSnapshot drops the pin of a staged body, deleting the object at once when the
// publish did not make it the latest snapshot (refused, or a repeat of the current one).
// An unknown outcome keeps it: the collector removes it later if it is unreferenced.
func (s *Server) unstageSnapshot(k string, res streamcore.Result, e *streamcore.Error) {
	if k == "" {
		return
	}
	ct := s.cold
	defer ct.unpin(k)
	if e == nil && (res.Err != nil || !res.Changed) {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		ct.store.Delete(ctx, k)
	}
}

// writeColdSnapshot writes the bytes [lo, lo+n) of a cold snapshot body as the answer,
// after opening the object (so a store failure is still a clean 502).
func (s *Server) writeColdSnapshot(w http.ResponseWriter, r *http.Request, sn *streamcore.Snapshot, status int, lo, n uint64) {
	ct := s.cold
	if ct == nil {
		s.writeError(w, r, streamcore.Errorf(http.StatusBadGateway, CodeColdStoreFailed, "the snapshot body is in a cold store this server has not configured"))
		return
	}
	ct.pin(sn.ColdKey)
	defer ct.unpin(sn.ColdKey)
	var rc io.ReadCloser
	if r.Method != http.MethodHead && n > 0 {
		var err error
		rc, err = ct.store.GetRange(r.Context(), sn.ColdKey, int64(lo), int64(n))
		if err != nil {
			s.writeError(w, r, coldStoreFailed(err))
			return
		}
		defer rc.Close()
	}
	w.Header().Set("Content-Length", strconv.FormatUint(n, 10))
	w.WriteHeader(status)
	if rc != nil {
		io.Copy(w, rc)
	}
}

// openColdSnapshot opens a whole cold snapshot body for bootstrap; it is streamed, since
// a snapshot assembled from parts may be up to 1 GiB.
func (s *Server) openColdSnapshot(ctx context.Context, sn *streamcore.Snapshot) (io.ReadCloser, *streamcore.Error) {
	ct := s.cold
	if ct == nil {
		return nil, streamcore.Errorf(http.StatusBadGateway, CodeColdStoreFailed, "the snapshot body is in a cold store this server has not configured")
	}
	rc, err := ct.store.GetRange(ctx, sn.ColdKey, 0, int64(sn.Size))
	if err != nil {
		return nil, coldStoreFailed(err)
	}
	return rc, nil
}
