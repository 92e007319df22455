package streamcore

import (
	"bytes"
	"encoding/json"
	"regexp"
	"strings"
	"testing"
	"unicode/utf8"
)

// jsonErrMessage is the shape of every refusal message: fixed text and at most a byte
// position, never body text (checklist-protocol 3.3).
var jsonErrMessage = regexp.MustCompile(`^(invalid JSON( at byte [0-9]+)?: [a-zA-Z0-9 ',;:\\{}\[\]-]+|JSON message nests deeper than 127 levels|an empty JSON array appends nothing)$`)

func TestNormalizeJSONTable(t *testing.T) {
	arr := func(n int) string { return strings.Repeat("[", n) + strings.Repeat("]", n) }
	for _, tc := range []struct {
		name, in, want string
		n              int
		create         bool
		code, msg      string // refusal code and a substring of its message
	}{
		{name: "object", in: `{"a":1}`, want: "{\"a\":1}\n", n: 1},
		{name: "scalars", in: `[true,false,null,0,-0,"",1.5E+3,-2e-2]`, want: "true\nfalse\nnull\n0\n-0\n\"\"\n1.5E+3\n-2e-2\n", n: 8},
		{name: "huge number verbatim", in: `[1e400,-1E-400,123456789012345678901234567890]`, want: "1e400\n-1E-400\n123456789012345678901234567890\n", n: 3},
		{name: "all escapes verbatim", in: `"\"\\\/\b\f\n\r\t\u00E9\uD83D\uDE00"`, want: `"\"\\\/\b\f\n\r\t\u00E9\uD83D\uDE00"` + "\n", n: 1},
		{name: "lone low surrogate", in: `["\udc00","x\uDBFF"]`, want: "\"\\udc00\"\n\"x\\uDBFF\"\n", n: 2},
		{name: "whitespace inside strings kept", in: "[ \" a\\t b \" , { \"k y\" : \" \" } ]", want: "\" a\\t b \"\n{\"k y\":\" \"}\n", n: 2},
		{name: "raw UTF-8 and U+2028 kept", in: "\"\u00e9\u2028\u4e16\U0001F600\x7f\"", want: "\"\u00e9\u2028\u4e16\U0001F600\x7f\"\n", n: 1},
		{name: "long plain string", in: `"` + strings.Repeat("abcdefgh", 9) + `"`, want: `"` + strings.Repeat("abcdefgh", 9) + `"` + "\n", n: 1},
		{name: "all whitespace kinds", in: " \t\r\n[ \t\r\n{ \t\r\n\"a\" \t\r\n: \t\r\n[ \t\r\n1 \t\r\n, \t\r\n2 \t\r\n] \t\r\n} \t\r\n] \t\r\n", want: "{\"a\":[1,2]}\n", n: 1},
		{name: "nested arrays flattened once", in: `[[],[[]],{}]`, want: "[]\n[[]]\n{}\n", n: 3},
		{name: "create empty array", in: "\n[\t]\r", create: true},
		{name: "depth 127 object in array", in: "[" + strings.Repeat(`{"a":`, 127) + "0" + strings.Repeat("}", 127) + "]", want: strings.Repeat(`{"a":`, 127) + "0" + strings.Repeat("}", 127) + "\n", n: 1},
		{name: "depth 127 per element", in: "[" + arr(127) + "," + arr(127) + "]", want: arr(127) + "\n" + arr(127) + "\n", n: 2},
		{name: "depth 128 element", in: "[1," + arr(128) + "]", code: CodeInvalidRequest, msg: "deeper than 127"},
		{name: "depth 128 array body", in: arr(128), want: arr(127) + "\n", n: 1},
		{name: "depth 129 array body", in: arr(129), code: CodeInvalidRequest, msg: "deeper"},
		{name: "depth 128 object body", in: strings.Repeat(`{"a":`, 128) + "0" + strings.Repeat("}", 128), code: CodeInvalidRequest, msg: "deeper"},
		{name: "empty append", in: " [ ] ", code: CodeEmptyAppend},
		{name: "empty body", in: "", code: CodeInvalidRequest, msg: "empty"},
		{name: "whitespace body", in: " \r\n\t", code: CodeInvalidRequest, msg: "empty"},
		{name: "BOM", in: "\xef\xbb\xbf{}", code: CodeInvalidRequest, msg: "at byte 0"},
		{name: "NUL", in: "\x00", code: CodeInvalidRequest},
		{name: "form feed is not whitespace", in: "\f1", code: CodeInvalidRequest},
		{name: "NBSP is not whitespace", in: "1\u00a0", code: CodeInvalidRequest},
		{name: "bare minus", in: "-", code: CodeInvalidRequest},
		{name: "trailing dot", in: "1.", code: CodeInvalidRequest},
		{name: "leading dot", in: ".5", code: CodeInvalidRequest},
		{name: "plus sign", in: "+1", code: CodeInvalidRequest},
		{name: "leading zero", in: "-01", code: CodeInvalidRequest, msg: "at byte 2"},
		{name: "bare exponent", in: "1e", code: CodeInvalidRequest},
		{name: "hex", in: "0x1", code: CodeInvalidRequest},
		{name: "NaN", in: "NaN", code: CodeInvalidRequest},
		{name: "short u escape", in: `"\u12"`, code: CodeInvalidRequest},
		{name: "bad escape", in: `"\x41"`, code: CodeInvalidRequest},
		{name: "raw tab in string", in: "\"a\tb\"", code: CodeInvalidRequest},
		{name: "raw LF in string", in: "[\"a\nb\"]", code: CodeInvalidRequest, msg: "at byte 3"},
		{name: "invalid UTF-8", in: "[\"ok\",\"\xc3\x28\"]", code: CodeInvalidRequest, msg: "UTF-8"},
		{name: "UTF-8 surrogate", in: "\"\xed\xa0\x80\"", code: CodeInvalidRequest, msg: "UTF-8"},
		{name: "overlong UTF-8", in: "\"\xc0\xaf\"", code: CodeInvalidRequest, msg: "UTF-8"},
		{name: "invalid byte outside string", in: "[1,\xff]", code: CodeInvalidRequest},
		{name: "unterminated string", in: `"abc`, code: CodeInvalidRequest},
		{name: "unterminated top array", in: `[1,2`, code: CodeInvalidRequest},
		{name: "unterminated nested", in: `[[1,2]`, code: CodeInvalidRequest},
		{name: "missing comma", in: `[1 2]`, code: CodeInvalidRequest},
		{name: "trailing comma object", in: `{"a":1,}`, code: CodeInvalidRequest},
		{name: "single quotes", in: `{'a':1}`, code: CodeInvalidRequest},
		{name: "unquoted name", in: `{a:1}`, code: CodeInvalidRequest},
		{name: "two values", in: `{} {}`, code: CodeInvalidRequest},
		{name: "data after array", in: `[1] 2`, code: CodeInvalidRequest},
		{name: "data after empty array", in: `[] 2`, code: CodeInvalidRequest},
		{name: "comment", in: `1 // x`, code: CodeInvalidRequest},
		{name: "literal prefix", in: `nul`, code: CodeInvalidRequest},
		{name: "literal suffix", in: `truex`, code: CodeInvalidRequest},
	} {
		got, n, err := NormalizeJSON([]byte(tc.in), tc.create)
		if tc.code != "" {
			if err == nil || err.Status != 400 || err.Code != tc.code || !strings.Contains(err.Message, tc.msg) || !jsonErrMessage.MatchString(err.Message) {
				t.Errorf("%s: got %q, %v; want a 400 %s mentioning %q", tc.name, got, err, tc.code, tc.msg)
			}
			continue
		}
		if err != nil || string(got) != tc.want || n != tc.n {
			t.Errorf("%s: got %q n=%d err=%v; want %q n=%d", tc.name, got, n, err, tc.want, tc.n)
		}
		if n > 0 && cap(got) > len(tc.in)+1 {
			t.Errorf("%s: output capacity %d for a %d-byte body", tc.name, cap(got), len(tc.in))
		}
	}
}

// jsonDepthOracle is the nesting depth of valid JSON text (brackets outside strings).
func jsonDepthOracle(b []byte) int {
	depth, maxDepth, inStr := 0, 0, false
	for i := 0; i < len(b); i++ {
		switch c := b[i]; {
		case inStr && c == '\\':
			i++
		case c == '"':
			inStr = !inStr
		case inStr:
		case c == '[' || c == '{':
			depth++
			maxDepth = max(maxDepth, depth)
		case c == ']' || c == '}':
			depth--
		}
	}
	return maxDepth
}

// normalizeOracle is the JSON message rule built from encoding/json (json.Compact without
// escaping only drops whitespace; RawMessage keeps element text verbatim).
func normalizeOracle(in []byte, allowEmpty bool) (out []byte, n int, ok bool, code string) {
	if !json.Valid(in) || !utf8.Valid(in) {
		return nil, 0, false, CodeInvalidRequest
	}
	msgs := [][]byte{in}
	if t := bytes.TrimLeft(in, " \t\r\n"); t[0] == '[' {
		var elems []json.RawMessage
		if json.Unmarshal(in, &elems) != nil {
			panic("valid array did not unmarshal")
		}
		if len(elems) == 0 {
			if allowEmpty {
				return nil, 0, true, ""
			}
			return nil, 0, false, CodeEmptyAppend
		}
		msgs = msgs[:0]
		for _, e := range elems {
			msgs = append(msgs, e)
		}
	}
	for _, m := range msgs {
		if jsonDepthOracle(m) > MaxJSONDepth {
			return nil, 0, false, CodeInvalidRequest
		}
		var buf bytes.Buffer
		if err := json.Compact(&buf, m); err != nil {
			panic(err)
		}
		out = append(append(out, buf.Bytes()...), '\n')
	}
	return out, len(msgs), true, ""
}

func jsonSeeds(f *testing.F) {
	for _, s := range []string{
		`{"a":[1,2,{"b":null}]}`, `[1,2]`, `"\ud800"`, `-0.5e-3`, `[]`, ` [ ] `, `[[],{}]`, "\"é\"", `1e400`,
		"[ {\"a\" : \"x y\"} ,\n\t2 ]", "\xef\xbb\xbf[]", "\"\xed\xa0\x80\"", `"abcdefgh\"abcdefgh\\abcdefgh"`,
		"\"abcdefg\x01\"", "\"abcdefg\u00e9abcdefgh\"", `{"a":1,"a":2}`, `[0,-0,0.0e0]`, "[\"\\u0000\"]",
		strings.Repeat("[", 128) + strings.Repeat("]", 128), strings.Repeat("[", 129) + strings.Repeat("]", 129),
		"[1," + strings.Repeat("[", 128) + strings.Repeat("]", 128) + "]",
	} {
		f.Add([]byte(s), false)
		f.Add([]byte(s), true)
	}
}

// FuzzNormalizeJSONOracle checks NormalizeJSON against the encoding/json oracle (success
// exactly when json.Valid, valid UTF-8 and shallow enough; identical output), that refusals
// are well-formed 400s, and that stored text is a fixed point: re-posting the stored
// messages as one array gives back the same bytes.
func FuzzNormalizeJSONOracle(f *testing.F) {
	jsonSeeds(f)
	f.Fuzz(func(t *testing.T, in []byte, create bool) {
		out, n, err := NormalizeJSON(in, create)
		want, wantN, ok, code := normalizeOracle(in, create)
		if err != nil {
			if err.Status != 400 || !jsonErrMessage.MatchString(err.Message) {
				t.Fatalf("refusal %v for %q", err, in)
			}
			if ok || err.Code != code {
				t.Fatalf("%q: refused with %v, oracle ok=%v code=%s", in, err, ok, code)
			}
			return
		}
		if !ok {
			t.Fatalf("%q: accepted as %q, oracle refuses with %s", in, out, code)
		}
		if !bytes.Equal(out, want) || n != wantN {
			t.Fatalf("%q: got %q (%d), oracle %q (%d)", in, out, n, want, wantN)
		}
		if bytes.Count(out, []byte("\n")) != n || len(out) > len(in)+1 {
			t.Fatalf("%q: %d messages in %q", in, n, out)
		}
		if n == 0 {
			return
		}
		lines := bytes.Split(out[:len(out)-1], []byte("\n"))
		for _, m := range lines {
			if !json.Valid(m) || jsonDepthOracle(m) > MaxJSONDepth {
				t.Fatalf("stored message %q is not JSON within the depth limit", m)
			}
		}
		again, n2, err := NormalizeJSON(append(append([]byte("["), bytes.Join(lines, []byte(","))...), ']'), false)
		if err != nil || n2 != n || !bytes.Equal(again, out) {
			t.Fatalf("stored %q is not a fixed point: %q %d %v", out, again, n2, err)
		}
	})
}

func benchBodies() map[string][]byte {
	var pretty, compact, strs, nums strings.Builder
	pretty.WriteString("[\n")
	compact.WriteString("[")
	strs.WriteString("[")
	nums.WriteString("[")
	for i := range 400 {
		if i > 0 {
			pretty.WriteString(",\n")
			compact.WriteString(",")
			strs.WriteString(",")
			nums.WriteString(",")
		}
		pretty.WriteString(`  {"id": 12345, "name": "a fairly ordinary name", "tags": ["x", "y", "z"], "score": 1.5e3, "ok": true}`)
		compact.WriteString(`{"id":12345,"name":"a fairly ordinary name","tags":["x","y","z"],"score":1.5e3,"ok":true,"nested":{"a":[1,2,3],"b":null}}`)
		strs.WriteString(`{"text":"Lorem ipsum dolor sit amet, consectetur adipiscing elit, sed do eiusmod tempor incididunt ut labore et dolore magna aliqua. \"Quoted\" \u00e9t\u00e9 caf\u00e9 na\u00efve","user":"someone@example.com"}`)
		nums.WriteString(`[1.25,-3,400000,7e-3,0,12,99.5,-0.001]`)
	}
	for _, b := range []*strings.Builder{&pretty, &compact, &strs, &nums} {
		b.WriteString("]")
	}
	return map[string][]byte{"pretty": []byte(pretty.String()), "compact": []byte(compact.String()), "strings": []byte(strs.String()), "numbers": []byte(nums.String())}
}

func BenchmarkNormalizeJSONShapes(b *testing.B) {
	bodies := benchBodies()
	for _, name := range []string{"compact", "pretty", "strings", "numbers"} {
		in := bodies[name]
		b.Run(name, func(b *testing.B) {
			b.SetBytes(int64(len(in)))
			b.ReportAllocs()
			for b.Loop() {
				if _, _, err := NormalizeJSON(in, false); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
	b.Run("stdlib-Valid-compact", func(b *testing.B) { // reference point, not a requirement
		in := bodies["compact"]
		b.SetBytes(int64(len(in)))
		for b.Loop() {
			json.Valid(in)
		}
	})
}
