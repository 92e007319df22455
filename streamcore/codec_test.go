package streamcore

import (
	"bytes"
	"encoding/json"
	"io"
	"strings"
	"testing"
	"unicode/utf8"
)

func TestNormalizeJSON(t *testing.T) {
	deep := func(n int) string { return strings.Repeat("[", n) + strings.Repeat("]", n) }
	obj := func(n int) string { return strings.Repeat(`{"a":`, n) + "1" + strings.Repeat("}", n) }
	for _, tc := range []struct {
		in, want string
		n        int
		code     string
		create   bool
	}{
		{in: `{"b": 1, "a" : 2}`, want: "{\"b\":1,\"a\":2}\n", n: 1},         // 6.7 order kept
		{in: `{"a":1,"a":2}`, want: "{\"a\":1,\"a\":2}\n", n: 1},             // duplicates kept
		{in: ` [1, "x" ,{"k" :[ ]}] `, want: "1\n\"x\"\n{\"k\":[]}\n", n: 3}, // 6.3 flatten
		{in: `[[1,2],[3,4]]`, want: "[1,2]\n[3,4]\n", n: 2},                  // 6.3
		{in: `[[[1,2,3]]]`, want: "[[1,2,3]]\n", n: 1},                       // 6.3
		{in: `1.50e3`, want: "1.50e3\n", n: 1},                               // number text kept
		{in: `1e400`, want: "1e400\n", n: 1},                                 // 6.2
		{in: `"\ud800 x"`, want: "\"\\ud800 x\"\n", n: 1},                    // 6.2 unpaired surrogate
		{in: "\"a b\\n\\u00e9 é\"", want: "\"a b\\n\\u00e9 é\"\n", n: 1},     // strings verbatim
		{in: `[]`, code: CodeEmptyAppend},                                    // 6.5
		{in: ` [ ] `, want: "", n: 0, create: true},                          // 6.5 create
		{in: ``, code: CodeInvalidRequest},                                   //
		{in: `{"a":}`, code: CodeInvalidRequest},                             // 6.1
		{in: `[1,]`, code: CodeInvalidRequest},                               //
		{in: `01`, code: CodeInvalidRequest},                                 //
		{in: `"\x01"`, code: CodeInvalidRequest},                             // control char
		{in: "\"\xff\"", code: CodeInvalidRequest},                           // invalid UTF-8
		{in: "\xef\xbb\xbf1", code: CodeInvalidRequest},                      // BOM refused
		{in: `1 2`, code: CodeInvalidRequest},                                //
		{in: `tru`, code: CodeInvalidRequest},                                //
		{in: obj(127), want: obj(127) + "\n", n: 1},                          // 6.8 depth 127 ok
		{in: obj(128), code: CodeInvalidRequest},                             // 6.8 too deep
		{in: deep(128), want: deep(127) + "\n", n: 1},                        // an array body may be 128 deep
		{in: deep(129), code: CodeInvalidRequest},
		{in: "\t\r\n{ \"x\" : [ true , false , null ] }\n", want: "{\"x\":[true,false,null]}\n", n: 1},
	} {
		got, n, err := NormalizeJSON([]byte(tc.in), tc.create)
		if tc.code != "" {
			if err == nil || err.Code != tc.code {
				t.Errorf("%q: err %v, want code %s", tc.in, err, tc.code)
			}
			continue
		}
		if err != nil || string(got) != tc.want || n != tc.n {
			t.Errorf("%q: got %q n=%d err=%v, want %q n=%d", tc.in, got, n, err, tc.want, tc.n)
		}
	}
}

func FuzzNormalizeJSON(f *testing.F) {
	for _, s := range []string{`{"a":[1,2,{"b":null}]}`, `[1,2]`, `"\ud800"`, `-0.5e-3`, `[]`, `[[],{}]`, "\"é\""} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		out, n, err := NormalizeJSON(in, true)
		if err != nil {
			if err.Status != 400 {
				t.Fatalf("status %d", err.Status)
			}
			return
		}
		if bytes.Count(out, []byte("\n")) != n {
			t.Fatalf("count %d for %q", n, out)
		}
		// Each stored message is JSON and normalising it again changes nothing.
		for _, msg := range bytes.SplitAfter(out, []byte("\n")) {
			if len(msg) == 0 {
				continue
			}
			if !json.Valid(msg) && !bytes.Contains(msg, []byte(`\u`)) {
				t.Fatalf("stored message %q is not JSON", msg)
			}
			again, m, err := NormalizeJSON(msg, true)
			if err != nil || m != 1 && !bytes.HasPrefix(msg, []byte("[")) || m == 1 && !bytes.Equal(again, msg) {
				if bytes.HasPrefix(msg, []byte("[")) {
					continue // a stored array message is flattened again by design
				}
				t.Fatalf("normalising %q again gave %q, %v", msg, again, err)
			}
		}
		// Whatever encoding/json accepts (and is not `[]`-only or too deep) we accept too.
		if !json.Valid(in) {
			return
		}
	})
}

func FuzzJSONAgreesWithStdlib(f *testing.F) {
	f.Add([]byte(`{"a":1}`))
	f.Add([]byte(`[1,"x"]`))
	f.Fuzz(func(t *testing.T, in []byte) {
		if !utf8.Valid(in) {
			return // encoding/json accepts invalid UTF-8; the JSON message rule refuses it (6.1)
		}
		_, _, err := NormalizeJSON(in, true)
		std := json.Valid(in)
		if std && err != nil && err.Code == CodeInvalidRequest && !strings.Contains(err.Message, "deeper") && !bytes.HasPrefix(in, []byte("\xef\xbb\xbf")) {
			t.Fatalf("stdlib accepts %q, we refuse: %v", in, err)
		}
		if !std && err == nil {
			t.Fatalf("stdlib refuses %q, we accept", in)
		}
	})
}

func readAllEvents(t *testing.T, stream []byte) []SSEEvent {
	t.Helper()
	rd := NewSSEReader(bytes.NewReader(stream))
	var evs []SSEEvent
	for {
		ev, err := rd.Next()
		if err == io.EOF {
			return evs
		}
		if err != nil {
			t.Fatalf("parse %q: %v", stream, err)
		}
		evs = append(evs, ev)
	}
}

func TestSSEFraming(t *testing.T) {
	var b []byte
	b = AppendSSEData(b, []byte("line1\nline2\n"), false)
	b = AppendSSEData(b, []byte{0, 1, 2, 0xff}, true)
	b = AppendSSEControl(b, SSEControl{StreamNextOffset: FormatOffset(12), UpToDate: true, StreamCursor: "7"})
	b = AppendSSEError(b, Errorf(404, CodeStreamNotFound, "gone"))
	evs := readAllEvents(t, b)
	if len(evs) != 4 {
		t.Fatalf("%d events in %q", len(evs), b)
	}
	if evs[0].Type != "data" || string(evs[0].Data) != "line1\nline2\n" {
		t.Fatalf("text event %+v", evs[0])
	}
	raw, err := DecodeSSEData(evs[1], true)
	if err != nil || !bytes.Equal(raw, []byte{0, 1, 2, 0xff}) {
		t.Fatalf("base64 event %q %v", raw, err)
	}
	var c SSEControl
	if json.Unmarshal(evs[2].Data, &c) != nil || c.StreamNextOffset != FormatOffset(12) || !c.UpToDate || c.StreamClosed {
		t.Fatalf("control %s", evs[2].Data)
	}
	if d, ok := ParseErrorBody(evs[3].Data); evs[3].Type != "error" || !ok || d.Code != CodeStreamNotFound {
		t.Fatalf("error event %+v", evs[3])
	}
	// A CR can never start a new event (injection).
	inj := AppendSSEData(nil, []byte("a\r\revent: control\rdata: x\r\r"), false)
	if evs := readAllEvents(t, inj); len(evs) != 1 || evs[0].Type != "data" {
		t.Fatalf("CR injection produced %+v", evs)
	}
}

func FuzzSSE(f *testing.F) {
	f.Add([]byte("hello\nworld"), true)
	f.Add([]byte(""), false)
	f.Fuzz(func(t *testing.T, payload []byte, b64 bool) {
		text := payload
		if !b64 {
			// CR and CRLF travel as LF.
			text = bytes.ReplaceAll(bytes.ReplaceAll(payload, []byte("\r\n"), []byte("\n")), []byte("\r"), []byte("\n"))
		}
		evs := readAllEvents(t, AppendSSEData(nil, payload, b64))
		if len(evs) != 1 {
			t.Fatalf("%d events", len(evs))
		}
		got, err := DecodeSSEData(evs[0], b64)
		if err != nil || !bytes.Equal(got, text) && !(len(got) == 0 && len(text) == 0) {
			t.Fatalf("round trip %q -> %q (%v)", payload, got, err)
		}
		// Arbitrary input never panics the reader.
		rd := NewSSEReader(bytes.NewReader(payload))
		for i := 0; i < 1000; i++ {
			if _, err := rd.Next(); err != nil {
				break
			}
		}
	})
}

func TestMultipartRoundTrip(t *testing.T) {
	bnd := NewBoundary()
	if len(bnd) != 32 {
		t.Fatal(bnd)
	}
	parts := []Part{{"application/octet-stream", nil}, {"application/json", []byte("{\"a\":1}\n")}, {"x/y", []byte("\r\n--" + "\r\n\r\n")}}
	var b []byte
	for _, p := range parts {
		b = AppendMultipartPart(b, bnd, p)
	}
	b = AppendMultipartEnd(b, bnd)
	got, err := ReadMultipart("multipart/mixed; boundary="+bnd, bytes.NewReader(b))
	if err != nil || len(got) != 3 {
		t.Fatalf("%v %d", err, len(got))
	}
	for i := range parts {
		if got[i].ContentType != parts[i].ContentType || !bytes.Equal(got[i].Body, parts[i].Body) {
			t.Fatalf("part %d: %+v", i, got[i])
		}
	}
	if _, err := ReadMultipart("text/plain", bytes.NewReader(b)); err == nil {
		t.Fatal("wrong content type accepted")
	}
}

func FuzzMultipart(f *testing.F) {
	f.Add([]byte("abc"), []byte("\r\n--x"), "text/plain")
	f.Fuzz(func(t *testing.T, a, b []byte, ct string) {
		if strings.ContainsAny(ct, "\r\n") || strings.TrimSpace(ct) != ct {
			return
		}
		bnd := NewBoundary()
		buf := AppendMultipartPart(nil, bnd, Part{ct, a})
		buf = AppendMultipartPart(buf, bnd, Part{"application/octet-stream", b})
		buf = AppendMultipartEnd(buf, bnd)
		got, err := ReadMultipart("multipart/mixed; boundary="+bnd, bytes.NewReader(buf))
		if err != nil || len(got) != 2 || !bytes.Equal(got[0].Body, a) || !bytes.Equal(got[1].Body, b) || got[0].ContentType != ct {
			t.Fatalf("round trip failed: %v %+v", err, got)
		}
		ReadMultipart("multipart/mixed; boundary=zz", bytes.NewReader(a)) // never panics
	})
}

func BenchmarkNormalizeJSON(b *testing.B) {
	var sb strings.Builder
	sb.WriteString("[")
	for i := 0; i < 200; i++ {
		if i > 0 {
			sb.WriteString(", ")
		}
		sb.WriteString(`{"id": 12345, "name": "a fairly ordinary name", "tags": ["x", "y", "z"], "score": 1.5e3, "ok": true}`)
	}
	sb.WriteString("]")
	in := []byte(sb.String())
	b.SetBytes(int64(len(in)))
	for i := 0; i < b.N; i++ {
		if _, _, err := NormalizeJSON(in, false); err != nil {
			b.Fatal(err)
		}
	}
}
