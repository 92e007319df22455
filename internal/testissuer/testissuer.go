// Package testissuer is a token issuer for tests: RSA keys by kid, a JWKS endpoint on
// loopback that publishes the keys in rotation, and RFC 9068 access tokens signed with
// them. Keys are generated at run time.
package testissuer

import (
	"crypto/rand"
	"crypto/rsa"
	"crypto/tls"
	"encoding/base64"
	"encoding/json"
	"math/big"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
)

// Issuer and Audience are the iss and aud of Claims.
const (
	Issuer   = "https://issuer.test"
	Audience = "https://streams.test"
)

// Issuer signs tokens and serves its JWKS.
type TestIssuer struct {
	mu        sync.Mutex
	keys      map[string]*rsa.PrivateKey
	published []string
	srv       *httptest.Server
}

// New starts an issuer publishing a fresh key for each kid.
func New(t testing.TB, kids ...string) *TestIssuer {
	t.Helper()
	is := &TestIssuer{keys: map[string]*rsa.PrivateKey{}}
	for _, k := range kids {
		is.AddKey(t, k)
	}
	is.srv = httptest.NewServer(http.HandlerFunc(is.serveJWKS))
	t.Cleanup(is.srv.Close)
	return is
}

// NewTLS is New serving its JWKS over HTTPS with the certificate pair given in PEM.
func NewTLS(t testing.TB, certPEM, keyPEM []byte, kids ...string) *TestIssuer {
	t.Helper()
	is := &TestIssuer{keys: map[string]*rsa.PrivateKey{}}
	for _, k := range kids {
		is.AddKey(t, k)
	}
	pair, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	is.srv = httptest.NewUnstartedServer(http.HandlerFunc(is.serveJWKS))
	is.srv.TLS = &tls.Config{Certificates: []tls.Certificate{pair}}
	is.srv.StartTLS()
	t.Cleanup(is.srv.Close)
	return is
}

// JWKSURL is where the issuer publishes its keys.
func (is *TestIssuer) JWKSURL() string { return is.srv.URL }

func (is *TestIssuer) serveJWKS(w http.ResponseWriter, r *http.Request) {
	is.mu.Lock()
	defer is.mu.Unlock()
	var set struct {
		Keys []map[string]string `json:"keys"`
	}
	for _, kid := range is.published {
		pub := is.keys[kid].PublicKey
		set.Keys = append(set.Keys, map[string]string{
			"kty": "RSA", "kid": kid, "use": "sig", "alg": "RS256",
			"n": base64.RawURLEncoding.EncodeToString(pub.N.Bytes()),
			"e": base64.RawURLEncoding.EncodeToString(big.NewInt(int64(pub.E)).Bytes()),
		})
	}
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(set)
}

// AddKey makes a key for kid and publishes it.
func (is *TestIssuer) AddKey(t testing.TB, kid string) {
	t.Helper()
	k, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	is.mu.Lock()
	is.keys[kid] = k
	is.published = append(is.published, kid)
	is.mu.Unlock()
}

// Publish sets the kids the JWKS lists.
func (is *TestIssuer) Publish(kids ...string) {
	is.mu.Lock()
	is.published = kids
	is.mu.Unlock()
}

// PublicKey returns kid's public key.
func (is *TestIssuer) PublicKey(kid string) *rsa.PublicKey {
	is.mu.Lock()
	defer is.mu.Unlock()
	return &is.keys[kid].PublicKey
}

// Claims returns valid access token claims for sub, expiring in ttl.
func Claims(sub string, ttl time.Duration) jwt.MapClaims {
	now := time.Now()
	return jwt.MapClaims{
		"iss": Issuer, "aud": Audience, "sub": sub, "client_id": "app",
		"iat": now.Unix(), "exp": now.Add(ttl).Unix(), "jti": "j-" + sub,
	}
}

// Sign signs c with kid's key (RS256) under the header typ.
func (is *TestIssuer) Sign(t testing.TB, kid string, c jwt.MapClaims, typ string) string {
	t.Helper()
	tok := jwt.NewWithClaims(jwt.SigningMethodRS256, c)
	tok.Header["kid"] = kid
	tok.Header["typ"] = typ
	is.mu.Lock()
	key := is.keys[kid]
	is.mu.Unlock()
	s, err := tok.SignedString(key)
	if err != nil {
		t.Fatal(err)
	}
	return s
}
