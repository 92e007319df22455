package streamcore

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"mime"
)

// Part is one body part of a bootstrap answer.
type Part struct {
	ContentType string
	Body        []byte
}

// NewBoundary returns a fresh 128-bit random multipart boundary.
func NewBoundary() string {
	var b [16]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// AppendMultipartPart appends one part (RFC 2046): "--B" CRLF, headers, CRLF CRLF, the raw
// bytes, CRLF. The body is never re-encoded.
func AppendMultipartPart(dst []byte, boundary string, p Part) []byte {
	dst = append(dst, "--"...)
	dst = append(dst, boundary...)
	dst = append(dst, "\r\nContent-Type: "...)
	dst = append(dst, p.ContentType...)
	dst = append(dst, "\r\n\r\n"...)
	dst = append(dst, p.Body...)
	return append(dst, "\r\n"...)
}

// AppendMultipartEnd appends the closing delimiter "--B--".
func AppendMultipartEnd(dst []byte, boundary string) []byte {
	dst = append(dst, "--"...)
	dst = append(dst, boundary...)
	return append(dst, "--"...)
}

// ReadMultipart parses a multipart/mixed body given its Content-Type header. Part bodies
// come back byte-exact (no transfer decoding; the CRLF before each delimiter belongs to the
// delimiter). It reads the whole body. Beyond what AppendMultipartPart writes it accepts a
// preamble, transport padding after a delimiter, parts without headers (ContentType is then
// "", meaning text/plain by RFC 2046) and an epilogue. It does not use mime/multipart, which
// misreads a part whose body starts with "--"+boundary.
func ReadMultipart(contentTypeHeader string, body io.Reader) ([]Part, error) {
	mt, params, err := mime.ParseMediaType(contentTypeHeader)
	if err != nil || mt != "multipart/mixed" || params["boundary"] == "" {
		return nil, fmt.Errorf("not a multipart/mixed answer: %q", contentTypeHeader)
	}
	raw, err := io.ReadAll(body)
	if err != nil {
		return nil, err
	}
	dashB := []byte("--" + params["boundary"])
	// The first delimiter may start the body (no CRLF before it) or follow a preamble.
	var pos int
	if bytes.HasPrefix(raw, dashB) {
		pos = len(dashB)
	} else if end, ok := findDelimiter(raw, 0, dashB); ok {
		pos = end
	} else {
		return nil, errors.New("multipart: no boundary delimiter")
	}
	var parts []Part
	for {
		next, final, ok := delimiterLine(raw, pos)
		if !ok {
			return nil, errors.New("multipart: malformed delimiter line")
		}
		if final {
			return parts, nil // the rest is the epilogue
		}
		pos = next
		var p Part
		if bytes.HasPrefix(raw[pos:], []byte("\r\n")) {
			pos += 2 // no header fields
		} else {
			hdrEnd := bytes.Index(raw[pos:], []byte("\r\n\r\n"))
			if hdrEnd < 0 {
				return nil, errors.New("multipart: unterminated part headers")
			}
			for _, line := range bytes.Split(raw[pos:pos+hdrEnd], []byte("\r\n")) {
				k, v, ok := bytes.Cut(line, []byte(":"))
				if ok && bytes.EqualFold(bytes.TrimSpace(k), []byte("Content-Type")) {
					p.ContentType = string(bytes.TrimSpace(v))
				}
			}
			pos += hdrEnd + 4
		}
		end, ok := findDelimiter(raw, pos, dashB)
		if !ok {
			return nil, errors.New("multipart: part without a closing boundary")
		}
		p.Body = raw[pos : end-2-len(dashB) : end-2-len(dashB)]
		parts = append(parts, p)
		pos = end
	}
}

// findDelimiter finds the first CRLF "--B" at or after from that is a real delimiter (the
// boundary is followed by "--", padding and CRLF, or the end) and returns the index just
// past "--B".
func findDelimiter(raw []byte, from int, dashB []byte) (int, bool) {
	crlfDashB := append([]byte("\r\n"), dashB...)
	for {
		i := bytes.Index(raw[from:], crlfDashB)
		if i < 0 {
			return 0, false
		}
		end := from + i + len(crlfDashB)
		if _, _, ok := delimiterLine(raw, end); ok {
			return end, true
		}
		from += i + 1
	}
}

// delimiterLine checks what follows "--B" at pos: "--" (final; anything may follow) or
// optional spaces and tabs then CRLF, whose end is next.
func delimiterLine(raw []byte, pos int) (next int, final, ok bool) {
	rest := raw[pos:]
	if bytes.HasPrefix(rest, []byte("--")) {
		return len(raw), true, true
	}
	n := len(rest) - len(bytes.TrimLeft(rest, " \t"))
	if bytes.HasPrefix(rest[n:], []byte("\r\n")) {
		return pos + n + 2, false, true
	}
	return 0, false, false
}
