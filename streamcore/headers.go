package streamcore

// Header names of the protocol, defined once for the server, the replicator and the client.
const (
	HdrContentType     = "Content-Type"
	HdrStreamNextOff   = "Stream-Next-Offset"
	HdrStreamOffset    = "Stream-Offset"
	HdrStreamCursor    = "Stream-Cursor"
	HdrStreamUpToDate  = "Stream-Up-To-Date"
	HdrStreamClosed    = "Stream-Closed"
	HdrStreamTTL       = "Stream-TTL"
	HdrStreamExpiresAt = "Stream-Expires-At"
	HdrStreamSeq       = "Stream-Seq"
	HdrStreamLastSeq   = "Stream-Last-Seq"
	HdrIncarnation     = "Stream-Incarnation"
	HdrRetainedOffset  = "Stream-Retained-Offset"
	HdrSnapshotOffset  = "Stream-Snapshot-Offset"
	HdrSnapshotDigest  = "Stream-Snapshot-Digest"
	HdrSnapshotParts   = "Stream-Snapshot-Parts"
	HdrSnapshotPart    = "Stream-Snapshot-Part"
	HdrSnapshotMatch   = "Stream-Snapshot-Match"
	HdrImmutable       = "Stream-Immutable"
	HdrSSEDataType     = "Stream-Data-Content-Type"
	HdrSSEEncoding     = "Stream-Sse-Data-Encoding"
	HdrRecordMatch     = "Stream-Record-Match"

	HdrPreviousIncarnation = "Stream-Previous-Incarnation"
	HdrInheritedOffset     = "Stream-Inherited-Offset"

	HdrForkedFrom    = "Stream-Forked-From"
	HdrForkOffset    = "Stream-Fork-Offset"
	HdrForkSubOffset = "Stream-Fork-Sub-Offset"

	HdrProducerID          = "Producer-Id"
	HdrProducerEpoch       = "Producer-Epoch"
	HdrProducerSeq         = "Producer-Seq"
	HdrProducerExpectedSeq = "Producer-Expected-Seq"
	HdrProducerReceivedSeq = "Producer-Received-Seq"
	HdrProducerClosedEpoch = "Producer-Closed-Epoch"
	HdrProducerClosedSeq   = "Producer-Closed-Seq"
	HdrProducerOutcome     = "Producer-Outcome"
	HdrProducerDigest      = "Producer-Digest"

	HdrUrsulaProtocol    = "Ursula-Protocol"
	HdrUrsulaClusterID   = "Ursula-Cluster-Id"
	HdrMaxRequestBytes   = "Ursula-Max-Request-Bytes"
	HdrMaxSnapshotBytes  = "Ursula-Max-Snapshot-Bytes"
	HdrMaxStagedParts    = "Ursula-Max-Staged-Parts"
	HdrMaxStagedBytes    = "Ursula-Max-Staged-Bytes"
	HdrNotApplied        = "X-Ursula-Not-Applied"
	HdrNotAppliedChecked = "X-Ursula-Not-Applied-Checked"
	HdrRetryAfter        = "Retry-After"
)

// Protocol numbers (checklist-protocol.md section 30).
const (
	ProtocolVersion   = "2"
	MaxRequestBytes   = 32 << 20 // 33,554,432
	MaxReadBytes      = 8 << 20  // 8,388,608: read response, SSE event and bootstrap cap
	MaxSnapshotParts  = 4096     // parts one commit may name (checklist 22.6)
	ChunkGrid         = 4 << 20  // immutable chunk grid
	MaxJSONDepth      = 127
	MaxStreamIDBytes  = 122
	MaxProducerID     = 256
	MaxStreamSeqBytes = 256
	MaxSafeInteger    = 1<<53 - 1
	ReceiptWindowSize = 1024
	MaxProducers      = 4096
	ProducerIdleEvict = 60 * 60 * 1000          // ms idle before a producer may be evicted
	ProducerExpiry    = 7 * 24 * 60 * 60 * 1000 // ms without a write before state is forgotten
	DefaultLongPollMs = 1000
	MaxLongPollMs     = 60000
)
