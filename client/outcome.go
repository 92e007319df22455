package client

import (
	"net/http"
	"strings"

	"github.com/ursula-go/ursula/streamcore"
)

// Outcome is what an answer to a write proves about that write (checklist-protocol 28).
// The zero value is Unknown, so an answer nobody classified is never
// mistaken for a refusal.
type Outcome int

const (
	// Unknown: the write may have applied, may not have, or may still apply. The client
	// repeats it with the same key, body and Producer-Digest (§5.6).
	Unknown Outcome = iota
	// Applied: a 2xx carrying the typed answer of its write (a producer repeat included).
	Applied
	// NotApplied: this request applied nothing of the write and never will: a refusal, a
	// redirect that proves the target applied nothing, or a request that never went out.
	NotApplied
)

func (o Outcome) String() string {
	switch o {
	case Applied:
		return "applied"
	case NotApplied:
		return "not-applied"
	}
	return "unknown"
}

// WriteKind names the kind of a write; it decides which typed answer proves a 2xx (§11.1).
type WriteKind int

const (
	WriteAppend          WriteKind = iota + 1 // append or close without producer headers
	WriteProducer                             // append or close with producer headers
	WriteCreate                               // PUT of a stream
	WritePublishSnapshot                      // snapshot publish or parts commit
	WriteStagePart                            // POST .../snapshot/{offset}/parts
	WriteDiscardParts                         // DELETE .../snapshot/parts
	WriteRetain                               // PUT .../retention/{offset}
	WriteDelete                               // DELETE of a stream
	WriteCreateBucket                         // PUT of a bucket
)

func (k WriteKind) String() string {
	switch k {
	case WriteAppend:
		return "append"
	case WriteProducer:
		return "producer append"
	case WriteCreate:
		return "create"
	case WritePublishSnapshot:
		return "snapshot publish"
	case WriteStagePart:
		return "snapshot part"
	case WriteDiscardParts:
		return "discard parts"
	case WriteRetain:
		return "retention"
	case WriteDelete:
		return "delete"
	case WriteCreateBucket:
		return "bucket create"
	}
	return "write"
}

// notAppliedCodes are the error codes that prove a 408 or 5xx applied nothing
// (checklist-protocol 28.6, the codes that prove a refusal), intermediary codes included.
// Every other 408/5xx code, and a code the client does not know, leaves the outcome unknown.
var notAppliedCodes = map[string]bool{
	"BODY_TOO_SLOW":                    true, // 408, intermediary cut the body before forwarding
	"NO_COLD_STORE":                    true, // 501
	"NO_LEADER":                        true, // 503 routing / leadership check before proposal
	"WAL_DISK_PRESSURE":                true, // 503 admission
	"RAFT_LOG_PRESSURE":                true,
	"INGRESS_BODY_BYTES_LIMIT_REACHED": true,
	"COLD_BACKPRESSURE":                true,
	"RAFT_UNCOMMITTED_BACKPRESSURE":    true,
	"APPLY_STOPPED":                    true,
	"GROUP_RESTARTING":                 true,
	"HISTORY_PENDING":                  true,
	"JSON_BOUNDARY_UNVERIFIED":         true,
	"SNAPSHOT_COMMITS_BUSY":            true,
	"AUTHENTICATION_UNAVAILABLE":       true, // intermediary that forwarded nothing
	"AUTHORIZATION_UNAVAILABLE":        true,
	"NO_UPSTREAM":                      true,
	"UPSTREAM_UNREACHABLE":             true,
	"UPLOAD_BUDGET_EXHAUSTED":          true,
}

// CodeProvesNotApplied reports whether an error code on a 408 or 5xx proves that the write
// applied nothing (checklist-protocol 28). The proof is the code, never the status.
func CodeProvesNotApplied(code string) bool { return notAppliedCodes[code] }

// WriteAnswer is one HTTP answer to a write, as the classifier needs it.
type WriteAnswer struct {
	Kind     WriteKind
	Status   int
	Header   http.Header
	Code     string // code of the JSON error body; "" when there is none
	BodySent bool   // some byte of the request body went out before the answer came
}

// OutcomePolicy holds the two choices the rules leave to a client.
type OutcomePolicy struct {
	// RequireVouch trusts the x-ursula-not-applied marker only together with the gateway's
	// x-ursula-not-applied-checked vouch (the rule of the 0.7.3+ SQLite extension for
	// clients behind gateways). False: a marker alone proves the refusal, right for a client
	// that talks to the nodes directly (they set the marker only before proposing).
	RequireVouch bool
	// LenientSuccess counts a 2xx without the typed answer of its write as applied. The
	// extension spec calls such an answer unknown (it may come from a misrouting proxy);
	// set this only against servers that implement the base protocol alone.
	LenientSuccess bool
}

// Classify decides the outcome of one answer to a write:
//
//	2xx with its typed answer (or any 2xx of a delete / bucket create) -> Applied
//	2xx without it                                        -> Unknown (Applied if LenientSuccess)
//	307/308 marked x-ursula-not-applied, or before any body byte went out -> NotApplied
//	307/308 after body bytes went out                     -> Unknown (servers never redirect then)
//	4xx/5xx with x-ursula-not-applied (+ vouch if RequireVouch) -> NotApplied
//	4xx other than 408                                    -> NotApplied
//	408/5xx whose code proves it (CodeProvesNotApplied)   -> NotApplied
//	any other 408/5xx, 1xx, 3xx                           -> Unknown
func (p OutcomePolicy) Classify(a WriteAnswer) Outcome {
	s := a.Status
	switch {
	case s >= 200 && s < 300:
		if p.LenientSuccess || HasTypedAnswer(a.Kind, s, a.Header) {
			return Applied
		}
		return Unknown
	case s == http.StatusTemporaryRedirect || s == http.StatusPermanentRedirect:
		if a.Header.Get(streamcore.HdrNotApplied) != "" || !a.BodySent {
			return NotApplied
		}
		return Unknown
	}
	if s >= 400 && p.markerTrusted(a.Header) {
		return NotApplied
	}
	switch {
	case s >= 400 && s < 500 && s != http.StatusRequestTimeout:
		return NotApplied
	case s == http.StatusRequestTimeout || s >= 500:
		if notAppliedCodes[a.Code] {
			return NotApplied
		}
	}
	return Unknown
}

func (p OutcomePolicy) markerTrusted(h http.Header) bool {
	if h.Get(streamcore.HdrNotApplied) == "" {
		return false
	}
	return !p.RequireVouch || h.Get(streamcore.HdrNotAppliedChecked) != ""
}

// ClassifyUnanswered decides the outcome of a write that got no HTTP answer: a request of
// which nothing went out (dial, DNS or TLS failure, cancelled before sending) applied
// nothing; once any of it was written, a timeout or a reset leaves it unknown.
func ClassifyUnanswered(sent bool) Outcome {
	if sent {
		return Unknown
	}
	return NotApplied
}

// HasTypedAnswer reports whether a 2xx carries the answer the server always sends for its
// kind of write (checklist-protocol 10.33): the receipt of a producer write (or a 204
// receipt-evicted), Stream-Next-Offset of another append or close, Stream-Incarnation of a
// create or a discard, the snapshot headers of a publish, Stream-Snapshot-Part of a part,
// Stream-Retained-Offset + Stream-Incarnation of a retention advance. A delete or a bucket
// create carries none, so its status alone proves it.
func HasTypedAnswer(kind WriteKind, status int, h http.Header) bool {
	has := func(name string) bool { return h.Get(name) != "" }
	switch kind {
	case WriteProducer:
		if has(streamcore.HdrStreamOffset) && has(streamcore.HdrStreamNextOff) {
			return true
		}
		return status == http.StatusNoContent && OutcomeToken(h.Get(streamcore.HdrProducerOutcome)) == "receipt-evicted"
	case WriteAppend:
		return has(streamcore.HdrStreamNextOff)
	case WriteCreate, WriteDiscardParts:
		return has(streamcore.HdrIncarnation)
	case WritePublishSnapshot:
		return has(streamcore.HdrSnapshotOffset) && has(streamcore.HdrSnapshotDigest)
	case WriteStagePart:
		return has(streamcore.HdrSnapshotPart)
	case WriteRetain:
		return has(streamcore.HdrRetainedOffset) && has(streamcore.HdrIncarnation)
	case WriteDelete, WriteCreateBucket:
		return true
	}
	return false
}

// OutcomeToken returns the token of a Producer-Outcome structured field without its
// parameters: "epoch-closed;by=claim" -> "epoch-closed".
func OutcomeToken(v string) string {
	if i := strings.IndexByte(v, ';'); i >= 0 {
		v = v[:i]
	}
	return strings.TrimSpace(v)
}
