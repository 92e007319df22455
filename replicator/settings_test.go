package replicator

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"testing"
	"time"

	"github.com/ursula-go/ursula/client"
)

// TestMaxFrameSettingAdjusted: URSULA_VFS_MAX_FRAME_BYTES out of range is clamped to the
// nearer bound (64 KiB, 32 MiB), a value that is not a number is ignored, and each logs
// setting_adjusted (level warn) once, at attach, naming the value used instead.
func TestMaxFrameSettingAdjusted(t *testing.T) {
	base := snapServer(t, nil)
	for i, c := range []struct {
		env  string
		used int
	}{
		{"1000", minFrameBytes},
		{"99999999999", maxFrameBytes},
		{"lots", maxFrameBytes},
		{"100000", -1}, // in range: used as given, nothing logged
	} {
		t.Setenv("URSULA_VFS_MAX_FRAME_BYTES", c.env)
		r, _, lb := snapAttach(t, base+"/settings/s"+strconv.Itoa(i), Options{})
		m := newModel()
		m.commit(t, r, 4, 4)
		m.commit(t, r, 4, 2)
		ev := lb.events("setting_adjusted")
		if c.used < 0 {
			if len(ev) != 0 || r.opts.MaxFrameBytes != 100000 {
				t.Fatalf("%s: limit %d, events %v", c.env, r.opts.MaxFrameBytes, ev)
			}
			continue
		}
		if len(ev) != 1 || ev[0]["level"] != "warn" || ev[0]["used"] != strconv.Itoa(c.used) || ev[0]["given"] != c.env || ev[0]["setting"] != "URSULA_VFS_MAX_FRAME_BYTES" {
			t.Fatalf("%s: setting_adjusted events %v", c.env, ev)
		}
		if r.opts.MaxFrameBytes != c.used {
			t.Fatalf("%s: limit %d, want %d", c.env, r.opts.MaxFrameBytes, c.used)
		}
	}
}

// TestTokenInClear: a token about to go over plain http to a host that is not this
// machine logs token_in_clear (level warn) once; the same over loopback, or with no
// token, logs nothing. The "remote" host is a name the test's transport dials on
// loopback, so no traffic leaves the machine.
func TestTokenInClear(t *testing.T) {
	base := snapServer(t, nil)
	bu, _ := url.Parse(base)
	loopDial := func(ctx context.Context, network, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, network, bu.Host)
	}
	newClient := func(token string) *client.Client {
		c, err := client.New("", client.WithHTTPClient(&http.Client{Transport: &http.Transport{DialContext: loopDial}}))
		if err != nil {
			t.Fatal(err)
		}
		c.SetToken(token)
		return c
	}
	remote := "http://db.example.test:" + bu.Port() + "/tokens/"
	for _, c := range []struct {
		url, token string
		want       int
	}{
		{remote + "remote", "secret", 1},
		{remote + "remote-none", "", 0},
		{base + "/tokens/local", "secret", 0},
		{"http://localhost:" + bu.Port() + "/tokens/localhost", "secret", 0},
	} {
		r, _, lb := snapAttach(t, c.url, Options{Client: newClient(c.token)})
		m := newModel()
		m.commit(t, r, 4, 4)
		m.commit(t, r, 4, 2)
		ev := lb.events("token_in_clear")
		if len(ev) != c.want || (c.want == 1 && ev[0]["level"] != "warn") {
			t.Fatalf("%s with token %q: token_in_clear events %v", c.url, c.token, ev)
		}
	}
	for _, c := range []struct {
		url   string
		clear bool
	}{
		{"https://db.example.test/b/s", false},
		{"http://127.0.0.1:1,127.0.0.2:1/b/s", false},
		{"http://127.0.0.1:1,db.example.test:1/b/s", true},
		{"http://[::1]:1/b/s", false},
	} {
		if got := tokenInClear(c.url); got != c.clear {
			t.Fatalf("tokenInClear(%s) = %t", c.url, got)
		}
	}
}

// TestDNSStaleEvent (checklist-vfs T32, S180): the transport's stale-address report becomes a dns_stale event
// (level warn) with age_ms and reason.
func TestDNSStaleEvent(t *testing.T) {
	lb := &logBuf{}
	dnsStaleLogger(lb, "http://db.example.test/b/s")("db.example.test", 31*time.Second, errors.New("SERVFAIL"))
	ev := lb.events("dns_stale")
	if len(ev) != 1 || ev[0]["level"] != "warn" || ev[0]["age_ms"] != "31000" || ev[0]["reason"] != "SERVFAIL" || ev[0]["host"] != "db.example.test" {
		t.Fatalf("dns_stale events %v", ev)
	}
}
