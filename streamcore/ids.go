package streamcore

import (
	"strings"
	"unicode/utf8"
)

// ValidateBucketID checks ^[a-z0-9_-]{4,64}$, refusing "snapshots" and ids starting with "__"
// (checklist-protocol 2.1, 2.2).
func ValidateBucketID(b string) *Error {
	if len(b) < 4 || len(b) > 64 {
		return errBadRequest(CodeInvalidBucketID, "bucket id must be 4 to 64 characters of [a-z0-9_-]")
	}
	for i := 0; i < len(b); i++ {
		c := b[i]
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '_' || c == '-') {
			return errBadRequest(CodeInvalidBucketID, "bucket id must be 4 to 64 characters of [a-z0-9_-]")
		}
	}
	if b == "snapshots" || strings.HasPrefix(b, "__") {
		return errBadRequest(CodeInvalidBucketID, "bucket id %q is reserved", b)
	}
	return nil
}

// ValidateStreamID checks a stream id under bucket (checklist-protocol 2.3-2.5).
func ValidateStreamID(bucket, s string) *Error {
	if err := validateStreamName(s, false); err != nil {
		return err
	}
	if len(bucket)+1+len(s) > MaxStreamIDBytes {
		return errBadRequest(CodeInvalidStreamID, "bucket id + '/' + stream id must be at most %d bytes", MaxStreamIDBytes)
	}
	if s == "streams" || strings.HasPrefix(s, "$") {
		return errBadRequest(CodeInvalidStreamID, "stream id %q is reserved", clip(s))
	}
	return nil
}

// ValidateCompatPath checks a stream path of the /v1/stream/ compatibility family, where
// the reference server allows '/' inside names.
func ValidateCompatPath(p string) *Error {
	if err := validateStreamName(p, true); err != nil {
		return err
	}
	for _, seg := range strings.Split(p, "/") {
		if seg == "" {
			return errBadRequest(CodeInvalidStreamID, "stream path has an empty segment")
		}
	}
	return nil
}

func validateStreamName(s string, allowSlash bool) *Error {
	switch {
	case len(s) == 0:
		return errBadRequest(CodeInvalidStreamID, "stream id is empty")
	case len(s) > MaxStreamIDBytes:
		return errBadRequest(CodeInvalidStreamID, "stream id is longer than %d bytes", MaxStreamIDBytes)
	case !utf8.ValidString(s):
		return errBadRequest(CodeInvalidStreamID, "stream id is not valid UTF-8")
	case strings.ContainsRune(s, 0):
		return errBadRequest(CodeInvalidStreamID, "stream id contains NUL")
	case strings.Contains(s, ".."):
		return errBadRequest(CodeInvalidStreamID, "stream id contains '..'")
	case !allowSlash && strings.Contains(s, "/"):
		return errBadRequest(CodeInvalidStreamID, "stream id contains '/'")
	}
	return nil
}
