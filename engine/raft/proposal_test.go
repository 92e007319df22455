package raftengine

import (
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
