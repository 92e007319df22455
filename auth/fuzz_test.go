package auth

import (
	"bytes"
	"crypto/rand"
	"crypto/rsa"
	"strings"
	"testing"

	"github.com/golang-jwt/jwt/v5"
)

// FuzzParseTokenFile: any input parses or fails cleanly; a listed token's scopes hold no
// word with a slash.
func FuzzParseTokenFile(f *testing.F) {
	f.Add("tok a-bucket,b-bucket\n# c\ntok2 *\ntok3 admin\n")
	f.Add("t\n")
	f.Add("t ,,,\n")
	f.Fuzz(func(t *testing.T, s string) {
		ts, err := ParseTokenFile(strings.NewReader(s))
		if err != nil {
			return
		}
		for _, sc := range ts.byHash {
			for b := range sc.Buckets {
				if strings.ContainsAny(b, "/*,") || b == ScopeAdmin {
					t.Fatalf("scope word %q kept as a bucket", b)
				}
			}
		}
	})
}

// FuzzParsePolicy: any input parses or fails cleanly; every owner has both halves.
func FuzzParsePolicy(f *testing.F) {
	f.Add(`[[bucket]]
id = "tenant-a"
public_read = true
owners = [{ issuer = "https://i", subject = "s" }]
`)
	f.Add("[[bucket]]\nid = 1\n")
	f.Fuzz(func(t *testing.T, s string) {
		p, err := ParsePolicy(bytes.NewReader([]byte(s)))
		if err != nil {
			return
		}
		for id, b := range p.buckets {
			if id != b.ID {
				t.Fatalf("bucket %q filed under %q", b.ID, id)
			}
			for _, o := range b.Owners {
				if o.Issuer == "" || o.Subject == "" {
					t.Fatal("an owner without issuer or subject")
				}
			}
			if p.Owns(id, "", "") {
				t.Fatal("the empty subject owns a bucket")
			}
		}
	})
}

// FuzzVerifyJWT: arbitrary token strings never verify against a key they were not signed
// with, and never panic the parser.
func FuzzVerifyJWT(f *testing.F) {
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		f.Fatal(err)
	}
	other, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		f.Fatal(err)
	}
	tok := jwt.NewWithClaims(jwt.SigningMethodRS256, claims("alice"))
	tok.Header["typ"] = "at+jwt"
	valid, _ := tok.SignedString(other)
	f.Add(valid)
	f.Add("eyJhbGciOiJub25lIiwidHlwIjoiYXQrand0In0.e30.")
	f.Add("..")
	v := newJWTVerifier(JWTConfig{Issuer: testIss, Audience: testAud}, func(*jwt.Token) (any, error) { return &key.PublicKey, nil })
	f.Fuzz(func(t *testing.T, s string) {
		if p, err := v.Verify(s); err == nil {
			t.Fatalf("an unsigned token verified: %+v", p)
		}
	})
}
