package replicator

import (
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/ursula-go/ursula/client"
	"github.com/ursula-go/ursula/streamcore"
)

// The smallest and largest commit frame URSULA_VFS_MAX_FRAME_BYTES may set: below 64 KiB
// a single page change with its header hardly fits, and the server takes no request over
// 32 MiB.
const (
	minFrameBytes = 64 << 10
	maxFrameBytes = streamcore.MaxRequestBytes
)

// maxFrameFromEnv reads URSULA_VFS_MAX_FRAME_BYTES: a value out of range is clamped to
// the nearer bound and a value that is not a number is ignored; adjusted says what was
// done then ("" when the value is used as it is, or the variable is unset).
func maxFrameFromEnv() (n int, adjusted string) {
	raw := strings.TrimSpace(os.Getenv("URSULA_VFS_MAX_FRAME_BYTES"))
	if raw == "" {
		return maxFrameBytes, ""
	}
	v, err := strconv.ParseInt(raw, 10, 64)
	switch {
	case err != nil:
		return maxFrameBytes, fmt.Sprintf("setting=URSULA_VFS_MAX_FRAME_BYTES given=%q used=%d reason=%q", raw, maxFrameBytes, "not a number")
	case v < minFrameBytes:
		return minFrameBytes, fmt.Sprintf("setting=URSULA_VFS_MAX_FRAME_BYTES given=%q used=%d reason=%q", raw, minFrameBytes, "below the smallest frame limit")
	case v > maxFrameBytes:
		return maxFrameBytes, fmt.Sprintf("setting=URSULA_VFS_MAX_FRAME_BYTES given=%q used=%d reason=%q", raw, maxFrameBytes, "above the largest request the server takes")
	}
	return int(v), ""
}

// writeEvent writes one logfmt event line of the replica of streamURL to w, at the
// event's level.
func writeEvent(w io.Writer, streamURL, event, format string, args ...any) {
	fmt.Fprintf(w, "sqlite-ursula-vfs level=%s event=%s url=%q %s\n", eventLevel(event), event, streamURL, fmt.Sprintf(format, args...))
}

// NewClient is the HTTP client of the URSULA_VFS_* settings, the one a replica of streamURL
// uses when Options.Client is nil (read-only attaches of the adapters use it too), its
// events written to log:
//   - URSULA_VFS_CA_FILE: only its CAs are trusted for https://. A file that cannot be read
//     logs ca_file_unreadable, one without a certificate ca_file_without_certificates
//     (both level=error), and either is an error: falling back to the system roots would
//     trust what the user meant to exclude (checklist-vfs S179, Y).
//   - the transport's stale DNS answers are logged as dns_stale (checklist-vfs L103, S180);
//   - URSULA_VFS_IDLE_MS: how long an idle connection is kept (90 s; 0 keeps none, each
//     request on a new connection: checklist-vfs L99);
//   - redirects are never followed: 307 is resent to the same URL, others fail (over a node
//     list the client follows NotLeader answers within the list instead);
//   - the token of SetToken, else of URSULA_VFS_TOKEN_FILE as it is now (a replica re-reads
//     the file on every 401).
func NewClient(streamURL string, log io.Writer) (*client.Client, error) {
	if log == nil {
		log = os.Stderr
	}
	caFile := os.Getenv("URSULA_VFS_CA_FILE")
	if caFile != "" {
		if _, err := os.ReadFile(caFile); err != nil {
			writeEvent(log, streamURL, "ca_file_unreadable", "file=%q reason=%q", caFile, err.Error())
			return nil, newError(KindLocalSetup, ActionFix, err, "URSULA_VFS_CA_FILE %s cannot be read: %v", caFile, err)
		}
	}
	tr, err := client.NewTransportWith(client.TransportOptions{CAFile: caFile, OnDNSStale: dnsStaleLogger(log, streamURL)})
	if err != nil {
		writeEvent(log, streamURL, "ca_file_without_certificates", "file=%q reason=%q", caFile, err.Error())
		return nil, newError(KindLocalSetup, ActionFix, err, "URSULA_VFS_CA_FILE %s holds no usable CA certificate: %v", caFile, err)
	}
	tr.IdleConnTimeout = 90 * time.Second
	if v, err := strconv.Atoi(os.Getenv("URSULA_VFS_IDLE_MS")); err == nil && v >= 0 {
		tr.IdleConnTimeout = time.Duration(v) * time.Millisecond
		tr.DisableKeepAlives = v == 0
	}
	c, err := client.New("", client.WithHTTPClient(&http.Client{Transport: client.NewInlineTransport(tr)}))
	if err != nil {
		return nil, err
	}
	c.MaxRedirects = -1
	if tok := tokenOverride.Load(); tok != nil {
		c.SetToken(*tok)
	} else if p := os.Getenv("URSULA_VFS_TOKEN_FILE"); p != "" {
		if b, err := os.ReadFile(p); err == nil {
			c.SetToken(string(bytes.TrimSpace(b)))
		}
	}
	return c, nil
}

// dnsStaleLogger reports the transport's stale DNS answers as dns_stale events.
func dnsStaleLogger(w io.Writer, streamURL string) func(host string, age time.Duration, reason error) {
	return func(host string, age time.Duration, reason error) {
		writeEvent(w, streamURL, "dns_stale", "host=%q age_ms=%d reason=%q", host, age.Milliseconds(), reason.Error())
	}
}

// tokenInClear reports whether a bearer token sent to streamURL crosses a network
// unencrypted: plain http to a host other than this machine.
func tokenInClear(streamURL string) bool {
	var hosts []string
	scheme := ""
	if nu, multi, err := client.ParseNodeURL(streamURL); err == nil && multi {
		scheme = nu.Scheme
		for _, n := range nu.Nodes {
			hosts = append(hosts, n.Host)
		}
	} else if u, err := url.Parse(streamURL); err == nil {
		scheme = strings.ToLower(u.Scheme)
		hosts = []string{u.Hostname()}
	}
	if scheme != "http" {
		return false
	}
	for _, h := range hosts {
		h = strings.ToLower(h)
		if ip := net.ParseIP(h); h != "localhost" && !strings.HasSuffix(h, ".localhost") && (ip == nil || !ip.IsLoopback()) {
			return true
		}
	}
	return false
}

// warnTokenInClear logs token_in_clear once per replica, the first time a token is about
// to go over plain http to a host other than this machine.
func (r *Replica) warnTokenInClear() {
	if !r.clearText || r.tokenWarned.Load() || !r.opts.Client.HasToken() {
		return
	}
	if r.tokenWarned.CompareAndSwap(false, true) {
		r.logf("token_in_clear", "reason=%q", "the bearer token goes over plain http to a host that is not this machine; use https")
	}
}
