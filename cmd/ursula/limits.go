package main

import (
	"crypto/tls"
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/ursula-go/ursula/internal/fdlimit"
	"github.com/ursula-go/ursula/raftlog"
	"github.com/ursula-go/ursula/server"
)

// limitsConfig is the [limits] section: what clients can make the node hold.
type limitsConfig struct {
	MaxConnections    int    `toml:"max_connections"`         // 0: from the descriptor limit
	MaxLiveReaders    int    `toml:"max_live_readers"`        // 0: 3/4 of max_connections
	IdleTimeout       string `toml:"idle_timeout"`            // keep-alive connection idle limit
	ReadHeaderTimeout string `toml:"read_header_timeout"`     // time to send the request headers
	BodyIdleTimeout   string `toml:"body_idle_timeout"`       // longest gap within a request body
	BodyMinRate       int64  `toml:"body_min_rate"`           // bytes/s a body must average (-1: off)
	WriteTimeout      string `toml:"write_timeout"`           // sending a non-live response
	LiveWriteTimeout  string `toml:"live_write_timeout"`      // each write of an SSE stream
	SSEKeepAlive      string `toml:"sse_keepalive"`           // comment interval on a quiet SSE stream
	InflightBodySize  int64  `toml:"inflight_body_size"`      // node-wide request body bytes in flight
	ColdReadSize      int64  `toml:"cold_read_size"`          // most cold bytes one catch-up read takes
	InflightColdRead  int64  `toml:"inflight_cold_read_size"` // node-wide cold bytes held for readers
	MinFreeWALBytes   int64  `toml:"wal_min_free_bytes"`      // refuse writes below (-1: off)
	ResumeFreeWALByte int64  `toml:"wal_resume_free_bytes"`
	FreeMemInterval   string `toml:"free_memory_interval"`   // return free heap to the OS ("off": never)
	FreeMemMinBytes   int64  `toml:"free_memory_min_bytes"`  // only while more free heap than this is held
	MaxStreamsPerBuck int    `toml:"max_streams_per_bucket"` // 0: no cap
}

// Defaults of [limits] that are not the server package's.
const (
	defaultIdleTimeout       = 60 * time.Second
	defaultReadHeaderTimeout = 10 * time.Second
	defaultMaxConnections    = 16384
	// descriptorReserve keeps descriptors for what is not a client connection: the node
	// journal's segments, cold-tier files, peer connections, SQLite files.
	descriptorReserve = 1024
)

// resolvedLimits is [limits] with every default applied.
type resolvedLimits struct {
	maxConns, maxLive         int
	idle, readHeader          time.Duration
	server                    server.Limits
	walMinFree, walResumeFree int64
	freeMemEvery              time.Duration // 0: off
	freeMemMin                uint64
	nofile                    uint64
	guard                     *raftlog.DiskGuard // raft engine: the journal disk's admission
}

func parseDur(name, v string, def time.Duration) (time.Duration, error) {
	if v == "" {
		return def, nil
	}
	d, err := time.ParseDuration(v)
	if err != nil || d <= 0 {
		return 0, fmt.Errorf("limits.%s: %q is not a positive duration such as \"30s\"", name, v)
	}
	return d, nil
}

func resolveLimits(lc *limitsConfig) (resolvedLimits, error) {
	var r resolvedLimits
	var err error
	if r.idle, err = parseDur("idle_timeout", lc.IdleTimeout, defaultIdleTimeout); err != nil {
		return r, err
	}
	if r.readHeader, err = parseDur("read_header_timeout", lc.ReadHeaderTimeout, defaultReadHeaderTimeout); err != nil {
		return r, err
	}
	sl := server.Limits{InflightBodyBytes: lc.InflightBodySize, BodyMinRate: lc.BodyMinRate,
		ColdReadBytes: lc.ColdReadSize, InflightColdReadBytes: lc.InflightColdRead}
	if sl.BodyIdleTimeout, err = parseDur("body_idle_timeout", lc.BodyIdleTimeout, server.DefaultBodyIdleTimeout); err != nil {
		return r, err
	}
	if sl.WriteTimeout, err = parseDur("write_timeout", lc.WriteTimeout, server.DefaultWriteTimeout); err != nil {
		return r, err
	}
	if sl.LiveWriteTimeout, err = parseDur("live_write_timeout", lc.LiveWriteTimeout, server.DefaultLiveWriteTimeout); err != nil {
		return r, err
	}
	if sl.SSEKeepAlive, err = parseDur("sse_keepalive", lc.SSEKeepAlive, server.DefaultSSEKeepAlive); err != nil {
		return r, err
	}
	if lc.MaxStreamsPerBuck < 0 {
		return r, fmt.Errorf("limits.max_streams_per_bucket %d must not be negative (0: no cap)", lc.MaxStreamsPerBuck)
	}
	sl.MaxStreamsPerBucket = lc.MaxStreamsPerBuck
	r.server = sl
	r.nofile = fdlimit.Raise()
	r.maxConns = lc.MaxConnections
	if r.maxConns <= 0 {
		r.maxConns = defaultMaxConnections
		if r.nofile > 0 {
			if room := int64(r.nofile) - descriptorReserve; room < int64(r.maxConns) {
				r.maxConns = int(max(room, 64))
			}
		}
	}
	if r.nofile > 0 && uint64(r.maxConns) >= r.nofile {
		return r, fmt.Errorf("limits.max_connections %d must be below the descriptor limit %d", r.maxConns, r.nofile)
	}
	r.maxLive = lc.MaxLiveReaders
	if r.maxLive <= 0 {
		r.maxLive = r.maxConns * 3 / 4
	}
	if r.maxLive >= r.maxConns {
		// Past the connection cap a reader gets the listener's 503, never the live-read
		// one: keep room for writers and ordinary reads next to the live readers.
		return r, fmt.Errorf("limits.max_live_readers %d must be below limits.max_connections %d", r.maxLive, r.maxConns)
	}
	r.walMinFree, r.walResumeFree = lc.MinFreeWALBytes, lc.ResumeFreeWALByte
	if lc.FreeMemInterval != "off" {
		if r.freeMemEvery, err = parseDur("free_memory_interval", lc.FreeMemInterval, server.DefaultFreeMemoryInterval); err != nil {
			return r, err
		}
	}
	switch {
	case lc.FreeMemMinBytes < 0:
		return r, fmt.Errorf("limits.free_memory_min_bytes %d must not be negative", lc.FreeMemMinBytes)
	case lc.FreeMemMinBytes == 0:
		r.freeMemMin = server.DefaultFreeMemoryMinBytes
	default:
		r.freeMemMin = uint64(lc.FreeMemMinBytes)
	}
	return r, nil
}

// adminMaxConnections caps the admin listener's connections: operators and tools, a few
// at once. It comes out of the descriptors descriptorReserve keeps.
const adminMaxConnections = 256

// httpServer builds a listener's server with the connection limits (at most maxConns open
// at once), TLS terminated in the listener when tlsCfg is not nil, and the HTTP library's
// own refusals in the JSON error body, over TLS too. Serve hs with hs.Serve(ln).
func (r resolvedLimits) httpServer(h http.Handler, raw net.Listener, maxConns int, tlsCfg *tls.Config) (*http.Server, net.Listener) {
	hs := &http.Server{Handler: h, ReadHeaderTimeout: r.readHeader, IdleTimeout: r.idle, MaxHeaderBytes: 64 << 10}
	var ln net.Listener = server.LimitConnections(raw, maxConns)
	if tlsCfg != nil {
		// The handshake is bounded as http.Server bounds its own: by the header timeout.
		ln = server.TLSListener(ln, tlsCfg, r.readHeader)
	}
	return hs, server.JSONRefusals(hs, ln)
}
