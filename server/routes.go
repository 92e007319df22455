package server

// The route table: every path family and method of the protocol, its Ursula extensions
// and the operational endpoints, each handed to the handler of its resource.

import (
	"net/http"
	"net/url"
	"strings"

	"github.com/ursula-go/ursula/auth"
	"github.com/ursula-go/ursula/streamcore"
)

func (s *Server) route(w http.ResponseWriter, r *http.Request) {
	raw := r.URL.EscapedPath()
	if r.Method == http.MethodOptions {
		if isOpsPath(r.URL.Path) {
			// No preflight grant: browsers then never send a cross-site admin mutation.
			w.WriteHeader(http.StatusNoContent)
			return
		}
		s.preflight(w, r)
		return
	}
	// The size of a request is its first check on every route: a declared body over the
	// limit answers 413 before its headers, its path or its stream are looked at, so a
	// client learns the one fault it cannot fix by retrying elsewhere.
	if r.ContentLength > streamcore.MaxRequestBytes {
		s.writeError(w, r, tooLarge(true))
		return
	}
	if raw == "/__ursula/ready" {
		// Readiness stays open: load balancers probe it without credentials.
		s.handleReady(w, r)
		return
	}
	if raw == raftUpgradePath {
		s.handleRaftUpgrade(w, r) // peers prove themselves with mutual TLS, not a token
		return
	}
	if strings.HasPrefix(raw, "/__ursula/") || raw == "/__ursula" || raw == "/metrics" {
		if r = s.guard(w, r, "", auth.Admin); r == nil {
			return
		}
	}
	switch raw {
	case "/__ursula/metrics":
		s.handleMetricsJSON(w, r)
		return
	case "/metrics":
		s.handleMetricsProm(w, r)
		return
	}
	if strings.HasPrefix(raw, backupPrefix) {
		s.handleBackup(w, r, raw)
		return
	}
	if isAdminPath(raw) {
		s.adminOnly(w, r)
		return
	}
	if strings.HasPrefix(raw, "/__ursula/") || raw == "/__ursula" {
		s.writeError(w, r, streamcore.Errorf(http.StatusNotFound, streamcore.CodeNotFound, "no such operational endpoint"))
		return
	}
	if strings.HasPrefix(raw, CompatPrefix) {
		s.routeCompat(w, r, raw[len(CompatPrefix):])
		return
	}
	segs, err := splitPath(raw)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	switch len(segs) {
	case 0:
		s.writeError(w, r, streamcore.Errorf(http.StatusNotFound, streamcore.CodeNotFound, "no route; streams live at /{bucket}/{stream}"))
	case 1:
		s.routeBucket(w, r, segs[0])
	default:
		if e := streamcore.ValidateBucketID(segs[0]); e != nil {
			s.writeError(w, r, e)
			return
		}
		if e := streamcore.ValidateStreamID(segs[0], segs[1]); e != nil {
			s.writeError(w, r, e)
			return
		}
		if r = s.guard(w, r, segs[0], actionOf(r)); r == nil {
			return
		}
		t := &target{bucket: segs[0], stream: segs[1], key: segs[0] + "/" + segs[1], url: raw}
		if e := s.streamRefusal(t.key); e != nil {
			drainBody(r) // its group cannot serve now (admin_lifecycle.go)
			s.writeError(w, r, e)
			return
		}
		s.routeStream(w, r, t, segs[2:])
		if sw, ok := w.(*statusWriter); ok && r.Method == http.MethodGet && sw.status < 300 {
			s.usage.read(t.bucket, sw.sent)
		}
	}
}

// splitPath splits on raw '/' before percent-decoding each segment.
func splitPath(raw string) ([]string, *streamcore.Error) {
	raw = strings.TrimPrefix(raw, "/")
	if raw == "" {
		return nil, nil
	}
	parts := strings.Split(raw, "/")
	for i, p := range parts {
		d, err := url.PathUnescape(p)
		if err != nil {
			return nil, streamcore.Errorf(http.StatusBadRequest, streamcore.CodeInvalidRequest, "path is not valid percent-encoding")
		}
		if strings.Contains(d, "/") {
			return nil, streamcore.Errorf(http.StatusBadRequest, streamcore.CodeInvalidStreamID, "an encoded '/' is not allowed in a path segment")
		}
		parts[i] = d
	}
	return parts, nil
}

func (s *Server) routeBucket(w http.ResponseWriter, r *http.Request, bucket string) {
	if r.Method != http.MethodPut {
		w.Header().Set("Allow", "PUT, OPTIONS")
		s.writeError(w, r, streamcore.Errorf(http.StatusMethodNotAllowed, streamcore.CodeMethodNotAllowed, "a bucket only supports PUT (validate id)"))
		return
	}
	if e := streamcore.ValidateBucketID(bucket); e != nil {
		s.writeError(w, r, e)
		return
	}
	if r = s.guard(w, r, bucket, auth.Write); r == nil {
		return
	}
	if _, e := s.readBody(w, r); e != nil {
		s.writeError(w, r, e) // a body without Content-Length is refused once it crosses the limit
		return
	}
	w.WriteHeader(http.StatusCreated)
}

var removedSubresources = map[string]bool{"attrs": true, "keyed-state": true, "append-batch": true}

func (s *Server) routeStream(w http.ResponseWriter, r *http.Request, t *target, rest []string) {
	m := r.Method
	switch len(rest) {
	case 0:
		switch m {
		case http.MethodPut:
			s.handleCreate(w, r, t)
		case http.MethodPost:
			s.handleAppend(w, r, t)
		case http.MethodGet:
			s.handleRead(w, r, t)
		case http.MethodHead:
			if s.verifyLeader(w, r, t.key) {
				s.handleHead(w, r, t)
			}
		case http.MethodDelete:
			s.handleDelete(w, r, t)
		default:
			s.methodNotAllowed(w, r, "GET, HEAD, PUT, POST, DELETE, OPTIONS")
		}
		return
	case 1:
		switch rest[0] {
		case "bootstrap":
			if m != http.MethodGet {
				s.methodNotAllowed(w, r, "GET, OPTIONS")
				return
			}
			if s.verifyLeader(w, r, t.key) {
				s.handleBootstrap(w, r, t)
			}
			return
		case "snapshot":
			// The removed latest-snapshot path.
			w.Header().Set("Allow", "")
			s.writeError(w, r, streamcore.Errorf(http.StatusMethodNotAllowed, streamcore.CodeUnsupported, "the latest-snapshot path was removed; use HEAD for Stream-Snapshot-Offset, then GET /snapshot/{offset}"))
			return
		}
	case 2:
		switch rest[0] {
		case "snapshot":
			if rest[1] == "parts" && m == http.MethodDelete {
				s.handleDiscardParts(w, r, t)
				return
			}
			switch m {
			case http.MethodPut:
				s.handlePublishSnapshot(w, r, t, rest[1])
			case http.MethodGet:
				if s.verifyLeader(w, r, t.key) {
					s.handleReadSnapshot(w, r, t, rest[1], false)
				}
			case http.MethodDelete:
				s.writeError(w, r, streamcore.Errorf(http.StatusMethodNotAllowed, streamcore.CodeUnsupported, "snapshots cannot be deleted"))
			default:
				s.methodNotAllowed(w, r, "GET, PUT, OPTIONS")
			}
			return
		case "retention":
			if m != http.MethodPut {
				s.methodNotAllowed(w, r, "PUT, OPTIONS")
				return
			}
			s.handleRetain(w, r, t, rest[1])
			return
		}
	case 3:
		if rest[0] == "snapshot" && rest[2] == "parts" {
			if m != http.MethodPost {
				s.methodNotAllowed(w, r, "POST, OPTIONS")
				return
			}
			s.handleStagePart(w, r, t, rest[1])
			return
		}
	case 4:
		if rest[0] == "incarnation" && (rest[2] == "chunk" || rest[2] == "snapshot") {
			if m != http.MethodGet && m != http.MethodHead {
				s.methodNotAllowed(w, r, "GET, HEAD, OPTIONS")
				return
			}
			s.handleImmutable(w, r, t, rest[1], rest[2], rest[3])
			return
		}
	}
	s.writeError(w, r, streamcore.Errorf(http.StatusNotFound, streamcore.CodeNotFound, "no such route"))
}

// routeCompat serves /v1/stream/{path...}: the whole remainder names one stream of the
// compatibility bucket, and only the stream routes exist there.
func (s *Server) routeCompat(w http.ResponseWriter, r *http.Request, rawRest string) {
	name, err := url.PathUnescape(rawRest)
	if err != nil {
		s.writeError(w, r, streamcore.Errorf(http.StatusBadRequest, streamcore.CodeInvalidRequest, "path is not valid percent-encoding"))
		return
	}
	if e := streamcore.ValidateCompatPath(name); e != nil {
		s.writeError(w, r, e)
		return
	}
	if r = s.guard(w, r, CompatBucket, actionOf(r)); r == nil {
		return
	}
	t := &target{bucket: CompatBucket, stream: name, key: CompatBucket + "/" + name, compat: true, url: r.URL.EscapedPath()}
	s.routeStream(w, r, t, nil)
}

// keyForPath maps a stream path as a client names it (Stream-Forked-From) to a key.
func keyForPath(p string) (string, *streamcore.Error) {
	if u, err := url.Parse(p); err == nil && u.Path != "" {
		p = u.EscapedPath()
	}
	if strings.HasPrefix(p, CompatPrefix) {
		name, err := url.PathUnescape(p[len(CompatPrefix):])
		if err != nil {
			return "", streamcore.Errorf(http.StatusBadRequest, streamcore.CodeInvalidHeader, "Stream-Forked-From is not a valid stream path")
		}
		if e := streamcore.ValidateCompatPath(name); e != nil {
			return "", e
		}
		return CompatBucket + "/" + name, nil
	}
	segs, e := splitPath(p)
	if e != nil || len(segs) != 2 {
		return "", streamcore.Errorf(http.StatusBadRequest, streamcore.CodeInvalidHeader, "Stream-Forked-From must name a stream path /{bucket}/{stream}")
	}
	if e := streamcore.ValidateBucketID(segs[0]); e != nil {
		return "", e
	}
	if e := streamcore.ValidateStreamID(segs[0], segs[1]); e != nil {
		return "", e
	}
	return segs[0] + "/" + segs[1], nil
}

// allow reports whether r uses method; otherwise it answers 405 naming method and the
// caller returns.
func (s *Server) allow(w http.ResponseWriter, r *http.Request, method string) bool {
	if r.Method == method {
		return true
	}
	s.methodNotAllowed(w, r, method)
	return false
}

func (s *Server) methodNotAllowed(w http.ResponseWriter, r *http.Request, allow string) {
	w.Header().Set("Allow", allow)
	s.writeError(w, r, streamcore.Errorf(http.StatusMethodNotAllowed, streamcore.CodeMethodNotAllowed, "method %s is not supported here", r.Method))
}

// preflight answers OPTIONS the same for every path, before and without authorization:
// a per-path answer would tell an unauthenticated caller what exists.
func (s *Server) preflight(w http.ResponseWriter, r *http.Request) {
	h := w.Header()
	h.Set("Access-Control-Allow-Methods", "GET, HEAD, POST, PUT, DELETE, OPTIONS")
	if req := r.Header.Get("Access-Control-Request-Headers"); req != "" {
		h.Set("Access-Control-Allow-Headers", req)
	} else {
		h.Set("Access-Control-Allow-Headers", "*")
	}
	h.Set("Access-Control-Max-Age", "86400")
	w.WriteHeader(http.StatusNoContent)
}
