package streamcore

import "strings"

// DefaultContentType is a stream's type when create names none.
const DefaultContentType = "application/octet-stream"

// NormalizeContentType lowercases and trims a media type and its parameters, joining them
// with "; " (checklist-protocol 5.2). Parameters are compared, so keep their order.
func NormalizeContentType(ct string) (string, bool) {
	ct = strings.TrimSpace(ct)
	if ct == "" {
		return "", false
	}
	parts := strings.Split(ct, ";")
	base := strings.ToLower(strings.TrimSpace(parts[0]))
	if !validMediaType(base) {
		return "", false
	}
	out := base
	for _, p := range parts[1:] {
		p = strings.TrimSpace(p)
		if p == "" {
			continue
		}
		k, v, ok := strings.Cut(p, "=")
		k = strings.ToLower(strings.TrimSpace(k))
		v = strings.TrimSpace(v)
		if !ok || k == "" || !isToken(k) {
			return "", false
		}
		out += "; " + k + "=" + strings.ToLower(v)
	}
	return out, true
}

func validMediaType(base string) bool {
	t, s, ok := strings.Cut(base, "/")
	return ok && t != "" && s != "" && isToken(t) && isToken(s)
}

func isToken(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c <= ' ' || c >= 0x7f || strings.IndexByte("()<>@,;:\\\"/[]?={}", c) >= 0 {
			return false
		}
	}
	return s != ""
}

// MediaType is the base type of a normalized content type, without parameters.
func MediaType(ct string) string {
	base, _, _ := strings.Cut(ct, ";")
	return strings.TrimSpace(base)
}

// IsJSON reports whether a stream of this type follows the JSON message rule.
func IsJSON(ct string) bool { return MediaType(ct) == "application/json" }

// IsText reports whether SSE carries this type as text (text/* or JSON) rather than base64.
func IsText(ct string) bool {
	mt := MediaType(ct)
	return strings.HasPrefix(mt, "text/") || mt == "application/json"
}

// ReadContentType is the Content-Type of a read of a stream of type ct.
func ReadContentType(ct string) string {
	if IsJSON(ct) {
		return "application/x-ndjson"
	}
	return ct
}
