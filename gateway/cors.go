package gateway

// CORS answers of the gateway's own, with a node's rules (see server/guard.go): the
// configured origins, no credentials, no grant on operational routes, and one preflight
// answer for every path.

import (
	"net/http"
	"slices"
	"strings"

	"github.com/ursula-go/ursula/streamcore"
)

// corsOrigin is the Access-Control-Allow-Origin answer for origin, or "" for none.
func (g *Gateway) corsOrigin(origin string) string {
	allowed := g.settings.Load().cors
	if allowed == nil {
		if g.cfg.Auth == nil {
			return "*"
		}
		return ""
	}
	if slices.Contains(allowed, "*") {
		return "*"
	}
	if origin != "" && slices.Contains(allowed, origin) {
		return origin
	}
	return ""
}

// cors sets the CORS grant for r on h (none on operational routes).
func (g *Gateway) cors(h http.Header, r *http.Request) {
	p := r.URL.Path
	if p == "/metrics" || p == "/__ursula" || strings.HasPrefix(p, "/__ursula/") {
		return
	}
	o := g.corsOrigin(r.Header.Get("Origin"))
	if o == "" {
		return
	}
	h.Set("Access-Control-Allow-Origin", o)
	h.Set("Access-Control-Expose-Headers", "*")
	if o != "*" {
		h.Add("Vary", "Origin")
	}
}

// preflight answers OPTIONS the same for every path, before and without authorization.
func (g *Gateway) preflight(w http.ResponseWriter, r *http.Request) {
	h := w.Header()
	h.Set("Access-Control-Allow-Methods", "GET, HEAD, POST, PUT, DELETE, OPTIONS")
	if req := r.Header.Get("Access-Control-Request-Headers"); req != "" {
		h.Set("Access-Control-Allow-Headers", req)
	} else {
		h.Set("Access-Control-Allow-Headers", "*")
	}
	h.Set("Access-Control-Max-Age", "86400")
	h.Set(streamcore.HdrNotAppliedChecked, "1")
	w.WriteHeader(http.StatusNoContent)
}
