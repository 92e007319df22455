package auth

import (
	"context"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"math/big"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
)

// issuer is a test token issuer: RSA keys by kid and a JWKS endpoint on loopback that
// publishes the keys currently in rotation.
type issuer struct {
	mu        sync.Mutex
	keys      map[string]*rsa.PrivateKey
	published []string
	srv       *httptest.Server
}

const (
	testIss = "https://issuer.test"
	testAud = "https://streams.test"
)

func newIssuer(t testing.TB, kids ...string) *issuer {
	t.Helper()
	is := &issuer{keys: map[string]*rsa.PrivateKey{}}
	for _, k := range kids {
		is.addKey(t, k)
	}
	is.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
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
	}))
	t.Cleanup(is.srv.Close)
	return is
}

func (is *issuer) addKey(t testing.TB, kid string) {
	k, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	is.mu.Lock()
	is.keys[kid] = k
	is.published = append(is.published, kid)
	is.mu.Unlock()
}

// claims returns valid access token claims for sub.
func claims(sub string) jwt.MapClaims {
	now := time.Now()
	return jwt.MapClaims{
		"iss": testIss, "aud": testAud, "sub": sub, "client_id": "app",
		"iat": now.Unix(), "exp": now.Add(time.Hour).Unix(), "jti": "j-" + sub,
	}
}

// sign signs c with kid's key; typ defaults to at+jwt.
func (is *issuer) sign(t testing.TB, kid string, c jwt.MapClaims, typ string) string {
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

func (is *issuer) verifier(t testing.TB) *JWTVerifier {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	v, err := NewJWTVerifier(ctx, JWTConfig{Issuer: testIss, Audience: testAud, JWKSURL: is.srv.URL, HTTPClient: is.srv.Client()})
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func TestJWTVerify(t *testing.T) {
	is := newIssuer(t, "k1")
	v := is.verifier(t)
	with := func(edit func(jwt.MapClaims)) jwt.MapClaims {
		c := claims("alice")
		edit(c)
		return c
	}
	pub := is.keys["k1"].PublicKey
	der, err := x509.MarshalPKIXPublicKey(&pub)
	if err != nil {
		t.Fatal(err)
	}
	pemKey := pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der})
	hsWith := func(secret []byte) string {
		tok := jwt.NewWithClaims(jwt.SigningMethodHS256, claims("alice"))
		tok.Header["kid"] = "k1"
		tok.Header["typ"] = "at+jwt"
		s, err := tok.SignedString(secret)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	none := jwt.NewWithClaims(jwt.SigningMethodNone, claims("alice"))
	none.Header["kid"] = "k1"
	none.Header["typ"] = "at+jwt"
	noneTok, err := none.SignedString(jwt.UnsafeAllowNoneSignatureType)
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name  string
		token string
		ok    bool
	}{
		{"valid", is.sign(t, "k1", claims("alice"), "at+jwt"), true},
		{"media type typ", is.sign(t, "k1", claims("alice"), "application/at+jwt"), true},
		{"expired", is.sign(t, "k1", with(func(c jwt.MapClaims) { c["exp"] = time.Now().Add(-time.Hour).Unix() }), "at+jwt"), false},
		{"no exp", is.sign(t, "k1", with(func(c jwt.MapClaims) { delete(c, "exp") }), "at+jwt"), false},
		{"wrong audience", is.sign(t, "k1", with(func(c jwt.MapClaims) { c["aud"] = "https://other.test" }), "at+jwt"), false},
		{"wrong issuer", is.sign(t, "k1", with(func(c jwt.MapClaims) { c["iss"] = "https://evil.test" }), "at+jwt"), false},
		{"id token typ", is.sign(t, "k1", claims("alice"), "JWT"), false},
		{"no typ", is.sign(t, "k1", claims("alice"), ""), false},
		{"no sub", is.sign(t, "k1", with(func(c jwt.MapClaims) { delete(c, "sub") }), "at+jwt"), false},
		{"no client_id", is.sign(t, "k1", with(func(c jwt.MapClaims) { delete(c, "client_id") }), "at+jwt"), false},
		{"no jti", is.sign(t, "k1", with(func(c jwt.MapClaims) { delete(c, "jti") }), "at+jwt"), false},
		{"no iat", is.sign(t, "k1", with(func(c jwt.MapClaims) { delete(c, "iat") }), "at+jwt"), false},
		{"iat in the future", is.sign(t, "k1", with(func(c jwt.MapClaims) { c["iat"] = time.Now().Add(time.Hour).Unix() }), "at+jwt"), false},
		{"alg none", noneTok, false},
		{"HS256 keyed with the public key PEM", hsWith(pemKey), false},
		{"HS256 keyed with the public key DER", hsWith(der), false},
		{"tampered payload", tamper(is.sign(t, "k1", claims("alice"), "at+jwt")), false},
		{"garbage", "not.a.token", false},
	}
	for _, c := range cases {
		p, err := v.Verify(c.token)
		if (err == nil) != c.ok {
			t.Errorf("%s: err = %v, want ok=%v", c.name, err, c.ok)
			continue
		}
		if c.ok && (p.Subject != "alice" || p.Issuer != testIss || p.Expires.IsZero()) {
			t.Errorf("%s: principal %+v", c.name, p)
		}
	}
}

// tamper changes the subject of a signed token without signing it again.
func tamper(tok string) string {
	parts := strings.Split(tok, ".")
	b, _ := base64.RawURLEncoding.DecodeString(parts[1])
	b = []byte(strings.Replace(string(b), `"alice"`, `"mallory"`, 1))
	parts[1] = base64.RawURLEncoding.EncodeToString(b)
	return strings.Join(parts, ".")
}

func TestJWTKeyRotation(t *testing.T) {
	is := newIssuer(t, "k1")
	v := is.verifier(t)
	if _, err := v.Verify(is.sign(t, "k1", claims("alice"), "at+jwt")); err != nil {
		t.Fatalf("k1 before rotation: %v", err)
	}
	// A key that the JWKS does not publish is unknown, whoever signed with it.
	is.addKey(t, "k2")
	is.mu.Lock()
	is.published = []string{"k1"}
	is.mu.Unlock()
	if _, err := v.Verify(is.sign(t, "k2", claims("alice"), "at+jwt")); err == nil {
		t.Fatal("a token signed by an unpublished key verified")
	}
	// The issuer rotates to k2: the unknown kid makes the verifier fetch the JWKS again.
	is.mu.Lock()
	is.published = []string{"k1", "k2"}
	is.mu.Unlock()
	var err error
	for i := 0; i < 3; i++ { // the refetch is rate limited to one a second
		if _, err = v.Verify(is.sign(t, "k2", claims("alice"), "at+jwt")); err == nil {
			break
		}
		time.Sleep(1100 * time.Millisecond)
	}
	if err != nil {
		t.Fatalf("k2 after rotation: %v", err)
	}
}
