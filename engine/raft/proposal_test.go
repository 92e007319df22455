package raftengine

import (
	"bytes"
	"math"
	"strings"
	"testing"

	"github.com/ursula-go/ursula/streamcore"
)

// TestProposalCapHoldsTheEncoding: an entry built in proposalCap(c) bytes never grows,
// with every field at its widest (largest varints, long strings, fork, producer, fault).
func TestProposalCapHoldsTheEncoding(t *testing.T) {
	long := strings.Repeat("k", 300)
	full := &streamcore.Command{
		Op: streamcore.OpAppend, Key: long, Now: math.MinInt64, IfIncarnation: math.MaxUint64,
		ContentType: long, TTL: math.MinInt64, ExpiresAt: long, ExpiresAtMs: math.MinInt64,
		NewIncarnation: math.MaxUint64, Fork: &streamcore.ForkSpec{Source: long, Offset: math.MaxUint64, HasOffset: true, SubOffset: math.MaxUint64},
		Body: make([]byte, 1<<20), Messages: math.MaxInt32, Close: true, StreamSeq: long,
		BodyFault: &streamcore.Error{Status: 400, Code: long, Message: long, Headers: map[string]string{long: long, "a": "b"}},
		Producer:  &streamcore.ProducerHeaders{ID: long, Epoch: math.MaxUint64, Seq: math.MaxUint64, Digest: long},
		DigestBad: true, WithIncHdr: true, Offset: math.MaxUint64, SnapshotType: long, SnapshotDigest: long,
		SnapshotColdKey: long, SnapshotSize: math.MaxUint64, ChunkKey: long, ChunkEnd: math.MaxUint64,
	}
	cases := map[string]*streamcore.Command{
		"empty":       {},
		"1 MiB body":  {Op: streamcore.OpAppend, Key: "bench/s1", ContentType: "application/octet-stream", Body: make([]byte, 1<<20), Producer: &streamcore.ProducerHeaders{ID: "writer-1", Epoch: 1, Seq: 99}},
		"every field": full,
	}
	for name, c := range cases {
		n := proposalCap(c)
		data := streamcore.AppendCommand(make([]byte, 1, n), c)
		if cap(data) != n {
			t.Errorf("%s: the entry grew from %d to %d bytes (%d used)", name, n, cap(data), len(data))
		}
	}
}

// TestCommandEntryAroundBody: a command whose body came in a frame is encoded into that
// frame (the entry shares the body's memory, no copy); one without a frame, or whose head
// fields do not fit before the body, gets its own buffer. Both decode to the command.
func TestCommandEntryAroundBody(t *testing.T) {
	frame, body := streamcore.NewBodyFrame(1 << 20)
	for i := range body {
		body[i] = byte(i)
	}
	framed := &streamcore.Command{Op: streamcore.OpAppend, Key: "bench/s1", ContentType: "application/octet-stream",
		Body: body, BodyFrame: frame, Producer: &streamcore.ProducerHeaders{ID: "writer-1", Epoch: 1, Seq: 99}}
	longKey := *framed
	longKey.Key = "bench/" + strings.Repeat("k", streamcore.BodyFrameHead)
	plain := *framed
	plain.BodyFrame = nil
	cases := []struct {
		name   string
		c      *streamcore.Command
		shares bool
	}{
		{"framed", framed, true},
		{"head longer than the room", &longKey, false},
		{"no frame", &plain, false},
	}
	for _, tc := range cases {
		entry := commandEntry(tc.c)
		if entry[0] != entryCommand {
			t.Fatalf("%s: entry kind %d", tc.name, entry[0])
		}
		// The body's bytes inside the entry: shared with the frame, or a copy.
		at := len(entry) - len(body)
		for ; at >= 0 && !bytes.Equal(entry[at:at+len(body)], body); at-- {
		}
		if at < 0 {
			t.Fatalf("%s: body not in the entry", tc.name)
		}
		if shares := &entry[at] == &body[0]; shares != tc.shares {
			t.Fatalf("%s: entry shares the frame: %v, want %v", tc.name, shares, tc.shares)
		}
		got, err := streamcore.DecodeCommand(entry[1:])
		if err != nil || got.Key != tc.c.Key || !bytes.Equal(got.Body, body) || got.Producer.Seq != 99 {
			t.Fatalf("%s: decode: %v", tc.name, err)
		}
	}
}
