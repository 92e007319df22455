package auth

import (
	"context"
	"crypto/x509"
	"encoding/base64"
	"encoding/pem"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"

	"github.com/ursula-go/ursula/internal/testcerts"
	"github.com/ursula-go/ursula/internal/testissuer"
)

const (
	testIss = testissuer.Issuer
	testAud = testissuer.Audience
)

func claims(sub string) jwt.MapClaims { return testissuer.Claims(sub, time.Hour) }

func verifierOf(t testing.TB, is *testissuer.TestIssuer) *JWTVerifier {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	v, err := NewJWTVerifier(ctx, JWTConfig{Issuer: testIss, Audience: testAud, JWKSURL: is.JWKSURL()})
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func TestJWTVerify(t *testing.T) {
	is := testissuer.New(t, "k1")
	v := verifierOf(t, is)
	with := func(edit func(jwt.MapClaims)) jwt.MapClaims {
		c := claims("alice")
		edit(c)
		return c
	}
	der, err := x509.MarshalPKIXPublicKey(is.PublicKey("k1"))
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
		{"valid", is.Sign(t, "k1", claims("alice"), "at+jwt"), true},
		{"media type typ", is.Sign(t, "k1", claims("alice"), "application/at+jwt"), true},
		{"expired", is.Sign(t, "k1", with(func(c jwt.MapClaims) { c["exp"] = time.Now().Add(-time.Hour).Unix() }), "at+jwt"), false},
		{"no exp", is.Sign(t, "k1", with(func(c jwt.MapClaims) { delete(c, "exp") }), "at+jwt"), false},
		{"wrong audience", is.Sign(t, "k1", with(func(c jwt.MapClaims) { c["aud"] = "https://other.test" }), "at+jwt"), false},
		{"wrong issuer", is.Sign(t, "k1", with(func(c jwt.MapClaims) { c["iss"] = "https://evil.test" }), "at+jwt"), false},
		{"id token typ", is.Sign(t, "k1", claims("alice"), "JWT"), false},
		{"no typ", is.Sign(t, "k1", claims("alice"), ""), false},
		{"no sub", is.Sign(t, "k1", with(func(c jwt.MapClaims) { delete(c, "sub") }), "at+jwt"), false},
		{"no client_id", is.Sign(t, "k1", with(func(c jwt.MapClaims) { delete(c, "client_id") }), "at+jwt"), false},
		{"no jti", is.Sign(t, "k1", with(func(c jwt.MapClaims) { delete(c, "jti") }), "at+jwt"), false},
		{"no iat", is.Sign(t, "k1", with(func(c jwt.MapClaims) { delete(c, "iat") }), "at+jwt"), false},
		{"iat in the future", is.Sign(t, "k1", with(func(c jwt.MapClaims) { c["iat"] = time.Now().Add(time.Hour).Unix() }), "at+jwt"), false},
		{"alg none", noneTok, false},
		{"HS256 keyed with the public key PEM", hsWith(pemKey), false},
		{"HS256 keyed with the public key DER", hsWith(der), false},
		{"tampered payload", tamper(is.Sign(t, "k1", claims("alice"), "at+jwt")), false},
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
	is := testissuer.New(t, "k1")
	v := verifierOf(t, is)
	if _, err := v.Verify(is.Sign(t, "k1", claims("alice"), "at+jwt")); err != nil {
		t.Fatalf("k1 before rotation: %v", err)
	}
	// A key that the JWKS does not publish is unknown, whoever signed with it.
	is.AddKey(t, "k2")
	is.Publish("k1")
	if _, err := v.Verify(is.Sign(t, "k2", claims("alice"), "at+jwt")); err == nil {
		t.Fatal("a token signed by an unpublished key verified")
	}
	// The issuer rotates to k2: the unknown kid makes the verifier fetch the JWKS again.
	is.Publish("k1", "k2")
	var err error
	for i := 0; i < 3; i++ { // the refetch is rate limited to one a second
		if _, err = v.Verify(is.Sign(t, "k2", claims("alice"), "at+jwt")); err == nil {
			break
		}
		time.Sleep(1100 * time.Millisecond)
	}
	if err != nil {
		t.Fatalf("k2 after rotation: %v", err)
	}
}

// auth.jwks_ca_file verifies the JWKS URL's TLS: the issuer's CA lets tokens verify;
// another CA (or the system roots) refuses the issuer at start.
func TestJWKSCAFile(t *testing.T) {
	dir := t.TempDir()
	ca := testcerts.NewCA(t, "issuer-ca")
	pair := ca.Issue(t, "issuer")
	is := testissuer.NewTLS(t, pair.CertPEM, pair.KeyPEM, "k1")
	if !strings.HasPrefix(is.JWKSURL(), "https://") {
		t.Fatalf("issuer not on TLS: %s", is.JWKSURL())
	}
	caFile := ca.WriteCA(t, dir, "ca.crt")
	otherCA := testcerts.NewCA(t, "other").WriteCA(t, dir, "other.crt")
	cfg := func(caFile string) Config {
		return Config{Issuer: testIss, Audience: testAud, JWKSURL: is.JWKSURL(), JWKSCAFile: caFile}
	}
	a, err := New(t.Context(), cfg(caFile))
	if err != nil {
		t.Fatal(err)
	}
	p, err := a.Authenticate("Bearer " + is.Sign(t, "k1", claims("alice"), "at+jwt"))
	if err != nil || p.Subject != "alice" {
		t.Fatalf("token from the TLS issuer: %v %+v", err, p)
	}
	for _, bad := range []string{otherCA, ""} {
		if a, err := New(t.Context(), cfg(bad)); err == nil {
			if _, err := a.Authenticate("Bearer " + is.Sign(t, "k1", claims("alice"), "at+jwt")); err == nil {
				t.Fatalf("CA file %q: the issuer's TLS was trusted", bad)
			}
		}
	}
	if _, err := New(t.Context(), cfg(filepath.Join(dir, "missing.crt"))); err == nil {
		t.Fatal("a missing CA file was accepted")
	}
}

// A token that verified is taken again without a signature check until VerifiedTTL or its
// exp; a token that failed is checked every time.
func TestJWTVerifiedCache(t *testing.T) {
	is := testissuer.New(t, "k1")
	v := verifierOf(t, is)
	keys, calls := v.keys, 0
	v.keys = func(tk *jwt.Token) (any, error) { calls++; return keys(tk) }
	clock := time.Now()
	v.now = func() time.Time { return clock }
	tok := is.Sign(t, "k1", claims("alice"), "at+jwt")
	for i := range 3 {
		p, err := v.Verify(tok)
		if err != nil || p.Subject != "alice" {
			t.Fatalf("verify %d: %v %v", i, p, err)
		}
	}
	if calls != 1 {
		t.Fatalf("%d signature checks for one token verified three times, want 1", calls)
	}
	clock = clock.Add(VerifiedTTL)
	if _, err := v.Verify(tok); err != nil || calls != 2 {
		t.Fatalf("after VerifiedTTL: %v, %d checks, want 2", err, calls)
	}
	// Past its exp a cached token is not taken from the cache (the clock here is the
	// cache's; the parser, on the real clock, still accepts it).
	short := is.Sign(t, "k1", testissuer.Claims("bob", 2*time.Second), "at+jwt")
	if _, err := v.Verify(short); err != nil {
		t.Fatal(err)
	}
	clock = clock.Add(3 * time.Second)
	n := calls
	v.Verify(short)
	if calls != n+1 {
		t.Fatal("a cached token was taken past its exp")
	}
	bad := tamper(tok)
	for range 2 {
		if _, err := v.Verify(bad); err == nil {
			t.Fatal("a tampered token verified")
		}
	}
	if _, ok := v.cache[bad]; ok {
		t.Fatal("a tampered token was cached")
	}
}
