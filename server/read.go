package server

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/url"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

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
	jsonArray bool      // compat family: JSON reads are one JSON array of whole messages
	pin       any       // keeps the blocks behind data mapped (streamcore.Buffer.Pin)
	cold      *coldPlan // bytes below the hot buffer, fetched after the View (cold_read.go)
	hotStart  uint64    // first offset still in the hot tier
}

func (v *view) isJSON() bool { return streamcore.IsJSON(v.ct) }

// readQuery holds the parsed read parameters (checklist 14).
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
// protocol's order: 404, 410, 416, then 412.
func (s *Server) look(t *target, off streamcore.ReadOffset, maxBytes uint64, inc uint64) (*view, *streamcore.Error) {
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
			hotStart: str.Data.Base()}
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
		if s.planCold(v, t.key, str) {
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
			e = s.fetchCold(v)
		} else {
			s.cold.unpinPlan(v.cold)
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

// renew proposes the read renewal of a sliding TTL when one is due. On a follower of a
// replicated engine the proposal is refused (NotLeader); the renewal is then asked of the
// leader in the background, as a GET ?offset=now (a read that renews there), at most once
// a second per stream.
func (s *Server) renew(ctx context.Context, t *target, v *view) {
	if v == nil || !v.renew {
		return
	}
	_, err := s.engine.Propose(ctx, &streamcore.Command{Op: streamcore.OpTouch, Key: t.key, Now: s.now()})
	var nl *NotLeaderError
	if err != nil && errors.As(err, &nl) && nl.LeaderURL != "" {
		forwardRenewal(strings.TrimRight(nl.LeaderURL, "/") + t.url + "?offset=now")
	}
}

var renewForwards struct {
	sync.Mutex
	last map[string]time.Time
}

var renewClient = &http.Client{Timeout: 2 * time.Second,
	CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}

func forwardRenewal(u string) {
	now := time.Now()
	renewForwards.Lock()
	if renewForwards.last == nil || len(renewForwards.last) > 10000 {
		renewForwards.last = map[string]time.Time{}
	}
	if last, ok := renewForwards.last[u]; ok && now.Sub(last) < time.Second {
		renewForwards.Unlock()
		return
	}
	renewForwards.last[u] = now
	renewForwards.Unlock()
	go func() {
		res, err := renewClient.Get(u)
		if err == nil {
			io.Copy(io.Discard, io.LimitReader(res.Body, 1<<16))
			res.Body.Close()
		}
	}()
}

// trimText shortens a text window so it never ends inside a UTF-8 code point and, for
// NDJSON, ends at the last complete line when one exists (checklist 18.11, 18.12).
func trimText(v *view, json bool) {
	if v.end == v.tail || v.end == v.start {
		return
	}
	flat := flatten(v.data)
	n := len(flat)
	if json {
		if i := strings.LastIndexByte(string(flat), '\n'); i >= 0 {
			n = i + 1
		}
	}
	if n == len(flat) {
		// Back off an incomplete trailing code point.
		for k := 1; k <= 3 && k <= n; k++ {
			c := flat[n-k]
			if c < 0x80 {
				break
			}
			if c >= 0xC0 {
				if !utf8.FullRune(flat[n-k:]) {
					n -= k
				}
				break
			}
		}
	}
	if n == 0 {
		return // a single code point wider than the window: send it whole rather than stall
	}
	v.data = [][]byte{flat[:n]}
	v.end = v.start + uint64(n)
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

// etagMatches compares If-None-Match weakly (checklist 19.3).
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

func (s *Server) handleRead(w http.ResponseWriter, r *http.Request, t *target) {
	rq, e := parseReadQuery(r.URL.Query(), t.compat)
	if e != nil {
		s.writeError(w, r, e)
		return
	}
	inc, e := parseIncarnation(r)
	if e != nil {
		s.writeError(w, r, e)
		return
	}
	if (rq.leader || rq.live != "") && !s.verifyLeader(w, r, t.key) {
		return
	}
	switch rq.live {
	case "long-poll":
		s.longPoll(w, r, t, rq, inc)
		return
	case "sse":
		s.serveSSE(w, r, t, rq, inc)
		return
	}
	v, e := s.look(t, rq.off, rq.maxBytes, inc)
	if (rq.off.Now || e != nil && (e.Status == http.StatusNotFound || e.Status == http.StatusRequestedRangeNotSatisfiable)) && !s.tailHere(w, r, t.key) {
		return // a follower: offset=now, and a missing stream or offset, come from the leader
	}
	if e != nil {
		if e.Status == http.StatusPreconditionFailed {
			s.renew(r.Context(), t, v)
		}
		s.writeError(w, r, e)
		return
	}
	s.renew(r.Context(), t, v)
	s.writeData(w, r, v, rq.off.Now, "")
}

// tailHere reports whether this node may resolve offset=now, or refuse a catch-up read with
// 404 or 416, for key's stream. A follower's replica can trail the leader by a commit
// round, so on a replicated engine a follower sends such a read to the leader (307; 503
// while none is known) rather than answer from its stale prefix. Other catch-up reads are
// served from the local replica; their Stream-Up-To-Date is the tail this node knows
// (checklist-ops 108, the spec's read path).
func (s *Server) tailHere(w http.ResponseWriter, r *http.Request, key string) bool {
	lv, ok := s.engine.(LeaderVerifier)
	if !ok {
		return true
	}
	err := lv.LeaderHint(key)
	if err == nil {
		return true
	}
	e := leaderError(err, false)
	if e == nil {
		return true
	}
	s.writeError(w, r, e)
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

func (s *Server) handleHead(w http.ResponseWriter, r *http.Request, t *target) {
	inc, e := parseIncarnation(r)
	if e != nil {
		s.writeError(w, r, e)
		return
	}
	v, e := s.look(t, streamcore.ReadOffset{Now: true}, 0, inc)
	if e != nil {
		s.writeError(w, r, e)
		return
	}
	h := w.Header()
	h.Set("Content-Type", v.ct)
	h.Set(streamcore.HdrStreamNextOff, streamcore.FormatOffset(v.tail))
	h.Set(streamcore.HdrRetainedOffset, streamcore.FormatOffset(v.retained))
	if s.cold != nil {
		h.Set(HdrColdHotStart, streamcore.FormatOffset(max(v.hotStart, v.retained))) // diagnostic
	}
	h.Set(streamcore.HdrIncarnation, u64(v.inc))
	h.Set(streamcore.HdrMaxRequestBytes, strconv.Itoa(streamcore.MaxRequestBytes))
	if s.cold != nil {
		h.Set(streamcore.HdrMaxSnapshotBytes, strconv.FormatInt(s.cold.maxSnapshotBytes(), 10)) // parts upload
	}
	if v.closed {
		h.Set(streamcore.HdrStreamClosed, "true")
	}
	if v.ttl >= 0 {
		h.Set(streamcore.HdrStreamTTL, strconv.FormatInt(v.ttl, 10))
	}
	if v.expiresAt != "" {
		h.Set(streamcore.HdrStreamExpiresAt, v.expiresAt)
	}
	if v.snap != nil {
		h.Set(streamcore.HdrSnapshotOffset, streamcore.FormatOffset(v.snap.Offset))
		h.Set(streamcore.HdrSnapshotDigest, v.snap.Digest)
	}
	w.WriteHeader(http.StatusOK)
}

// cursorEpoch is 2024-10-09T00:00:00Z; cursors count 20-second intervals from it.
var cursorEpoch = time.Date(2024, 10, 9, 0, 0, 0, 0, time.UTC)

// nextCursor computes Stream-Cursor (checklist 17).
func (s *Server) nextCursor(client string) string {
	cur := int64(s.clock().Sub(cursorEpoch) / (20 * time.Second))
	if c, err := strconv.ParseInt(client, 10, 64); err == nil && c >= cur {
		jitter := 1 + randIntn(3600)
		step := int64((jitter + 19) / 20)
		return strconv.FormatInt(c+max(1, step), 10)
	}
	return strconv.FormatInt(cur, 10)
}

func (s *Server) liveSlot(w http.ResponseWriter, r *http.Request) bool {
	if s.live.Add(1) > int64(s.cfg.MaxLiveReaders) {
		s.live.Add(-1)
		e := streamcore.Errorf(http.StatusServiceUnavailable, streamcore.CodeLiveReadBackpressure, "too many live readers on this node").
			With(streamcore.HdrRetryAfter, "1")
		s.writeError(w, r, e)
		return false
	}
	return true
}

func (s *Server) longPoll(w http.ResponseWriter, r *http.Request, t *target, rq *readQuery, inc uint64) {
	if !s.liveSlot(w, r) {
		return
	}
	defer s.live.Add(-1)
	deadline := time.NewTimer(rq.timeout)
	defer deadline.Stop()
	off := rq.off
	var firstInc uint64
	for i := 0; ; i++ {
		ch := s.engine.Watch(t.key)
		v, e := s.look(t, off, rq.maxBytes, inc)
		if e == nil && i > 0 && v.inc != firstInc {
			// Recreated while waiting: the old stream is gone.
			if inc != 0 {
				e = streamcore.Errorf(http.StatusPreconditionFailed, streamcore.CodeIncarnationMismatch, "stream was recreated").With(streamcore.HdrIncarnation, u64(v.inc))
			} else if off.Pos > v.tail {
				e = streamcore.Errorf(http.StatusRequestedRangeNotSatisfiable, streamcore.CodeOffsetOutOfRange, "stream was recreated").
					With(streamcore.HdrStreamNextOff, streamcore.FormatOffset(v.tail)).With(streamcore.HdrIncarnation, u64(v.inc))
			}
		}
		if e != nil {
			s.writeError(w, r, e)
			return
		}
		if i == 0 {
			firstInc = v.inc
			s.renew(r.Context(), t, v)
			if off.Now {
				off = streamcore.ReadOffset{Pos: v.start}
			}
		}
		if v.end > v.start {
			s.writeData(w, r, v, false, s.cursorIfOpen(v, rq))
			return
		}
		if v.closed {
			s.noContent(w, v, "")
			return
		}
		select {
		case <-ch:
		case <-deadline.C:
			s.noContent(w, v, s.nextCursor(rq.cursor))
			return
		case <-r.Context().Done():
			return
		}
	}
}

func (s *Server) cursorIfOpen(v *view, rq *readQuery) string {
	if v.closed && v.end == v.tail {
		return ""
	}
	return s.nextCursor(rq.cursor)
}

// noContent is the long-poll 204: timeout, or closed at the tail.
func (s *Server) noContent(w http.ResponseWriter, v *view, cursor string) {
	h := w.Header()
	h.Set(streamcore.HdrStreamNextOff, streamcore.FormatOffset(v.start))
	h.Set(streamcore.HdrStreamUpToDate, "true")
	h.Set(streamcore.HdrIncarnation, u64(v.inc))
	if v.closed {
		h.Set(streamcore.HdrStreamClosed, "true")
	}
	if cursor != "" {
		h.Set(streamcore.HdrStreamCursor, cursor)
	}
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) serveSSE(w http.ResponseWriter, r *http.Request, t *target, rq *readQuery, inc uint64) {
	// Validation errors are plain HTTP answers before the event stream starts.
	v, e := s.look(t, rq.off, 0, inc)
	if e != nil {
		s.writeError(w, r, e)
		return
	}
	if !s.liveSlot(w, r) {
		return
	}
	defer s.live.Add(-1)
	s.renew(r.Context(), t, v)
	b64 := !streamcore.IsText(v.ct)
	json := v.isJSON()
	maxBytes := rq.maxBytes
	if !b64 && maxBytes < 4 {
		maxBytes = 4
	}
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-store, no-cache")
	if v.jsonArray {
		h.Set(streamcore.HdrSSEDataType, v.ct)
	} else {
		h.Set(streamcore.HdrSSEDataType, streamcore.ReadContentType(v.ct))
	}
	h.Set(streamcore.HdrIncarnation, u64(v.inc))
	if b64 {
		h.Set(streamcore.HdrSSEEncoding, "base64")
	}
	w.WriteHeader(http.StatusOK)
	flusher, _ := w.(http.Flusher)
	firstInc := v.inc
	off := streamcore.ReadOffset{Pos: v.start}
	var buf []byte
	var idle <-chan time.Time
	if s.cfg.SSEMaxIdle > 0 {
		tm := time.NewTimer(s.cfg.SSEMaxIdle)
		defer tm.Stop()
		idle = tm.C
	}
	sentInitial := false
	for {
		ch := s.engine.Watch(t.key)
		v, e = s.look(t, off, maxBytes, 0)
		if e == nil && v.inc != firstInc {
			e = streamcore.Errorf(http.StatusNotFound, streamcore.CodeStreamNotFound, "stream was deleted or recreated")
		}
		if e != nil {
			buf = streamcore.AppendSSEError(buf[:0], e)
			w.Write(buf)
			return
		}
		if !b64 && !v.jsonArray {
			trimText(v, json)
		}
		if v.end > v.start {
			payload := flatten(v.data)
			if v.jsonArray {
				payload = jsonArrayOf(v.data)
			}
			buf = buf[:0]
			buf = streamcore.AppendSSEData(buf, payload, b64)
			buf = streamcore.AppendSSEControl(buf, s.control(v, rq))
			_, err := w.Write(buf)
			runtime.KeepAlive(v)
			if err != nil {
				return
			}
			if flusher != nil {
				flusher.Flush()
			}
			s.metrics.readBytes.Add(v.end - v.start)
			off = streamcore.ReadOffset{Pos: v.end}
			sentInitial = true
			if v.closed && v.end == v.tail {
				return
			}
			continue
		}
		if v.closed || !sentInitial {
			buf = streamcore.AppendSSEControl(buf[:0], s.control(v, rq))
			w.Write(buf)
			if flusher != nil {
				flusher.Flush()
			}
			sentInitial = true
			if v.closed {
				return
			}
		}
		select {
		case <-ch:
		case <-idle:
			return
		case <-r.Context().Done():
			return
		}
	}
}

func (s *Server) control(v *view, rq *readQuery) streamcore.SSEControl {
	c := streamcore.SSEControl{StreamNextOffset: streamcore.FormatOffset(v.end)}
	atTail := v.end == v.tail
	if atTail {
		c.UpToDate = true
	}
	if v.closed && atTail {
		c.StreamClosed = true
	} else {
		c.StreamCursor = s.nextCursor(rq.cursor)
	}
	return c
}
