package replicator

import (
	"fmt"
	"io"
	"net"
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
