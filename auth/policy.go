package auth

import (
	"fmt"
	"io"

	"github.com/BurntSushi/toml"

	"github.com/ursula-go/ursula/streamcore"
)

// Owner is an issuer-qualified subject: the same "sub" from another issuer is someone else.
type Owner struct {
	Issuer  string `toml:"issuer"`
	Subject string `toml:"subject"`
}

// BucketPolicy is one bucket's entry in the policy file.
type BucketPolicy struct {
	ID         string  `toml:"id"`
	PublicRead bool    `toml:"public_read"`
	Owners     []Owner `toml:"owners"`
}

// Policy is the tenant policy file:
//
//	[[bucket]]
//	id = "tenant-a"
//	public_read = true
//	owners = [{ issuer = "https://issuer.example", subject = "user-1" }]
type Policy struct {
	buckets map[string]*BucketPolicy
}

// ParsePolicy reads a policy file. Unknown keys, duplicate buckets and owners without an
// issuer or subject are refused, so a typo cannot silently open or close a bucket.
func ParsePolicy(r io.Reader) (*Policy, error) {
	var doc struct {
		Bucket []BucketPolicy `toml:"bucket"`
	}
	md, err := toml.NewDecoder(r).Decode(&doc)
	if err != nil {
		return nil, err
	}
	if und := md.Undecoded(); len(und) > 0 {
		return nil, fmt.Errorf("unknown key %s", und[0].String())
	}
	p := &Policy{buckets: map[string]*BucketPolicy{}}
	for i := range doc.Bucket {
		b := &doc.Bucket[i]
		if e := streamcore.ValidateBucketID(b.ID); e != nil {
			return nil, fmt.Errorf("bucket %d: id %q: %s", i+1, b.ID, e.Message)
		}
		if p.buckets[b.ID] != nil {
			return nil, fmt.Errorf("bucket %q is listed twice", b.ID)
		}
		for _, o := range b.Owners {
			if o.Issuer == "" || o.Subject == "" {
				return nil, fmt.Errorf("bucket %q: an owner needs issuer and subject", b.ID)
			}
		}
		p.buckets[b.ID] = b
	}
	return p, nil
}

// PublicRead reports whether anyone, without credentials, may read bucket.
func (p *Policy) PublicRead(bucket string) bool {
	if p == nil {
		return false
	}
	b := p.buckets[bucket]
	return b != nil && b.PublicRead
}

// Owns reports whether the subject of issuer owns bucket.
func (p *Policy) Owns(bucket, issuer, subject string) bool {
	if p == nil || subject == "" {
		return false
	}
	b := p.buckets[bucket]
	if b == nil {
		return false
	}
	for _, o := range b.Owners {
		if o.Issuer == issuer && o.Subject == subject {
			return true
		}
	}
	return false
}
