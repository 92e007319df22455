package streamcore

import (
	"fmt"
	"strconv"
)

// OffsetDigits is the width of every offset token: a zero-padded decimal byte position.
const OffsetDigits = 20

// FormatOffset renders a byte position as its 20-digit token.
func FormatOffset(off uint64) string {
	var b [OffsetDigits]byte
	for i := OffsetDigits - 1; i >= 0; i-- {
		b[i] = byte('0' + off%10)
		off /= 10
	}
	return string(b[:])
}

// ReadOffset is a parsed read offset: a position, the start sentinel (-1) or the tail (now).
type ReadOffset struct {
	Pos   uint64
	Start bool // "-1": the first retained byte
	Now   bool // "now": the tail
}

// ParseOffset accepts only the issued form: exactly 20 ASCII digits.
func ParseOffset(s string) (uint64, error) {
	if len(s) != OffsetDigits {
		return 0, fmt.Errorf("offset %q is not a 20-digit offset token", clip(s))
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return 0, fmt.Errorf("offset %q is not a 20-digit offset token", clip(s))
		}
	}
	v, err := strconv.ParseUint(s, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("offset %q is out of range", clip(s))
	}
	return v, nil
}

// ParseReadOffset accepts a 20-digit token or the read sentinels "-1" and "now".
func ParseReadOffset(s string) (ReadOffset, error) {
	switch s {
	case "-1":
		return ReadOffset{Start: true}, nil
	case "now":
		return ReadOffset{Now: true}, nil
	}
	p, err := ParseOffset(s)
	return ReadOffset{Pos: p}, err
}

// clip shortens client text quoted in messages.
func clip(s string) string {
	if len(s) > 40 {
		return s[:40] + "..."
	}
	return s
}
