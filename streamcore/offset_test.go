package streamcore

import (
	"strings"
	"testing"
)

func TestParseReadOffset(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want ReadOffset
		ok   bool
	}{
		{"-1", ReadOffset{Start: true}, true},
		{"now", ReadOffset{Now: true}, true},
		{"00000000000000000042", ReadOffset{Pos: 42}, true},
		{"18446744073709551615", ReadOffset{Pos: 1<<64 - 1}, true},
		{"18446744073709551616", ReadOffset{}, false}, // overflows
		{"42", ReadOffset{}, false},                   // 4.5: only the issued form
		{"0000000000000000004a", ReadOffset{}, false},
		{"-2", ReadOffset{}, false},
		{"NOW", ReadOffset{}, false},
		{"", ReadOffset{}, false},
		{"+0000000000000000042", ReadOffset{}, false},
	} {
		got, err := ParseReadOffset(tc.in)
		if (err == nil) != tc.ok || tc.ok && got != tc.want {
			t.Errorf("ParseReadOffset(%q) = %+v, %v", tc.in, got, err)
		}
	}
}

func FuzzOffset(f *testing.F) {
	f.Add(uint64(0), "00000000000000000000")
	f.Add(uint64(1<<63), "-1")
	f.Fuzz(func(t *testing.T, n uint64, s string) {
		tok := FormatOffset(n)
		if len(tok) != OffsetDigits {
			t.Fatalf("token %q", tok)
		}
		back, err := ParseOffset(tok)
		if err != nil || back != n {
			t.Fatalf("round trip %d -> %q -> %d, %v", n, tok, back, err)
		}
		// Lexicographic order is positional order (4.2).
		if m := n / 3; (FormatOffset(m) < tok) != (m < n) {
			t.Fatalf("order of %d and %d", m, n)
		}
		if v, err := ParseOffset(s); err == nil && FormatOffset(v) != s {
			t.Fatalf("accepted a non-canonical offset %q", s)
		}
	})
}

func TestIDs(t *testing.T) {
	for _, b := range []string{"abcd", "a-b_c0", strings.Repeat("a", 64)} {
		if e := ValidateBucketID(b); e != nil {
			t.Errorf("bucket %q refused: %v", b, e)
		}
	}
	for _, b := range []string{"abc", "ABCD", "a.bc", strings.Repeat("a", 65), "snapshots", "__abc", "ab/c"} {
		if ValidateBucketID(b) == nil {
			t.Errorf("bucket %q accepted", b)
		}
	}
	for _, s := range []string{"x", "snapshot", "a.b", "héllo", strings.Repeat("s", 57)} {
		if e := ValidateStreamID("abcdefgh", s); e != nil {
			t.Errorf("stream %q refused: %v", s, e)
		}
	}
	long64 := strings.Repeat("b", 64)
	for _, s := range []string{"", "a/b", "a..b", "streams", "$tx", "a\x00b", "\xff", strings.Repeat("s", 58)} {
		if ValidateStreamID(long64, s) == nil {
			t.Errorf("stream %q accepted", s)
		}
	}
}

func FuzzIDs(f *testing.F) {
	f.Add("abcd", "stream")
	f.Fuzz(func(t *testing.T, b, s string) {
		if ValidateBucketID(b) == nil && ValidateStreamID(b, s) == nil {
			if len(b)+1+len(s) > MaxStreamIDBytes || strings.Contains(s, "/") || strings.Contains(s, "..") {
				t.Fatalf("accepted %q/%q", b, s)
			}
		}
	})
}

func TestNormalizeContentType(t *testing.T) {
	for in, want := range map[string]string{
		"Application/JSON":                   "application/json",
		" text/plain ; Charset=UTF-8 ":       "text/plain; charset=utf-8",
		"application/json;charset=utf-8;a=b": "application/json; charset=utf-8; a=b",
	} {
		if got, ok := NormalizeContentType(in); !ok || got != want {
			t.Errorf("%q -> %q", in, got)
		}
	}
	for _, bad := range []string{"", "text", "/plain", "text/", "te xt/plain", "text/plain; =x"} {
		if _, ok := NormalizeContentType(bad); ok {
			t.Errorf("%q accepted", bad)
		}
	}
}
