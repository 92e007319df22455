package replicator

import (
	"context"
	"errors"
	"net/http"
	"time"

	"github.com/ursula-go/ursula/client"
)

// attachRetry runs one read step of an attach (the HEAD, the rebuild) and runs it again
// while it fails with an answer that says "later" (a 5xx, 429 or 307: the stream is
// there but cannot serve now) and the retry budget lasts, logging each retry as
// attach_retrying. A refused connection or any other answer fails at once: an
// unreachable endpoint is reported without a wait. Only steps that write nothing to the
// stream go through here; the claim is never repeated.
func (r *Replica) attachRetry(ctx context.Context, step string, fn func() error) error {
	deadline := time.Now().Add(r.opts.RetryBudget)
	wait := 100 * time.Millisecond
	for attempt := 1; ; attempt++ {
		err := fn()
		if err == nil || !retryableAttachError(err) || time.Now().Add(wait).After(deadline) {
			return err
		}
		var ce *client.Error
		if errors.As(err, &ce) && ce.RetryAfter > 0 {
			wait = max(wait, ce.RetryAfter)
		}
		r.logf("attach_retrying", "step=%q attempt=%d wait_ms=%d reason=%q", step, attempt, wait.Milliseconds(), err.Error())
		select {
		case <-ctx.Done():
			return err
		case <-time.After(wait):
		}
		wait = min(2*wait, 2*time.Second)
	}
}

func retryableAttachError(err error) bool {
	var ce *client.Error
	if !errors.As(err, &ce) {
		return false
	}
	return ce.Status >= 500 || ce.Status == http.StatusTooManyRequests || ce.Status == http.StatusTemporaryRedirect
}
