package streamcore

import (
	"encoding/json"
	"fmt"
	"net/http"
)

// Error is a protocol refusal: an HTTP status, an UPPER_SNAKE code, a message that never
// echoes request bodies or credentials, and the extra headers the answer must carry.
type Error struct {
	Status  int
	Code    string
	Message string
	Headers map[string]string
}

func (e *Error) Error() string { return fmt.Sprintf("%d %s: %s", e.Status, e.Code, e.Message) }

// With returns e with one more header set.
func (e *Error) With(name, value string) *Error {
	if e.Headers == nil {
		e.Headers = map[string]string{}
	}
	e.Headers[name] = value
	return e
}

// Errorf builds an Error.
func Errorf(status int, code, format string, args ...any) *Error {
	return &Error{Status: status, Code: code, Message: fmt.Sprintf(format, args...)}
}

// Body is the JSON error body {"error":{"code","message"}}.
func (e *Error) Body() []byte {
	b, _ := json.Marshal(ErrorBody{Error: ErrorDetail{Code: e.Code, Message: e.Message}})
	return b
}

// ErrorBody is the wire shape of every 4xx/5xx body.
type ErrorBody struct {
	Error ErrorDetail `json:"error"`
}

// ErrorDetail is the inner object of an ErrorBody.
type ErrorDetail struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

// ParseErrorBody decodes an error body; ok is false when b is not one.
func ParseErrorBody(b []byte) (ErrorDetail, bool) {
	var eb ErrorBody
	if err := json.Unmarshal(b, &eb); err != nil || eb.Error.Code == "" {
		return ErrorDetail{}, false
	}
	return eb.Error, true
}

// Error codes (checklist-protocol.md section 29).
const (
	CodeInvalidRequest         = "INVALID_REQUEST"
	CodeInvalidHeader          = "INVALID_HEADER"
	CodeInvalidQuery           = "INVALID_QUERY"
	CodeInvalidOffset          = "INVALID_OFFSET"
	CodeQueryNotAccepted       = "QUERY_NOT_ACCEPTED"
	CodeInvalidResource        = "INVALID_RESOURCE"
	CodeInvalidBucketID        = "INVALID_BUCKET_ID"
	CodeInvalidStreamID        = "INVALID_STREAM_ID"
	CodeInvalidProducer        = "INVALID_PRODUCER"
	CodeDigestMismatch         = "PRODUCER_DIGEST_MISMATCH"
	CodeMissingContentType     = "MISSING_CONTENT_TYPE"
	CodeEmptyAppend            = "EMPTY_APPEND"
	CodeInvalidRecords         = "INVALID_RECORD_BOUNDARIES"
	CodeNotJSONBoundary        = "NOT_JSON_BOUNDARY"
	CodeInvalidRetention       = "INVALID_RETENTION"
	CodeInvalidSnapshot        = "INVALID_SNAPSHOT"
	CodeInvalidPartsCommit     = "INVALID_PARTS_COMMIT"
	CodeUnknownPart            = "UNKNOWN_PART"
	CodeSnapshotDigest         = "SNAPSHOT_DIGEST_MISMATCH"
	CodeSnapshotTooLarge       = "SNAPSHOT_TOO_LARGE"
	CodeStagedPartsLimit       = "STAGED_PARTS_LIMIT"
	CodeCommitInProgress       = "SNAPSHOT_COMMIT_IN_PROGRESS"
	CodeCommitsBusy            = "SNAPSHOT_COMMITS_BUSY"
	CodeUnsupported            = "UNSUPPORTED"
	CodeEpochClosed            = "PRODUCER_EPOCH_CLOSED"
	CodeEpochStale             = "PRODUCER_EPOCH_STALE"
	CodeProducerExpired        = "PRODUCER_EXPIRED"
	CodeKeyConflict            = "PRODUCER_KEY_CONFLICT"
	CodeStreamNotFound         = "STREAM_NOT_FOUND"
	CodeBucketNotFound         = "BUCKET_NOT_FOUND"
	CodeBucketErased           = "BUCKET_ERASED"
	CodeSnapshotNotFound       = "SNAPSHOT_NOT_FOUND"
	CodeNotFound               = "NOT_FOUND"
	CodeMethodNotAllowed       = "METHOD_NOT_ALLOWED"
	CodeStreamClosed           = "STREAM_CLOSED"
	CodeStreamSeqConflict      = "STREAM_SEQ_CONFLICT"
	CodeContentTypeMismatch    = "CONTENT_TYPE_MISMATCH"
	CodeAlreadyExists          = "STREAM_ALREADY_EXISTS_CONFLICT"
	CodeProducerSeqConflict    = "PRODUCER_SEQ_CONFLICT"
	CodeSnapshotConflict       = "SNAPSHOT_CONFLICT"
	CodeStreamGone             = "STREAM_GONE"
	CodeIncarnationMismatch    = "INCARNATION_MISMATCH"
	CodeRequestTooLarge        = "REQUEST_TOO_LARGE"
	CodeOffsetOutOfRange       = "OFFSET_OUT_OF_RANGE"
	CodeRangeNotSatisfiable    = "RANGE_NOT_SATISFIABLE"
	CodeProducerLimit          = "PRODUCER_LIMIT"
	CodeInternal               = "INTERNAL"
	CodeNoColdStore            = "NO_COLD_STORE"
	CodeLiveReadBackpressure   = "LIVE_READ_BACKPRESSURE"
	CodeOutcomeUnknown         = "OUTCOME_UNKNOWN"
	CodeBodyTooSlow            = "BODY_TOO_SLOW"
	CodeBodyUnreadable         = "BODY_UNREADABLE"
	CodeNoLeader               = "NO_LEADER"
	CodeJSONBoundaryUnverified = "JSON_BOUNDARY_UNVERIFIED"
)

// Common refusals.
func errBadRequest(code, format string, args ...any) *Error {
	return Errorf(http.StatusBadRequest, code, format, args...)
}
