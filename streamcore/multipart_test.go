package streamcore

import (
	"bytes"
	"io"
	"mime"
	"mime/multipart"
	"regexp"
	"strings"
	"testing"
	"testing/iotest"
)

func TestMultipartWire(t *testing.T) {
	got := string(AppendMultipartEnd(AppendMultipartPart(AppendMultipartPart([]byte("x"), "B", Part{"application/octet-stream", nil}), "B", Part{"application/json", []byte("{}\n")}), "B"))
	want := "x--B\r\nContent-Type: application/octet-stream\r\n\r\n\r\n--B\r\nContent-Type: application/json\r\n\r\n{}\n\r\n--B--"
	if got != want {
		t.Fatalf("%q\nwant %q", got, want)
	}
	seen := map[string]bool{}
	for range 100 {
		b := NewBoundary()
		if !regexp.MustCompile(`^[0-9a-f]{32}$`).MatchString(b) || seen[b] {
			t.Fatalf("boundary %q", b)
		}
		seen[b] = true
		// The boundary needs no quoting in the Content-Type header.
		if _, p, err := mime.ParseMediaType("multipart/mixed; boundary=" + b); err != nil || p["boundary"] != b {
			t.Fatal(err)
		}
	}
}

func TestReadMultipart(t *testing.T) {
	const ct = "multipart/mixed; boundary=B"
	for _, tc := range []struct {
		name, ct, body string
		want           []Part
		bad            bool
	}{
		{name: "ours", ct: ct, body: "--B\r\nContent-Type: a/b\r\n\r\nxy\r\n--B\r\nContent-Type: c/d\r\n\r\n\r\n--B--", want: []Part{{"a/b", []byte("xy")}, {"c/d", []byte{}}}},
		{name: "quoted boundary, epilogue", ct: `multipart/mixed; boundary="B"`, body: "--B\r\ncontent-type:  a/b \r\nX-Other: 1\r\n\r\nxy\r\n--B--\r\nepilogue", want: []Part{{"a/b", []byte("xy")}}},
		{name: "preamble and padding", ct: ct, body: "preamble\r\n--B \t\r\nContent-Type: a/b\r\n\r\n\r\n--Bx\r\n--B  \r\n\r\nz\r\n--B--", want: []Part{{"a/b", []byte("\r\n--Bx")}, {"", []byte("z")}}},
		{name: "no parts", ct: ct, body: "--B--", want: nil},
		{name: "not multipart/mixed", ct: "multipart/form-data; boundary=B", body: "--B--", bad: true},
		{name: "no boundary param", ct: "multipart/mixed", body: "--B--", bad: true},
		{name: "truncated", ct: ct, body: "--B\r\nContent-Type: a/b\r\n\r\nxy", bad: true},
		{name: "no close delimiter", ct: ct, body: "--B\r\nContent-Type: a/b\r\n\r\nxy\r\n--B", bad: true},
		{name: "bad delimiter line", ct: ct, body: "--Bx\r\n\r\n", bad: true},
		{name: "unterminated headers", ct: ct, body: "--B\r\nContent-Type: a/b\r\n", bad: true},
		{name: "no delimiter", ct: ct, body: "hello", bad: true},
	} {
		got, err := ReadMultipart(tc.ct, strings.NewReader(tc.body))
		if tc.bad {
			if err == nil {
				t.Errorf("%s: accepted as %q", tc.name, got)
			}
			continue
		}
		if err != nil || len(got) != len(tc.want) {
			t.Errorf("%s: %q %v", tc.name, got, err)
			continue
		}
		for i := range got {
			if got[i].ContentType != tc.want[i].ContentType || !bytes.Equal(got[i].Body, tc.want[i].Body) {
				t.Errorf("%s: part %d %q want %q", tc.name, i, got[i], tc.want[i])
			}
		}
	}
}

// FuzzMultipartRoundTrip: any number of arbitrary part bodies (CRLF, "--", even the
// boundary itself, unless it forms a delimiter: CRLF "--" boundary) come back byte-exact
// and in order; with a fresh random boundary mime/multipart reads the same parts;
// ReadMultipart never panics on arbitrary input.
func FuzzMultipartRoundTrip(f *testing.F) {
	f.Add([]byte("abc"), []byte("\r\n--x"), uint8(2), "text/plain", false)
	f.Add([]byte(""), []byte(""), uint8(0), "application/octet-stream", true)
	f.Add([]byte("--0123\r\n"), []byte("\r\n\r\n--0123--"), uint8(5), "application/json", true)
	f.Add([]byte("\r\n--0123"), []byte("--0123--\r\n--0123\r\n"), uint8(3), "a/b", true)
	f.Fuzz(func(t *testing.T, a, b []byte, cut uint8, ct string, fixed bool) {
		if strings.ContainsAny(ct, "\r\n") || strings.TrimSpace(ct) != ct {
			ct = "application/octet-stream"
		}
		bnd := NewBoundary()
		if fixed {
			bnd = "0123" // lets the fuzzer put the boundary into bodies
		}
		// The parts: a, b, and pieces of a split at cut.
		k := min(int(cut), len(a))
		parts := []Part{{ct, a}, {"application/octet-stream", b}, {"x/y", a[:k]}, {"x/z", a[k:]}}
		var buf []byte
		for _, p := range parts {
			buf = AppendMultipartPart(buf, bnd, p)
		}
		buf = AppendMultipartEnd(buf, bnd)
		header := "multipart/mixed; boundary=" + bnd
		got, err := ReadMultipart(header, iotest.HalfReader(bytes.NewReader(buf)))
		inBody := false
		for _, p := range parts {
			inBody = inBody || bytes.Contains(p.Body, []byte("\r\n--"+bnd))
		}
		if !inBody {
			if err != nil || len(got) != len(parts) {
				t.Fatalf("%q: %d parts, %v", buf, len(got), err)
			}
			for i := range parts {
				if got[i].ContentType != parts[i].ContentType || !bytes.Equal(got[i].Body, parts[i].Body) {
					t.Fatalf("part %d: %q want %q", i, got[i], parts[i])
				}
			}
			// mime/multipart as a second opinion, for header values it accepts.
			if _, _, perr := mime.ParseMediaType(ct); perr == nil && !strings.Contains(ct, "%") && !fixed {
				mr := multipart.NewReader(bytes.NewReader(buf), bnd)
				for i := range parts {
					p, err := mr.NextRawPart()
					if err != nil {
						t.Fatalf("mime/multipart part %d: %v", i, err)
					}
					body, _ := io.ReadAll(p)
					if !bytes.Equal(body, parts[i].Body) {
						t.Fatalf("mime/multipart part %d: %q want %q", i, body, parts[i].Body)
					}
				}
			}
		}
		ReadMultipart(header, bytes.NewReader(a)) // never panics
		ReadMultipart("multipart/mixed; boundary=0123", bytes.NewReader(append(a, b...)))
	})
}

func BenchmarkMultipart(b *testing.B) {
	snap := bytes.Repeat([]byte("s"), 1<<20)
	msg := []byte(`{"id":12345,"name":"a fairly ordinary name","tags":["x","y","z"]}` + "\n")
	bnd := NewBoundary()
	buf := AppendMultipartPart(nil, bnd, Part{"application/json", snap})
	for range 1000 {
		buf = AppendMultipartPart(buf, bnd, Part{"application/json", msg})
	}
	buf = AppendMultipartEnd(buf, bnd)
	b.SetBytes(int64(len(buf)))
	for b.Loop() {
		if parts, err := ReadMultipart("multipart/mixed; boundary="+bnd, bytes.NewReader(buf)); err != nil || len(parts) != 1001 {
			b.Fatal(err)
		}
	}
}
