package auth

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"strings"
	"sync/atomic"
	"time"

	"github.com/ursula-go/ursula/tlsfiles"
)

// Principal is who a valid credential speaks for.
type Principal struct {
	Issuer  string // JWT "iss"; "" for a token-file token
	Subject string // JWT "sub"; "" for a token-file token
	Scopes  Scopes
	Expires time.Time // zero: the credential does not expire (token file)
}

// Action is what a request does to its resource.
type Action int

const (
	// Read covers GET and HEAD of streams, snapshots, bootstrap and immutable objects:
	// what public_read opens to anonymous callers.
	Read Action = iota + 1
	// Write covers everything else on a bucket: create, append, close, delete,
	// snapshot publication, retention.
	Write
	// Admin covers the operational routes (metrics, Raft and cold-tier operations).
	Admin
)

// Decision is the answer to one request.
type Decision int

const (
	// Allow lets the request reach its resource.
	Allow Decision = iota + 1
	// Unauthenticated asks for credentials: 401.
	Unauthenticated
	// Conceal answers as if the resource did not exist: 404. A caller without the
	// bucket's scope must not learn whether anything is there.
	Conceal
)

// Config is the [auth] section. Any field set turns authentication on.
type Config struct {
	TokenFile  string // static tokens: "TOKEN SCOPE[,SCOPE...]" per line
	Issuer     string // JWT access tokens: required iss
	Audience   string // JWT access tokens: required aud
	JWKSURL    string // the issuer's keys (empty: RFC 8414 discovery under Issuer)
	PolicyFile string // per-bucket owners and public_read (TOML)
	// JWKSCAFile is PEM CA certificates that verify the TLS of the JWKS URL and of
	// discovery (only those: the system roots are then not consulted). Empty: the
	// system roots.
	JWKSCAFile string
	// HTTPClient fetches JWKS and discovery documents (nil: default, 10 s timeout).
	HTTPClient *http.Client
}

// Enabled reports whether any auth setting is present.
func (c Config) Enabled() bool {
	return c.TokenFile != "" || c.Issuer != "" || c.Audience != "" || c.JWKSURL != "" || c.PolicyFile != ""
}

// ErrBadCredentials is returned for a credential that is present but not valid.
var ErrBadCredentials = errors.New("invalid credentials")

// Authorizer authenticates requests and decides what they may do. The token and policy
// files are swapped atomically by Reload, so requests never see half of a file.
type Authorizer struct {
	cfg    Config
	tokens atomic.Pointer[TokenSet]
	policy atomic.Pointer[Policy]
	jwt    *JWTVerifier
}

// New loads the files of cfg and, when an issuer is configured, the JWT verifier. ctx
// ends the verifier's background key refresh.
func New(ctx context.Context, cfg Config) (*Authorizer, error) {
	if !cfg.Enabled() {
		return nil, errors.New("auth: nothing configured")
	}
	a := &Authorizer{cfg: cfg}
	if err := a.Reload(); err != nil {
		return nil, err
	}
	if cfg.JWKSCAFile != "" && cfg.Issuer == "" && cfg.JWKSURL == "" {
		return nil, errors.New("auth.jwks_ca_file is set without auth.issuer or auth.jwks_url")
	}
	if cfg.Issuer != "" || cfg.Audience != "" || cfg.JWKSURL != "" {
		hc := cfg.HTTPClient
		if cfg.JWKSCAFile != "" {
			tc, err := tlsfiles.ClientConfigFromCAFile(cfg.JWKSCAFile)
			if err != nil {
				return nil, fmt.Errorf("auth.jwks_ca_file: %w", err)
			}
			hc = &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: tc, Proxy: nil}}
		}
		v, err := NewJWTVerifier(ctx, JWTConfig{Issuer: cfg.Issuer, Audience: cfg.Audience, JWKSURL: cfg.JWKSURL, HTTPClient: hc})
		if err != nil {
			return nil, err
		}
		a.jwt = v
	}
	return a, nil
}

// Reload reads the token file and the policy file again. On an error the previous
// contents stay in force.
func (a *Authorizer) Reload() error {
	var ts *TokenSet
	var pol *Policy
	if a.cfg.TokenFile != "" {
		f, err := os.Open(a.cfg.TokenFile)
		if err != nil {
			return fmt.Errorf("auth.token_file: %w", err)
		}
		ts, err = ParseTokenFile(f)
		f.Close()
		if err != nil {
			return fmt.Errorf("auth.token_file %s: %w", a.cfg.TokenFile, err)
		}
	}
	if a.cfg.PolicyFile != "" {
		f, err := os.Open(a.cfg.PolicyFile)
		if err != nil {
			return fmt.Errorf("auth.policy_file: %w", err)
		}
		pol, err = ParsePolicy(f)
		f.Close()
		if err != nil {
			return fmt.Errorf("auth.policy_file %s: %w", a.cfg.PolicyFile, err)
		}
	}
	a.tokens.Store(ts)
	a.policy.Store(pol)
	return nil
}

// Authenticate reads an Authorization header value. An empty header is an anonymous
// caller: (nil, nil). Anything else must be "Bearer <token>" with a token the token file
// lists or a valid access token of the issuer; otherwise the error wraps ErrBadCredentials.
func (a *Authorizer) Authenticate(header string) (*Principal, error) {
	if header == "" {
		return nil, nil
	}
	scheme, tok, ok := strings.Cut(header, " ")
	tok = strings.TrimSpace(tok)
	if !ok || !strings.EqualFold(scheme, "Bearer") || tok == "" {
		return nil, fmt.Errorf("%w: want Authorization: Bearer <token>", ErrBadCredentials)
	}
	if sc, ok := a.tokens.Load().Lookup(tok); ok {
		return &Principal{Scopes: sc}, nil
	}
	if a.jwt == nil {
		return nil, fmt.Errorf("%w: unknown token", ErrBadCredentials)
	}
	p, err := a.jwt.Verify(tok)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrBadCredentials, err)
	}
	return p, nil
}

// Decide answers whether p (nil: anonymous) may do act on bucket ("" for Admin).
func (a *Authorizer) Decide(p *Principal, bucket string, act Action) Decision {
	if act == Admin {
		switch {
		case p == nil:
			return Unauthenticated
		case p.Scopes.Admin:
			return Allow
		}
		return Conceal
	}
	pol := a.policy.Load()
	if p != nil && (p.Scopes.Bucket(bucket) || pol.Owns(bucket, p.Issuer, p.Subject)) {
		return Allow
	}
	if act == Read && pol.PublicRead(bucket) {
		return Allow
	}
	if p == nil {
		return Unauthenticated
	}
	return Conceal
}

type principalKey struct{}

// NewContext returns ctx carrying p.
func NewContext(ctx context.Context, p *Principal) context.Context {
	return context.WithValue(ctx, principalKey{}, p)
}

// FromContext returns the principal of ctx (nil: anonymous or auth off).
func FromContext(ctx context.Context) *Principal {
	p, _ := ctx.Value(principalKey{}).(*Principal)
	return p
}
