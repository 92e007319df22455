package streamcore

import (
	"net/http"
	"unicode/utf8"
)

// NormalizeJSON applies the JSON message text rule (checklist-protocol 6) to a write body:
// it validates the whole body as RFC 8259 JSON text, flattens a top-level array by exactly
// one level, and returns the stored form: each message with insignificant whitespace
// removed (member order, duplicate names, number and string text kept byte-for-byte)
// followed by one LF. count is the number of messages.
//
// A body of `[]` is an empty stream when allowEmptyArray (create) and EMPTY_APPEND
// otherwise. Unpaired surrogate escapes and numbers outside double range are valid. A
// UTF-8 byte order mark is refused as invalid JSON text (RFC 8259 forbids sending one).
// Each message may nest at most MaxJSONDepth deep; the flattened array does not count.
func NormalizeJSON(body []byte, allowEmptyArray bool) (stored []byte, count int, err *Error) {
	p := jsonParser{in: body, out: make([]byte, 0, len(body)+1)}
	p.ws()
	if p.i >= len(p.in) {
		return nil, 0, jsonErr("body is empty; it must be JSON text")
	}
	if p.in[p.i] == '[' {
		p.i++
		p.ws()
		if p.i < len(p.in) && p.in[p.i] == ']' {
			p.i++
			p.ws()
			if p.i != len(p.in) {
				return nil, 0, p.fail("unexpected data after the top-level value")
			}
			if allowEmptyArray {
				return nil, 0, nil
			}
			return nil, 0, Errorf(http.StatusBadRequest, CodeEmptyAppend, "an empty JSON array appends nothing")
		}
		for {
			if e := p.value(0); e != nil {
				return nil, 0, e
			}
			p.out = append(p.out, '\n')
			count++
			p.ws()
			if p.i >= len(p.in) {
				return nil, 0, p.fail("unterminated top-level array")
			}
			c := p.in[p.i]
			p.i++
			if c == ']' {
				break
			}
			if c != ',' {
				return nil, 0, p.fail("expected ',' or ']' in the top-level array")
			}
			p.ws()
		}
	} else {
		if e := p.value(0); e != nil {
			return nil, 0, e
		}
		p.out = append(p.out, '\n')
		count = 1
	}
	p.ws()
	if p.i != len(p.in) {
		return nil, 0, p.fail("unexpected data after the top-level value")
	}
	return p.out, count, nil
}

func jsonErr(msg string) *Error {
	return Errorf(http.StatusBadRequest, CodeInvalidRequest, "invalid JSON: %s", msg)
}

type jsonParser struct {
	in  []byte
	i   int
	out []byte
}

func (p *jsonParser) fail(msg string) *Error {
	return Errorf(http.StatusBadRequest, CodeInvalidRequest, "invalid JSON at byte %d: %s", p.i, msg)
}

func (p *jsonParser) ws() {
	for p.i < len(p.in) {
		switch p.in[p.i] {
		case ' ', '\t', '\n', '\r':
			p.i++
		default:
			return
		}
	}
}

// value parses one value whose enclosing containers number depth, copying it compactly.
func (p *jsonParser) value(depth int) *Error {
	if p.i >= len(p.in) {
		return p.fail("unexpected end of input")
	}
	switch c := p.in[p.i]; {
	case c == '{' || c == '[':
		if depth+1 > MaxJSONDepth {
			return Errorf(http.StatusBadRequest, CodeInvalidRequest, "JSON message nests deeper than %d levels", MaxJSONDepth)
		}
		return p.container(depth + 1)
	case c == '"':
		return p.str()
	case c == '-' || c >= '0' && c <= '9':
		return p.number()
	case c == 't':
		return p.literal("true")
	case c == 'f':
		return p.literal("false")
	case c == 'n':
		return p.literal("null")
	}
	return p.fail("unexpected character")
}

func (p *jsonParser) container(depth int) *Error {
	open := p.in[p.i]
	close := byte(']')
	if open == '{' {
		close = '}'
	}
	p.out = append(p.out, open)
	p.i++
	p.ws()
	if p.i < len(p.in) && p.in[p.i] == close {
		p.out = append(p.out, close)
		p.i++
		return nil
	}
	for {
		if open == '{' {
			if p.i >= len(p.in) || p.in[p.i] != '"' {
				return p.fail("expected a string member name")
			}
			if e := p.str(); e != nil {
				return e
			}
			p.ws()
			if p.i >= len(p.in) || p.in[p.i] != ':' {
				return p.fail("expected ':' after a member name")
			}
			p.out = append(p.out, ':')
			p.i++
			p.ws()
		}
		if e := p.value(depth); e != nil {
			return e
		}
		p.ws()
		if p.i >= len(p.in) {
			return p.fail("unterminated container")
		}
		c := p.in[p.i]
		p.i++
		if c == close {
			p.out = append(p.out, close)
			return nil
		}
		if c != ',' {
			return p.fail("expected ',' or the end of the container")
		}
		p.out = append(p.out, ',')
		p.ws()
	}
}

func (p *jsonParser) literal(word string) *Error {
	if len(p.in)-p.i < len(word) || string(p.in[p.i:p.i+len(word)]) != word {
		return p.fail("invalid literal")
	}
	p.out = append(p.out, word...)
	p.i += len(word)
	return nil
}

func (p *jsonParser) number() *Error {
	start := p.i
	if p.in[p.i] == '-' {
		p.i++
	}
	digits := func() int {
		n := 0
		for p.i < len(p.in) && p.in[p.i] >= '0' && p.in[p.i] <= '9' {
			p.i++
			n++
		}
		return n
	}
	if p.i < len(p.in) && p.in[p.i] == '0' {
		p.i++
	} else if digits() == 0 {
		return p.fail("invalid number")
	}
	if p.i < len(p.in) && p.in[p.i] == '.' {
		p.i++
		if digits() == 0 {
			return p.fail("invalid number fraction")
		}
	}
	if p.i < len(p.in) && (p.in[p.i] == 'e' || p.in[p.i] == 'E') {
		p.i++
		if p.i < len(p.in) && (p.in[p.i] == '+' || p.in[p.i] == '-') {
			p.i++
		}
		if digits() == 0 {
			return p.fail("invalid number exponent")
		}
	}
	p.out = append(p.out, p.in[start:p.i]...)
	return nil
}

func isHex(c byte) bool { return c >= '0' && c <= '9' || c >= 'a' && c <= 'f' || c >= 'A' && c <= 'F' }

// str copies a string literal verbatim after validating escapes and UTF-8.
func (p *jsonParser) str() *Error {
	start := p.i
	p.i++ // opening quote
	for p.i < len(p.in) {
		c := p.in[p.i]
		switch {
		case c == '"':
			p.i++
			p.out = append(p.out, p.in[start:p.i]...)
			return nil
		case c == '\\':
			if p.i+1 >= len(p.in) {
				return p.fail("unterminated escape")
			}
			switch p.in[p.i+1] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
				p.i += 2
			case 'u':
				if p.i+6 > len(p.in) || !isHex(p.in[p.i+2]) || !isHex(p.in[p.i+3]) || !isHex(p.in[p.i+4]) || !isHex(p.in[p.i+5]) {
					return p.fail("invalid \\u escape")
				}
				p.i += 6
			default:
				return p.fail("invalid escape")
			}
		case c < 0x20:
			return p.fail("control character in a string")
		case c < 0x80:
			p.i++
		default:
			r, n := utf8.DecodeRune(p.in[p.i:])
			if r == utf8.RuneError && n <= 1 {
				return p.fail("invalid UTF-8 in a string")
			}
			p.i += n
		}
	}
	return p.fail("unterminated string")
}
