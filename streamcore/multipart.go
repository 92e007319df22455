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
// come back byte-exact (no transfer decoding).
func ReadMultipart(contentTypeHeader string, body io.Reader) ([]Part, error) {
	mt, params, err := mime.ParseMediaType(contentTypeHeader)
	if err != nil || mt != "multipart/mixed" || params["boundary"] == "" {
		return nil, fmt.Errorf("not a multipart/mixed answer: %q", contentTypeHeader)
	}
	raw, err := io.ReadAll(body)
	if err != nil {
		return nil, err
	}
	delim := []byte("--" + params["boundary"])
	if !bytes.HasPrefix(raw, delim) {
		return nil, errors.New("multipart: body does not start with the boundary")
	}
	raw = raw[len(delim):]
	var parts []Part
	for {
		if bytes.HasPrefix(raw, []byte("--")) {
			return parts, nil // closing delimiter
		}
		if !bytes.HasPrefix(raw, []byte("\r\n")) {
			return nil, errors.New("multipart: malformed delimiter line")
		}
		raw = raw[2:]
		hdrEnd := bytes.Index(raw, []byte("\r\n\r\n"))
		if hdrEnd < 0 {
			return nil, errors.New("multipart: unterminated part headers")
		}
		var p Part
		for _, line := range bytes.Split(raw[:hdrEnd], []byte("\r\n")) {
			k, v, ok := bytes.Cut(line, []byte(":"))
			if ok && bytes.EqualFold(bytes.TrimSpace(k), []byte("Content-Type")) {
				p.ContentType = string(bytes.TrimSpace(v))
			}
		}
		raw = raw[hdrEnd+4:]
		next := bytes.Index(raw, append([]byte("\r\n"), delim...))
		if next < 0 {
			return nil, errors.New("multipart: part without a closing boundary")
		}
		p.Body = raw[:next:next]
		parts = append(parts, p)
		raw = raw[next+2+len(delim):]
	}
}
