package server

import (
	"bytes"
	"net/http"
	"net/url"
	"runtime"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/ursula-go/ursula/coldtier"
	"github.com/ursula-go/ursula/streamcore"
)

// view is what a read saw of a stream under the engine's lock. Its data slices are
// immutable, so the answer is written after the lock is released.
type view struct {
	ct        string
	inc       uint64
	tail      uint64
	retained  uint64
	closed    bool
	ttl       int64
	expiresAt string
	snap      *streamcore.Snapshot
	renew     bool
	start     uint64 // resolved read offset
	end       uint64 // just past the returned bytes
	data      [][]byte
	jsonArray bool               // compat family: JSON reads are one JSON array of whole messages
	pin       any                // keeps the blocks behind data mapped (streamcore.Buffer.Pin)
	cold      *coldtier.ReadPlan // bytes below the hot buffer, fetched after the View
	coldHeld  int64              // cold bytes charged to the node's budget (Server.done gives them back)
	hotStart  uint64             // first offset still in the hot tier
	prevInc   uint64             // history rewrite: the token before it (0 = none)
	inherited uint64             // history rewrite: the tail kept then
}

func (v *view) isJSON() bool { return streamcore.IsJSON(v.ct) }

// readQuery holds the parsed read parameters.
type readQuery struct {
	off        streamcore.ReadOffset
	hasOffset  bool
	live       string
	leader     bool
	maxBytes   uint64
	timeout    time.Duration
	cursor     string
	hasCursorQ bool
}

var removedReadParams = []string{"record", "tail_records", "max_records", "record_view"}

func parseReadQuery(q url.Values, compat bool) (*readQuery, *streamcore.Error) {
	rq := &readQuery{off: streamcore.ReadOffset{Start: true}, maxBytes: streamcore.MaxReadBytes, timeout: streamcore.DefaultLongPollMs * time.Millisecond}
	for _, p := range removedReadParams {
		if q.Has(p) {
			return nil, streamcore.Errorf(http.StatusBadRequest, streamcore.CodeInvalidQuery, "query parameter %q was removed", p)
		}
	}
	if q.Has("offset") {
		o, err := parseReadOffset(q.Get("offset"), compat)
		if err != nil {
			return nil, streamcore.Errorf(http.StatusBadRequest, streamcore.CodeInvalidOffset, "%s", err.Error())
		}
		rq.off, rq.hasOffset = o, true
	}
	switch l := q.Get("live"); {
	case !q.Has("live"):
	case l == "long-poll" || l == "sse":
		rq.live = l
		if !rq.hasOffset {
			return nil, streamcore.Errorf(http.StatusBadRequest, streamcore.CodeInvalidQuery, "live reads need an offset")
		}
	default:
		return nil, streamcore.Errorf(http.StatusBadRequest, streamcore.CodeInvalidQuery, "live must be long-poll or sse")
	}
	switch c := q.Get("consistency"); {
	case !q.Has("consistency") || c == "local":
	case c == "leader":
		if rq.live != "" {
			return nil, streamcore.Errorf(http.StatusBadRequest, streamcore.CodeInvalidQuery, "consistency=leader cannot be combined with live reads")
		}
		rq.leader = true
	default:
		return nil, streamcore.Errorf(http.StatusBadRequest, streamcore.CodeInvalidQuery, "consistency must be local or leader")
	}
	if q.Has("max_bytes") {
		if n, err := strconv.ParseUint(q.Get("max_bytes"), 10, 64); err == nil {
			if n < rq.maxBytes {
				rq.maxBytes = n
			}
		}
	}
	if rq.maxBytes < 1 {
		rq.maxBytes = 1
	}
	if q.Has("timeout_ms") {
		if n, err := strconv.ParseInt(q.Get("timeout_ms"), 10, 64); err == nil {
			n = max(1, min(n, streamcore.MaxLongPollMs))
			rq.timeout = time.Duration(n) * time.Millisecond
		}
	}
	rq.cursor, rq.hasCursorQ = q.Get("cursor"), q.Has("cursor")
	return rq, nil
}

// look takes a view of t at off reading at most maxBytes. It returns the refusal in the
// protocol's order: 404, 410, 416, then 412. Cold bytes in the view are charged to the
// node's cold-read budget until s.done(v).
func (s *Server) look(t *target, off streamcore.ReadOffset, maxBytes uint64, inc uint64) (*view, *streamcore.Error) {
	return s.lookCapped(t, off, maxBytes, inc, 0)
}

// lookShort is look for a catch-up read, which may answer with fewer bytes than asked:
// a window that starts in the cold tier is cut to Limits.ColdReadBytes.
func (s *Server) lookShort(t *target, off streamcore.ReadOffset, maxBytes uint64, inc uint64) (*view, *streamcore.Error) {
	return s.lookCapped(t, off, maxBytes, inc, uint64(s.cfg.Limits.ColdReadBytes))
}

// lookCapped is look with the cold part of the window cut to coldCap bytes (0: uncut).
func (s *Server) lookCapped(t *target, off streamcore.ReadOffset, maxBytes, inc, coldCap uint64) (*view, *streamcore.Error) {
	var v *view
	var e *streamcore.Error
	now := s.now()
	s.engine.View(t.key, now, func(st *streamcore.State, str *streamcore.Stream) {
		if str == nil {
			e = st.NotFound(t.key)
			if e.Code == streamcore.CodeBucketNotFound && s.engine.BucketKnown(t.bucket) {
				e = streamcore.Errorf(http.StatusNotFound, streamcore.CodeStreamNotFound, "stream does not exist")
			}
			return
		}
		if str.SoftDeleted {
			e = streamcore.Errorf(http.StatusGone, streamcore.CodeStreamGone, "stream was deleted")
			return
		}
		v = &view{ct: str.ContentType, inc: str.Incarnation, tail: str.Tail(), retained: str.Retained,
			closed: str.Closed, ttl: str.TTL, expiresAt: str.ExpiresAt, snap: str.Snapshot, renew: str.ReadRenewalDue(now),
			hotStart: str.Data.Base(), prevInc: str.PreviousIncarnation, inherited: str.InheritedOffset}
		switch {
		case off.Now:
			v.start = v.tail
		case off.Start:
			v.start = v.retained
			if v.retained > 0 {
				e = gone(v)
				return
			}
		default:
			v.start = off.Pos
		}
		if v.start < v.retained {
			e = gone(v)
			return
		}
		if v.start > v.tail {
			e = streamcore.Errorf(http.StatusRequestedRangeNotSatisfiable, streamcore.CodeOffsetOutOfRange, "offset is beyond the stream tail").
				With(streamcore.HdrStreamNextOff, streamcore.FormatOffset(v.tail)).With(streamcore.HdrIncarnation, u64(v.inc))
			return
		}
		v.end = min(v.tail, v.start+maxBytes)
		if base := str.Data.Base(); coldCap > 0 && v.start < base && v.start+coldCap < base {
			v.end = min(v.end, v.start+coldCap)
		}
		if v.cold = s.cold.Plan(str, v.start, v.end); v.cold != nil {
			if base := str.Data.Base(); v.end > base {
				v.data, v.pin = str.Data.Slices(base, v.end), str.Data.Pin()
			}
			v.jsonArray = t.compat && str.IsJSON() // cut to whole messages after the fetch
			return
		}
		if t.compat && str.IsJSON() {
			v.jsonArray = true
			v.end = wholeMessages(str, v.start, v.end)
		}
		v.data = str.Data.Slices(v.start, v.end)
		v.pin = str.Data.Pin()
	})
	if e == nil && inc != 0 && inc != v.inc {
		e = streamcore.Errorf(http.StatusPreconditionFailed, streamcore.CodeIncarnationMismatch, "Stream-Incarnation does not match the stream's current incarnation").
			With(streamcore.HdrIncarnation, u64(v.inc))
	}
	if v != nil && v.cold != nil {
		if e == nil {
			e = s.fetchCold(t.key, v)
		} else {
			s.cold.Release(v.cold)
		}
	}
	return v, e
}

// wholeMessages moves end back to the last message boundary in (start, end], or forward
// to the end of the first message when the window holds no whole message.
func wholeMessages(str *streamcore.Stream, start, end uint64) uint64 {
	if end == start || end == str.Tail() {
		return end
	}
	for e := end; e > start; e-- {
		if str.Data.ByteAt(e-1) == '\n' {
			return e
		}
	}
	for e := end; e < str.Tail(); e++ {
		if str.Data.ByteAt(e) == '\n' {
			return e + 1
		}
	}
	return str.Tail()
}

// jsonArrayOf renders stored messages (each ending in LF) as one JSON array.
func jsonArrayOf(data [][]byte) []byte {
	n := 2
	for _, p := range data {
		n += len(p)
	}
	out := make([]byte, 0, n)
	out = append(out, '[')
	for _, p := range data {
		out = append(out, p...)
	}
	if out[len(out)-1] == '\n' {
		out = out[:len(out)-1]
	}
	for i := 1; i < len(out); i++ {
		if out[i] == '\n' {
			out[i] = ','
		}
	}
	return append(out, ']')
}

// parseReadOffset accepts the 20-digit form and the sentinels; the compatibility family
// also accepts the reference server's "READSEQ_BYTEOFFSET" form, whose byte part is the
// position.
func parseReadOffset(s string, compat bool) (streamcore.ReadOffset, error) {
	if compat {
		if pos, ok := compatOffset(s); ok {
			return streamcore.ReadOffset{Pos: pos}, nil
		}
	}
	return streamcore.ParseReadOffset(s)
}

func compatOffset(s string) (uint64, bool) {
	a, b, ok := strings.Cut(s, "_")
	if !ok || a == "" || b == "" || len(a) > 20 || len(b) > 20 || !allDigits(a) || !allDigits(b) {
		return 0, false
	}
	v, err := strconv.ParseUint(b, 10, 64)
	return v, err == nil
}

func allDigits(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}

func gone(v *view) *streamcore.Error {
	return streamcore.Errorf(http.StatusGone, streamcore.CodeStreamGone, "offset is below the stream's retained offset").
		With(streamcore.HdrStreamNextOff, streamcore.FormatOffset(v.retained)).With(streamcore.HdrIncarnation, u64(v.inc))
}

func u64(v uint64) string { return strconv.FormatUint(v, 10) }

// trimText shortens a text window so it never ends inside a UTF-8 code point and, for
// NDJSON, ends at the last complete line when one exists. It cuts the window's parts where
// they are, without copying them into one slice.
func trimText(v *view, json bool) {
	if v.end == v.tail || v.end == v.start {
		return
	}
	total := 0
	for _, p := range v.data {
		total += len(p)
	}
	n := total
	if json {
		at := total
		for i := len(v.data) - 1; i >= 0; i-- {
			at -= len(v.data[i])
			if j := bytes.LastIndexByte(v.data[i], '\n'); j >= 0 {
				n = at + j + 1
				break
			}
		}
	}
	if n == total {
		// Back off an incomplete trailing code point (its bytes may straddle parts).
		var last [4]byte
		k := 0
		for i := len(v.data) - 1; i >= 0 && k < len(last); i-- {
			p := v.data[i]
			for j := len(p) - 1; j >= 0 && k < len(last); j-- {
				k++
				last[len(last)-k] = p[j]
			}
		}
		tail := last[len(last)-k:]
		for k := 1; k <= 3 && k <= len(tail); k++ {
			c := tail[len(tail)-k]
			if c < 0x80 {
				break
			}
			if c >= 0xC0 {
				if !utf8.FullRune(tail[len(tail)-k:]) {
					n -= k
				}
				break
			}
		}
	}
	if n == 0 {
		return // a single code point wider than the window: send it whole rather than stall
	}
	v.data = cutParts(v.data, n)
	v.end = v.start + uint64(n)
}

// cutParts returns the first n bytes of parts as parts (a new outer slice; the bytes are
// shared).
func cutParts(parts [][]byte, n int) [][]byte {
	out := make([][]byte, 0, len(parts))
	for _, p := range parts {
		if n <= 0 {
			break
		}
		k := min(len(p), n)
		out = append(out, p[:k])
		n -= k
	}
	return out
}

func flatten(parts [][]byte) []byte {
	if len(parts) == 1 {
		return parts[0]
	}
	var out []byte
	for _, p := range parts {
		out = append(out, p...)
	}
	return out
}

func etagOf(v *view) string {
	tag := `"` + u64(v.inc) + ":" + u64(v.start) + ":" + u64(v.end)
	if v.closed && v.end == v.tail {
		tag += ":c"
	}
	return tag + `"`
}

// etagMatches compares If-None-Match weakly.
func etagMatches(r *http.Request, etag string) bool {
	inm := r.Header.Get("If-None-Match")
	if inm == "" {
		return false
	}
	want := strings.TrimPrefix(etag, "W/")
	for _, p := range strings.Split(inm, ",") {
		p = strings.TrimSpace(p)
		if p == "*" || strings.TrimPrefix(p, "W/") == want {
			return true
		}
	}
	return false
}

// writeData answers a read with the bytes of v (catch-up and long-poll 200).
func (s *Server) writeData(w http.ResponseWriter, r *http.Request, v *view, noETag bool, cursor string) {
	defer runtime.KeepAlive(v)
	h := w.Header()
	body := v.data
	n := v.end - v.start
	if v.jsonArray {
		h.Set("Content-Type", v.ct)
		arr := jsonArrayOf(v.data)
		if n == 0 {
			arr = []byte("[]")
		}
		body, n = [][]byte{arr}, uint64(len(arr))
	} else {
		h.Set("Content-Type", streamcore.ReadContentType(v.ct))
	}
	h.Set(streamcore.HdrStreamNextOff, streamcore.FormatOffset(v.end))
	h.Set(streamcore.HdrIncarnation, u64(v.inc))
	if v.end == v.tail {
		h.Set(streamcore.HdrStreamUpToDate, "true")
		if v.closed {
			h.Set(streamcore.HdrStreamClosed, "true")
		}
	}
	if cursor != "" {
		h.Set(streamcore.HdrStreamCursor, cursor)
	}
	if !noETag {
		etag := etagOf(v)
		h.Set("ETag", etag)
		if etagMatches(r, etag) {
			w.WriteHeader(http.StatusNotModified)
			return
		}
	}
	h.Set("Content-Length", strconv.FormatUint(n, 10))
	w.WriteHeader(http.StatusOK)
	if r.Method == http.MethodHead {
		return
	}
	for _, p := range body {
		w.Write(p)
	}
	s.metrics.readBytes.Add(v.end - v.start)
}

// fetchCold reads the planned cold bytes (outside any lock) and puts them in front of
// v.data. A compat JSON read is then cut back to whole messages.
func (s *Server) fetchCold(key string, v *view) *streamcore.Error {
	n := int64(v.cold.Size())
	if !s.coldReads.take(n, coldReadWait) {
		s.cold.Release(v.cold)
		return coldReadRefusal()
	}
	v.coldHeld = n
	cold, e := s.cold.Fetch(v.cold)
	if e != nil {
		s.done(v)
		return e
	}
	v.data = append(cold, v.data...)
	if v.jsonArray && v.end < v.tail {
		flat := flatten(v.data)
		if i := bytes.LastIndexByte(flat, '\n'); i >= 0 {
			v.data, v.end = [][]byte{flat[:i+1]}, v.start+uint64(i+1)
		} else {
			// One message longer than the window: read on to its end.
			more, e := s.cold.ReadRange(key, v.inc, v.end, min(v.tail, v.start+streamcore.MaxRequestBytes))
			if e != nil {
				s.done(v)
				return e
			}
			s.coldReads.force(int64(len(more)))
			v.coldHeld += int64(len(more))
			if i := bytes.IndexByte(more, '\n'); i >= 0 {
				more = more[:i+1]
			}
			v.data, v.end = [][]byte{flat, more}, v.end+uint64(len(more))
		}
	}
	return nil
}
