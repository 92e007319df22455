package raftlog

import (
	"encoding/binary"
	"hash/crc32"
	"testing"
)

func TestCRCUint64MatchesUpdate(t *testing.T) {
	for _, v := range []uint64{0, 1, 0xdeadbeefcafef00d, 1<<64 - 1} {
		var b [8]byte
		binary.LittleEndian.PutUint64(b[:], v)
		for _, seed := range []uint32{0, 0x12345678} {
			if got, want := crcUint64(seed, v), crc32.Update(seed, castagnoli, b[:]); got != want {
				t.Fatalf("crcUint64(%#x, %#x) = %#x, want %#x", seed, v, got, want)
			}
		}
	}
}
