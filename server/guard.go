package server

// The authentication hook: with an auth.Authorizer configured, every request except
// preflight and readiness is authenticated and authorized before it reaches its
// resource, and the CORS answer follows the configured origins.

import (
	"net/http"
	"slices"

	"github.com/ursula-go/ursula/auth"
	"github.com/ursula-go/ursula/streamcore"
)

// CodeUnauthorized is the error code of a 401: no credential, or one that is not valid.
const CodeUnauthorized = "UNAUTHORIZED"

// actionOf is what the request method does to a stream resource.
func actionOf(r *http.Request) auth.Action {
	if r.Method == http.MethodGet || r.Method == http.MethodHead {
		return auth.Read
	}
	return auth.Write
}

// guard authenticates r and decides whether it may do act on bucket ("" for the
// operational routes). It answers a refusal itself and returns nil; otherwise it returns
// the request to serve, carrying the principal (auth.FromContext). Without an authorizer
// every request passes unchanged.
func (s *Server) guard(w http.ResponseWriter, r *http.Request, bucket string, act auth.Action) *http.Request {
	a := s.cfg.Auth
	if a == nil {
		return r
	}
	p, err := a.Authenticate(r.Header.Get("Authorization"))
	if err != nil {
		w.Header().Set("WWW-Authenticate", `Bearer error="invalid_token"`)
		s.writeError(w, r, streamcore.Errorf(http.StatusUnauthorized, CodeUnauthorized, "the bearer token is not valid"))
		return nil
	}
	switch a.Decide(p, bucket, act) {
	case auth.Allow:
		if p == nil {
			return r
		}
		return r.WithContext(auth.NewContext(r.Context(), p))
	case auth.Unauthenticated:
		w.Header().Set("WWW-Authenticate", "Bearer")
		s.writeError(w, r, streamcore.Errorf(http.StatusUnauthorized, CodeUnauthorized, "this request needs a bearer token"))
		return nil
	}
	// Conceal: the answer of a missing resource, the same whether the bucket exists or not.
	if act == auth.Admin {
		s.writeError(w, r, streamcore.Errorf(http.StatusNotFound, streamcore.CodeNotFound, "no such operational endpoint"))
	} else {
		s.writeError(w, r, streamcore.Errorf(http.StatusNotFound, streamcore.CodeBucketNotFound, "bucket does not exist"))
	}
	return nil
}

// corsOrigin is the Access-Control-Allow-Origin answer for a request from origin, or ""
// for none. With no configured origins a node without auth allows every origin (a bare
// node is open anyway) and a node with auth allows none; configured origins are matched
// exactly, "*" among them allowing all. Credentials are never allowed, so "*" grants no
// ambient access: a page still has to present its own bearer token.
func (s *Server) corsOrigin(origin string) string {
	allowed := s.cfg.CORSAllowedOrigins
	if allowed == nil {
		if s.cfg.Auth == nil {
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
