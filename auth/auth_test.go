package auth

import (
	"strings"
	"testing"
	"time"
)

func TestParseTokenFile(t *testing.T) {
	ts, err := ParseTokenFile(strings.NewReader(`# tokens
tok-a  tenant-a,tenant-b   # two buckets
tok-all *
tok-admin admin

tok-both *,admin
`))
	if err != nil {
		t.Fatal(err)
	}
	if ts.Len() != 4 {
		t.Fatalf("Len = %d, want 4", ts.Len())
	}
	cases := []struct {
		tok, bucket            string
		known, bucketOK, admin bool
	}{
		{"tok-a", "tenant-a", true, true, false},
		{"tok-a", "tenant-c", true, false, false},
		{"tok-all", "anything", true, true, false},
		{"tok-admin", "tenant-a", true, false, true},
		{"tok-both", "x", true, true, true},
		{"tok-", "tenant-a", false, false, false},
		{"#", "tenant-a", false, false, false},
	}
	for _, c := range cases {
		sc, ok := ts.Lookup(c.tok)
		if ok != c.known || sc.Bucket(c.bucket) != c.bucketOK || sc.Admin != c.admin {
			t.Errorf("%s on %s: known=%v bucket=%v admin=%v", c.tok, c.bucket, ok, sc.Bucket(c.bucket), sc.Admin)
		}
	}
	for _, bad := range []string{"lonely-token\n", "t a/b\n", "t a*\n", "t a\nt b\n"} {
		if _, err := ParseTokenFile(strings.NewReader(bad)); err == nil {
			t.Errorf("%q: parsed, want an error", bad)
		}
	}
}

func TestParsePolicy(t *testing.T) {
	p, err := ParsePolicy(strings.NewReader(`
[[bucket]]
id = "tenant-a"
public_read = true
owners = [{ issuer = "https://issuer.example", subject = "user-1" }]

[[bucket]]
id = "tenant-b"
owners = [{ issuer = "https://issuer.example", subject = "user-2" }]
`))
	if err != nil {
		t.Fatal(err)
	}
	if !p.PublicRead("tenant-a") || p.PublicRead("tenant-b") || p.PublicRead("unknown") {
		t.Error("public_read wrong")
	}
	if !p.Owns("tenant-a", "https://issuer.example", "user-1") {
		t.Error("owner not recognized")
	}
	if p.Owns("tenant-a", "https://other.example", "user-1") || p.Owns("tenant-b", "https://issuer.example", "user-1") || p.Owns("tenant-a", "", "") {
		t.Error("a stranger owns a bucket")
	}
	for _, bad := range []string{
		"[[bucket]]\nid = \"aaaa\"\npublic = true\n",                  // typo of public_read
		"[[bucket]]\nid = \"aaaa\"\n[[bucket]]\nid = \"aaaa\"\n",      // twice
		"[[bucket]]\nid = \"aaaa\"\nowners = [{ subject = \"s\" }]\n", // no issuer
		"[[bucket]]\nid = \"\"\n",
		"[[bucket]]\nid = \"a/b\"\n",
	} {
		if _, err := ParsePolicy(strings.NewReader(bad)); err == nil {
			t.Errorf("%q: parsed, want an error", bad)
		}
	}
}

func TestDecide(t *testing.T) {
	a := &Authorizer{}
	pol, err := ParsePolicy(strings.NewReader(`
[[bucket]]
id = "pub1"
public_read = true
owners = [{ issuer = "iss", subject = "alice" }]
[[bucket]]
id = "priv1"
owners = [{ issuer = "iss", subject = "alice" }]
`))
	if err != nil {
		t.Fatal(err)
	}
	a.policy.Store(pol)
	alice := &Principal{Issuer: "iss", Subject: "alice", Expires: time.Now().Add(time.Hour)}
	bob := &Principal{Issuer: "iss", Subject: "bob"}
	scoped := &Principal{Scopes: Scopes{Buckets: map[string]bool{"priv1": true}}}
	all := &Principal{Scopes: Scopes{AllBuckets: true}}
	admin := &Principal{Scopes: Scopes{Admin: true}}
	cases := []struct {
		name   string
		p      *Principal
		bucket string
		act    Action
		want   Decision
	}{
		{"anonymous reads public", nil, "pub1", Read, Allow},
		{"anonymous writes public", nil, "pub1", Write, Unauthenticated},
		{"anonymous reads private", nil, "priv1", Read, Unauthenticated},
		{"anonymous admin", nil, "", Admin, Unauthenticated},
		{"owner writes", alice, "priv1", Write, Allow},
		{"stranger reads private", bob, "priv1", Read, Conceal},
		{"stranger reads public", bob, "pub1", Read, Allow},
		{"stranger writes public", bob, "pub1", Write, Conceal},
		{"stranger on unknown bucket", bob, "nope1", Read, Conceal},
		{"scope grants", scoped, "priv1", Write, Allow},
		{"scope is not other buckets", scoped, "other1", Read, Conceal},
		{"star grants any bucket", all, "other1", Write, Allow},
		{"star is not admin", all, "", Admin, Conceal},
		{"admin is admin", admin, "", Admin, Allow},
		{"admin is no bucket", admin, "priv1", Read, Conceal},
	}
	for _, c := range cases {
		if got := a.Decide(c.p, c.bucket, c.act); got != c.want {
			t.Errorf("%s: got %v, want %v", c.name, got, c.want)
		}
	}
}
