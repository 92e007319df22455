package server

// Backup endpoints: the group list, the export of one group's state and the restore of
// one stream. The ursula backup command drives them; each group is exported consistent
// on its own (no cross-group consistency) while writes go on.

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/ursula-go/ursula/engine"
	"github.com/ursula-go/ursula/streamcore"
)

// Backup paths.
const (
	backupPrefix      = "/__ursula/backup/"
	backupGroupsPath  = "/__ursula/backup/groups"
	backupRestorePath = "/__ursula/backup/restore"
)

// maxRestoreBody bounds one restored stream (its bytes, snapshot and producer state).
const maxRestoreBody = 1 << 30

// BackupGroupList is the JSON answer of GET /__ursula/backup/groups.
type BackupGroupList struct {
	ClusterID string   `json:"cluster_id"`
	Engine    string   `json:"engine"`
	Groups    []uint64 `json:"groups"`
}

// handleBackup serves
//
//	GET  /__ursula/backup/groups            the groups to export (BackupGroupList)
//	GET  /__ursula/backup/groups/{g}        group g's state (streamcore.WriteState), cold bytes inline
//	POST /__ursula/backup/restore?key=K     install one stream (streamcore.EncodeStream) as a history rewrite
//
// A replicated engine answers an export on a follower with a redirect to the group's
// leader, as it does for writes.
func (s *Server) handleBackup(w http.ResponseWriter, r *http.Request, raw string) {
	bk, ok := s.engine.(engine.Backup)
	if !ok {
		s.writeError(w, r, streamcore.Errorf(http.StatusNotImplemented, streamcore.CodeNotFound, "this engine cannot export backups"))
		return
	}
	switch {
	case raw == backupGroupsPath:
		if !s.allow(w, r, http.MethodGet) {
			return
		}
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(BackupGroupList{ClusterID: s.cfg.ClusterID, Engine: s.engine.Stats().Engine, Groups: bk.BackupGroups()})
	case strings.HasPrefix(raw, backupGroupsPath+"/"):
		if !s.allow(w, r, http.MethodGet) {
			return
		}
		g, err := strconv.ParseUint(strings.TrimPrefix(raw, backupGroupsPath+"/"), 10, 64)
		if err != nil {
			s.writeError(w, r, streamcore.Errorf(http.StatusNotFound, streamcore.CodeNotFound, "use /__ursula/backup/groups/{group}"))
			return
		}
		s.exportGroup(w, r, bk, g)
	case raw == backupRestorePath:
		if !s.allow(w, r, http.MethodPost) {
			return
		}
		if !s.explicitAdmin(w, r) { // a history rewrite a web page must not trigger
			return
		}
		s.restoreStream(w, r)
	default:
		s.writeError(w, r, streamcore.Errorf(http.StatusNotFound, streamcore.CodeNotFound, "no such backup endpoint"))
	}
}

func (s *Server) exportGroup(w http.ResponseWriter, r *http.Request, bk engine.Backup, g uint64) {
	ctx, cancel := context.WithTimeout(r.Context(), 10*time.Second)
	defer cancel()
	var pinned []string
	st, err := bk.CaptureGroup(ctx, g, func(live *streamcore.State) {
		if s.cold == nil {
			return
		}
		// Pin what the copy references, so nothing it needs is collected before it is read.
		for _, str := range live.Streams {
			for _, ch := range str.Chunks {
				pinned = append(pinned, ch.Key)
			}
			if str.Snapshot != nil && str.Snapshot.ColdKey != "" {
				pinned = append(pinned, str.Snapshot.ColdKey)
			}
		}
		s.cold.Pin(pinned...)
	})
	defer func() { s.cold.Unpin(pinned...) }()
	if err != nil {
		e := leaderError(err, false)
		if e == nil {
			e = streamcore.Errorf(http.StatusNotFound, streamcore.CodeNotFound, "%s", err.Error())
		}
		s.writeError(w, r, e)
		return
	}
	if e := s.inlineCold(ctx, st); e != nil {
		s.writeError(w, r, e)
		return
	}
	w.Header().Set("Content-Type", "application/octet-stream")
	if err := streamcore.WriteState(w, st); err != nil {
		panic(http.ErrAbortHandler) // the client sees a cut body, never a short backup
	}
}

// inlineCold replaces every cold reference of the captured state by the bytes, so a
// backup needs no cold store to restore. Streams deleted while forks read through them
// are left out: their bytes live on in each fork.
func (s *Server) inlineCold(ctx context.Context, st *streamcore.State) *streamcore.Error {
	for k, str := range st.Streams {
		if str.SoftDeleted {
			delete(st.Streams, k)
			continue
		}
		if (len(str.Chunks) > 0 || str.Snapshot != nil && str.Snapshot.ColdKey != "") && s.cold == nil {
			return streamcore.Errorf(http.StatusInternalServerError, streamcore.CodeInternal, "stream %s references cold objects but this server has no cold store", k)
		}
		if len(str.Chunks) > 0 {
			from := str.Chunks[0].Start
			plan := s.cold.Plan(str, from, str.Data.Base())
			if plan == nil {
				return streamcore.Errorf(http.StatusInternalServerError, streamcore.CodeInternal, "stream %s: chunks end above the hot start", k)
			}
			cold, e := s.cold.Fetch(plan)
			if e != nil {
				return e
			}
			if err := str.InlineCold(from, bytes.Join(cold, nil)); err != nil {
				return streamcore.Errorf(http.StatusInternalServerError, streamcore.CodeInternal, "stream %s: %v", k, err)
			}
		}
		if sn := str.Snapshot; sn != nil && sn.ColdKey != "" {
			rc, e := s.cold.OpenSnapshot(ctx, sn, 0, -1)
			if e != nil {
				return e
			}
			body, err := io.ReadAll(rc)
			rc.Close()
			if err != nil || uint64(len(body)) != sn.Size {
				return streamcore.Errorf(http.StatusBadGateway, streamcore.CodeInternal, "snapshot of %s: read %d of %d bytes: %v", k, len(body), sn.Size, err)
			}
			str.Snapshot = &streamcore.Snapshot{Offset: sn.Offset, ContentType: sn.ContentType, Digest: sn.Digest, Body: body}
		}
	}
	return nil
}

// restoreStream installs one stream of a backup: OpRestoreStream through the engine, so
// every replica of the stream's group applies the same rewrite.
func (s *Server) restoreStream(w http.ResponseWriter, r *http.Request) {
	key := r.URL.Query().Get("key")
	if b, st, ok := strings.Cut(key, "/"); !ok || b == "" || st == "" {
		drainBody(r)
		s.writeError(w, r, streamcore.Errorf(http.StatusBadRequest, streamcore.CodeInvalidQuery, "restore needs key=bucket/stream"))
		return
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxRestoreBody))
	if err != nil {
		var mb *http.MaxBytesError
		if errors.As(err, &mb) {
			s.writeError(w, r, streamcore.Errorf(http.StatusRequestEntityTooLarge, streamcore.CodeInvalidRequest, "a restored stream is limited to %d bytes", maxRestoreBody))
		}
		return
	}
	res, e := s.propose(r.Context(), &streamcore.Command{Op: streamcore.OpRestoreStream, Key: key, Now: s.now(),
		NewIncarnation: NewIncarnation(), Body: body})
	if e != nil {
		s.writeError(w, r, e)
		return
	}
	res.Created = false // no Location: the stream's URL is the client's business
	s.writeResult(w, r, &target{key: key}, res)
}
