package streamcore

// Op names a command of the per-stream state machine.
type Op uint8

const (
	OpCreate Op = iota + 1
	OpAppend    // append and/or close (Close set, Body empty = close-only)
	OpDelete
	OpTouch // renew a sliding TTL on behalf of a read
	OpPublishSnapshot
	OpRetain
	// OpRecordChunk records that the bytes [Offset, ChunkEnd) of the incarnation
	// IfIncarnation are stored in the cold object ChunkKey and trims them from the hot
	// buffer. Offset must be the stream's current hot start.
	OpRecordChunk
	// OpRestoreStream installs a stream from a backup as a history rewrite: Body is the
	// stream encoded by EncodeStream, NewIncarnation its new token (see restore.go).
	OpRestoreStream
	// OpPurgeBucket erases every stream of the bucket Key (a bucket name, no slash) in
	// this state and fences the bucket forever (see purge.go).
	OpPurgeBucket
)

func (o Op) String() string {
	switch o {
	case OpCreate:
		return "create"
	case OpAppend:
		return "append"
	case OpDelete:
		return "delete"
	case OpTouch:
		return "touch"
	case OpPublishSnapshot:
		return "publish_snapshot"
	case OpRetain:
		return "retain"
	case OpRecordChunk:
		return "record_chunk"
	case OpRestoreStream:
		return "restore_stream"
	case OpPurgeBucket:
		return "purge_bucket"
	}
	return "unknown"
}

// Command is one deterministic mutation. Everything apply needs is inside it: the proposing
// node fills Now, NewIncarnation and the outcome of body checks (normalised JSON, digest
// comparison) once, so every replica reaches the same state. Commands are plain data so an
// engine can serialise them (gob/JSON) into a log.
type Command struct {
	Op  Op
	Key string // "bucket/stream"
	Now int64  // Unix milliseconds, assigned by the proposer

	// IfIncarnation is the Stream-Incarnation precondition (0 = absent).
	IfIncarnation uint64

	// Create.
	ContentType    string // normalised; "" = not given
	TTL            int64  // seconds; -1 = not given
	ExpiresAt      string // RFC 3339 text as sent; "" = not given
	ExpiresAtMs    int64
	NewIncarnation uint64 // token for a stream this command creates
	Fork           *ForkSpec

	// Create and append.
	Body       []byte // stored form (JSON already normalised)
	Messages   int    // JSON messages in Body (0 for non-JSON)
	Close      bool   // Stream-Closed: true
	StreamSeq  string // Stream-Seq (already filtered: printable ASCII); "" = absent
	BodyFault  *Error // content fault found by the proposer (missing type, empty, bad JSON)
	Producer   *ProducerHeaders
	DigestBad  bool // Producer-Digest did not match the body
	WithIncHdr bool // the write carried Stream-Incarnation (epoch floor rules)

	// Snapshot publish and retention.
	Offset         uint64
	SnapshotType   string
	SnapshotDigest string

	// Cold tier. A snapshot publish whose body the proposer stored as an object carries
	// its key and size instead of Body. BoundaryChecked: the proposer read the cold tier
	// and found Offset to be a JSON message boundary (the hot buffer no longer holds the
	// byte before it); BoundaryRefuted: it read that byte and found no boundary. Neither:
	// the boundary is unverified and apply refuses rather than guess. Record chunk:
	// ChunkKey holds [Offset, ChunkEnd).
	SnapshotColdKey string
	SnapshotSize    uint64
	BoundaryChecked bool
	BoundaryRefuted bool
	ChunkKey        string
	ChunkEnd        uint64

	// BodyFrame, when set, is the frame (NewBodyFrame) Body was read into, for
	// AppendCommandAround. It is not part of the command: never encoded, and a command
	// without it means the same.
	BodyFrame []byte
}

// ProducerHeaders are the idempotent producer headers of a write.
type ProducerHeaders struct {
	ID     string
	Epoch  uint64
	Seq    uint64
	Digest string // Producer-Digest as sent, "" if absent (part of the write's identity)
}

// ForkSpec makes a create a fork of another stream (Stream-Forked-From and friends).
type ForkSpec struct {
	Source    string // key of the source stream
	Offset    uint64
	HasOffset bool
	SubOffset uint64
}
