package server

import (
	"net/http"
	"time"

	"github.com/ursula-go/ursula/streamcore"
)

// ErrBodyTooSlow is what a paced body's read returns once its sender fell behind.
var ErrBodyTooSlow = errBodyTooSlow

// PaceBody returns a shallow copy of r whose body must keep the node's pace: each read
// brings bytes within idle, and after the first idle period the body averages at least
// minRate bytes a second (0: only the gap is checked). A read that falls behind fails
// with ErrBodyTooSlow. For other handlers on a real connection (the gateway); the
// server's own request keeps its body, as paceRequest explains.
func PaceBody(w http.ResponseWriter, r *http.Request, idle time.Duration, minRate int64) *http.Request {
	if r.Body == nil || r.Body == http.NoBody || r.ContentLength == 0 {
		return r
	}
	paced := *r
	paced.Body = &pacedBody{body: r.Body, rc: http.NewResponseController(w), start: time.Now(), idle: idle, minRate: minRate}
	return &paced
}

// BodyTooSlow is the 408 BODY_TOO_SLOW refusal of a body that fell behind its pace.
func BodyTooSlow() *streamcore.Error { return bodyTooSlow() }
