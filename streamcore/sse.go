package streamcore

import (
	"bufio"
	"bytes"
	"encoding/base64"
	"encoding/json"
	"io"
)

// SSEControl is the payload of an `event: control` (checklist-protocol 18.5).
type SSEControl struct {
	StreamNextOffset string `json:"streamNextOffset"`
	StreamCursor     string `json:"streamCursor,omitempty"`
	UpToDate         bool   `json:"upToDate,omitempty"`
	StreamClosed     bool   `json:"streamClosed,omitempty"`
}

// base64Line is the width of one data: line of a base64 payload.
const base64Line = 1024

// AppendSSEData appends an `event: data` carrying payload. Text is framed as one data:
// line per LF-separated segment (an empty last segment included); the standard parser's
// LF-join then gives the payload back byte for byte (see AppendSSEDataParts for leading
// spaces). Binary payloads are base64 (RFC 4648, padded), split over lines of base64Line
// characters. A CR or CRLF in text also ends a data: line (as in the reference server), so
// a payload can never inject an event; such bytes arrive as LF, the one lossy case of text SSE.
func AppendSSEData(dst, payload []byte, b64 bool) []byte {
	return AppendSSEDataParts(dst, [][]byte{payload}, b64)
}

// AppendSSEDataParts is AppendSSEData for a payload given as the concatenation of parts
// (a stream's bytes as they are stored), encoded without first copying them into one
// slice: an event of 8 MiB would otherwise cost its reader 8 MiB more. Line ends, CRLF
// pairs and base64 groups may straddle parts.
func AppendSSEDataParts(dst []byte, parts [][]byte, b64 bool) []byte {
	dst = append(dst, "event: data\n"...)
	if b64 {
		lw := base64Lines{dst: dst}
		enc := base64.NewEncoder(base64.StdEncoding, &lw)
		for _, p := range parts {
			enc.Write(p)
		}
		enc.Close()
		switch {
		case lw.lines == 0: // an empty payload is one empty data: line
			lw.dst = append(lw.dst, "data:\n"...)
		case lw.col > 0:
			lw.dst = append(lw.dst, '\n')
		}
		return append(lw.dst, '\n')
	}
	// open: "data:" of the current line is written; cr: the last terminator was a CR, so
	// an LF right after it (maybe in the next part) belongs to it.
	open, cr := false, false
	for _, p := range parts {
		if cr && len(p) > 0 {
			if p[0] == '\n' {
				p = p[1:]
			}
			cr = false
		}
		for len(p) > 0 {
			i := bytes.IndexAny(p, "\r\n")
			seg := p
			if i >= 0 {
				seg = p[:i]
			}
			if len(seg) > 0 {
				if !open {
					dst = append(dst, "data:"...)
					// Parsers strip exactly one space after the colon.
					if seg[0] == ' ' {
						dst = append(dst, ' ')
					}
					open = true
				}
				dst = append(dst, seg...)
			}
			if i < 0 {
				break
			}
			if !open {
				dst = append(dst, "data:"...)
			}
			dst = append(dst, '\n')
			open = false
			if p[i] == '\r' {
				switch {
				case i+1 == len(p):
					cr = true
				case p[i+1] == '\n':
					i++
				}
			}
			p = p[i+1:]
		}
	}
	if !open {
		dst = append(dst, "data:"...)
	}
	return append(dst, '\n', '\n')
}

// base64Lines collects base64 text as data: lines of base64Line characters.
type base64Lines struct {
	dst   []byte
	col   int // characters on the current (unterminated) line
	lines int // lines begun
}

func (w *base64Lines) Write(p []byte) (int, error) {
	n := len(p)
	for len(p) > 0 {
		if w.col == 0 {
			w.dst = append(w.dst, "data:"...)
			w.lines++
		}
		k := min(len(p), base64Line-w.col)
		w.dst = append(w.dst, p[:k]...)
		w.col += k
		p = p[k:]
		if w.col == base64Line {
			w.dst = append(w.dst, '\n')
			w.col = 0
		}
	}
	return n, nil
}

// AppendSSEControl appends an `event: control` with c as one line of compact JSON, the
// bytes json.Marshal gives (hand-written: this follows every data event).
func AppendSSEControl(dst []byte, c SSEControl) []byte {
	dst = append(dst, "event: control\ndata:{\"streamNextOffset\":"...)
	dst = appendJSONString(dst, c.StreamNextOffset)
	if c.StreamCursor != "" {
		dst = append(dst, `,"streamCursor":`...)
		dst = appendJSONString(dst, c.StreamCursor)
	}
	if c.UpToDate {
		dst = append(dst, `,"upToDate":true`...)
	}
	if c.StreamClosed {
		dst = append(dst, `,"streamClosed":true`...)
	}
	return append(dst, "}\n\n"...)
}

// appendJSONString appends s as json.Marshal would quote it.
func appendJSONString(dst []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c >= 0x7f || c == '"' || c == '\\' || c == '<' || c == '>' || c == '&' {
			b, _ := json.Marshal(s)
			return append(dst, b...)
		}
	}
	dst = append(dst, '"')
	dst = append(dst, s...)
	return append(dst, '"')
}

// AppendSSEError appends an `event: error` whose data is the JSON error body (json.Marshal
// output, so one line).
func AppendSSEError(dst []byte, e *Error) []byte {
	dst = append(dst, "event: error\ndata:"...)
	dst = append(dst, e.Body()...)
	return append(dst, "\n\n"...)
}

// SSEEvent is one parsed server-sent event.
type SSEEvent struct {
	Type string // "message" when the event named none
	Data []byte // data lines joined with LF; owned by the caller
	ID   string // the last event ID seen so far (WHATWG: it persists across events)
}

// SSEReader parses an event stream by the WHATWG rules: CRLF, CR or LF line ends, a
// leading BOM ignored, comment lines (":"), a field without a colon has an empty value,
// one leading space stripped from values, data lines joined with LF, unknown fields
// ignored, and an event without any data line is not dispatched.
type SSEReader struct {
	r       *bufio.Reader
	line    []byte
	started bool // the first line (which may carry a BOM) was read
	skipLF  bool // the last line ended with CR: an LF right after it belongs to it
	lastID  string
}

// NewSSEReader reads events from r.
func NewSSEReader(r io.Reader) *SSEReader {
	br, ok := r.(*bufio.Reader)
	if !ok {
		br = bufio.NewReaderSize(r, 64<<10)
	}
	return &SSEReader{r: br}
}

// readLine returns the next line without its terminator; the slice is valid until the
// next call. A line cut short by EOF is returned as a line; EOF comes on the next call.
// A CR never waits for the byte after it, so CR-terminated events are not held back.
func (s *SSEReader) readLine() ([]byte, error) {
	s.line = s.line[:0]
	for {
		buf, err := s.r.Peek(max(s.r.Buffered(), 1))
		if len(buf) == 0 {
			if err == io.EOF && len(s.line) > 0 {
				return s.stripBOM(s.line), nil
			}
			return nil, err
		}
		if s.skipLF {
			s.skipLF = false
			if buf[0] == '\n' {
				s.r.Discard(1)
				continue
			}
		}
		i := bytes.IndexAny(buf, "\r\n")
		if i < 0 {
			s.line = append(s.line, buf...)
			s.r.Discard(len(buf))
			continue
		}
		s.line = append(s.line, buf[:i]...)
		s.skipLF = buf[i] == '\r'
		s.r.Discard(i + 1)
		return s.stripBOM(s.line), nil
	}
}

func (s *SSEReader) stripBOM(line []byte) []byte {
	if !s.started {
		s.started = true
		line = bytes.TrimPrefix(line, []byte("\xef\xbb\xbf"))
	}
	return line
}

// Next returns the next event, io.EOF when the stream ended between events, or
// io.ErrUnexpectedEOF when it ended inside one (WHATWG drops such an event).
func (s *SSEReader) Next() (SSEEvent, error) {
	var typ string
	var data []byte
	hasData := false
	for {
		line, err := s.readLine()
		if err != nil {
			if err == io.EOF && (hasData || typ != "") {
				return SSEEvent{}, io.ErrUnexpectedEOF
			}
			return SSEEvent{}, err
		}
		if len(line) == 0 {
			if !hasData {
				typ = "" // nothing to dispatch
				continue
			}
			if typ == "" {
				typ = "message"
			}
			if data == nil {
				data = []byte{}
			}
			return SSEEvent{Type: typ, Data: data, ID: s.lastID}, nil
		}
		if line[0] == ':' {
			continue
		}
		field, value := line, []byte(nil)
		if i := bytes.IndexByte(line, ':'); i >= 0 {
			field, value = line[:i], line[i+1:]
			if len(value) > 0 && value[0] == ' ' {
				value = value[1:]
			}
		}
		switch string(field) {
		case "event":
			typ = string(value)
		case "data":
			if hasData {
				data = append(data, '\n')
			}
			data = append(data, value...)
			hasData = true
		case "id":
			if bytes.IndexByte(value, 0) < 0 {
				s.lastID = string(value)
			}
		}
	}
}

// DecodeSSEData returns the payload of a data event: its data as is, or decoded from
// base64 (line breaks between data: lines ignored).
func DecodeSSEData(ev SSEEvent, b64 bool) ([]byte, error) {
	if !b64 {
		return ev.Data, nil
	}
	out := make([]byte, base64.StdEncoding.DecodedLen(len(ev.Data)))
	n, err := base64.StdEncoding.Decode(out, ev.Data) // skips '\n' (and '\r')
	return out[:n], err
}
