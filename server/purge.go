package server

// Bucket purge on the admin plane: DELETE /__ursula/purge/{bucket} erases every stream of
// a bucket in every group of the engine, fences the bucket (later requests for it answer
// 404 BUCKET_ERASED) and deletes its cold objects. It is idempotent: a repeat removes
// nothing more and retries whatever a failure left (a group without a leader, the cold
// store).

import (
	"errors"
	"net/http"
	"net/url"
	"strings"

	"github.com/ursula-go/ursula/engine"
	"github.com/ursula-go/ursula/streamcore"
)

const purgePrefix = "/__ursula/purge/"

// PurgeAnswer is the answer of a bucket purge.
type PurgeAnswer struct {
	Bucket            string   `json:"bucket"`
	RemovedStreams    int      `json:"removed_streams"`
	GroupsWithStreams []uint64 `json:"groups_with_streams"`
	// StreamsHeldByForks counts the bucket's streams kept, deleted and unreachable,
	// because a fork in another bucket still reads through them.
	StreamsHeldByForks int `json:"streams_held_by_forks"`
	// ColdObjectsDeleted and ColdObjectsRemaining count the bucket's cold objects this
	// purge deleted and those still stored; ColdError says why some could not go.
	ColdObjectsDeleted   int     `json:"cold_objects_deleted"`
	ColdObjectsRemaining int     `json:"cold_objects_remaining"`
	ColdError            *string `json:"cold_error"`
	// Complete is true when nothing of the bucket is left: no stream, no cold object.
	Complete bool `json:"complete"`
}

func (s *Server) handlePurge(w http.ResponseWriter, r *http.Request, raw string) {
	drainBody(r)
	if !s.allow(w, r, http.MethodDelete) {
		return
	}
	bucket, err := url.PathUnescape(strings.TrimPrefix(raw, purgePrefix))
	if err != nil || strings.Contains(bucket, "/") {
		s.writeError(w, r, streamcore.Errorf(http.StatusBadRequest, streamcore.CodeInvalidBucketID, "the purge path names one bucket: %s{bucket}", purgePrefix))
		return
	}
	if e := streamcore.ValidateBucketID(bucket); e != nil {
		s.writeError(w, r, e)
		return
	}
	p, ok := s.engine.(engine.Purger)
	if !ok {
		s.writeError(w, r, streamcore.Errorf(http.StatusNotImplemented, streamcore.CodeUnsupported, "this engine cannot purge buckets"))
		return
	}
	rep, perr := p.PurgeBucket(r.Context(), bucket, s.now())
	if perr != nil {
		var se *streamcore.Error
		switch {
		case errors.As(perr, &se):
			s.writeError(w, r, se)
		case errors.Is(perr, engine.ErrNoLeader):
			// Never a redirect: any voter serves the purge; retry the same request.
			s.writeError(w, r, streamcore.Errorf(http.StatusServiceUnavailable, streamcore.CodeNoLeader, "a group has no reachable leader; the purge is idempotent, retry it").
				With(streamcore.HdrRetryAfter, "1"))
		default:
			s.cfg.Logger.Error("bucket purge failed", "bucket", bucket, "err", perr)
			s.writeError(w, r, streamcore.Errorf(http.StatusServiceUnavailable, streamcore.CodeOutcomeUnknown, "the purge did not finish; it is idempotent, retry it").
				With(streamcore.HdrRetryAfter, "1"))
		}
		return
	}
	cold := s.cold.PurgeBucket(r.Context(), bucket, rep.Removed)
	ans := PurgeAnswer{Bucket: bucket, RemovedStreams: len(rep.Removed), GroupsWithStreams: rep.Groups,
		StreamsHeldByForks: rep.HeldByForks, ColdObjectsDeleted: cold.Deleted, ColdObjectsRemaining: cold.Remaining}
	if ans.GroupsWithStreams == nil {
		ans.GroupsWithStreams = []uint64{}
	}
	if cold.Err != nil {
		s.cfg.Logger.Warn("bucket purge: cold objects remain", "bucket", bucket, "err", cold.Err)
		msg := "the cold store failed; repeat the purge"
		ans.ColdError = &msg
	}
	ans.Complete = cold.Err == nil && cold.Remaining == 0 && rep.HeldByForks == 0
	writeJSON(w, ans)
}
