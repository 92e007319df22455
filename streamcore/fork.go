package streamcore

import "net/http"

// A fork is a new stream that starts as a copy of a prefix of another stream (its source):
// it shares the source's bytes [0, fork offset) and then lives independently. Deleting a
// source that forks still reference only soft-deletes it (its path stays taken, reads and
// writes answer 410) until the last fork is gone; then it is collected, cascading up the
// chain. Stream-Fork-Sub-Offset extends the prefix into the append record at the fork
// offset: N bytes of it (binary) or its first N JSON messages (JSON streams).

// sameFork reports whether a repeated create names the same fork as the existing stream.
func sameFork(have, want *ForkSpec) bool {
	if have == nil || want == nil {
		return have == nil && want == nil
	}
	return have.Source == want.Source && (!want.HasOffset || want.Offset == have.Offset) && have.SubOffset == want.SubOffset
}

// forkConfig resolves what a fork inherits when the create does not say: the content type
// and the expiry (TTL or Expires-At) of the source.
func forkConfig(c *Command, src *Stream) (ct string, ttl int64, exp string, expMs int64) {
	ct, ttl, exp, expMs = c.ContentType, c.TTL, c.ExpiresAt, c.ExpiresAtMs
	if src == nil {
		return
	}
	if ct == "" {
		ct = src.ContentType
	}
	if ttl < 0 && exp == "" {
		ttl, exp, expMs = src.TTL, src.ExpiresAt, src.ExpiresAtMs
	}
	return
}

// forkInto makes ns a fork of src.
func (st *State) forkInto(ns, src *Stream, c *Command) *Error {
	if src == nil {
		return Errorf(http.StatusNotFound, CodeStreamNotFound, "fork source stream does not exist")
	}
	if src.SoftDeleted {
		return Errorf(http.StatusConflict, CodeAlreadyExists, "fork source stream was deleted but still has active forks")
	}
	if ns.ContentType != src.ContentType {
		return Errorf(http.StatusConflict, CodeContentTypeMismatch, "fork Content-Type differs from the source stream's")
	}
	off := src.Tail()
	if c.Fork.HasOffset {
		off = c.Fork.Offset
	}
	if off > src.Tail() || off < src.Retained {
		return Errorf(http.StatusBadRequest, CodeInvalidOffset, "fork offset is outside the source stream [retained, tail]")
	}
	end := off
	if c.Fork.SubOffset > 0 {
		var e *Error
		if end, e = src.subOffsetEnd(off, c.Fork.SubOffset); e != nil {
			return e
		}
	}
	ns.Data = src.Data.Prefix(end)
	// Cold bytes below the fork point: the source's chunks, the last one cut at the fork
	// point (its object holds more, which readers of the fork never ask for).
	ns.Chunks = append([]ColdChunk(nil), src.ColdChunksFor(0, end)...)
	if n := len(ns.Chunks); n > 0 && ns.Chunks[n-1].End > end {
		ns.Chunks[n-1].End = end
	}
	ns.Retained = src.Retained
	for _, a := range src.Appends {
		if a >= off {
			break
		}
		ns.Appends = append(ns.Appends, a)
	}
	if end > off {
		ns.Appends = append(ns.Appends, off) // the materialised prefix is the fork's own record
	}
	spec := *c.Fork
	spec.Offset, spec.HasOffset = off, true
	ns.Fork = &spec
	src.ForkRefs++
	return nil
}

// subOffsetEnd is where a sub-offset ends inside the append record that holds off.
func (s *Stream) subOffsetEnd(off, sub uint64) (uint64, *Error) {
	recEnd := s.recordEnd(off)
	if recEnd <= off {
		return 0, Errorf(http.StatusBadRequest, CodeInvalidOffset, "fork sub-offset: the source has no data past the fork offset")
	}
	if !s.IsJSON() {
		if off+sub > recEnd {
			return 0, Errorf(http.StatusBadRequest, CodeInvalidOffset, "fork sub-offset overshoots the length of the source record")
		}
		return off + sub, nil
	}
	if off < s.Data.Base() {
		// Counting messages needs the record's bytes, and apply cannot read the cold tier.
		return 0, Errorf(http.StatusBadRequest, CodeInvalidOffset, "fork sub-offset: the source record at the fork offset was moved to the cold tier; fork at a message boundary instead")
	}
	n, pos := uint64(0), off
	for _, part := range s.Data.Slices(off, recEnd) {
		for _, b := range part {
			pos++
			if b == '\n' {
				if n++; n == sub {
					return pos, nil
				}
			}
		}
	}
	return 0, Errorf(http.StatusBadRequest, CodeInvalidOffset, "fork sub-offset overshoots the number of messages in the source record")
}

// recordEnd is the end of the append record that contains off (the tail if none follows).
func (s *Stream) recordEnd(off uint64) uint64 {
	lo, hi := 0, len(s.Appends)
	for lo < hi { // first record start > off
		m := (lo + hi) / 2
		if s.Appends[m] <= off {
			lo = m + 1
		} else {
			hi = m
		}
	}
	if lo < len(s.Appends) {
		return s.Appends[lo]
	}
	return s.Tail()
}
