package streamcore

import (
	"encoding/binary"
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
// UTF-8 byte order mark is refused as invalid JSON text (RFC 8259 forbids sending one; a
// parser MAY ignore it, but storing it or silently dropping bytes is worse than a clear 400).
// Each message may nest at most MaxJSONDepth deep; the flattened array does not count.
// Refusals are 400 INVALID_REQUEST (EMPTY_APPEND for `[]`) and name at most a byte position,
// never body text.
//
// One pass, no reflection; the only allocation is the output (at most len(body) bytes).
// Text between whitespace runs is copied in bulk, so compact input is one copy per message.
func NormalizeJSON(body []byte, allowEmptyArray bool) (stored []byte, count int, err *Error) {
	p := jsonParser{in: body}
	p.skipWS()
	if p.i >= len(p.in) {
		return nil, 0, jsonErr("body is empty; it must be JSON text")
	}
	if p.in[p.i] != '[' {
		p.out = make([]byte, 0, len(p.in)-p.i+1)
		p.mark = p.i
		if e := p.value(0); e != nil {
			return nil, 0, e
		}
		p.flush()
		p.out = append(p.out, '\n')
		p.skipWS()
		if p.i != len(p.in) {
			return nil, 0, p.fail("unexpected data after the top-level value")
		}
		return p.out, 1, nil
	}
	p.i++
	p.skipWS()
	if p.i < len(p.in) && p.in[p.i] == ']' {
		p.i++
		p.skipWS()
		if p.i != len(p.in) {
			return nil, 0, p.fail("unexpected data after the top-level value")
		}
		if allowEmptyArray {
			return nil, 0, nil
		}
		return nil, 0, Errorf(http.StatusBadRequest, CodeEmptyAppend, "an empty JSON array appends nothing")
	}
	// Each element is followed by ',' or ']' in the input and by one LF in the output, so
	// the rest of the body bounds the output.
	p.out = make([]byte, 0, len(p.in)-p.i)
	for {
		p.mark = p.i
		if e := p.value(0); e != nil {
			return nil, 0, e
		}
		p.flush()
		p.out = append(p.out, '\n')
		count++
		p.skipWS()
		if p.i >= len(p.in) {
			return nil, 0, p.fail("unterminated top-level array")
		}
		c := p.in[p.i]
		p.i++
		if c == ']' {
			break
		}
		if c != ',' {
			p.i--
			return nil, 0, p.fail("expected ',' or ']' in the top-level array")
		}
		p.skipWS()
	}
	p.skipWS()
	if p.i != len(p.in) {
		return nil, 0, p.fail("unexpected data after the top-level value")
	}
	return p.out, count, nil
}

func jsonErr(msg string) *Error {
	return Errorf(http.StatusBadRequest, CodeInvalidRequest, "invalid JSON: %s", msg)
}

// jsonParser validates in and copies it to out without insignificant whitespace. Bytes
// in[mark:i] are accepted but not yet copied; whitespace flushes them and moves mark past.
type jsonParser struct {
	in   []byte
	i    int
	mark int
	out  []byte
}

func (p *jsonParser) fail(msg string) *Error {
	return Errorf(http.StatusBadRequest, CodeInvalidRequest, "invalid JSON at byte %d: %s", p.i, msg)
}

func (p *jsonParser) flush() {
	p.out = append(p.out, p.in[p.mark:p.i]...)
	p.mark = p.i
}

func isJSONSpace(c byte) bool { return c <= ' ' && (c == ' ' || c == '\t' || c == '\n' || c == '\r') }

// skipWS skips whitespace outside a message (nothing pending to copy).
func (p *jsonParser) skipWS() {
	for p.i < len(p.in) && isJSONSpace(p.in[p.i]) {
		p.i++
	}
}

// ws skips whitespace inside a message, dropping it from the output. The check is small
// enough to inline; compact input never takes the call.
func (p *jsonParser) ws() {
	if p.i < len(p.in) && p.in[p.i] <= ' ' {
		p.dropWS()
	}
}

func (p *jsonParser) dropWS() {
	if !isJSONSpace(p.in[p.i]) {
		return // a control character: the caller refuses it
	}
	p.flush()
	p.skipWS()
	p.mark = p.i
}

// value parses one value whose enclosing containers number depth.
func (p *jsonParser) value(depth int) *Error {
	if p.i >= len(p.in) {
		return p.fail("unexpected end of input")
	}
	switch c := p.in[p.i]; c {
	case '"':
		return p.str()
	case '{', '[':
		if depth >= MaxJSONDepth {
			return Errorf(http.StatusBadRequest, CodeInvalidRequest, "JSON message nests deeper than %d levels", MaxJSONDepth)
		}
		if c == '{' {
			return p.object(depth + 1)
		}
		return p.array(depth + 1)
	case 't':
		return p.literal("true")
	case 'f':
		return p.literal("false")
	case 'n':
		return p.literal("null")
	case '-', '0', '1', '2', '3', '4', '5', '6', '7', '8', '9':
		return p.number()
	}
	return p.fail("unexpected character")
}

// object parses {...}; depth counts it.
func (p *jsonParser) object(depth int) *Error {
	p.i++
	p.ws()
	if p.i < len(p.in) && p.in[p.i] == '}' {
		p.i++
		return nil
	}
	for {
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
		p.i++
		p.ws()
		if e := p.value(depth); e != nil {
			return e
		}
		if done, e := p.next('}', "object"); done || e != nil {
			return e
		}
	}
}

// array parses [...]; depth counts it.
func (p *jsonParser) array(depth int) *Error {
	p.i++
	p.ws()
	if p.i < len(p.in) && p.in[p.i] == ']' {
		p.i++
		return nil
	}
	for {
		if e := p.value(depth); e != nil {
			return e
		}
		if done, e := p.next(']', "array"); done || e != nil {
			return e
		}
	}
}

// next consumes what follows a member or element of a container closed by end: a ','
// (more to come) or end itself (done).
func (p *jsonParser) next(end byte, what string) (done bool, e *Error) {
	p.ws()
	if p.i >= len(p.in) {
		return false, p.fail("unterminated " + what)
	}
	switch p.in[p.i] {
	case ',':
		p.i++
		p.ws()
		return false, nil
	case end:
		p.i++
		return true, nil
	}
	article := "a"
	if what == "array" || what == "object" {
		article = "an"
	}
	return false, p.fail("expected ',' or '" + string(end) + "' in " + article + " " + what)
}

func (p *jsonParser) literal(word string) *Error {
	if len(p.in)-p.i < len(word) || string(p.in[p.i:p.i+len(word)]) != word {
		return p.fail("invalid literal")
	}
	p.i += len(word)
	return nil
}

func (p *jsonParser) digits() int {
	start := p.i
	for p.i < len(p.in) && p.in[p.i] >= '0' && p.in[p.i] <= '9' {
		p.i++
	}
	return p.i - start
}

// number checks the RFC 8259 number grammar; the text is kept as written (1e400 too).
func (p *jsonParser) number() *Error {
	if p.in[p.i] == '-' {
		p.i++
	}
	if p.i < len(p.in) && p.in[p.i] == '0' {
		p.i++
	} else if p.digits() == 0 {
		return p.fail("invalid number")
	}
	if p.i < len(p.in) && p.in[p.i] == '.' {
		p.i++
		if p.digits() == 0 {
			return p.fail("invalid number fraction")
		}
	}
	if p.i < len(p.in) && (p.in[p.i] == 'e' || p.in[p.i] == 'E') {
		p.i++
		if p.i < len(p.in) && (p.in[p.i] == '+' || p.in[p.i] == '-') {
			p.i++
		}
		if p.digits() == 0 {
			return p.fail("invalid number exponent")
		}
	}
	return nil
}

// strPlain marks the bytes a string literal may contain with no further check: printable
// ASCII other than '"' and '\\'.
var strPlain = func() (t [256]bool) {
	for c := 0x20; c < 0x80; c++ {
		t[c] = c != '"' && c != '\\'
	}
	return t
}()

const (
	lsb64 = 0x0101010101010101
	msb64 = 0x8080808080808080
)

// plain8 reports whether all 8 bytes of x are strPlain (SWAR: no byte < 0x20, none equal
// to '"' or '\\', none with the high bit set). Each test detects whether some byte
// matches exactly (borrows only disturb bytes above a match), so a word with a non-plain
// byte always falls back to the bytewise loop.
func plain8(x uint64) bool {
	q := x ^ (lsb64 * '"')
	b := x ^ (lsb64 * '\\')
	lt := (x - lsb64*0x20) &^ x // some byte < 0x20 (exact for ASCII bytes)
	zq := (q - lsb64) &^ q      // some byte == '"'
	zb := (b - lsb64) &^ b      // some byte == '\\'
	return (lt|zq|zb|x)&msb64 == 0
}

// str validates a string literal (escapes, control characters, UTF-8); the text itself is
// kept verbatim, so \u escapes of unpaired surrogates pass through untouched.
func (p *jsonParser) str() *Error {
	in := p.in
	i := p.i + 1 // opening quote
	for {
		for i+8 <= len(in) && plain8(binary.LittleEndian.Uint64(in[i:])) {
			i += 8
		}
		for i < len(in) && strPlain[in[i]] {
			i++
		}
		if i >= len(in) {
			p.i = i
			return p.fail("unterminated string")
		}
		switch c := in[i]; {
		case c == '"':
			p.i = i + 1
			return nil
		case c == '\\':
			if i+1 >= len(in) {
				p.i = i
				return p.fail("unterminated escape")
			}
			switch in[i+1] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
				i += 2
			case 'u':
				if i+6 > len(in) || !isHex(in[i+2]) || !isHex(in[i+3]) || !isHex(in[i+4]) || !isHex(in[i+5]) {
					p.i = i
					return p.fail("invalid \\u escape")
				}
				i += 6
			default:
				p.i = i
				return p.fail("invalid escape")
			}
		case c < 0x20:
			p.i = i
			return p.fail("control character in a string")
		default: // c >= 0x80
			r, n := utf8.DecodeRune(in[i:])
			if r == utf8.RuneError && n <= 1 {
				p.i = i
				return p.fail("invalid UTF-8 in a string")
			}
			i += n
		}
	}
}

func isHex(c byte) bool { return c >= '0' && c <= '9' || c >= 'a' && c <= 'f' || c >= 'A' && c <= 'F' }
