package streamcore

import (
	"maps"
	"net/http"
	"slices"
	"strings"
)

// Bucket purge (tenant offboarding). OpPurgeBucket removes every stream of a bucket from
// a state and records the bucket as erased, so no later command can bring it back: a
// create or restore in it is refused, and every request for one of its streams answers
// 404 BUCKET_ERASED. An engine applies the command to each of its states (every
// partition, every Raft group), as its streams are spread over all of them. Applying it
// again removes nothing more.

// PurgedStream names a stream incarnation a purge removed, so the caller can drop what
// lives outside the state (staged snapshot parts).
type PurgedStream struct {
	Key         string
	Incarnation uint64
}

func erasedError() *Error {
	return Errorf(http.StatusNotFound, CodeBucketErased, "bucket was erased")
}

// IsErased reports whether bucket was purged in this state.
func (st *State) IsErased(bucket string) bool { return st.Erased[bucket] }

func (st *State) purgeBucket(c *Command) Result {
	bucket := c.Key
	if bucket == "" || strings.Contains(bucket, "/") {
		return fail(Errorf(http.StatusBadRequest, CodeInvalidBucketID, "a purge names one bucket"))
	}
	if st.Erased == nil {
		st.Erased = map[string]bool{}
	}
	st.Erased[bucket] = true
	delete(st.Buckets, bucket)
	prefix := bucket + "/"
	var keys []string
	for k := range st.Streams {
		if strings.HasPrefix(k, prefix) {
			keys = append(keys, k)
		}
	}
	slices.Sort(keys) // the same order on every replica
	res := Result{Status: http.StatusOK}
	// Every stream of the bucket is first marked deleted, then those no fork reads
	// through are removed; removing a fork releases its source, which goes as well once
	// nothing else reads through it (drop). A stream that a fork in another bucket still
	// reads through stays, deleted and unreachable, until that fork goes.
	for _, k := range keys {
		st.Streams[k].SoftDeleted = true
	}
	before := map[string]uint64{}
	for _, k := range keys {
		before[k] = st.Streams[k].Incarnation
	}
	for _, k := range keys {
		s := st.Streams[k]
		if s == nil || s.ForkRefs > 0 {
			continue
		}
		delete(st.Streams, k)
		st.drop(s)
	}
	for _, k := range slices.Sorted(maps.Keys(before)) {
		if st.Streams[k] == nil {
			res.Purged = append(res.Purged, PurgedStream{Key: k, Incarnation: before[k]})
		}
	}
	res.Changed = len(keys) > 0
	return res
}

// HeldByForks counts the streams of bucket that stay, deleted, because a fork in another
// bucket still reads through them.
func (st *State) HeldByForks(bucket string) int {
	n := 0
	for k, s := range st.Streams {
		if BucketOf(k) == bucket && s.SoftDeleted {
			n++
		}
	}
	return n
}
