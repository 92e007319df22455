package streamcore

import (
	"fmt"
	"net/http"
)

// Restore from backup. A backup holds each stream encoded as in a state snapshot; the
// restore installs it with OpRestoreStream, a history rewrite: the stream gets a new
// token, reports the token it had before and the tail it kept, and every producer that
// survived keeps its receipts but may not write anything new in its current epoch.

// EncodeStream encodes one stream for OpRestoreStream (the encoding WriteState uses for
// each stream of a state).
func EncodeStream(s *Stream) []byte {
	e := encoder{}
	e.byte(stateCodecVersion)
	e.stream(s)
	return e.b
}

// DecodeStream decodes a stream encoded by EncodeStream.
func DecodeStream(b []byte) (*Stream, error) {
	d := decoder{b: b}
	if d.ver = d.byte(); !knownStateVersion(d.ver) {
		return nil, fmt.Errorf("%w: state codec version %d", ErrCodec, d.ver)
	}
	s := d.stream()
	if err := d.finish(); err != nil {
		return nil, err
	}
	return s, nil
}

// InlineCold makes s hold cold, the bytes [from, Data.Base()) its chunks hold, in front
// of its hot bytes, and drops the chunks: the stream then needs no cold store. s must be
// a copy nobody else reads (CaptureState).
func (s *Stream) InlineCold(from uint64, cold []byte) error {
	if from+uint64(len(cold)) != s.Data.Base() {
		return fmt.Errorf("streamcore: cold bytes [%d, %d) do not end at the hot start %d", from, from+uint64(len(cold)), s.Data.Base())
	}
	nb := Buffer{base: from, end: from}
	nb.Append(cold)
	for _, p := range s.Data.Slices(s.Data.Base(), s.Data.End()) {
		nb.Append(p)
	}
	s.Data = nb
	s.Chunks = nil
	return nil
}

// History reports the stream's last history rewrite: the token before it and the
// offset below which the bytes are the same under both (ok false: none since creation).
func (s *Stream) History() (previous, inherited uint64, ok bool) {
	return s.PreviousIncarnation, s.InheritedOffset, s.PreviousIncarnation != 0
}

func (st *State) restoreStream(c *Command) Result {
	if c.IfIncarnation != 0 {
		return st.rewriteInPlace(c) // no body: the stream rewrites itself
	}
	src, err := DecodeStream(c.Body)
	if err != nil {
		return fail(Errorf(http.StatusBadRequest, CodeInvalidRequest, "restored stream does not decode: %v", err))
	}
	switch {
	case c.NewIncarnation == 0:
		return fail(Errorf(http.StatusBadRequest, CodeInvalidRequest, "a restore needs a new incarnation token"))
	case src.SoftDeleted:
		return fail(Errorf(http.StatusBadRequest, CodeInvalidRequest, "a deleted stream cannot be restored"))
	case len(src.Chunks) > 0 || src.Snapshot != nil && src.Snapshot.ColdKey != "":
		return fail(Errorf(http.StatusBadRequest, CodeInvalidRequest, "a restored stream must carry its cold bytes inline"))
	}
	// One predecessor is reported: when the source had not written the stream since a
	// rewrite of its own, no byte changed, so the token from before that rewrite stands.
	prev, inherited := src.Incarnation, src.Tail()
	if src.PreviousIncarnation != 0 && src.InheritedOffset == src.Tail() {
		prev = src.PreviousIncarnation
	}
	if s := st.Streams[c.Key]; s != nil {
		if s.PreviousIncarnation == prev && s.InheritedOffset == inherited {
			// A repeat of this restore (a retried request): already done.
			r := Result{Status: http.StatusOK}
			s.configHeaders(&r)
			s.historyHeaders(&r)
			return r
		}
		return fail(Errorf(http.StatusConflict, CodeAlreadyExists, "a stream already exists at this path; restore needs a fresh target"))
	}
	ns := src
	ns.Key = c.Key
	ns.Incarnation = c.NewIncarnation
	ns.PreviousIncarnation, ns.InheritedOffset = prev, inherited
	// Each restored stream holds its own bytes: fork links do not survive a restore.
	ns.Fork, ns.ForkRefs = nil, 0
	for _, p := range ns.Producers {
		p.HistoryClosed = true
	}
	st.Streams[c.Key] = ns
	st.Buckets[BucketOf(c.Key)] = true
	r := Result{Status: http.StatusCreated, Created: true, Changed: true}
	ns.configHeaders(&r)
	ns.historyHeaders(&r)
	return r
}

// rewriteInPlace is a history rewrite of an existing stream (an accepted unsynced loss):
// with IfIncarnation naming the stream's current token, the stream keeps its bytes and
// metadata but gets the new token, reports the old one and its tail, and its producers
// are closed for their current epoch. Streams in a fork family or with cold chunks are refused.
func (st *State) rewriteInPlace(c *Command) Result {
	s := st.Streams[c.Key]
	switch {
	case c.NewIncarnation == 0:
		return fail(Errorf(http.StatusBadRequest, CodeInvalidRequest, "a rewrite needs a new incarnation token"))
	case s == nil || s.SoftDeleted:
		return fail(Errorf(http.StatusPreconditionFailed, CodeIncarnationMismatch, "the stream to rewrite does not exist"))
	case s.Incarnation == c.NewIncarnation:
		r := Result{Status: http.StatusOK} // a repeat of this rewrite
		s.configHeaders(&r)
		s.historyHeaders(&r)
		return r
	case s.Incarnation != c.IfIncarnation:
		return fail(s.mismatch())
	case s.Fork != nil || s.ForkRefs > 0 || len(s.Chunks) > 0:
		return fail(Errorf(http.StatusConflict, CodeInvalidRequest, "a stream in a fork family or with cold chunks cannot be rewritten in place"))
	}
	s.PreviousIncarnation, s.InheritedOffset = s.Incarnation, s.Tail()
	s.Incarnation = c.NewIncarnation
	for _, p := range s.Producers {
		p.HistoryClosed = true
	}
	r := Result{Status: http.StatusOK, Changed: true}
	s.configHeaders(&r)
	s.historyHeaders(&r)
	return r
}

func (s *Stream) historyHeaders(r *Result) {
	if prev, inh, ok := s.History(); ok {
		r.set(HdrPreviousIncarnation, incHeader(prev))
		r.set(HdrInheritedOffset, FormatOffset(inh))
	}
}
