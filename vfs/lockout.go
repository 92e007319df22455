package vfs

import (
	"fmt"
	"os"
	"sync"

	"github.com/ursula-go/ursula/replicator"
)

// failedAttaches are the files whose last attach in this process failed after it may
// have changed local files (discarded them, folded their WAL, replayed pages into them):
// such a file is not what any stream state says, so the ursula VFS refuses to open it
// until an attach succeeds. Refusals that change nothing (refusalChangesNothing) leave
// the file openable.
var failedAttaches = struct {
	sync.Mutex
	why map[string]string // by absolute path: the failed attach's error
}{why: map[string]string{}}

// refusalChangesNothing: attach refusals decided before any local file is touched.
func refusalChangesNothing(k replicator.Kind) bool {
	switch k {
	case replicator.KindInvalidURL, replicator.KindInUse, replicator.KindUnreplicated,
		replicator.KindOtherStream, replicator.KindNotFound, replicator.KindInvalidArg:
		return true
	}
	return false
}

// noteAttach records how an attach of path ended: a failure that may have changed local
// files locks the file out; a success lifts the lockout.
func noteAttach(path string, err error) {
	failedAttaches.Lock()
	defer failedAttaches.Unlock()
	if err == nil {
		delete(failedAttaches.why, path)
		return
	}
	if e, ok := replicator.AsError(err); ok && refusalChangesNothing(e.Kind) {
		return
	}
	failedAttaches.why[path] = err.Error()
}

// attachFailed is why path is locked out ("" when it is not).
func attachFailed(path string) string {
	failedAttaches.Lock()
	defer failedAttaches.Unlock()
	return failedAttaches.why[path]
}

// lockedOut is the error Status gives for a locked-out file.
func lockedOut(path, why string) error {
	return &Error{Kind: replicator.KindAttachFailed, Action: replicator.ActionFix,
		Message: fmt.Sprintf("%s is not attached: its last attach failed (%s)", path, why)}
}

// logOpenRefused writes the open_refused event of a locked-out file.
func logOpenRefused(path, why string) {
	fmt.Fprintf(os.Stderr, "sqlite-ursula-vfs level=warn event=open_refused file=%q reason=%q\n", path, "its last attach failed: "+why)
}
