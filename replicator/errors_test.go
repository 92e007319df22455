package replicator

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
)

// TestAttachNamesTheServersErrorCode: an attach the server refuses reports the server's
// JSON error code and message, also when the refused request was a HEAD (whose answer
// carries no body).
func TestAttachNamesTheServersErrorCode(t *testing.T) {
	base := snapServer(t, nil)
	_, err := Attach(context.Background(), base+"/dbs/x", filepath.Join(t.TempDir(), "a.db"), Options{Log: &logBuf{}})
	e, ok := AsError(err)
	if !ok || e.Kind != KindInvalidURL || e.Action != ActionFix {
		t.Fatalf("attach with a 3-character bucket id: %v", err)
	}
	t.Log(err)
	for _, want := range []string{"INVALID_BUCKET_ID", "bucket id must be 4 to 64 characters"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("the error %q does not name %q", err.Error(), want)
		}
	}
}
