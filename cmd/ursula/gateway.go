package main

// ursula gateway: one front door to a cluster (package gateway), configured from flags
// and a TOML file.

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/signal"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/BurntSushi/toml"

	"github.com/ursula-go/ursula/auth"
	"github.com/ursula-go/ursula/gateway"
	"github.com/ursula-go/ursula/internal/fdlimit"
	"github.com/ursula-go/ursula/internal/inlinehttp"
	"github.com/ursula-go/ursula/server"
	"github.com/ursula-go/ursula/tlsfiles"
)

const gatewayUsage = `Usage: ursula gateway --listen ADDR --upstream URL[,URL...] [--config FILE]

Forwards client requests to the nodes, following leader redirects itself (at most 3 hops
within 5 s, only to the listed upstreams), authenticating clients ([auth], as on a node),
applying per-bucket quotas and writing a usage log. Flags override the config file:

  [gateway]
  listen = "127.0.0.1:4440"
  upstreams = ["http://127.0.0.1:4437", "http://127.0.0.1:4447"]  # the nodes' peer URLs
  max_request_body_bytes = 33554432   # at most the nodes' limit (the default)
  usage_log = "/var/log/ursula/usage.jsonl"
  usage_chunk_bytes = 10000           # chunk unit of the usage lines (0: none)
  usage_flush_ms = 1000
  tls_cert_file = "..."               # HTTPS towards clients; both or neither
  tls_key_file = "..."
  upstream_ca_file = "..."            # CA of https:// upstreams
  upstream_token_file = "..."         # the gateway's own bearer token towards nodes with auth on
  eject_ms = 5000                     # an upstream whose connection failed goes last this long
  max_inflight_body_bytes = 268435456 # request body bytes held at once (503 over it)
  cors_allowed_origins = ["https://app.example"]  # or ["*"]; default: a node's rule
  insecure = false                    # allow a non-loopback listener without TLS and auth
  max_connections = 0                 # client connections open at once, 503 past it (0: from the descriptor limit, at most 16384)
  idle_timeout = "60s"                # a keep-alive connection idle this long is closed
  read_header_timeout = "10s"         # time to send a request's headers
  body_idle_timeout = "10s"           # longest gap within a request body (408 BODY_TOO_SLOW)
  body_min_rate = 4096                # bytes/s a body averages after body_idle_timeout (-1: off)
  write_timeout = "60s"               # relaying a whole non-live answer to a client
  live_write_timeout = "30s"          # each write of a long-poll or SSE answer
  upstream_connect_timeout = "5s"
  upstream_response_header_timeout = "30s"  # 504 UPSTREAM_TIMEOUT past it; live reads exempt ("off": none)
  [auth]                              # the node's keys: token_file, issuer, audience,
  token_file = "/etc/ursula/tokens"   # jwks_url, policy_file
  [quota.default]
  requests_per_sec = 100              # 429 + Retry-After over it
  max_live_reads = 100                # concurrent long-poll/SSE reads per bucket
  max_request_body_bytes = 1048576    # 413 over it
  [[quota.bucket]]
  id = "tenant-a"
  requests_per_sec = 10
`

// gatewayFile is the gateway's TOML config file.
type gatewayFile struct {
	Gateway struct {
		Listen              string   `toml:"listen"`
		Upstreams           []string `toml:"upstreams"`
		MaxRequestBodyBytes int64    `toml:"max_request_body_bytes"`
		UsageLog            string   `toml:"usage_log"`
		UsageChunkBytes     int64    `toml:"usage_chunk_bytes"`
		UsageFlushMs        int      `toml:"usage_flush_ms"`
		TLSCertFile         string   `toml:"tls_cert_file"`
		TLSKeyFile          string   `toml:"tls_key_file"`
		UpstreamCAFile      string   `toml:"upstream_ca_file"`
		UpstreamTokenFile   string   `toml:"upstream_token_file"`
		EjectMs             int      `toml:"eject_ms"`
		MaxInflightBody     int64    `toml:"max_inflight_body_bytes"`
		CORSAllowedOrigins  []string `toml:"cors_allowed_origins"`
		Insecure            bool     `toml:"insecure"`
		MaxConnections      int      `toml:"max_connections"`
		IdleTimeout         string   `toml:"idle_timeout"`
		ReadHeaderTimeout   string   `toml:"read_header_timeout"`
		BodyIdleTimeout     string   `toml:"body_idle_timeout"`
		BodyMinRate         int64    `toml:"body_min_rate"`
		WriteTimeout        string   `toml:"write_timeout"`
		LiveWriteTimeout    string   `toml:"live_write_timeout"`
		UpstreamConnect     string   `toml:"upstream_connect_timeout"`
		UpstreamRespHeader  string   `toml:"upstream_response_header_timeout"`
	} `toml:"gateway"`
	Auth  authConfig `toml:"auth"`
	Quota struct {
		Default quotaEntry   `toml:"default"`
		Bucket  []quotaEntry `toml:"bucket"`
	} `toml:"quota"`
}

type quotaEntry struct {
	ID                  string  `toml:"id"`
	RequestsPerSec      float64 `toml:"requests_per_sec"`
	MaxLiveReads        int     `toml:"max_live_reads"`
	MaxRequestBodyBytes int64   `toml:"max_request_body_bytes"`
}

func (q quotaEntry) limits() gateway.Limits {
	return gateway.Limits{RequestsPerSec: q.RequestsPerSec, MaxLiveReads: q.MaxLiveReads, MaxRequestBodyBytes: q.MaxRequestBodyBytes}
}

func runGateway(args []string, stderr io.Writer) error {
	fs := flag.NewFlagSet("gateway", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() { fmt.Fprint(stderr, gatewayUsage) }
	listen := fs.String("listen", "", "address to listen on")
	upstream := fs.String("upstream", "", "upstream node URLs, comma-separated")
	config := fs.String("config", "", "TOML config file")
	if err := fs.Parse(args); err != nil {
		return err
	}
	fc, err := readGatewayFile(*config)
	if err != nil {
		return err
	}
	gc := &fc.Gateway
	if *listen != "" {
		gc.Listen = *listen
	}
	if gc.Listen == "" {
		gc.Listen = "127.0.0.1:4440"
	}
	if *upstream != "" {
		gc.Upstreams = strings.Split(*upstream, ",")
	}
	if len(gc.Upstreams) == 0 {
		return errors.New("no upstream: give --upstream URL[,URL...] or gateway.upstreams")
	}
	logger := slog.New(slog.NewTextHandler(stderr, nil))
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()

	gl, err := fc.limits()
	if err != nil {
		return err
	}
	cfg := gateway.Config{MaxRequestBodyBytes: gc.MaxRequestBodyBytes, Logger: logger,
		EjectFor: time.Duration(gc.EjectMs) * time.Millisecond, MaxInflightBodyBytes: gc.MaxInflightBody,
		CORSAllowedOrigins: gc.CORSAllowedOrigins, BodyIdleTimeout: gl.bodyIdle, BodyMinRate: gc.BodyMinRate,
		UpstreamConnectTimeout: gl.connect, UpstreamResponseHeaderTimeout: gl.respHeader,
		WriteTimeout: gl.write, LiveWriteTimeout: gl.liveWrite}
	for _, s := range gc.Upstreams {
		u, err := url.Parse(strings.TrimRight(strings.TrimSpace(s), "/"))
		if err != nil {
			return fmt.Errorf("upstream %q: %w", s, err)
		}
		cfg.Upstreams = append(cfg.Upstreams, u)
	}
	var upTok atomic.Pointer[string]
	loadUpTok := func() error {
		if gc.UpstreamTokenFile == "" {
			return nil
		}
		b, err := os.ReadFile(gc.UpstreamTokenFile)
		if err != nil {
			return fmt.Errorf("gateway.upstream_token_file: %w", err)
		}
		tok := strings.TrimSpace(string(b))
		if tok == "" || strings.ContainsAny(tok, " \t\r\n") {
			return fmt.Errorf("gateway.upstream_token_file %s: want one token", gc.UpstreamTokenFile)
		}
		upTok.Store(&tok)
		return nil
	}
	if err := loadUpTok(); err != nil {
		return err
	}
	if gc.UpstreamTokenFile != "" {
		cfg.UpstreamToken = func() string { return *upTok.Load() }
	}
	if gc.UpstreamCAFile != "" {
		pool, err := tlsfiles.LoadCAPool(gc.UpstreamCAFile)
		if err != nil {
			return fmt.Errorf("gateway.upstream_ca_file: %w", err)
		}
		cfg.Transport = inlinehttp.New(&http.Transport{
			DialContext:         (&net.Dialer{Timeout: gl.connect, KeepAlive: 30 * time.Second}).DialContext,
			TLSClientConfig:     tlsfiles.ClientConfig(pool, nil),
			MaxIdleConnsPerHost: 64,
			IdleConnTimeout:     90 * time.Second,
		})
	}
	ac := auth.Config{TokenFile: fc.Auth.TokenFile, Issuer: fc.Auth.Issuer, Audience: fc.Auth.Audience,
		JWKSURL: fc.Auth.JWKSURL, PolicyFile: fc.Auth.PolicyFile, JWKSCAFile: fc.Auth.JWKSCAFile}
	if ac.Enabled() {
		a, err := auth.New(ctx, ac)
		if err != nil {
			return fmt.Errorf("auth: %w", err)
		}
		cfg.Auth = a
	}
	var cert *tlsfiles.Certificate
	if gc.TLSCertFile != "" || gc.TLSKeyFile != "" {
		c, err := tlsfiles.LoadCertificate(gc.TLSCertFile, gc.TLSKeyFile)
		if err != nil {
			return fmt.Errorf("gateway.tls_cert_file/tls_key_file: %w", err)
		}
		cert = c
	}
	if !isLoopback(gc.Listen) && (cert == nil || cfg.Auth == nil) {
		if !gc.Insecure {
			return fmt.Errorf("listen %s is not a loopback address and the gateway lacks TLS or authentication: configure gateway.tls_cert_file/tls_key_file and [auth], or set gateway.insecure = true to run this way on purpose", gc.Listen)
		}
		logger.Warn("INSECURE: the gateway serves a non-loopback address without TLS and authentication (gateway.insecure = true)", "addr", gc.Listen)
	}
	qp, err := fc.quotaPolicy()
	if err != nil {
		return err
	}
	// Always present (an empty policy limits nothing), so a reload can add quotas.
	cfg.Quotas = gateway.NewQuotas(qp)
	if gc.UsageLog != "" {
		u := gateway.OpenUsageLog(gc.UsageLog, gc.UsageChunkBytes, time.Duration(gc.UsageFlushMs)*time.Millisecond, logger)
		defer u.Close()
		cfg.Usage = u
	}
	g, err := gateway.New(cfg)
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", gc.Listen)
	if err != nil {
		return err
	}
	// SIGHUP reads the config file again and applies what can change without a restart:
	// quotas, body limits, CORS origins, and the auth, upstream-token and TLS files.
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	go func() {
		for {
			select {
			case <-ctx.Done():
				return
			case <-hup:
			}
			if err := reloadGateway(*config, g, cfg, cert, loadUpTok); err != nil {
				logger.Error("SIGHUP: reload failed; the previous settings stay in force", "err", err)
			} else {
				logger.Info("SIGHUP: gateway config, auth, upstream token and TLS files reloaded")
			}
		}
	}()
	// The node's connection limits: a cap with a fast 503 past it, header and idle
	// timeouts, bounded headers, and the library's own refusals with a JSON body.
	hs := &http.Server{Handler: g, ReadHeaderTimeout: gl.readHeader, IdleTimeout: gl.idle, MaxHeaderBytes: 64 << 10}
	ln = server.JSONRefusals(hs, server.LimitConnections(ln, gl.maxConns))
	served := make(chan error, 1)
	go func() {
		if cert == nil {
			served <- hs.Serve(ln)
			return
		}
		hs.TLSConfig = tlsfiles.ServerConfig(cert)
		served <- hs.ServeTLS(ln, "", "")
	}()
	scheme := "http"
	if cert != nil {
		scheme = "https"
	}
	logger.Info("ursula gateway listening", "addr", ln.Addr().String(), "scheme", scheme, "auth", cfg.Auth != nil, "upstreams", gc.Upstreams)
	select {
	case err := <-served:
		return err
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return hs.Shutdown(sctx)
}

// gatewayLimits are the gateway's connection and timeout settings, defaults applied.
type gatewayLimits struct {
	maxConns                            int
	idle, readHeader, bodyIdle, connect time.Duration
	write, liveWrite                    time.Duration
	respHeader                          time.Duration // negative: none
}

// limits resolves the connection and timeout keys of [gateway].
func (fc *gatewayFile) limits() (gatewayLimits, error) {
	gc := &fc.Gateway
	var l gatewayLimits
	dur := func(name, v string, def time.Duration) (time.Duration, error) {
		if v == "" {
			return def, nil
		}
		d, err := time.ParseDuration(v)
		if err != nil || d <= 0 {
			return 0, fmt.Errorf("gateway.%s: %q is not a positive duration such as \"30s\"", name, v)
		}
		return d, nil
	}
	var err error
	if l.idle, err = dur("idle_timeout", gc.IdleTimeout, defaultIdleTimeout); err != nil {
		return l, err
	}
	if l.readHeader, err = dur("read_header_timeout", gc.ReadHeaderTimeout, defaultReadHeaderTimeout); err != nil {
		return l, err
	}
	if l.bodyIdle, err = dur("body_idle_timeout", gc.BodyIdleTimeout, server.DefaultBodyIdleTimeout); err != nil {
		return l, err
	}
	if l.write, err = dur("write_timeout", gc.WriteTimeout, server.DefaultWriteTimeout); err != nil {
		return l, err
	}
	if l.liveWrite, err = dur("live_write_timeout", gc.LiveWriteTimeout, server.DefaultLiveWriteTimeout); err != nil {
		return l, err
	}
	if l.connect, err = dur("upstream_connect_timeout", gc.UpstreamConnect, gateway.DefaultUpstreamConnectTimeout); err != nil {
		return l, err
	}
	if gc.UpstreamRespHeader == "off" {
		l.respHeader = -1
	} else if l.respHeader, err = dur("upstream_response_header_timeout", gc.UpstreamRespHeader, gateway.DefaultUpstreamResponseHeaderTimeout); err != nil {
		return l, err
	}
	if gc.BodyMinRate < -1 {
		return l, fmt.Errorf("gateway.body_min_rate %d: want bytes a second, or -1 for off", gc.BodyMinRate)
	}
	nofile := fdlimit.Raise()
	l.maxConns = gc.MaxConnections
	switch {
	case l.maxConns < 0:
		return l, fmt.Errorf("gateway.max_connections %d must not be negative (0: from the descriptor limit)", l.maxConns)
	case l.maxConns == 0:
		// Each client connection may hold one upstream connection too.
		l.maxConns = defaultMaxConnections
		if nofile > 0 {
			if room := (int64(nofile) - descriptorReserve) / 2; room < int64(l.maxConns) {
				l.maxConns = int(max(room, 64))
			}
		}
	}
	if nofile > 0 && uint64(l.maxConns) >= nofile {
		return l, fmt.Errorf("gateway.max_connections %d must be below the descriptor limit %d", l.maxConns, nofile)
	}
	return l, nil
}

// readGatewayFile decodes the config file ("" : an empty config), refusing unknown keys.
func readGatewayFile(path string) (gatewayFile, error) {
	var fc gatewayFile
	if path == "" {
		return fc, nil
	}
	md, err := toml.DecodeFile(path, &fc)
	if err != nil {
		return fc, fmt.Errorf("config: %w", err)
	}
	if und := md.Undecoded(); len(und) > 0 {
		return fc, fmt.Errorf("config %s: unknown keys %v", path, und)
	}
	return fc, nil
}

func (fc *gatewayFile) quotaPolicy() (gateway.QuotaPolicy, error) {
	p := gateway.QuotaPolicy{Default: fc.Quota.Default.limits(), Buckets: map[string]gateway.Limits{}}
	for _, b := range fc.Quota.Bucket {
		if b.ID == "" {
			return p, errors.New("quota.bucket: an entry without id")
		}
		p.Buckets[b.ID] = b.limits()
	}
	return p, nil
}

// reloadGateway applies a SIGHUP: the config file's reloadable settings (checked whole
// before any is applied), then the files. Listen, upstreams, the usage log and the
// [auth] keys themselves take a restart; the files they name are read again.
func reloadGateway(path string, g *gateway.Gateway, cfg gateway.Config, cert *tlsfiles.Certificate, loadUpTok func() error) error {
	fc, err := readGatewayFile(path)
	if err != nil {
		return err
	}
	qp, err := fc.quotaPolicy()
	if err != nil {
		return err
	}
	gc := fc.Gateway
	if err := g.Update(gc.MaxRequestBodyBytes, gc.MaxInflightBody, gc.CORSAllowedOrigins); err != nil {
		return err
	}
	cfg.Quotas.SetPolicy(qp)
	var errs []error
	if cfg.Auth != nil {
		errs = append(errs, cfg.Auth.Reload())
	}
	errs = append(errs, loadUpTok())
	if cert != nil {
		errs = append(errs, cert.Reload())
	}
	return errors.Join(errs...)
}

// gatewayMain runs the gateway and returns the process exit code.
func gatewayMain(args []string, stderr io.Writer) int {
	err := runGateway(args, stderr)
	switch {
	case err == nil:
		return 0
	case errors.Is(err, flag.ErrHelp):
		return 0
	}
	fmt.Fprintf(stderr, "ursula gateway: %v\n", err)
	return 1
}
