package auth

import (
	"fmt"
	"strings"
)

// Scopes is what a credential grants: some buckets by id, every bucket ("*"), and the
// operational routes ("admin"). "*" does not include admin.
type Scopes struct {
	Buckets    map[string]bool
	AllBuckets bool
	Admin      bool
}

// ScopeAdmin and ScopeAllBuckets are the two scope words that are not bucket ids.
const (
	ScopeAdmin      = "admin"
	ScopeAllBuckets = "*"
)

// ParseScopes reads scope words separated by commas or spaces (the token file uses
// commas, a JWT "scope" claim spaces). A bucket id holds no comma, space or slash.
func ParseScopes(s string) (Scopes, error) {
	var sc Scopes
	for _, w := range strings.FieldsFunc(s, func(r rune) bool { return r == ',' || r == ' ' || r == '\t' }) {
		switch {
		case w == ScopeAdmin:
			sc.Admin = true
		case w == ScopeAllBuckets:
			sc.AllBuckets = true
		case strings.ContainsAny(w, "/*"):
			return Scopes{}, fmt.Errorf("scope %q is neither a bucket id, %q nor %q", w, ScopeAllBuckets, ScopeAdmin)
		default:
			if sc.Buckets == nil {
				sc.Buckets = map[string]bool{}
			}
			sc.Buckets[w] = true
		}
	}
	return sc, nil
}

// Bucket reports whether the scopes cover bucket.
func (s Scopes) Bucket(bucket string) bool { return s.AllBuckets || s.Buckets[bucket] }
