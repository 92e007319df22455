package server

import (
	"crypto/rand"
	"encoding/binary"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/ursula-go/ursula/streamcore"
)

func itoa(n int) string { return strconv.Itoa(n) }

func badHeader(format string, args ...any) *streamcore.Error {
	return streamcore.Errorf(http.StatusBadRequest, streamcore.CodeInvalidHeader, format, args...)
}

func tooLarge(contentLength bool) *streamcore.Error {
	e := streamcore.Errorf(http.StatusRequestEntityTooLarge, streamcore.CodeRequestTooLarge, "request body is larger than %d bytes", streamcore.MaxRequestBytes).
		With(streamcore.HdrMaxRequestBytes, strconv.Itoa(streamcore.MaxRequestBytes))
	if contentLength {
		e.With(streamcore.HdrNotApplied, "RequestBodyTooLarge")
	}
	return e
}

// single returns the one value of header name, refusing repeats.
func single(r *http.Request, name string) (string, bool, *streamcore.Error) {
	vs := r.Header.Values(name)
	switch len(vs) {
	case 0:
		return "", false, nil
	case 1:
		return vs[0], true, nil
	}
	return "", false, badHeader("%s must be given once", name)
}

// parseIncarnation reads the Stream-Incarnation precondition (0 = absent).
func parseIncarnation(r *http.Request) (uint64, *streamcore.Error) {
	v, ok, e := single(r, streamcore.HdrIncarnation)
	if e != nil || !ok {
		return 0, e
	}
	n, err := strconv.ParseUint(v, 10, 64)
	if err != nil || n < 1<<52 || n >= 1<<53 || strconv.FormatUint(n, 10) != v {
		return 0, badHeader("Stream-Incarnation is not a token this server issues")
	}
	return n, nil
}

// NewIncarnation draws a fresh incarnation token in [2^52, 2^53).
func NewIncarnation() uint64 {
	var b [8]byte
	rand.Read(b[:])
	return 1<<52 | binary.LittleEndian.Uint64(b[:])&(1<<52-1)
}

// parseSafeInt parses a canonical non-negative decimal integer <= 2^53-1.
func parseSafeInt(v string) (uint64, bool) {
	if v == "" || len(v) > 16 || (len(v) > 1 && v[0] == '0') {
		return 0, false
	}
	for i := 0; i < len(v); i++ {
		if v[i] < '0' || v[i] > '9' {
			return 0, false
		}
	}
	n, err := strconv.ParseUint(v, 10, 64)
	if err != nil || n > streamcore.MaxSafeInteger {
		return 0, false
	}
	return n, true
}

func badProducer(format string, args ...any) *streamcore.Error {
	return streamcore.Errorf(http.StatusBadRequest, streamcore.CodeInvalidProducer, format, args...)
}

// parseProducer reads Producer-Id/Epoch/Seq: all three or none.
func parseProducer(r *http.Request) (*streamcore.ProducerHeaders, *streamcore.Error) {
	id, hasID, e1 := single(r, streamcore.HdrProducerID)
	ep, hasEp, e2 := single(r, streamcore.HdrProducerEpoch)
	sq, hasSq, e3 := single(r, streamcore.HdrProducerSeq)
	for _, e := range []*streamcore.Error{e1, e2, e3} {
		if e != nil {
			return nil, badProducer("%s", e.Message)
		}
	}
	if !hasID && !hasEp && !hasSq {
		return nil, nil
	}
	if !hasID || !hasEp || !hasSq {
		return nil, badProducer("Producer-Id, Producer-Epoch and Producer-Seq must be sent together")
	}
	if id == "" || len(id) > streamcore.MaxProducerID {
		return nil, badProducer("Producer-Id must be 1 to %d bytes", streamcore.MaxProducerID)
	}
	epoch, ok := parseSafeInt(ep)
	if !ok {
		return nil, badProducer("Producer-Epoch must be a non-negative integer up to 2^53-1")
	}
	seq, ok := parseSafeInt(sq)
	if !ok {
		return nil, badProducer("Producer-Seq must be a non-negative integer up to 2^53-1")
	}
	ph := &streamcore.ProducerHeaders{ID: id, Epoch: epoch, Seq: seq}
	d, hasD, e := single(r, streamcore.HdrProducerDigest)
	if e != nil {
		return nil, e
	}
	if hasD {
		if !isLowerHex(d, 64) {
			return nil, badHeader("Producer-Digest must be 64 lowercase hex digits (BLAKE3-256 of the body)")
		}
		ph.Digest = d
	}
	return ph, nil
}

func isLowerHex(s string, n int) bool {
	if len(s) != n {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return false
		}
	}
	return true
}

// parseStreamSeq filters Stream-Seq: over 256 bytes is refused, non-printable ignored.
func parseStreamSeq(r *http.Request) (string, *streamcore.Error) {
	v, ok, e := single(r, streamcore.HdrStreamSeq)
	if e != nil || !ok {
		return "", e
	}
	if len(v) > streamcore.MaxStreamSeqBytes {
		return "", badHeader("Stream-Seq must be at most %d bytes", streamcore.MaxStreamSeqBytes)
	}
	for i := 0; i < len(v); i++ {
		if v[i] < 0x20 || v[i] > 0x7e {
			return "", nil
		}
	}
	return v, nil
}

// closedFlag reads Stream-Closed: only "true" (any case) counts.
func closedFlag(r *http.Request) bool {
	return strings.EqualFold(strings.TrimSpace(r.Header.Get(streamcore.HdrStreamClosed)), "true")
}

// parseTTL reads Stream-TTL (-1 = absent).
func parseTTL(r *http.Request) (int64, *streamcore.Error) {
	v, ok, e := single(r, streamcore.HdrStreamTTL)
	if e != nil || !ok {
		return -1, e
	}
	n, good := parseSafeInt(v)
	if !good {
		return -1, badHeader("Stream-TTL must be a non-negative integer number of seconds without sign or leading zeros")
	}
	return int64(n), nil
}

// parseExpiresAt reads Stream-Expires-At (RFC 3339).
func parseExpiresAt(r *http.Request) (string, int64, *streamcore.Error) {
	v, ok, e := single(r, streamcore.HdrStreamExpiresAt)
	if e != nil || !ok {
		return "", 0, e
	}
	t, err := time.Parse(time.RFC3339Nano, strings.TrimSpace(v))
	if err != nil {
		return "", 0, badHeader("Stream-Expires-At must be an RFC 3339 timestamp")
	}
	ms := t.UnixMilli()
	if ms <= 0 {
		ms = 1
	}
	return v, ms, nil
}

// contentOf prepares a write body for a stream of the request's content type: the stored
// form and the content fault (if any) for the state machine to report in order.
func contentOf(r *http.Request, body []byte, create bool) (ct string, stored []byte, msgs int, fault *streamcore.Error, hdrErr *streamcore.Error) {
	raw := r.Header.Get("Content-Type")
	if raw != "" {
		n, ok := streamcore.NormalizeContentType(raw)
		if !ok {
			return "", nil, 0, nil, badHeader("Content-Type is not a valid media type")
		}
		ct = n
	}
	if len(body) == 0 {
		if !create {
			fault = streamcore.Errorf(http.StatusBadRequest, streamcore.CodeEmptyAppend, "an append needs a body (or Stream-Closed: true to close)")
		}
		return ct, nil, 0, fault, nil
	}
	if ct == "" && !create {
		return ct, nil, 0, streamcore.Errorf(http.StatusBadRequest, streamcore.CodeMissingContentType, "a body needs a Content-Type"), nil
	}
	if streamcore.IsJSON(ct) {
		out, n, e := streamcore.NormalizeJSON(body, create)
		if e != nil {
			return ct, nil, 0, e, nil
		}
		return ct, out, n, nil, nil
	}
	return ct, body, 0, nil, nil
}
