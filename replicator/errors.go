package replicator

import (
	"errors"
	"fmt"
)

// Kind names why a replicated operation failed.
type Kind string

const (
	KindNotApplied   Kind = "not_applied"       // the server refused; nothing was written
	KindTooLarge     Kind = "too_large"         // the commit frame is over URSULA_VFS_MAX_FRAME_BYTES
	KindFenced       Kind = "fenced"            // a newer owner claimed the stream
	KindNotFound     Kind = "not_found"         // the stream does not exist (and the local file is not empty)
	KindInUse        Kind = "in_use"            // another process holds the local file
	KindUnreplicated Kind = "unreplicated_file" // the local file has data that did not come from a stream
	KindOtherStream  Kind = "other_stream"      // the local file belongs to another stream
	KindInvalidURL   Kind = "invalid_url"       // the stream URL cannot name a stream
	KindDamaged      Kind = "damaged"           // the stream holds a record this version cannot read
	KindUnavailable  Kind = "unavailable"       // the server could not be reached or answered 5xx
	KindUnsupported  Kind = "unsupported"       // page size, journal mode or stream format the replicator does not support
	KindLocalSetup   Kind = "local_setup"       // a local file could not be read or written
	KindInvalidArg   Kind = "invalid_argument"  // a path that cannot be a database file

	// Poison kinds: the file no longer takes commits until it is attached again.
	KindOutcomeUnknown Kind = "outcome_unknown" // a commit may or may not have been applied
	KindLocalDamage    Kind = "local_damage"    // the local file lost a write the stream has
	KindLocalState     Kind = "local_state"     // the stream holds a commit the local file was told failed

	// Refused-commit kinds (action retry): the commit failed alone, nothing was written.
	KindPaymentRequired Kind = "payment_required" // 402
	KindUnauthorized    Kind = "unauthorized"     // 401, still refused after re-reading the token
	KindForbidden       Kind = "forbidden"        // 403 with both not-applied headers
	KindRateLimited     Kind = "rate_limited"     // 429
	KindUnreachable     Kind = "unreachable"      // the last attempt never went out
	// KindRefusedUnchecked: an earlier commit was refused without proof that nothing of it
	// was applied, and the stream could not be read to check; commits wait for the check.
	KindRefusedUnchecked Kind = "refused_commit_unchecked"
	// KindAttachFailed: the file's last attach in this process failed after it may have
	// changed local files; it does not open until an attach succeeds.
	KindAttachFailed Kind = "attach_failed"
)

// Action says what the caller should do about an error.
type Action string

const (
	ActionRetry    Action = "retry"    // try the same operation again
	ActionReattach Action = "reattach" // close and open the database again
	ActionStop     Action = "stop"     // another owner has it: stop writing
	ActionFix      Action = "fix"      // change the input or configuration
)

// Error is a typed failure of the replicator; errors.As finds it in wrapped errors.
type Error struct {
	Kind    Kind
	Action  Action
	Message string
	Err     error
}

func (e *Error) Error() string {
	if e.Err != nil {
		return fmt.Sprintf("ursula %s (%s): %s: %v", e.Kind, e.Action, e.Message, e.Err)
	}
	return fmt.Sprintf("ursula %s (%s): %s", e.Kind, e.Action, e.Message)
}

func (e *Error) Unwrap() error { return e.Err }

func newError(kind Kind, action Action, err error, format string, args ...any) *Error {
	return &Error{Kind: kind, Action: action, Message: fmt.Sprintf(format, args...), Err: err}
}

// AsError returns the *Error in err's chain, if any.
func AsError(err error) (*Error, bool) {
	var e *Error
	ok := errors.As(err, &e)
	return e, ok
}
