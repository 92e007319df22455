package streamcore

import (
	"bytes"
	"strings"
	"testing"
)

// framed returns a copy of c whose Body was read into a body frame.
func framed(c *Command) *Command {
	f := *c
	frame, body := NewBodyFrame(len(c.Body))
	copy(body, c.Body)
	f.Body, f.BodyFrame = body, frame
	return &f
}

// sameMemory reports whether a and b share their first byte's address.
func sameMemory(a, b []byte) bool { return len(a) > 0 && len(b) > 0 && &a[0] == &b[0] }

func TestAppendCommandAround(t *testing.T) {
	body := bytes.Repeat([]byte("0123456789abcdef"), 8192) // 128 KiB
	producer := &ProducerHeaders{ID: "writer-1", Epoch: 3, Seq: 9, Digest: strings.Repeat("d", 64)}
	cases := []struct {
		name    string
		c       *Command
		inPlace bool // the entry is written around the body, sharing the frame
	}{
		{"plain append", framed(&Command{Op: OpAppend, Key: "b/s", Now: 1_700_000_000_000, ContentType: "application/octet-stream", Body: body}), true},
		{"producer, seq, close", framed(&Command{Op: OpAppend, Key: "b/s", Now: 5, ContentType: "text/plain", Body: body, Close: true,
			StreamSeq: "0042", Producer: producer, WithIncHdr: true, IfIncarnation: 7, DigestBad: true}), true},
		{"create with a body", framed(&Command{Op: OpCreate, Key: "b/new", Now: 5, TTL: 3600, ContentType: "text/plain", NewIncarnation: 99, Body: body}), true},
		{"body further into its frame", func() *Command {
			c := framed(&Command{Op: OpAppend, Key: "b/s", ContentType: "text/plain", Body: body})
			c.Body = c.Body[1:]
			return c
		}(), true},
		// The fields after the body outgrow the room after it: appended with one copy.
		{"long tail", framed(&Command{Op: OpAppend, Key: "b/s", ContentType: "text/plain", Body: body, StreamSeq: strings.Repeat("s", 2*BodyFrameTail)}), false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			want := AppendCommand([]byte{0xEE}, tc.c)
			got, ok := AppendCommandAround([]byte{0xEE}, tc.c)
			if !ok {
				t.Fatal("not encoded around the body")
			}
			if !bytes.Equal(got, want) {
				t.Fatalf("encoding differs from AppendCommand (%d vs %d bytes)", len(got), len(want))
			}
			head := cap(tc.c.BodyFrame) - cap(tc.c.Body)
			if shares := sameMemory(got, tc.c.BodyFrame[head-(len(want)-len(tc.c.Body)-tailLen(tc.c)):]); shares != tc.inPlace {
				t.Fatalf("entry shares the frame: %v, want %v", shares, tc.inPlace)
			}
			dec, err := DecodeCommand(got[1:])
			if err != nil || !bytes.Equal(dec.Body, tc.c.Body) || dec.Key != tc.c.Key {
				t.Fatalf("decode: %v", err)
			}
		})
	}

	refused := []struct {
		name string
		c    *Command
	}{
		{"no frame", &Command{Op: OpAppend, Key: "b/s", Body: body}},
		{"body not in its frame (normalised JSON)", func() *Command {
			c := framed(&Command{Op: OpAppend, Key: "b/s", Body: body})
			c.Body = append([]byte(nil), c.Body...)
			return c
		}()},
		{"body in another frame of the same size", func() *Command {
			c := framed(&Command{Op: OpAppend, Key: "b/s", Body: body})
			c.Body = framed(c).Body
			return c
		}()},
		{"empty body", framed(&Command{Op: OpAppend, Key: "b/s", Close: true})},
		{"head fields longer than the room", framed(&Command{Op: OpAppend, Key: "b/" + strings.Repeat("k", BodyFrameHead), Body: body})},
	}
	for _, tc := range refused {
		t.Run(tc.name, func(t *testing.T) {
			var before []byte
			if tc.c.BodyFrame != nil {
				before = append([]byte(nil), tc.c.BodyFrame[:cap(tc.c.BodyFrame)]...)
			}
			if entry, ok := AppendCommandAround([]byte{0xEE}, tc.c); ok || entry != nil {
				t.Fatal("encoded around a body it must not use")
			}
			if tc.c.BodyFrame != nil && !bytes.Equal(before, tc.c.BodyFrame[:cap(tc.c.BodyFrame)]) {
				t.Fatal("a refused frame was written to")
			}
		})
	}
}

// tailLen is the length of the encoding of c's fields after its body.
func tailLen(c *Command) int {
	var e encoder
	e.commandTail(c)
	return len(e.b)
}

func FuzzAppendCommandAround(f *testing.F) {
	f.Add("b/s", "text/plain", "seq", "writer", []byte("body"), uint64(3), true)
	f.Add(strings.Repeat("k", 600), "", "", "", []byte{0}, uint64(0), false)
	f.Fuzz(func(t *testing.T, key, ct, seq, producer string, body []byte, epoch uint64, closing bool) {
		c := &Command{Op: OpAppend, Key: key, ContentType: ct, StreamSeq: seq, Body: body, Close: closing}
		if producer != "" {
			c.Producer = &ProducerHeaders{ID: producer, Epoch: epoch}
		}
		c = framed(c)
		want := AppendCommand([]byte{1}, c)
		got, ok := AppendCommandAround([]byte{1}, c)
		if ok && !bytes.Equal(got, want) {
			t.Fatalf("encoding differs from AppendCommand")
		}
		if !ok && len(body) > 0 && len(want)-len(body)-tailLen(c) <= BodyFrameHead {
			t.Fatalf("refused although the head fits")
		}
	})
}
