package server

// Guards of the operational routes (/__ursula/...): they carry no CORS grant, their
// mutations need a request a browser cannot send cross-site without a preflight (which
// they never grant), and cold flushes are rate-limited per stream.

import (
	"mime"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/ursula-go/ursula/streamcore"
)

// HdrAdmin marks an admin mutation as sent on purpose by an operator's tool. Any custom
// header makes a cross-site browser request need a preflight, which admin routes refuse.
const HdrAdmin = "X-Ursula-Admin"

// CodeAdminRequestNotExplicit refuses an admin mutation that a web page could have sent.
const CodeAdminRequestNotExplicit = "ADMIN_REQUEST_NOT_EXPLICIT"

// CodeFlushRateLimited refuses a cold flush of a stream flushed less than a second ago.
const CodeFlushRateLimited = "FLUSH_RATE_LIMITED"

// isOpsPath reports the operational paths (/__ursula/...): none of them grants CORS.
func isOpsPath(p string) bool {
	return p == "/__ursula" || strings.HasPrefix(p, "/__ursula/")
}

// explicitAdmin reports whether an admin mutation is a non-simple request: it carries
// X-Ursula-Admin, X-Ursula-Process-Incarnation or a JSON Content-Type. Answers the refusal
// itself otherwise.
func (s *Server) explicitAdmin(w http.ResponseWriter, r *http.Request) bool {
	if r.Header.Get(HdrAdmin) != "" || r.Header.Get(HdrProcessIncarnation) != "" {
		return true
	}
	if mt, _, err := mime.ParseMediaType(r.Header.Get("Content-Type")); err == nil && mt == "application/json" {
		return true
	}
	drainBody(r)
	s.writeError(w, r, streamcore.Errorf(http.StatusForbidden, CodeAdminRequestNotExplicit,
		"admin mutations need the header %s: 1 (or Content-Type: application/json)", HdrAdmin))
	return false
}

// flushInterval is the least time between two cold flushes of one stream on request.
const flushInterval = time.Second

// flushLimiter remembers when each stream was last flushed on request.
type flushLimiter struct {
	mu   sync.Mutex
	last map[string]time.Time
}

// allow reports whether key may be flushed now and, if not, how long until it may.
func (f *flushLimiter) allow(key string, now time.Time) (bool, time.Duration) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.last == nil {
		f.last = map[string]time.Time{}
	}
	if t, ok := f.last[key]; ok && now.Sub(t) < flushInterval {
		return false, flushInterval - now.Sub(t)
	}
	// Forget streams flushed long ago, so the map stays as small as the recent flushes.
	if len(f.last) > 1024 {
		for k, t := range f.last {
			if now.Sub(t) >= flushInterval {
				delete(f.last, k)
			}
		}
	}
	f.last[key] = now
	return true, 0
}
