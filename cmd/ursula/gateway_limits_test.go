package main

import (
	"strings"
	"testing"
	"time"

	"github.com/ursula-go/ursula/gateway"
	"github.com/ursula-go/ursula/server"
)

func TestGatewayLimitsConfig(t *testing.T) {
	for _, tc := range []struct {
		name  string
		set   func(*gatewayFile)
		err   string
		check func(gatewayLimits) bool
	}{
		{"defaults", func(*gatewayFile) {}, "", func(l gatewayLimits) bool {
			return l.idle == defaultIdleTimeout && l.readHeader == defaultReadHeaderTimeout &&
				l.bodyIdle == server.DefaultBodyIdleTimeout && l.write == server.DefaultWriteTimeout &&
				l.liveWrite == server.DefaultLiveWriteTimeout && l.connect == gateway.DefaultUpstreamConnectTimeout &&
				l.respHeader == gateway.DefaultUpstreamResponseHeaderTimeout && l.maxConns >= 64
		}},
		{"set", func(f *gatewayFile) {
			f.Gateway.IdleTimeout, f.Gateway.UpstreamRespHeader, f.Gateway.MaxConnections = "2s", "90s", 100
		}, "", func(l gatewayLimits) bool {
			return l.idle == 2*time.Second && l.respHeader == 90*time.Second && l.maxConns == 100
		}},
		{"response header off", func(f *gatewayFile) { f.Gateway.UpstreamRespHeader = "off" }, "",
			func(l gatewayLimits) bool { return l.respHeader < 0 }},
		{"bad duration", func(f *gatewayFile) { f.Gateway.ReadHeaderTimeout = "soon" }, "gateway.read_header_timeout", nil},
		{"zero duration", func(f *gatewayFile) { f.Gateway.WriteTimeout = "0s" }, "gateway.write_timeout", nil},
		{"negative connections", func(f *gatewayFile) { f.Gateway.MaxConnections = -1 }, "gateway.max_connections", nil},
		{"connections over the descriptor limit", func(f *gatewayFile) { f.Gateway.MaxConnections = 1 << 40 }, "descriptor limit", nil},
		{"bad body rate", func(f *gatewayFile) { f.Gateway.BodyMinRate = -2 }, "gateway.body_min_rate", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var f gatewayFile
			tc.set(&f)
			l, err := f.limits()
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("err %v, want one naming %s", err, tc.err)
				}
				return
			}
			if err != nil || !tc.check(l) {
				t.Fatalf("%+v %v", l, err)
			}
		})
	}
}
