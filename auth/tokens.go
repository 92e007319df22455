package auth

import (
	"bufio"
	"crypto/sha256"
	"fmt"
	"io"
	"strings"
)

// TokenSet is a parsed token file: each line "TOKEN SCOPE[,SCOPE...]", "#" starts a
// comment, blank lines are skipped. Tokens are kept by their SHA-256, so that looking one
// up does not compare secrets byte by byte.
type TokenSet struct {
	byHash map[[sha256.Size]byte]Scopes
}

// ParseTokenFile reads a token file.
func ParseTokenFile(r io.Reader) (*TokenSet, error) {
	ts := &TokenSet{byHash: map[[sha256.Size]byte]Scopes{}}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 4096), 1<<20)
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		if i := strings.IndexByte(line, '#'); i >= 0 {
			line = line[:i]
		}
		f := strings.Fields(line)
		if len(f) == 0 {
			continue
		}
		if len(f) < 2 {
			return nil, fmt.Errorf("line %d: want TOKEN SCOPE[,SCOPE...]", n)
		}
		scopes, err := ParseScopes(strings.Join(f[1:], ","))
		if err != nil {
			return nil, fmt.Errorf("line %d: %w", n, err)
		}
		h := sha256.Sum256([]byte(f[0]))
		if _, dup := ts.byHash[h]; dup {
			return nil, fmt.Errorf("line %d: the token is listed twice", n)
		}
		ts.byHash[h] = scopes
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	return ts, nil
}

// Lookup returns the scopes of token, or false when the file does not list it.
func (ts *TokenSet) Lookup(token string) (Scopes, bool) {
	if ts == nil {
		return Scopes{}, false
	}
	s, ok := ts.byHash[sha256.Sum256([]byte(token))]
	return s, ok
}

// Len is the number of tokens.
func (ts *TokenSet) Len() int { return len(ts.byHash) }
