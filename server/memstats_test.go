package server

import "testing"

func TestParseStatmRSS(t *testing.T) {
	for _, c := range []struct {
		in   string
		want uint64
	}{
		{"1000 250 30 4 0 60 0\n", 250 * 4096},
		{"1000 0 30 4 0 60 0", 0},
		{"1000", 0},
		{"", 0},
		{"1000 x 30", 0},
		{"  7   3  ", 3 * 4096},
	} {
		if got := parseStatmRSS([]byte(c.in), 4096); got != c.want {
			t.Errorf("parseStatmRSS(%q) = %d, want %d", c.in, got, c.want)
		}
	}
}
