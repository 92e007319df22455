package streamcore

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"io"
	"strings"
	"testing"
	"testing/iotest"
)

// conformanceSSE is parseSSEEvents of the official conformance suite
// (@durable-streams/server-conformance-tests src/index.ts): CR and CRLF become LF, blocks
// split on blank lines, one space after "data:" stripped, data lines joined with LF, only
// blocks with an event type and a data line kept.
func conformanceSSE(stream string) (types, data []string) {
	norm := strings.ReplaceAll(strings.ReplaceAll(stream, "\r\n", "\n"), "\r", "\n")
	for _, block := range strings.Split(norm, "\n\n") {
		if strings.TrimSpace(block) == "" {
			continue
		}
		typ, lines, has := "", []string{}, false
		for _, line := range strings.Split(block, "\n") {
			if v, ok := strings.CutPrefix(line, "event:"); ok {
				typ = strings.TrimSpace(v)
			} else if v, ok := strings.CutPrefix(line, "data:"); ok {
				lines = append(lines, strings.TrimPrefix(v, " "))
				has = true
			}
		}
		if typ != "" && has {
			types = append(types, typ)
			data = append(data, strings.Join(lines, "\n"))
		}
	}
	return types, data
}

func TestSSEWire(t *testing.T) {
	for _, tc := range []struct {
		name, payload string
		b64           bool
		want          string
	}{
		{"plain", "hello", false, "event: data\ndata:hello\n\n"},
		{"trailing LF is an empty last line", "a\nb\n", false, "event: data\ndata:a\ndata:b\ndata:\n\n"},
		{"empty", "", false, "event: data\ndata:\n\n"},
		{"blank lines", "\n\n", false, "event: data\ndata:\ndata:\ndata:\n\n"},
		{"leading space kept", " x\n  y", false, "event: data\ndata:  x\ndata:   y\n\n"},
		{"NDJSON", "{\"a\":1}\n[2]\n", false, "event: data\ndata:{\"a\":1}\ndata:[2]\ndata:\n\n"},
		{"CR and CRLF end lines", "a\rb\r\nc", false, "event: data\ndata:a\ndata:b\ndata:c\n\n"},
		{"colon and field text", "event: control\ndata: x", false, "event: data\ndata:event: control\ndata:data: x\n\n"},
		{"base64", "\x00\x01\xfe\xff", true, "event: data\ndata:AAH+/w==\n\n"},
		{"base64 empty", "", true, "event: data\ndata:\n\n"},
	} {
		got := string(AppendSSEData([]byte("prev"), []byte(tc.payload), tc.b64))
		if got != "prev"+tc.want {
			t.Errorf("%s: got %q want %q", tc.name, got, tc.want)
		}
	}
	long := bytes.Repeat([]byte{0xfb}, 3000)
	enc := string(AppendSSEData(nil, long, true))
	lines := strings.Split(strings.TrimSuffix(enc, "\n\n"), "\n")[1:]
	if len(lines) != 4 || lines[0] != "data:"+strings.Repeat("+/v7", 256) {
		t.Fatalf("base64 lines %q", lines)
	}
	for _, l := range lines {
		if (len(l)-len("data:"))%4 != 0 {
			t.Fatalf("base64 line of %d characters", len(l)-5)
		}
	}
	for _, tc := range []struct {
		c    SSEControl
		want string
	}{
		{SSEControl{StreamNextOffset: "00000000000000000042"}, `{"streamNextOffset":"00000000000000000042"}`},
		{SSEControl{StreamNextOffset: "1", StreamCursor: "77", UpToDate: true}, `{"streamNextOffset":"1","streamCursor":"77","upToDate":true}`},
		{SSEControl{StreamNextOffset: "1", UpToDate: true, StreamClosed: true}, `{"streamNextOffset":"1","upToDate":true,"streamClosed":true}`},
		{SSEControl{StreamNextOffset: "a\"<\n\u2028é", StreamCursor: "\x00"}, `{"streamNextOffset":"a\"\u003c\n\u2028é","streamCursor":"\u0000"}`},
	} {
		got := string(AppendSSEControl(nil, tc.c))
		if got != "event: control\ndata:"+tc.want+"\n\n" {
			t.Errorf("control %+v: %q", tc.c, got)
		}
	}
	e := Errorf(404, CodeStreamNotFound, "stream was deleted\nor recreated")
	if got := string(AppendSSEError(nil, e)); got != "event: error\ndata:"+string(e.Body())+"\n\n" || strings.Count(got, "\n") != 3 {
		t.Errorf("error event %q", got)
	}
}

// TestSSEConformanceParser checks the framing against the conformance suite's own parser,
// including the JSON-mode expectation that a data event of the compat family (one JSON
// array of whole messages, built by the server) parses as JSON.
func TestSSEConformanceParser(t *testing.T) {
	var b []byte
	payloads := []string{"start\n\nevent: data\ndata: fake-event\n\nend", " lead", "x\n", `[{"id":1,"message":"hello"}]`}
	for _, p := range payloads {
		b = AppendSSEData(b, []byte(p), false)
		b = AppendSSEControl(b, SSEControl{StreamNextOffset: "5", StreamCursor: "1", UpToDate: true})
	}
	b = AppendSSEData(b, []byte("start\r\revent: control\rdata: {\"cr_injected\":true}\r\rend"), false)
	b = AppendSSEControl(b, SSEControl{StreamNextOffset: "6"})
	types, data := conformanceSSE(string(b))
	if len(types) != 2*len(payloads)+2 {
		t.Fatalf("types %q", types)
	}
	for i, p := range payloads {
		if types[2*i] != "data" || types[2*i+1] != "control" || data[2*i] != p {
			t.Errorf("event %d: %q %q", i, types[2*i], data[2*i])
		}
	}
	var v []map[string]any
	if err := json.Unmarshal([]byte(data[6]), &v); err != nil || v[0]["message"] != "hello" {
		t.Errorf("JSON data event %q: %v", data[6], err)
	}
	if types[len(types)-1] != "control" || strings.Contains(data[len(data)-1], "cr_injected") {
		t.Errorf("CR injection: %q", data)
	}
}

func readEvents(t testing.TB, r io.Reader) ([]SSEEvent, error) {
	t.Helper()
	rd := NewSSEReader(r)
	var evs []SSEEvent
	for {
		ev, err := rd.Next()
		if err != nil {
			if err == io.EOF {
				err = nil
			}
			return evs, err
		}
		evs = append(evs, ev)
	}
}

func TestSSEReaderWHATWG(t *testing.T) {
	type ev struct{ typ, data, id string }
	for _, tc := range []struct {
		name, in string
		want     []ev
		err      error
	}{
		{"LF", "event: a\ndata: x\n\n", []ev{{"a", "x", ""}}, nil},
		{"CRLF", "event: a\r\ndata: x\r\n\r\n", []ev{{"a", "x", ""}}, nil},
		{"CR", "event: a\rdata: x\r\r", []ev{{"a", "x", ""}}, nil},
		{"mixed ends", "data:1\rdata:2\r\ndata:3\n\r\n", []ev{{"message", "1\n2\n3", ""}}, nil},
		{"BOM", "\xef\xbb\xbfdata:x\n\n", []ev{{"message", "x", ""}}, nil},
		{"BOM only once", "data:\xef\xbb\xbfx\n\n", []ev{{"message", "\xef\xbb\xbfx", ""}}, nil},
		{"comments", ":hi\ndata:x\n: there\n\n", []ev{{"message", "x", ""}}, nil},
		{"one space stripped", "data:  x \n\n", []ev{{"message", " x ", ""}}, nil},
		{"no space", "data:x\n\n", []ev{{"message", "x", ""}}, nil},
		{"field without colon", "data\ndata\n\n", []ev{{"message", "\n", ""}}, nil},
		{"empty data line dispatches", "data:\n\n", []ev{{"message", "", ""}}, nil},
		{"no data, no event", "event: control\n\ndata:y\n\n", []ev{{"message", "y", ""}}, nil},
		{"unknown fields", "retry: 5\nfoo: bar\ndata:z\n\n", []ev{{"message", "z", ""}}, nil},
		{"id persists", "id: 7\ndata:a\n\ndata:b\n\nid\ndata:c\n\n", []ev{{"message", "a", "7"}, {"message", "b", "7"}, {"message", "c", ""}}, nil},
		{"id with NUL ignored", "id: 1\ndata:a\n\nid: 2\x003\ndata:b\n\n", []ev{{"message", "a", "1"}, {"message", "b", "1"}}, nil},
		{"Data is case-sensitive", "Data:x\n\n", nil, nil},
		{"blank lines between", "\n\n\r\ndata:x\n\n\n", []ev{{"message", "x", ""}}, nil},
		{"cut inside event", "data:x\n", nil, io.ErrUnexpectedEOF},
		{"cut inside line", "data:x\n\ndata:y", []ev{{"message", "x", ""}}, io.ErrUnexpectedEOF},
		{"empty", "", nil, nil},
	} {
		for _, r := range []func(string) io.Reader{
			func(s string) io.Reader { return strings.NewReader(s) },
			func(s string) io.Reader { return iotest.OneByteReader(strings.NewReader(s)) },
		} {
			evs, err := readEvents(t, r(tc.in))
			var got []ev
			for _, e := range evs {
				got = append(got, ev{e.Type, string(e.Data), e.ID})
			}
			if !errors.Is(err, tc.err) || len(got) != len(tc.want) {
				t.Errorf("%s: %q, %v", tc.name, got, err)
				continue
			}
			for i := range got {
				if got[i] != tc.want[i] {
					t.Errorf("%s: event %d %q want %q", tc.name, i, got[i], tc.want[i])
				}
			}
		}
	}
}

// TestSSEReaderCRDoesNotBlock: an event ended by CR CR is delivered without waiting for the
// byte that would tell a CR from a CRLF.
func TestSSEReaderCRDoesNotBlock(t *testing.T) {
	pr, pw := io.Pipe()
	defer pw.Close()
	go pw.Write([]byte("data:x\r\r"))
	done := make(chan SSEEvent)
	go func() {
		ev, _ := NewSSEReader(pr).Next()
		done <- ev
	}()
	if ev := <-done; string(ev.Data) != "x" {
		t.Fatalf("%+v", ev)
	}
}

func TestDecodeSSEData(t *testing.T) {
	ev := SSEEvent{Type: "data", Data: []byte("AAH+\n/w==")}
	if b, err := DecodeSSEData(ev, true); err != nil || !bytes.Equal(b, []byte{0, 1, 0xfe, 0xff}) {
		t.Fatalf("%q %v", b, err)
	}
	if _, err := DecodeSSEData(SSEEvent{Data: []byte("AAH")}, true); err == nil {
		t.Fatal("unpadded base64 accepted")
	}
	if b, err := DecodeSSEData(SSEEvent{Data: []byte("AAH")}, false); err != nil || string(b) != "AAH" {
		t.Fatal(b, err)
	}
}

// FuzzSSERoundTrip: any payload survives AppendSSEData and SSEReader byte for byte (text
// with CR and CRLF turned into LF, the one transformation SSE forces), the conformance
// suite's parser agrees, and a following control event is never disturbed.
func FuzzSSERoundTrip(f *testing.F) {
	for _, s := range []string{"", "\n", " ", "a\n", "\r\n", "\r", " a\n b\n", ":x", "data: y\n\nevent: control", "\xef\xbb\xbfx", "\x00\xff"} {
		f.Add([]byte(s), false, uint8(0))
		f.Add([]byte(s), true, uint8(3))
	}
	f.Add(bytes.Repeat([]byte{0xab}, 1500), true, uint8(1))
	f.Fuzz(func(t *testing.T, payload []byte, b64 bool, chunk uint8) {
		want := payload
		if !b64 {
			want = bytes.ReplaceAll(bytes.ReplaceAll(payload, []byte("\r\n"), []byte("\n")), []byte("\r"), []byte("\n"))
		}
		ctl := SSEControl{StreamNextOffset: FormatOffset(uint64(len(payload))), StreamCursor: "9", UpToDate: b64}
		stream := AppendSSEControl(AppendSSEData(nil, payload, b64), ctl)
		var r io.Reader = bytes.NewReader(stream)
		if chunk > 0 {
			r = &chunkReader{b: stream, n: int(chunk)}
		}
		evs, err := readEvents(t, r)
		if err != nil || len(evs) != 2 || evs[0].Type != "data" || evs[1].Type != "control" {
			t.Fatalf("%q: %+v %v", stream, evs, err)
		}
		got, err := DecodeSSEData(evs[0], b64)
		if err != nil || !bytes.Equal(got, want) {
			t.Fatalf("round trip %q -> %q (%v)", payload, got, err)
		}
		var c SSEControl
		if err := json.Unmarshal(evs[1].Data, &c); err != nil || c != ctl {
			t.Fatalf("control %q: %+v %v", evs[1].Data, c, err)
		}
		types, data := conformanceSSE(string(stream))
		if len(types) != 2 || types[0] != "data" || types[1] != "control" {
			t.Fatalf("conformance parser: %q", types)
		}
		if b64 {
			dec, err := base64.StdEncoding.DecodeString(strings.ReplaceAll(data[0], "\n", ""))
			if err != nil || !bytes.Equal(dec, want) || len(strings.ReplaceAll(data[0], "\n", ""))%4 != 0 {
				t.Fatalf("conformance parser base64 %q: %v", data[0], err)
			}
		} else if data[0] != string(want) {
			t.Fatalf("conformance parser text %q want %q", data[0], want)
		}
	})
}

type chunkReader struct {
	b []byte
	n int
}

func (c *chunkReader) Read(p []byte) (int, error) {
	if len(c.b) == 0 {
		return 0, io.EOF
	}
	n := copy(p[:min(len(p), c.n)], c.b)
	c.b = c.b[n:]
	return n, nil
}

// FuzzSSEReader: arbitrary input never panics the reader; every event has data and a type;
// reading in small pieces gives the same events; the control encoder matches json.Marshal.
func FuzzSSEReader(f *testing.F) {
	for _, s := range []string{"data:x\n\n", "event: a\r\ndata\r\n\r\n", "\xef\xbb\xbf:c\rid:1\rdata: y\r\r", "data:a\ndata:b\r\n\r\n", "id:\x00\ndata:\n\n"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		evs, err := readEvents(t, bytes.NewReader(in))
		evs2, err2 := readEvents(t, iotest.OneByteReader(bytes.NewReader(in)))
		if err != err2 || len(evs) != len(evs2) {
			t.Fatalf("%q: %d/%v vs %d/%v", in, len(evs), err, len(evs2), err2)
		}
		for i := range evs {
			if evs[i].Type == "" || evs[i].Data == nil || evs[i].Type != evs2[i].Type || !bytes.Equal(evs[i].Data, evs2[i].Data) || evs[i].ID != evs2[i].ID {
				t.Fatalf("%q: event %d %+v vs %+v", in, i, evs[i], evs2[i])
			}
		}
		s := string(in)
		c := SSEControl{StreamNextOffset: s, StreamCursor: strings.ToUpper(s), UpToDate: len(s)%2 == 0, StreamClosed: len(s)%3 == 0}
		m, _ := json.Marshal(c)
		if got := AppendSSEControl(nil, c); string(got) != "event: control\ndata:"+string(m)+"\n\n" {
			t.Fatalf("control %q vs json.Marshal %q", got, m)
		}
	})
}

func BenchmarkSSE(b *testing.B) {
	payload := bytes.Repeat([]byte(`{"id":12345,"name":"a fairly ordinary name","tags":["x","y","z"]}`+"\n"), 100)
	var stream []byte
	for range 100 {
		stream = AppendSSEData(stream, payload, false)
		stream = AppendSSEControl(stream, SSEControl{StreamNextOffset: "00000000000000001234", StreamCursor: "42", UpToDate: true})
	}
	b.Run("encode", func(b *testing.B) {
		b.SetBytes(int64(len(payload)))
		b.ReportAllocs()
		var buf []byte
		for b.Loop() {
			buf = AppendSSEData(buf[:0], payload, false)
			buf = AppendSSEControl(buf, SSEControl{StreamNextOffset: "00000000000000001234", StreamCursor: "42", UpToDate: true})
		}
	})
	b.Run("decode", func(b *testing.B) {
		b.SetBytes(int64(len(stream)))
		b.ReportAllocs()
		for b.Loop() {
			if evs, err := readEvents(b, bytes.NewReader(stream)); err != nil || len(evs) != 200 {
				b.Fatal(err)
			}
		}
	})
}

// sseDataOracle is the one-slice framing AppendSSEDataParts must reproduce for any split
// of the payload: a data: line per CR, LF or CRLF separated segment, an extra space before
// a segment that starts with one, and the base64 text in lines of base64Line characters.
func sseDataOracle(payload []byte, b64 bool) []byte {
	dst := []byte("event: data\n")
	line := func(l []byte) {
		dst = append(dst, "data:"...)
		if len(l) > 0 && l[0] == ' ' {
			dst = append(dst, ' ')
		}
		dst = append(append(dst, l...), '\n')
	}
	if b64 {
		enc := []byte(base64.StdEncoding.EncodeToString(payload))
		if len(enc) == 0 {
			line(nil)
		}
		for len(enc) > 0 {
			n := min(len(enc), base64Line)
			line(enc[:n])
			enc = enc[n:]
		}
		return append(dst, '\n')
	}
	for {
		i := bytes.IndexAny(payload, "\r\n")
		if i < 0 {
			line(payload)
			break
		}
		line(payload[:i])
		if payload[i] == '\r' && i+1 < len(payload) && payload[i+1] == '\n' {
			i++
		}
		payload = payload[i+1:]
	}
	return append(dst, '\n')
}

// FuzzSSEDataParts: framing a payload split into parts at any points (empty parts, a CRLF
// or a base64 group cut in two) gives the bytes of framing it whole.
func FuzzSSEDataParts(f *testing.F) {
	for _, s := range []string{"", "\r\n", "a\r", " x\n y", "\r\r\n\n", "\x00\xff\xfe"} {
		f.Add([]byte(s), false, []byte{1, 0, 2})
		f.Add([]byte(s), true, []byte{1, 1})
	}
	f.Add(bytes.Repeat([]byte{0xab}, 3000), true, []byte{200, 255, 7})
	f.Add(bytes.Repeat([]byte("ab\r"), 1000), false, []byte{1, 2, 3, 250})
	f.Fuzz(func(t *testing.T, payload []byte, b64 bool, cuts []byte) {
		var parts [][]byte
		rest := payload
		for _, c := range cuts {
			n := min(int(c), len(rest))
			parts = append(parts, rest[:n])
			rest = rest[n:]
		}
		parts = append(parts, rest)
		want := sseDataOracle(payload, b64)
		if got := AppendSSEDataParts(nil, parts, b64); !bytes.Equal(got, want) {
			t.Fatalf("parts %q b64=%v:\n got %q\nwant %q", parts, b64, got, want)
		}
		if got := AppendSSEData([]byte("x"), payload, b64); !bytes.Equal(got[1:], want) {
			t.Fatalf("whole %q b64=%v:\n got %q\nwant %q", payload, b64, got, want)
		}
	})
}
