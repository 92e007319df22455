package streamcore

import (
	"encoding/hex"
	"hash"

	"github.com/ursula-go/ursula/internal/blake3seq"
)

// ProducerDigestOf is the Producer-Digest of a body: lowercase hex BLAKE3-256 (checklist 10.20).
func ProducerDigestOf(body []byte) string {
	sum := blake3seq.Sum256(body)
	return hex.EncodeToString(sum[:])
}

// SnapshotDigestOf is the Stream-Snapshot-Digest of a snapshot: lowercase hex BLAKE3 of
// u64 little-endian len(content type) || content type || body (checklist 21.3).
func SnapshotDigestOf(contentType string, body []byte) string {
	h := NewSnapshotDigest(contentType)
	h.Write(body)
	return hex.EncodeToString(h.Sum(nil))
}

// NewSnapshotDigest returns a hash to which a snapshot body is written piece by piece, so a
// body too large to hold is digested as it streams; hex of its Sum is SnapshotDigestOf.
func NewSnapshotDigest(contentType string) hash.Hash {
	h := blake3seq.New()
	var n [8]byte
	l := uint64(len(contentType))
	for i := range n {
		n[i] = byte(l >> (8 * i))
	}
	h.Write(n[:])
	h.Write([]byte(contentType))
	return h
}
