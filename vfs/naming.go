package vfs

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net/url"
	"os"
	"path"
	"path/filepath"
	"strings"

	"github.com/ursula-go/ursula/client"
	"github.com/ursula-go/ursula/replicator"
)

// Local file naming when Open gets no Path (checklist-vfs H): <label>-<hash>.db in
// sqlite-ursula/ under the user's cache directory, the same name the Python and Node
// bindings compute, so every binding on a host finds the same cache of a stream.

// canonicalURL is the one spelling of a stream URL that names its local file: scheme and
// host lowercased, the port only when not the scheme's default, the path with dot
// segments resolved and each segment percent-decoded then re-encoded one fixed way, no
// trailing slash, no userinfo. A URL naming several nodes of a cluster lists each node
// spelled that way, sorted: the same nodes in another order name the same database.
func canonicalURL(raw string) (string, error) {
	nu, multi, err := client.ParseNodeURL(raw)
	if err != nil {
		return "", err
	}
	if multi {
		raw = nu.At(0) // the path is read as the first node's URL
	}
	u, err := url.Parse(raw)
	if err != nil {
		return "", err
	}
	scheme := strings.ToLower(u.Scheme)
	host := strings.ToLower(u.Hostname())
	if strings.Contains(host, ":") {
		host = "[" + host + "]"
	}
	if p := u.Port(); p != "" && !(scheme == "http" && p == "80") && !(scheme == "https" && p == "443") {
		host += ":" + p
	}
	if multi {
		host = nu.CanonicalAuthority()
	}
	var segs []string
	for _, s := range pathSegments(u) {
		segs = append(segs, url.PathEscape(s))
	}
	return scheme + "://" + host + "/" + strings.Join(segs, "/"), nil
}

// pathSegments are the decoded, dot-resolved, non-empty segments of u's path.
func pathSegments(u *url.URL) []string {
	var out []string
	for _, s := range strings.Split(path.Clean("/"+u.EscapedPath()), "/") {
		if s == "" {
			continue
		}
		if d, err := url.PathUnescape(s); err == nil {
			s = d
		}
		out = append(out, s)
	}
	return out
}

// fileLabel is the readable part of the name: the last two path segments joined by "-",
// lowercased, every run outside [a-z0-9_-] and a leading "-" turned into "_", at most 64
// characters; "stream" without a path.
func fileLabel(u *url.URL) string {
	segs := pathSegments(u)
	if len(segs) > 2 {
		segs = segs[len(segs)-2:]
	}
	if len(segs) == 0 {
		return "stream"
	}
	var b strings.Builder
	run := false
	for _, r := range strings.ToLower(strings.Join(segs, "-")) {
		if r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '_' || r == '-' {
			b.WriteRune(r)
			run = false
		} else if !run {
			b.WriteByte('_')
			run = true
		}
	}
	label := b.String()
	if strings.HasPrefix(label, "-") {
		label = "_" + label[1:]
	}
	if len(label) > 64 {
		label = label[:64]
	}
	return label
}

// DefaultFileName is <label>-<hash>.db for a stream URL: hash is the first 32 hex digits
// of SHA-256 over the canonical URL.
func DefaultFileName(streamURL string) (string, error) {
	canon, err := canonicalURL(streamURL)
	if err != nil {
		return "", err
	}
	// The label reads only the path (a node list is no host url.Parse takes).
	rest := canon[strings.Index(canon, "://")+3:]
	u, err := url.Parse("http://host" + rest[strings.IndexByte(rest, '/'):])
	if err != nil {
		return "", err
	}
	sum := sha256.Sum256([]byte(canon))
	return fileLabel(u) + "-" + hex.EncodeToString(sum[:16]) + ".db", nil
}

// cacheDir is sqlite-ursula in $XDG_CACHE_HOME (when absolute) or ~/.cache, mode 0700.
func cacheDir() (string, error) {
	base := os.Getenv("XDG_CACHE_HOME")
	if !filepath.IsAbs(base) {
		home := os.Getenv("HOME")
		if !filepath.IsAbs(home) {
			h, err := os.UserHomeDir()
			if err != nil || !filepath.IsAbs(h) {
				return "", &Error{Kind: replicator.KindLocalSetup, Action: replicator.ActionFix,
					Message: "no cache directory (set XDG_CACHE_HOME or HOME), so give Options.Path"}
			}
			home = h
		}
		base = filepath.Join(home, ".cache")
	}
	dir := filepath.Join(base, "sqlite-ursula")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", &Error{Kind: replicator.KindLocalSetup, Action: replicator.ActionFix, Err: err,
			Message: fmt.Sprintf("cannot create the cache directory %s; give Options.Path", dir)}
	}
	return dir, nil
}

// localPath resolves the local file: an absolute form of path, or the default name in
// the cache directory. ":memory:", "" with no cache, and "file:" URIs are refused.
func localPath(streamURL, p string) (string, error) {
	if p == ":memory:" || strings.HasPrefix(p, "file:") {
		return "", &Error{Kind: replicator.KindInvalidArg, Action: replicator.ActionFix,
			Message: fmt.Sprintf("Path %q must be a plain file path (not :memory: or a file: URI)", p)}
	}
	if p == "" {
		dir, err := cacheDir()
		if err != nil {
			return "", err
		}
		name, err := DefaultFileName(streamURL)
		if err != nil {
			return "", &Error{Kind: replicator.KindInvalidURL, Action: replicator.ActionFix, Err: err, Message: "stream URL does not parse"}
		}
		p = filepath.Join(dir, name)
	}
	return filepath.Abs(p)
}
