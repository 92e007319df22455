package main

// The node's security settings: TLS on the client listener, mutual TLS between peers,
// authentication, and the refusal to face a network unprotected unless told to.

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"syscall"

	"github.com/ursula-go/ursula/auth"
	raftengine "github.com/ursula-go/ursula/engine/raft"
	"github.com/ursula-go/ursula/tlsfiles"
)

// authConfig is the [auth] section; any key set turns authentication on.
type authConfig struct {
	TokenFile  string `toml:"token_file"`
	Issuer     string `toml:"issuer"`
	Audience   string `toml:"audience"`
	JWKSURL    string `toml:"jwks_url"`
	JWKSCAFile string `toml:"jwks_ca_file"`
	PolicyFile string `toml:"policy_file"`
}

// security is what a node's listeners and handlers need from those settings.
type security struct {
	cert     *tlsfiles.Certificate // nil: plain HTTP
	auth     *auth.Authorizer      // nil: every request is let in
	peer     *raftengine.PeerTLS   // nil: plain TCP between peers
	peerCert *tlsfiles.Certificate
}

// loadSecurity reads the TLS pair and the auth files, and refuses a listener on a
// non-loopback address that lacks TLS or auth unless server.insecure is set. ctx ends
// the JWKS refresh.
func loadSecurity(ctx context.Context, fc *fileConfig, addr string, logger *slog.Logger) (*security, error) {
	sec := &security{}
	s := &fc.Server
	if s.TLSCertFile != "" || s.TLSKeyFile != "" {
		c, err := tlsfiles.LoadCertificate(s.TLSCertFile, s.TLSKeyFile)
		if err != nil {
			return nil, fmt.Errorf("server.tls_cert_file/tls_key_file: %w", err)
		}
		sec.cert = c
	}
	if r := &fc.Raft; r.TLSCAFile != "" || r.TLSCertFile != "" || r.TLSKeyFile != "" {
		if r.TLSCAFile == "" {
			return nil, errors.New("raft.tls_cert_file/tls_key_file need raft.tls_ca_file (the cluster CA)")
		}
		pool, err := tlsfiles.LoadCAPool(r.TLSCAFile)
		if err != nil {
			return nil, fmt.Errorf("raft.tls_ca_file: %w", err)
		}
		c, err := tlsfiles.LoadCertificate(r.TLSCertFile, r.TLSKeyFile)
		if err != nil {
			return nil, fmt.Errorf("raft.tls_cert_file/tls_key_file: %w", err)
		}
		sec.peerCert = c
		sec.peer = &raftengine.PeerTLS{Server: tlsfiles.MutualServerConfig(c, pool), Client: tlsfiles.ClientConfig(pool, c)}
	}
	ac := auth.Config{TokenFile: fc.Auth.TokenFile, Issuer: fc.Auth.Issuer, Audience: fc.Auth.Audience,
		JWKSURL: fc.Auth.JWKSURL, PolicyFile: fc.Auth.PolicyFile, JWKSCAFile: fc.Auth.JWKSCAFile}
	if ac.Enabled() {
		a, err := auth.New(ctx, ac)
		if err != nil {
			return nil, fmt.Errorf("auth: %w", err)
		}
		sec.auth = a
	}
	if !isLoopback(addr) && (sec.cert == nil || sec.auth == nil) {
		var missing []string
		if sec.cert == nil {
			missing = append(missing, "TLS (server.tls_cert_file, server.tls_key_file)")
		}
		if sec.auth == nil {
			missing = append(missing, "authentication (auth.token_file or auth.issuer)")
		}
		if !s.Insecure {
			return nil, fmt.Errorf("listen %s is not a loopback address and the node has no %v: anyone who reaches it could read, write and delete every stream; configure them, or set server.insecure = true to run this way on purpose", addr, missing)
		}
		for i := 0; i < 3; i++ { // loud on purpose: this is easy to miss in a log
			logger.Warn("INSECURE: serving a non-loopback address without protection (server.insecure = true)", "addr", addr, "missing", missing)
		}
	}
	return sec, nil
}

// checkClusterListener refuses a cluster listener on a non-loopback address without
// mutual TLS unless insecure: peers would otherwise accept any TCP connection as a peer.
func (sec *security) checkClusterListener(bind string, insecure bool, logger *slog.Logger) error {
	if sec.peer != nil || isLoopback(bind) {
		return nil
	}
	if !insecure {
		return fmt.Errorf("cluster listener %s is not a loopback address and peer traffic has no mutual TLS: anyone who reaches it could act as a peer; set raft.tls_ca_file, raft.tls_cert_file and raft.tls_key_file, or server.insecure = true to run this way on purpose", bind)
	}
	logger.Warn("INSECURE: the cluster listener accepts peers without mutual TLS (server.insecure = true)", "addr", bind)
	return nil
}

// scheme is the URL scheme of the client listener.
func (sec *security) scheme() string {
	if sec.cert != nil {
		return "https"
	}
	return "http"
}

// serverTLS is the TLS config of the node's listeners (client and admin), nil for plain
// HTTP. TLS is terminated in the listener (resolvedLimits.httpServer), HTTP/2 and
// HTTP/1.1 offered as http.Server.ServeTLS offers them.
func (sec *security) serverTLS() *tls.Config {
	if sec.cert == nil {
		return nil
	}
	return tlsfiles.ServerConfig(sec.cert)
}

// reloadOnHUP loads the certificate and the auth files again on every SIGHUP until ctx
// ends. (The certificate also follows its files by itself; SIGHUP forces the load.)
func (sec *security) reloadOnHUP(ctx context.Context, logger *slog.Logger) {
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	go func() {
		defer signal.Stop(hup)
		for {
			select {
			case <-ctx.Done():
				return
			case <-hup:
			}
			var errs []error
			if sec.cert != nil {
				errs = append(errs, sec.cert.Reload())
			}
			if sec.peerCert != nil {
				errs = append(errs, sec.peerCert.Reload())
			}
			if sec.auth != nil {
				errs = append(errs, sec.auth.Reload())
			}
			if err := errors.Join(errs...); err != nil {
				logger.Error("SIGHUP: reload failed; the previous files stay in force", "err", err)
			} else {
				logger.Info("SIGHUP: TLS certificate and auth files reloaded")
			}
		}
	}()
}

// isLoopback reports whether addr (host:port) binds only loopback interfaces. An empty
// host or an unspecified address binds every interface.
func isLoopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		host = addr
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}
