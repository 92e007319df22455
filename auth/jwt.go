package auth

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/MicahParks/keyfunc/v3"
	"github.com/golang-jwt/jwt/v5"
	"golang.org/x/time/rate"
)

// asymmetricAlgs are the only signature algorithms accepted. Leaving out "none" and the
// HMAC family closes the algorithm confusion attack, where a token is MACed with the
// issuer's public key as the shared secret.
var asymmetricAlgs = []string{"RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512", "EdDSA"}

// JWTConfig names the issuer whose access tokens a node accepts.
type JWTConfig struct {
	Issuer   string // required "iss"
	Audience string // required in "aud"
	// JWKSURL is where the issuer's keys are; empty: found by RFC 8414 discovery under
	// Issuer (/.well-known/oauth-authorization-server, then openid-configuration).
	JWKSURL string
	// HTTPClient fetches discovery and the JWKS (nil: a client with a 10 s timeout).
	HTTPClient *http.Client
	// Leeway tolerates clock skew on exp, nbf and iat (0: 30 s).
	Leeway time.Duration
}

// JWTVerifier checks RFC 9068 access tokens: header typ at+jwt, an asymmetric signature
// by a key of the issuer's JWKS (cached by kid and fetched again when an unknown kid
// appears, at most once a second), and the claims iss, aud, sub, client_id, iat, exp, jti.
type JWTVerifier struct {
	issuer string
	parser *jwt.Parser
	keys   jwt.Keyfunc
	now    func() time.Time

	mu    sync.Mutex
	cache map[string]verified // by the whole token, signature included
}

// verified is a token that passed Verify, good until until.
type verified struct {
	p     *Principal
	until time.Time
}

// A token that verified is taken again without its signature check for at most
// VerifiedTTL (and never past its exp): a signature check costs tens of microseconds, a
// request carries the same token many times. A key the issuer withdraws from its JWKS
// therefore stops tokens already seen within VerifiedTTL. The cache holds at most
// VerifiedMax tokens; past that it starts over.
const (
	VerifiedTTL = 30 * time.Second
	VerifiedMax = 4096
)

// accessClaims are the claims of an RFC 9068 access token that a node reads.
type accessClaims struct {
	jwt.RegisteredClaims
	ClientID string `json:"client_id"`
	Scope    string `json:"scope"`
}

// NewJWTVerifier fetches the issuer's keys (a failing first fetch is retried on the first
// token) and returns the verifier. ctx ends the background JWKS refresh.
func NewJWTVerifier(ctx context.Context, cfg JWTConfig) (*JWTVerifier, error) {
	if cfg.Issuer == "" || cfg.Audience == "" {
		return nil, errors.New("auth.issuer and auth.audience are both required for JWT access tokens")
	}
	hc := cfg.HTTPClient
	if hc == nil {
		hc = &http.Client{Timeout: 10 * time.Second}
	}
	url := cfg.JWKSURL
	if url == "" {
		u, err := discoverJWKS(ctx, hc, cfg.Issuer)
		if err != nil {
			return nil, err
		}
		url = u
	}
	kf, err := keyfunc.NewDefaultOverrideCtx(ctx, []string{url}, keyfunc.Override{
		Client:            hc,
		HTTPTimeout:       10 * time.Second,
		RefreshInterval:   time.Hour,
		RefreshUnknownKID: rate.NewLimiter(rate.Every(time.Second), 1),
		RateLimitWaitMax:  time.Second,
	})
	if err != nil {
		return nil, fmt.Errorf("jwks %s: %w", url, err)
	}
	return newJWTVerifier(cfg, kf.Keyfunc), nil
}

func newJWTVerifier(cfg JWTConfig, keys jwt.Keyfunc) *JWTVerifier {
	leeway := cfg.Leeway
	if leeway == 0 {
		leeway = 30 * time.Second
	}
	return &JWTVerifier{
		issuer: cfg.Issuer,
		keys:   keys,
		now:    time.Now,
		cache:  map[string]verified{},
		parser: jwt.NewParser(
			jwt.WithValidMethods(asymmetricAlgs),
			jwt.WithIssuer(cfg.Issuer),
			jwt.WithAudience(cfg.Audience),
			jwt.WithExpirationRequired(),
			jwt.WithIssuedAt(),
			jwt.WithLeeway(leeway),
		),
	}
}

// Verify checks token and returns its principal.
func (v *JWTVerifier) Verify(token string) (*Principal, error) {
	now := v.now()
	v.mu.Lock()
	hit, ok := v.cache[token]
	v.mu.Unlock()
	if ok && now.Before(hit.until) {
		return hit.p, nil
	}
	p, err := v.verify(token)
	if err != nil {
		return nil, err
	}
	until := now.Add(VerifiedTTL)
	if p.Expires.Before(until) {
		until = p.Expires
	}
	v.mu.Lock()
	if len(v.cache) >= VerifiedMax {
		clear(v.cache)
	}
	v.cache[token] = verified{p: p, until: until}
	v.mu.Unlock()
	return p, nil
}

// verify checks token's signature and claims.
func (v *JWTVerifier) verify(token string) (*Principal, error) {
	var c accessClaims
	_, err := v.parser.ParseWithClaims(token, &c, func(t *jwt.Token) (any, error) {
		// The type is checked before any key is looked up, so that an ID token or a
		// token of another kind never causes a JWKS fetch.
		typ, _ := t.Header["typ"].(string)
		if !strings.EqualFold(typ, "at+jwt") && !strings.EqualFold(typ, "application/at+jwt") {
			return nil, fmt.Errorf("token type %q is not an access token (at+jwt)", typ)
		}
		return v.keys(t)
	})
	if err != nil {
		return nil, err
	}
	switch {
	case c.Subject == "":
		return nil, errors.New("token has no sub")
	case c.ClientID == "":
		return nil, errors.New("token has no client_id")
	case c.IssuedAt == nil:
		return nil, errors.New("token has no iat")
	case c.ID == "":
		return nil, errors.New("token has no jti")
	}
	scopes, err := ParseScopes(c.Scope)
	if err != nil {
		scopes = Scopes{} // a scope of the issuer's own vocabulary grants nothing here
	}
	return &Principal{Issuer: c.Issuer, Subject: c.Subject, Scopes: scopes, Expires: c.ExpiresAt.Time}, nil
}

// discoverJWKS reads jwks_uri from the issuer's RFC 8414 metadata (or, failing that, its
// OpenID configuration).
func discoverJWKS(ctx context.Context, hc *http.Client, issuer string) (string, error) {
	base := strings.TrimRight(issuer, "/")
	var lastErr error
	for _, p := range []string{"/.well-known/oauth-authorization-server", "/.well-known/openid-configuration"} {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+p, nil)
		if err != nil {
			return "", err
		}
		resp, err := hc.Do(req)
		if err != nil {
			lastErr = err
			continue
		}
		body, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
		resp.Body.Close()
		if err != nil || resp.StatusCode != http.StatusOK {
			lastErr = fmt.Errorf("%s: status %d", base+p, resp.StatusCode)
			continue
		}
		var md struct {
			Issuer  string `json:"issuer"`
			JWKSURI string `json:"jwks_uri"`
		}
		if err := json.Unmarshal(body, &md); err != nil || md.JWKSURI == "" {
			lastErr = fmt.Errorf("%s: no jwks_uri", base+p)
			continue
		}
		if md.Issuer != issuer {
			return "", fmt.Errorf("%s: metadata names issuer %q, not %q", base+p, md.Issuer, issuer)
		}
		return md.JWKSURI, nil
	}
	return "", fmt.Errorf("auth.jwks_url is not set and discovery under %s failed: %v", issuer, lastErr)
}
