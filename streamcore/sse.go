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
// LF-join then gives the payload back byte for byte (see appendDataLine for leading spaces). Binary
// payloads are base64 (RFC 4648, padded), split over lines of base64Line characters.
// A CR or CRLF in text also ends a data: line (as in the reference server), so a payload
// can never inject an event; such bytes arrive as LF, the one lossy case of text SSE.
func AppendSSEData(dst, payload []byte, b64 bool) []byte {
	dst = append(dst, "event: data\n"...)
	if b64 {
		enc := make([]byte, base64.StdEncoding.EncodedLen(len(payload)))
		base64.StdEncoding.Encode(enc, payload)
		if len(enc) == 0 {
			dst = append(dst, "data:\n"...)
		}
		for len(enc) > 0 {
			n := min(len(enc), base64Line)
			dst = append(dst, "data:"...)
			dst = append(dst, enc[:n]...)
			dst = append(dst, '\n')
			enc = enc[n:]
		}
		return append(dst, '\n')
	}
	for {
		i := bytes.IndexAny(payload, "\r\n")
		if i < 0 {
			dst = appendDataLine(dst, payload)
			break
		}
		dst = appendDataLine(dst, payload[:i])
		if payload[i] == '\r' && i+1 < len(payload) && payload[i+1] == '\n' {
			i++
		}
		payload = payload[i+1:]
	}
	return append(dst, '\n')
}

// appendDataLine writes "data:" and the line; a line that starts with a space gets one
// more, because parsers strip exactly one space after the colon.
func appendDataLine(dst, line []byte) []byte {
	dst = append(dst, "data:"...)
	if len(line) > 0 && line[0] == ' ' {
		dst = append(dst, ' ')
	}
	dst = append(dst, line...)
	return append(dst, '\n')
}

// AppendSSEControl appends an `event: control` with c as one line of JSON.
func AppendSSEControl(dst []byte, c SSEControl) []byte {
	b, _ := json.Marshal(c)
	dst = append(dst, "event: control\ndata:"...)
	dst = append(dst, b...)
	return append(dst, "\n\n"...)
}

// AppendSSEError appends an `event: error` whose data is the JSON error body.
func AppendSSEError(dst []byte, e *Error) []byte {
	dst = append(dst, "event: error\ndata:"...)
	dst = append(dst, e.Body()...)
	return append(dst, "\n\n"...)
}

// SSEEvent is one parsed server-sent event.
type SSEEvent struct {
	Type string // "message" when the event named none
	Data []byte
	ID   string
}

// SSEReader parses an event stream (the WHATWG rules: CRLF, CR or LF line ends, comment
// lines, one leading space stripped from values, data lines joined with LF).
type SSEReader struct {
	r    *bufio.Reader
	line []byte
}

// NewSSEReader reads events from r.
func NewSSEReader(r io.Reader) *SSEReader {
	br, ok := r.(*bufio.Reader)
	if !ok {
		br = bufio.NewReaderSize(r, 64<<10)
	}
	return &SSEReader{r: br}
}

// readLine returns the next line without its terminator.
func (s *SSEReader) readLine() ([]byte, error) {
	s.line = s.line[:0]
	for {
		b, err := s.r.ReadByte()
		if err != nil {
			if err == io.EOF && len(s.line) > 0 {
				return s.line, nil
			}
			return nil, err
		}
		switch b {
		case '\n':
			return s.line, nil
		case '\r':
			if nb, err := s.r.Peek(1); err == nil && nb[0] == '\n' {
				s.r.ReadByte()
			}
			return s.line, nil
		}
		s.line = append(s.line, b)
	}
}

// Next returns the next event, or io.EOF when the stream ended between events.
func (s *SSEReader) Next() (SSEEvent, error) {
	var ev SSEEvent
	var data []byte
	hasData := false
	for {
		line, err := s.readLine()
		if err != nil {
			if err == io.EOF && (hasData || ev.Type != "") {
				return SSEEvent{}, io.ErrUnexpectedEOF
			}
			return SSEEvent{}, err
		}
		if len(line) == 0 {
			if !hasData && ev.Type == "" {
				continue // blank line with no event: ignore
			}
			if ev.Type == "" {
				ev.Type = "message"
			}
			ev.Data = data
			return ev, nil
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
			ev.Type = string(value)
		case "data":
			if hasData {
				data = append(data, '\n')
			}
			data = append(data, value...)
			hasData = true
		case "id":
			ev.ID = string(value)
		}
	}
}

// DecodeSSEData returns the payload of a data event.
func DecodeSSEData(ev SSEEvent, b64 bool) ([]byte, error) {
	if !b64 {
		return ev.Data, nil
	}
	clean := bytes.ReplaceAll(ev.Data, []byte("\n"), nil)
	out := make([]byte, base64.StdEncoding.DecodedLen(len(clean)))
	n, err := base64.StdEncoding.Decode(out, clean)
	return out[:n], err
}
