package sqlitewal

import (
	"errors"
	"fmt"
	"testing"

	"github.com/ursula-go/ursula/replicator"
)

// TestResultCode: a refused, too large or fenced commit is SQLITE_IOERR_AUTH (SQLite rolls
// back and the file stays usable), the WAL read-back and write failures keep their own
// codes, and anything else is an I/O write error.
func TestResultCode(t *testing.T) {
	refused := &replicator.Error{Kind: replicator.KindNotApplied, Action: replicator.ActionRetry}
	for _, c := range []struct {
		name string
		err  error
		want int
	}{
		{"refused, retry", refused, CodeIOErrAuth},
		{"wrapped refusal", fmt.Errorf("commit: %w", refused), CodeIOErrAuth},
		{"too large", &replicator.Error{Kind: replicator.KindTooLarge, Action: replicator.ActionFix}, CodeIOErrAuth},
		{"fenced", &replicator.Error{Kind: replicator.KindFenced, Action: replicator.ActionStop}, CodeIOErrAuth},
		{"outcome unknown", &replicator.Error{Kind: replicator.KindOutcomeUnknown, Action: replicator.ActionReattach}, CodeIOErrWrite},
		{"WAL read-back", errIORead, CodeIOErrRead},
		{"WAL write", errIOWrite, CodeIOErrWrite},
		{"other", errors.New("disk on fire"), CodeIOErrWrite},
	} {
		if got := ResultCode(c.err); got != c.want {
			t.Errorf("%s: ResultCode = %d, want %d", c.name, got, c.want)
		}
	}
}
