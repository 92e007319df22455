package client

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"iter"
	"net/http"
	"net/http/httptrace"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ursula-go/ursula/internal/inlinehttp"
	"github.com/ursula-go/ursula/streamcore"
	"github.com/ursula-go/ursula/tlsfiles"
)

// Client speaks the Durable Streams protocol with the Ursula extensions. It is safe for
// concurrent use. Every write answer is classified as Applied, NotApplied or Unknown
// (see OutcomePolicy.Classify); failures come back as *Error.
//
// Stream-addressed methods take the stream URL: a full URL such as
// http://127.0.0.1:4437/bucket/stream, or a reference resolved against the base URL given
// to New (for example "bucket/stream"). A full URL may name several nodes of one cluster,
// http://n1:4437,n2:4437,n3:4437/bucket/stream (see ParseNodeURL).
type Client struct {
	// HTTP sends the requests. New installs a keep-alive InlineTransport; a client given
	// with WithHTTPClient is copied and its redirect following turned off (the client
	// follows redirects itself, only where they prove the write applied nothing).
	HTTP *http.Client
	// Base resolves relative stream references; nil means they are refused.
	Base *url.URL
	// Policy holds the classification choices (marker vouch, lenient 2xx).
	Policy OutcomePolicy
	// WriteTimeout and ReadTimeout bound a request whose context has no deadline
	// (0 = none). A long-poll gets its timeout_ms plus ReadTimeout. SSE is never bounded.
	WriteTimeout time.Duration
	ReadTimeout  time.Duration
	// MaxRedirects bounds how many 307/308 hops a request follows (0: 5; negative: none).
	MaxRedirects int
	// UserAgent is sent on every request when set (New sets DefaultUserAgent).
	UserAgent string

	token  atomic.Pointer[string]
	routes sync.Map // node list (scheme://authority) -> *nodeRoute (nodes.go)
}

// Option configures New.
type Option func(*Client)

// WithHTTPClient sends requests with hc (copied; its redirect following is turned off).
func WithHTTPClient(hc *http.Client) Option {
	return func(c *Client) {
		cp := *hc
		cp.CheckRedirect = noRedirect
		c.HTTP = &cp
	}
}

// WithToken sets the bearer token sent as "Authorization: Bearer <token>".
func WithToken(token string) Option { return func(c *Client) { c.SetToken(token) } }

// WithPolicy sets the outcome classification policy.
func WithPolicy(p OutcomePolicy) Option { return func(c *Client) { c.Policy = p } }

// WithTimeouts sets the default write and read timeouts.
func WithTimeouts(write, read time.Duration) Option {
	return func(c *Client) { c.WriteTimeout, c.ReadTimeout = write, read }
}

// WithUserAgent sets the User-Agent header.
func WithUserAgent(ua string) Option { return func(c *Client) { c.UserAgent = ua } }

// New returns a client. baseURL may be empty when every call passes full URLs;
// otherwise it is the prefix relative references resolve under (a trailing "/" is implied,
// so with base http://h/bucket the reference "s" names http://h/bucket/s).
func New(baseURL string, opts ...Option) (*Client, error) {
	c := &Client{
		HTTP:         &http.Client{Transport: NewInlineTransport(NewTransport()), CheckRedirect: noRedirect},
		WriteTimeout: 30 * time.Second,
		ReadTimeout:  30 * time.Second,
		MaxRedirects: 5,
		UserAgent:    DefaultUserAgent,
	}
	if baseURL != "" {
		u, err := url.Parse(baseURL)
		if err != nil || !u.IsAbs() {
			return nil, fmt.Errorf("streamcore: base URL %q is not an absolute URL", baseURL)
		}
		if !strings.HasSuffix(u.Path, "/") {
			u.Path += "/"
			if u.RawPath != "" {
				u.RawPath += "/"
			}
		}
		c.Base = u
	}
	for _, o := range opts {
		o(c)
	}
	return c, nil
}

// NewTransport returns the net/http transport under the InlineTransport New installs: the
// inline transport dials, resolves, sets up TLS and keeps idle connections by its settings,
// and hands it what it does not send itself (requests through a proxy). Its settings: many
// idle connections per host (for concurrent writers and live readers), dialing and TLS are
// bounded (5 s each), host names are resolved under the rules of dns.go (a lookup at most
// every 30 s, last addresses kept through failed lookups), and the outbound proxy comes
// from HTTPS_PROXY, HTTP_PROXY, ALL_PROXY and NO_PROXY as they are when it is made
// (proxyFromEnv).
func NewTransport() *http.Transport {
	return newTransport(newAddrCache(nil))
}

// TransportOptions configure NewTransportWith.
type TransportOptions struct {
	// CAFile is a PEM file whose CA certificates alone are trusted for https:// URLs;
	// "" keeps the system roots.
	CAFile string
	// OnDNSStale is told when a host's last addresses serve a dial after its lookup
	// failed: the time since the last successful lookup and the failure. It is called at
	// most once per host every 5 s, with the transport's resolver locked (so it must not
	// dial).
	OnDNSStale func(host string, age time.Duration, reason error)
}

// NewTransportWith is NewTransport with the options o.
func NewTransportWith(o TransportOptions) (*http.Transport, error) {
	tr := newTransport(newAddrCache(o.OnDNSStale))
	if o.CAFile == "" {
		return tr, nil
	}
	cfg, err := tlsfiles.ClientConfigFromCAFile(o.CAFile)
	if err != nil {
		return nil, err
	}
	tr.TLSClientConfig = cfg
	return tr, nil
}

func newTransport(ac *addrCache) *http.Transport {
	return &http.Transport{
		Proxy:                 proxyFromEnv(),
		DialContext:           ac.dialContext,
		MaxIdleConns:          512,
		MaxIdleConnsPerHost:   256,
		IdleConnTimeout:       90 * time.Second,
		TLSHandshakeTimeout:   5 * time.Second,
		ExpectContinueTimeout: time.Second,
		ForceAttemptHTTP2:     true,
		// A request up to this size (head and body) leaves in one write; net/http's
		// 4 KiB default cut a commit of a few pages in two.
		WriteBufferSize: 32 << 10,
	}
}

// NewTransportWithCA is NewTransport trusting the CA certificates of the PEM file
// caFile for https:// URLs (only those: the system roots are not consulted then); ""
// keeps the system roots.
func NewTransportWithCA(caFile string) (*http.Transport, error) {
	return NewTransportWith(TransportOptions{CAFile: caFile})
}

// InlineTransport is the transport New installs over NewTransport: each HTTP/1.1
// exchange runs in the calling goroutine, on connections of its own; requests through a
// proxy (and Expect/Upgrade requests) go to its Fallback (package internal/inlinehttp).
type InlineTransport = inlinehttp.Transport

// NewInlineTransport returns an InlineTransport over fallback, whose dialer, TLS
// configuration, proxy and idle settings it follows (nil: NewTransport()).
func NewInlineTransport(fallback *http.Transport) *InlineTransport {
	if fallback == nil {
		fallback = NewTransport()
	}
	return inlinehttp.New(fallback)
}

func noRedirect(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }

// SetToken sets (or, with "", clears) the bearer token; safe while requests run.
func (c *Client) SetToken(token string) {
	if token == "" {
		c.token.Store(nil)
		return
	}
	c.token.Store(&token)
}

// HasToken reports whether a bearer token is set.
func (c *Client) HasToken() bool { return c.token.Load() != nil }

// StreamURL joins a base URL, a bucket and a stream id into a stream URL, escaping both ids.
func StreamURL(base, bucket, stream string) string {
	return strings.TrimRight(base, "/") + "/" + url.PathEscape(bucket) + "/" + url.PathEscape(stream)
}

// ---------------------------------------------------------------------------------------
// Errors

// Error is a request that did not succeed: an error answer, an answer the client
// cannot read as success, or no answer at all (Status 0, Err set). Outcome says what it
// proves about a write; for reads, which change nothing, it is NotApplied.
type Error struct {
	Op      string // "append", "create", "read", ...
	Method  string
	URL     string
	Status  int    // 0 when no answer came
	Code    string // code of the JSON error body; "" when none
	Message string // message of the error body, or the start of a non-JSON body
	Outcome Outcome
	Err     error // the transport error when no answer came

	// NotApplied is the x-ursula-not-applied token ("" when absent).
	NotApplied string
	// Header holds every header of the answer (nil when none came).
	Header http.Header

	// Typed headers of the answer; -1 or "" when absent.
	ProducerEpoch       int64
	ProducerSeq         int64
	ProducerExpectedSeq int64
	ProducerReceivedSeq int64
	ProducerClosedEpoch int64
	ProducerClosedSeq   int64
	ProducerOutcome     string // full structured value, e.g. "epoch-closed;by=claim"
	StreamLastSeq       string // only on a 409 STREAM_SEQ_CONFLICT
	StreamNextOffset    string
	StreamClosed        bool
	Incarnation         string
	SnapshotOffset      string // a 409 SNAPSHOT_CONFLICT names the latest snapshot
	SnapshotDigest      string
	RetryAfter          time.Duration
	Location            string
	MaxRequestBytes     int64
}

func (e *Error) Error() string {
	var b strings.Builder
	b.WriteString("ursula ")
	b.WriteString(e.Op)
	b.WriteString(" ")
	b.WriteString(e.URL)
	b.WriteString(": ")
	if e.Status == 0 {
		if e.Err != nil {
			b.WriteString(e.Err.Error())
		} else {
			b.WriteString("no answer")
		}
	} else {
		b.WriteString(strconv.Itoa(e.Status))
		if e.Code != "" {
			b.WriteString(" ")
			b.WriteString(e.Code)
		}
		if e.Message != "" {
			b.WriteString(": ")
			b.WriteString(e.Message)
		}
	}
	b.WriteString(" (outcome ")
	b.WriteString(e.Outcome.String())
	b.WriteString(")")
	return b.String()
}

func (e *Error) Unwrap() error { return e.Err }

// Fenced reports a producer 403 (it carries Producer-Epoch): a newer epoch of the producer
// owns the stream, or the key conflicts, or the producer expired (see ProducerOutcome).
func (e *Error) Fenced() bool { return e.Status == http.StatusForbidden && e.ProducerEpoch >= 0 }

// OutcomeOf returns what err proves about a write: Applied for nil, the outcome of a
// *Error, Unknown for anything else.
func OutcomeOf(err error) Outcome {
	if err == nil {
		return Applied
	}
	var ce *Error
	if errors.As(err, &ce) {
		return ce.Outcome
	}
	return Unknown
}

// ---------------------------------------------------------------------------------------
// Results

// WriteResult is the typed answer of an applied write (Outcome Applied).
type WriteResult struct {
	Status int
	Header http.Header

	Created     bool   // create: 201 (false: 200, an identical stream existed)
	Location    string // create 201
	ContentType string // create: the stream content type

	Offset      string // Stream-Offset: start of the write's bytes (producer receipt)
	NextOffset  string // Stream-Next-Offset: end of the write / new tail
	Closed      bool   // Stream-Closed: true
	Incarnation string // Stream-Incarnation

	ProducerEpoch       int64 // -1 when absent
	ProducerSeq         int64 // highest applied seq of the epoch; -1 when absent
	ProducerClosedEpoch int64 // claim answers: the epoch this claim closed; -1 when absent
	ProducerClosedSeq   int64
	// Duplicate is a producer 204: an earlier request with the same key applied the write
	// (a close-only producer write answers 204 even when it applies now; both hold).
	Duplicate bool
	// ReceiptEvicted: a repeat whose range the server no longer keeps (no Offset/NextOffset).
	ReceiptEvicted bool

	SnapshotOffset string // publish / commit
	SnapshotDigest string
	SnapshotPart   string // staged part id
	RetainedOffset string // retention
}

// ReadResult is the answer to a catch-up or long-poll read.
type ReadResult struct {
	Status      int    // 200, 204 (long-poll timeout or closed at tail) or 304
	Data        []byte // the bytes read (appended to ReadOptions.Buf[:0])
	NextOffset  string
	UpToDate    bool
	Closed      bool
	Incarnation string
	ETag        string
	Cursor      string
	ContentType string // the read representation (application/x-ndjson for JSON streams)
	NotModified bool   // 304 for If-None-Match
	Header      http.Header
}

// StreamInfo is the metadata HEAD reports.
type StreamInfo struct {
	ContentType         string // configured type (application/json for JSON streams)
	NextOffset          string // the tail
	Closed              bool
	TTL                 int64  // Stream-TTL seconds; -1 when absent
	ExpiresAt           string // Stream-Expires-At as sent; "" when absent
	RetainedOffset      string
	SnapshotOffset      string // "" when no snapshot
	SnapshotDigest      string
	Incarnation         string
	PreviousIncarnation string // history rewrites only
	InheritedOffset     string
	MaxRequestBytes     int64 // -1 when absent
	MaxSnapshotBytes    int64 // -1 when absent (no parts upload)
	Protocol            string
	ClusterID           string
	Header              http.Header
}

// SnapshotResult is the answer to a snapshot read.
type SnapshotResult struct {
	Status       int // 200, 206 or 304
	Data         []byte
	ContentType  string
	Offset       string // Stream-Snapshot-Offset
	Digest       string // Stream-Snapshot-Digest (always over the whole snapshot)
	NextOffset   string
	UpToDate     bool
	Incarnation  string
	ETag         string
	ContentRange string
	NotModified  bool
	Header       http.Header
}

// BootstrapResult is a parsed bootstrap answer: the snapshot part and the update parts.
type BootstrapResult struct {
	SnapshotOffset string // "-1" when the stream has no snapshot
	NextOffset     string // end of the updates (P)
	UpToDate       bool   // complete form: the updates reach the tail
	Closed         bool
	Incarnation    string
	Snapshot       streamcore.Part   // first part (empty application/octet-stream when no snapshot)
	Updates        []streamcore.Part // update parts, contiguous bytes [snapshot point, NextOffset)
	Header         http.Header
}

// ---------------------------------------------------------------------------------------
// Options

// CallOptions are the optional extras of a request.
type CallOptions struct {
	IfIncarnation string      // Stream-Incarnation precondition ("" = none)
	Header        http.Header // extra request headers
}

func firstCall(o []CallOptions) CallOptions {
	if len(o) > 0 {
		return o[0]
	}
	return CallOptions{}
}

// CreateOptions configure a stream create.
type CreateOptions struct {
	ContentType   string        // "" = not sent (server default application/octet-stream)
	TTL           time.Duration // > 0: Stream-TTL in whole seconds
	ExpiresAt     time.Time     // non-zero: Stream-Expires-At (RFC 3339)
	Closed        bool          // Stream-Closed: true (Body is the complete content)
	Body          []byte        // initial content
	StreamSeq     string        // stored as the starting Stream-Seq
	IfIncarnation string
	Header        http.Header
}

// ProducerKey is an idempotent producer's key of one write.
type ProducerKey struct {
	ID    string
	Epoch uint64
	Seq   uint64
}

// AppendOptions configure an append or close.
type AppendOptions struct {
	ContentType   string       // required by the server for a non-empty body
	Producer      *ProducerKey // idempotent producer headers (nil = none)
	Digest        bool         // send Producer-Digest (BLAKE3-256 of the body)
	StreamSeq     string       // Stream-Seq compare-and-set
	IfIncarnation string
	Close         bool // Stream-Closed: true (append and close atomically)
	Header        http.Header
}

// ReadOptions configure a catch-up or long-poll read.
type ReadOptions struct {
	Offset        string        // "" = "-1" (start); "now" = tail
	MaxBytes      int           // > 0: max_bytes
	LongPoll      bool          // live=long-poll
	Timeout       time.Duration // long-poll timeout_ms (0 = server default, 1 s)
	Cursor        string
	Consistency   string // "leader" for a linearizable catch-up read
	IfIncarnation string
	IfNoneMatch   string
	Buf           []byte // reused for Data when it has room
	Header        http.Header
}

// SnapshotReadOptions configure a snapshot read.
type SnapshotReadOptions struct {
	IfIncarnation string
	IfNoneMatch   string
	Range         string // e.g. "bytes=0-1023"
	Header        http.Header
}

// SubscribeOptions configure an SSE subscription.
type SubscribeOptions struct {
	Offset        string // "" = "now"
	MaxBytes      int
	Cursor        string
	IfIncarnation string
	Header        http.Header
}

// ---------------------------------------------------------------------------------------
// Writes

// Create creates a stream (PUT). 201 = created, 200 = an identical stream existed.
func (c *Client) Create(ctx context.Context, streamURL string, o CreateOptions) (*WriteResult, error) {
	h := make(http.Header, 8)
	if o.ContentType != "" {
		h.Set(streamcore.HdrContentType, o.ContentType)
	}
	if o.TTL > 0 {
		h.Set(streamcore.HdrStreamTTL, strconv.FormatInt(int64(o.TTL/time.Second), 10))
	}
	if !o.ExpiresAt.IsZero() {
		h.Set(streamcore.HdrStreamExpiresAt, o.ExpiresAt.UTC().Format(time.RFC3339Nano))
	}
	if o.Closed {
		h.Set(streamcore.HdrStreamClosed, "true")
	}
	if o.StreamSeq != "" {
		h.Set(streamcore.HdrStreamSeq, o.StreamSeq)
	}
	setCall(h, CallOptions{IfIncarnation: o.IfIncarnation, Header: o.Header})
	return c.write(ctx, "create", WriteCreate, http.MethodPut, streamURL, h, o.Body)
}

// CreateBucket validates a bucket id (PUT /{bucket}); buckets are otherwise implicit.
func (c *Client) CreateBucket(ctx context.Context, bucketURL string, o ...CallOptions) (*WriteResult, error) {
	h := make(http.Header, 2)
	setCall(h, firstCall(o))
	return c.write(ctx, "create bucket", WriteCreateBucket, http.MethodPut, bucketURL, h, nil)
}

// Append appends body (POST). With o.Close it also closes the stream atomically; an empty
// body with o.Close is a close-only request (see Close).
func (c *Client) Append(ctx context.Context, streamURL string, body []byte, o AppendOptions) (*WriteResult, error) {
	h := make(http.Header, 10)
	if o.ContentType != "" {
		h.Set(streamcore.HdrContentType, o.ContentType)
	}
	kind := WriteAppend
	if p := o.Producer; p != nil {
		kind = WriteProducer
		h.Set(streamcore.HdrProducerID, p.ID)
		h.Set(streamcore.HdrProducerEpoch, strconv.FormatUint(p.Epoch, 10))
		h.Set(streamcore.HdrProducerSeq, strconv.FormatUint(p.Seq, 10))
	}
	if o.Digest {
		h.Set(streamcore.HdrProducerDigest, streamcore.ProducerDigestOf(body))
	}
	if o.StreamSeq != "" {
		h.Set(streamcore.HdrStreamSeq, o.StreamSeq)
	}
	if o.Close {
		h.Set(streamcore.HdrStreamClosed, "true")
	}
	setCall(h, CallOptions{IfIncarnation: o.IfIncarnation, Header: o.Header})
	op := "append"
	if o.Close && len(body) == 0 {
		op = "close"
	}
	return c.write(ctx, op, kind, http.MethodPost, streamURL, h, body)
}

// Close closes the stream: an empty POST with Stream-Closed: true (o.Producer, o.StreamSeq
// and o.IfIncarnation apply; o.ContentType is ignored by the server).
func (c *Client) Close(ctx context.Context, streamURL string, o AppendOptions) (*WriteResult, error) {
	o.Close = true
	return c.Append(ctx, streamURL, nil, o)
}

// Delete deletes the stream (204).
func (c *Client) Delete(ctx context.Context, streamURL string, o ...CallOptions) (*WriteResult, error) {
	h := make(http.Header, 2)
	setCall(h, firstCall(o))
	return c.write(ctx, "delete", WriteDelete, http.MethodDelete, streamURL, h, nil)
}

// PublishSnapshot publishes body as the snapshot of [start, offset) (PUT .../snapshot/{offset}).
func (c *Client) PublishSnapshot(ctx context.Context, streamURL, offset, contentType string, body []byte, o ...CallOptions) (*WriteResult, error) {
	h := make(http.Header, 4)
	if contentType != "" {
		h.Set(streamcore.HdrContentType, contentType)
	}
	setCall(h, firstCall(o))
	return c.write(ctx, "publish snapshot", WritePublishSnapshot, http.MethodPut, subURL(streamURL, "snapshot", offset), h, body)
}

// StageSnapshotPart stages one part of a snapshot upload (POST .../snapshot/{offset}/parts).
func (c *Client) StageSnapshotPart(ctx context.Context, streamURL, offset string, body []byte, o ...CallOptions) (*WriteResult, error) {
	h := make(http.Header, 2)
	setCall(h, firstCall(o))
	return c.write(ctx, "stage snapshot part", WriteStagePart, http.MethodPost, subURL(streamURL, "snapshot", offset)+"/parts", h, body)
}

// CommitSnapshotParts commits staged parts, in order, as the snapshot at offset; digest is
// SnapshotDigestOf(contentType, concatenated parts).
func (c *Client) CommitSnapshotParts(ctx context.Context, streamURL, offset, contentType, digest string, partIDs []string, o ...CallOptions) (*WriteResult, error) {
	h := make(http.Header, 6)
	if contentType != "" {
		h.Set(streamcore.HdrContentType, contentType)
	}
	h.Set(streamcore.HdrSnapshotParts, strconv.Itoa(len(partIDs)))
	h.Set(streamcore.HdrSnapshotDigest, digest)
	setCall(h, firstCall(o))
	var body []byte
	for _, id := range partIDs {
		body = append(body, id...)
		body = append(body, '\n')
	}
	return c.write(ctx, "commit snapshot parts", WritePublishSnapshot, http.MethodPut, subURL(streamURL, "snapshot", offset), h, body)
}

// DiscardSnapshotParts discards the staged parts (DELETE .../snapshot/parts).
func (c *Client) DiscardSnapshotParts(ctx context.Context, streamURL string, o ...CallOptions) (*WriteResult, error) {
	h := make(http.Header, 2)
	setCall(h, firstCall(o))
	return c.write(ctx, "discard snapshot parts", WriteDiscardParts, http.MethodDelete, strings.TrimRight(streamURL, "/")+"/snapshot/parts", h, nil)
}

// Retain advances the retention boundary (PUT .../retention/{offset}).
func (c *Client) Retain(ctx context.Context, streamURL, offset string, o ...CallOptions) (*WriteResult, error) {
	h := make(http.Header, 2)
	setCall(h, firstCall(o))
	return c.write(ctx, "retain", WriteRetain, http.MethodPut, subURL(streamURL, "retention", offset), h, nil)
}

// ---------------------------------------------------------------------------------------
// Reads

// Read is a catch-up read, or a long-poll read with o.LongPoll.
func (c *Client) Read(ctx context.Context, streamURL string, o ReadOptions) (*ReadResult, error) {
	off := o.Offset
	if off == "" {
		if o.LongPoll {
			off = "now"
		} else {
			off = "-1"
		}
	}
	q := make([]byte, 0, 96)
	q = append(q, "?offset="...)
	q = append(q, url.QueryEscape(off)...)
	timeout := c.ReadTimeout
	if o.LongPoll {
		q = append(q, "&live=long-poll"...)
		if o.Timeout > 0 {
			ms := o.Timeout.Milliseconds()
			q = append(q, "&timeout_ms="...)
			q = strconv.AppendInt(q, max(ms, 1), 10)
			if timeout > 0 {
				timeout += o.Timeout
			}
		} else if timeout > 0 {
			timeout += time.Duration(streamcore.DefaultLongPollMs) * time.Millisecond
		}
	}
	if o.MaxBytes > 0 {
		q = append(q, "&max_bytes="...)
		q = strconv.AppendInt(q, int64(o.MaxBytes), 10)
	}
	if o.Cursor != "" {
		q = append(q, "&cursor="...)
		q = append(q, url.QueryEscape(o.Cursor)...)
	}
	if o.Consistency != "" {
		q = append(q, "&consistency="...)
		q = append(q, url.QueryEscape(o.Consistency)...)
	}
	h := make(http.Header, 4)
	if o.IfNoneMatch != "" {
		h.Set("If-None-Match", o.IfNoneMatch)
	}
	setCall(h, CallOptions{IfIncarnation: o.IfIncarnation, Header: o.Header})
	resp, err := c.read(ctx, "read", http.MethodGet, streamURL+string(q), h, timeout)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	r := &ReadResult{
		Status:      resp.StatusCode,
		NextOffset:  resp.Header.Get(streamcore.HdrStreamNextOff),
		UpToDate:    flag(resp.Header, streamcore.HdrStreamUpToDate),
		Closed:      flag(resp.Header, streamcore.HdrStreamClosed),
		Incarnation: resp.Header.Get(streamcore.HdrIncarnation),
		ETag:        resp.Header.Get("ETag"),
		Cursor:      resp.Header.Get(streamcore.HdrStreamCursor),
		ContentType: resp.Header.Get(streamcore.HdrContentType),
		NotModified: resp.StatusCode == http.StatusNotModified,
		Header:      resp.Header,
	}
	r.Data, err = readAllInto(o.Buf[:0], resp.Body, resp.ContentLength)
	if err != nil {
		return nil, c.transportError("read", http.MethodGet, streamURL, err, false, true)
	}
	return r, nil
}

// Head returns the stream's metadata.
func (c *Client) Head(ctx context.Context, streamURL string, o ...CallOptions) (*StreamInfo, error) {
	h := make(http.Header, 2)
	setCall(h, firstCall(o))
	resp, err := c.read(ctx, "head", http.MethodHead, streamURL, h, c.ReadTimeout)
	if err != nil {
		return nil, c.explainHead(ctx, streamURL, h, err)
	}
	resp.Body.Close()
	rh := resp.Header
	return &StreamInfo{
		ContentType:         rh.Get(streamcore.HdrContentType),
		NextOffset:          rh.Get(streamcore.HdrStreamNextOff),
		Closed:              flag(rh, streamcore.HdrStreamClosed),
		TTL:                 optInt(rh, streamcore.HdrStreamTTL),
		ExpiresAt:           rh.Get(streamcore.HdrStreamExpiresAt),
		RetainedOffset:      rh.Get(streamcore.HdrRetainedOffset),
		SnapshotOffset:      rh.Get(streamcore.HdrSnapshotOffset),
		SnapshotDigest:      rh.Get(streamcore.HdrSnapshotDigest),
		Incarnation:         rh.Get(streamcore.HdrIncarnation),
		PreviousIncarnation: rh.Get("Stream-Previous-Incarnation"),
		InheritedOffset:     rh.Get("Stream-Inherited-Offset"),
		MaxRequestBytes:     optInt(rh, streamcore.HdrMaxRequestBytes),
		MaxSnapshotBytes:    optInt(rh, streamcore.HdrMaxSnapshotBytes),
		Protocol:            rh.Get(streamcore.HdrUrsulaProtocol),
		ClusterID:           rh.Get(streamcore.HdrUrsulaClusterID),
		Header:              rh,
	}, nil
}

// explainHead fills in the error code and message of a refused HEAD, whose answer has no
// body to carry them, from a GET of the same URL at the tail: a caller sees the server's
// INVALID_BUCKET_ID and why, not a bare "400 Bad Request". A 404 is left as it is (it is
// common and says enough).
func (c *Client) explainHead(ctx context.Context, streamURL string, h http.Header, err error) error {
	ce, ok := err.(*Error)
	if !ok || ce.Status < 400 || ce.Status == http.StatusNotFound || ce.Code != "" {
		return err
	}
	u := streamURL + "?offset=now"
	if strings.Contains(streamURL, "?") {
		u = streamURL + "&offset=now"
	}
	resp, gerr := c.read(ctx, "head", http.MethodGet, u, h, c.ReadTimeout)
	if gerr == nil {
		resp.Body.Close()
		return err
	}
	if ge, ok := gerr.(*Error); ok && ge.Status == ce.Status && ge.Code != "" {
		ce.Code, ce.Message = ge.Code, ge.Message
	}
	return err
}

// ReadSnapshot reads the snapshot at offset (only the latest is readable).
func (c *Client) ReadSnapshot(ctx context.Context, streamURL, offset string, o ...SnapshotReadOptions) (*SnapshotResult, error) {
	var so SnapshotReadOptions
	if len(o) > 0 {
		so = o[0]
	}
	h := make(http.Header, 4)
	if so.IfNoneMatch != "" {
		h.Set("If-None-Match", so.IfNoneMatch)
	}
	if so.Range != "" {
		h.Set("Range", so.Range)
	}
	setCall(h, CallOptions{IfIncarnation: so.IfIncarnation, Header: so.Header})
	resp, err := c.read(ctx, "read snapshot", http.MethodGet, subURL(streamURL, "snapshot", offset), h, c.ReadTimeout)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	rh := resp.Header
	r := &SnapshotResult{
		Status:       resp.StatusCode,
		ContentType:  rh.Get(streamcore.HdrContentType),
		Offset:       rh.Get(streamcore.HdrSnapshotOffset),
		Digest:       rh.Get(streamcore.HdrSnapshotDigest),
		NextOffset:   rh.Get(streamcore.HdrStreamNextOff),
		UpToDate:     flag(rh, streamcore.HdrStreamUpToDate),
		Incarnation:  rh.Get(streamcore.HdrIncarnation),
		ETag:         rh.Get("ETag"),
		ContentRange: rh.Get("Content-Range"),
		NotModified:  resp.StatusCode == http.StatusNotModified,
		Header:       rh,
	}
	if r.Data, err = readAllInto(nil, resp.Body, resp.ContentLength); err != nil {
		return nil, c.transportError("read snapshot", http.MethodGet, streamURL, err, false, true)
	}
	return r, nil
}

// Bootstrap reads the latest snapshot and the updates after it in one multipart answer.
func (c *Client) Bootstrap(ctx context.Context, streamURL string, o ...CallOptions) (*BootstrapResult, error) {
	h := make(http.Header, 2)
	setCall(h, firstCall(o))
	u := strings.TrimRight(streamURL, "/") + "/bootstrap"
	resp, err := c.read(ctx, "bootstrap", http.MethodGet, u, h, c.ReadTimeout)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	rh := resp.Header
	parts, perr := streamcore.ReadMultipart(rh.Get(streamcore.HdrContentType), resp.Body)
	if perr != nil {
		ce := newErr("bootstrap", http.MethodGet, u, NotApplied, perr, "")
		ce.Status, ce.Header = resp.StatusCode, rh
		return nil, ce
	}
	if len(parts) == 0 {
		ce := newErr("bootstrap", http.MethodGet, u, NotApplied, nil, "bootstrap answer without a snapshot part")
		ce.Status, ce.Header = resp.StatusCode, rh
		return nil, ce
	}
	return &BootstrapResult{
		SnapshotOffset: rh.Get(streamcore.HdrSnapshotOffset),
		NextOffset:     rh.Get(streamcore.HdrStreamNextOff),
		UpToDate:       flag(rh, streamcore.HdrStreamUpToDate),
		Closed:         flag(rh, streamcore.HdrStreamClosed),
		Incarnation:    rh.Get(streamcore.HdrIncarnation),
		Snapshot:       parts[0],
		Updates:        parts[1:],
		Header:         rh,
	}, nil
}

// ---------------------------------------------------------------------------------------
// SSE

// SSEMessage is one event of a subscription: a decoded data payload or a control event.
type SSEMessage struct {
	Kind    string // "data" or "control"
	Data    []byte // payload of a data event (base64 already decoded)
	Control streamcore.SSEControl
}

// Subscription is a live SSE read. Next returns events in order; Close ends it.
type Subscription struct {
	Header          http.Header
	DataContentType string // Stream-Data-Content-Type
	Base64          bool   // Stream-Sse-Data-Encoding: base64
	Incarnation     string

	url       string
	body      io.ReadCloser
	cancel    context.CancelFunc
	r         *streamcore.SSEReader
	closed    atomic.Bool
	closeOnce sync.Once
}

// Subscribe opens an SSE read (live=sse). Request errors (400, 404, 410, 412, ...) come
// back here as *Error; errors after the stream started come from Next.
func (c *Client) Subscribe(ctx context.Context, streamURL string, o SubscribeOptions) (*Subscription, error) {
	off := o.Offset
	if off == "" {
		off = "now"
	}
	u := streamURL + "?offset=" + url.QueryEscape(off) + "&live=sse"
	if o.MaxBytes > 0 {
		u += "&max_bytes=" + strconv.Itoa(o.MaxBytes)
	}
	if o.Cursor != "" {
		u += "&cursor=" + url.QueryEscape(o.Cursor)
	}
	h := make(http.Header, 4)
	h.Set("Accept", "text/event-stream")
	setCall(h, CallOptions{IfIncarnation: o.IfIncarnation, Header: o.Header})
	ctx, cancel := context.WithCancel(ctx)
	resp, err := c.read(ctx, "subscribe", http.MethodGet, u, h, 0)
	if err != nil {
		cancel()
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		resp.Body.Close()
		cancel()
		ce := c.answerError("subscribe", http.MethodGet, u, resp, nil)
		ce.Outcome, ce.Message = NotApplied, fmt.Sprintf("%d is not an event stream", resp.StatusCode)
		return nil, ce
	}
	return &Subscription{
		Header:          resp.Header,
		DataContentType: resp.Header.Get(streamcore.HdrSSEDataType),
		Base64:          strings.EqualFold(resp.Header.Get(streamcore.HdrSSEEncoding), "base64"),
		Incarnation:     resp.Header.Get(streamcore.HdrIncarnation),
		url:             u,
		body:            resp.Body,
		cancel:          cancel,
		r:               streamcore.NewSSEReader(resp.Body),
	}, nil
}

// Next returns the next data or control event. It returns io.EOF when the server ended the
// stream (after a control event with StreamClosed) or after Close, a *Error for an
// `event: error` (Code and Message of its body) or a broken connection (Err set). Unknown
// event types are skipped. Next must not be called concurrently; Close may be, to end a
// blocked Next.
func (s *Subscription) Next() (SSEMessage, error) {
	if s.closed.Load() {
		return SSEMessage{}, io.EOF
	}
	for {
		ev, err := s.r.Next()
		if err != nil {
			closedByUs := s.closed.Load()
			s.Close()
			if err == io.EOF || closedByUs {
				return SSEMessage{}, io.EOF
			}
			return SSEMessage{}, newErr("subscribe", http.MethodGet, s.url, NotApplied, err, "")
		}
		switch ev.Type {
		case "data":
			d, err := streamcore.DecodeSSEData(ev, s.Base64)
			if err != nil {
				s.Close()
				return SSEMessage{}, newErr("subscribe", http.MethodGet, s.url, NotApplied, err, "undecodable data event: "+err.Error())
			}
			return SSEMessage{Kind: "data", Data: d}, nil
		case "control":
			var ctl streamcore.SSEControl
			if err := json.Unmarshal(ev.Data, &ctl); err != nil {
				s.Close()
				return SSEMessage{}, newErr("subscribe", http.MethodGet, s.url, NotApplied, err, "undecodable control event: "+err.Error())
			}
			return SSEMessage{Kind: "control", Control: ctl}, nil
		case "error":
			s.Close()
			ce := newErr("subscribe", http.MethodGet, s.url, NotApplied, nil, "")
			if d, ok := streamcore.ParseErrorBody(ev.Data); ok {
				ce.Code, ce.Message = d.Code, d.Message
			} else {
				ce.Message = clipBody(ev.Data)
			}
			return SSEMessage{}, ce
		}
	}
}

// All iterates over the events until the end or an error (yielded last, io.EOF excluded).
func (s *Subscription) All() iter.Seq2[SSEMessage, error] {
	return func(yield func(SSEMessage, error) bool) {
		for {
			m, err := s.Next()
			if err == io.EOF {
				return
			}
			if !yield(m, err) || err != nil {
				return
			}
		}
	}
}

// Close ends the subscription; safe to call more than once and from another goroutine.
func (s *Subscription) Close() error {
	var err error
	s.closeOnce.Do(func() {
		s.closed.Store(true)
		s.cancel()
		err = s.body.Close()
	})
	return err
}

// ---------------------------------------------------------------------------------------
// Request machinery

func setCall(h http.Header, o CallOptions) {
	if o.IfIncarnation != "" {
		h.Set(streamcore.HdrIncarnation, o.IfIncarnation)
	}
	for k, vs := range o.Header {
		for _, v := range vs {
			h.Add(k, v)
		}
	}
}

func subURL(streamURL, sub, offset string) string {
	return strings.TrimRight(streamURL, "/") + "/" + sub + "/" + url.PathEscape(offset)
}

func (c *Client) resolve(ref string) (string, error) {
	if _, ok, err := ParseNodeURL(ref); ok {
		return ref, err // a node list is absolute (and not a URL url.Parse reads)
	}
	u, err := url.Parse(ref)
	if err != nil {
		return "", fmt.Errorf("invalid URL %q: %w", ref, err)
	}
	if u.IsAbs() {
		return ref, nil
	}
	if c.Base == nil {
		return "", fmt.Errorf("relative URL %q without a base URL", ref)
	}
	return c.Base.ResolveReference(u).String(), nil
}

func (c *Client) newRequest(ctx context.Context, method, u string, h http.Header, body io.ReadCloser, n int64) (*http.Request, error) {
	req, err := http.NewRequestWithContext(ctx, method, u, nil)
	if err != nil {
		return nil, err
	}
	req.Header = h
	if body != nil {
		req.Body = body
		req.ContentLength = n
	}
	if t := c.token.Load(); t != nil {
		req.Header.Set("Authorization", "Bearer "+*t)
	}
	if c.UserAgent != "" {
		req.Header.Set("User-Agent", c.UserAgent)
	}
	return req, nil
}

// cancelBody cancels the request's timeout context when the body is closed.
type cancelBody struct {
	io.ReadCloser
	cancel context.CancelFunc
}

func (b cancelBody) Close() error {
	err := b.ReadCloser.Close()
	b.cancel()
	return err
}

func (c *Client) withTimeout(ctx context.Context, d time.Duration) (context.Context, context.CancelFunc) {
	if _, ok := ctx.Deadline(); ok || d <= 0 {
		return ctx, func() {}
	}
	return context.WithTimeout(ctx, d)
}

// write sends a write, following redirects that prove the target applied nothing, and
// classifies the final answer. Over a node list it goes to the stream's preferred node,
// moves on to the next node when one cannot be reached before anything went out, and
// follows a NotLeader answer to the leader it names when that leader is in the list.
func (c *Client) write(ctx context.Context, op string, kind WriteKind, method, ref string, h http.Header, body []byte) (*WriteResult, error) {
	u, err := c.resolve(ref)
	if err != nil {
		return nil, newErr(op, method, ref, NotApplied, err, "")
	}
	rt, nu, err := c.routeFor(u)
	if err != nil {
		return nil, newErr(op, method, u, NotApplied, err, "")
	}
	ctx, cancel := c.withTimeout(ctx, c.WriteTimeout)
	defer cancel()
	node := 0
	if rt != nil {
		if node, err = rt.first(ctx, c, nu); err != nil {
			return nil, newErr(op, method, u, NotApplied, err, "")
		}
		u = nu.At(node)
	}
	for hop := 0; ; hop++ {
		// sent: some of the request may have left. bodySent: some of its body may have
		// left, counted once the transport finished (or failed) writing the request. The
		// body is an in-memory reader net/http recognises, so HTTP/1 writes head and body
		// with one write: a body it cannot size up gets the head flushed on its own first,
		// a second write that wakes the server a second time (about 25 us of client CPU
		// per request on loopback, and the server's read of the head alone).
		var sent, bodySent atomic.Bool
		trace := &httptrace.ClientTrace{
			WroteHeaders: func() { sent.Store(true) },
			WroteRequest: func(httptrace.WroteRequestInfo) { bodySent.Store(len(body) > 0) },
		}
		var rb io.ReadCloser
		if len(body) > 0 {
			rb = io.NopCloser(bytes.NewReader(body))
		}
		req, err := c.newRequest(httptrace.WithClientTrace(ctx, trace), method, u, h, rb, int64(len(body)))
		if err != nil {
			return nil, newErr(op, method, u, NotApplied, err, "")
		}
		if len(body) > 0 {
			req.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(body)), nil }
		}
		resp, err := c.HTTP.Do(req)
		if err != nil {
			ce := c.transportError(op, method, u, err, sent.Load() || bodySent.Load(), false)
			if rt != nil {
				// The next attempt, in this call or the caller's resend, goes to the next node.
				node = rt.skip(nu, node)
				if ce.Outcome == NotApplied && hop < nodeHops(nu) && ctx.Err() == nil {
					u = nu.At(node)
					continue
				}
			}
			return nil, ce
		}
		if rt != nil {
			if uerr := rt.observe(nu, node, resp.Header); uerr != nil {
				resp.Body.Close()
				outcome := Unknown
				if resp.StatusCode >= 300 {
					outcome = c.Policy.Classify(WriteAnswer{Kind: kind, Status: resp.StatusCode, Header: resp.Header, BodySent: bodySent.Load()})
				}
				return nil, newErr(op, method, u, outcome, uerr, "")
			}
		}
		a := WriteAnswer{Kind: kind, Status: resp.StatusCode, Header: resp.Header, BodySent: bodySent.Load()}
		if resp.StatusCode >= 200 && resp.StatusCode < 300 {
			io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<20))
			resp.Body.Close()
			if c.Policy.Classify(a) == Applied {
				return writeResult(resp), nil
			}
			ce := c.answerError(op, method, u, resp, nil)
			ce.Outcome = Unknown
			ce.Message = fmt.Sprintf("%d without the typed answer of a %s", resp.StatusCode, kind)
			return nil, ce
		}
		eb := readErrorBody(resp)
		if d, ok := streamcore.ParseErrorBody(eb); ok {
			a.Code = d.Code
		}
		outcome := c.Policy.Classify(a)
		ce := c.answerError(op, method, u, resp, eb)
		ce.Outcome = outcome
		if rt != nil {
			next, err := c.reroute(rt, nu, node, ce)
			if err != nil {
				return nil, err
			}
			if next >= 0 {
				node = next
				if outcome == NotApplied && hop < nodeHops(nu) {
					u = nu.At(node)
					continue
				}
			}
			return nil, ce
		}
		if isRedirect(resp.StatusCode) && outcome == NotApplied && ce.Location != "" && hop < c.maxRedirects() {
			next, err := resolveAgainst(u, ce.Location)
			if err == nil {
				u = next
				continue
			}
		}
		return nil, ce
	}
}

// reroute decides where the next attempt over a node list goes after an error answer
// from node: the node a redirect names, or the next node after a NotLeader 503 (-1: the
// answer is not about routing). A redirect to a host outside the list is refused with a
// *URLError in ce.Err: the request, and its token, never go there.
func (c *Client) reroute(rt *nodeRoute, nu *NodeURL, node int, ce *Error) (int, error) {
	switch {
	case ce.Status >= 300 && ce.Status < 400 && ce.Location != "":
		i := nu.indexOf(node, ce.Location)
		if i < 0 {
			ce.Err = &URLError{URL: nu.Scheme + "://" + nu.Authority() + nu.Rest, Reason: fmt.Sprintf(
				"node %s redirected to %s, which is not one of the URL's nodes; not followed, so no request or token goes to a host the URL does not name",
				nu.Nodes[node].authority(), ce.Location)}
			ce.Message = ce.Err.Error()
			return -1, ce
		}
		rt.setPreferred(nu, i)
		return i, nil
	case isNotLeader(ce.Status, ce.Header, ce.Code):
		return rt.skip(nu, node), nil
	}
	return -1, nil
}

func (c *Client) maxRedirects() int {
	if c.MaxRedirects < 0 {
		return 0 // never follow
	}
	if c.MaxRedirects == 0 {
		return 5
	}
	return c.MaxRedirects
}

// read sends a read (GET or HEAD), following redirects. A 2xx or 304 answer is returned
// with its body open; the caller closes it. Over a node list a read moves on to the next
// node when one cannot be reached or knows no leader, and follows redirects only within
// the list.
func (c *Client) read(ctx context.Context, op, method, ref string, h http.Header, timeout time.Duration) (*http.Response, error) {
	u, err := c.resolve(ref)
	if err != nil {
		return nil, newErr(op, method, ref, NotApplied, err, "")
	}
	rt, nu, err := c.routeFor(u)
	if err != nil {
		return nil, newErr(op, method, u, NotApplied, err, "")
	}
	ctx, cancel := c.withTimeout(ctx, timeout)
	node := 0
	if rt != nil {
		if node, err = rt.first(ctx, c, nu); err != nil {
			cancel()
			return nil, newErr(op, method, u, NotApplied, err, "")
		}
		u = nu.At(node)
	}
	for hop := 0; ; hop++ {
		req, err := c.newRequest(ctx, method, u, h, nil, 0)
		if err != nil {
			cancel()
			return nil, newErr(op, method, u, NotApplied, err, "")
		}
		resp, err := c.HTTP.Do(req)
		if err != nil {
			if rt != nil && hop < nodeHops(nu) && ctx.Err() == nil {
				node = rt.skip(nu, node)
				u = nu.At(node)
				continue
			}
			cancel()
			return nil, c.transportError(op, method, u, err, true, true)
		}
		if rt != nil {
			if uerr := rt.observe(nu, node, resp.Header); uerr != nil {
				resp.Body.Close()
				cancel()
				return nil, newErr(op, method, u, NotApplied, uerr, "")
			}
		}
		if (resp.StatusCode >= 200 && resp.StatusCode < 300) || resp.StatusCode == http.StatusNotModified {
			resp.Body = cancelBody{resp.Body, cancel}
			return resp, nil
		}
		eb := readErrorBody(resp)
		ce := c.answerError(op, method, u, resp, eb)
		ce.Outcome = NotApplied
		if rt != nil {
			next, err := c.reroute(rt, nu, node, ce)
			if err != nil {
				cancel()
				return nil, err
			}
			if next >= 0 && hop < nodeHops(nu) {
				node = next
				u = nu.At(node)
				continue
			}
			cancel()
			return nil, ce
		}
		if isRedirect(resp.StatusCode) && ce.Location != "" && hop < c.maxRedirects() {
			if next, err := resolveAgainst(u, ce.Location); err == nil {
				u = next
				continue
			}
		}
		cancel()
		return nil, ce
	}
}

func isRedirect(s int) bool {
	return s == http.StatusTemporaryRedirect || s == http.StatusPermanentRedirect
}

func resolveAgainst(base, loc string) (string, error) {
	b, err := url.Parse(base)
	if err != nil {
		return "", err
	}
	l, err := url.Parse(loc)
	if err != nil {
		return "", err
	}
	return b.ResolveReference(l).String(), nil
}

// newErr is a Error without an answer (typed header fields -1).
func newErr(op, method, u string, outcome Outcome, err error, msg string) *Error {
	if msg == "" && err != nil {
		msg = err.Error()
	}
	return &Error{Op: op, Method: method, URL: u, Err: err, Message: msg, Outcome: outcome,
		ProducerEpoch: -1, ProducerSeq: -1, ProducerExpectedSeq: -1, ProducerReceivedSeq: -1,
		ProducerClosedEpoch: -1, ProducerClosedSeq: -1, MaxRequestBytes: -1}
}

func (c *Client) transportError(op, method, u string, err error, sent, read bool) *Error {
	ce := newErr(op, method, u, Unknown, err, "")
	if read {
		ce.Outcome = NotApplied
	} else {
		ce.Outcome = ClassifyUnanswered(sent)
	}
	return ce
}

func readErrorBody(resp *http.Response) []byte {
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<20))
	resp.Body.Close()
	return b
}

func clipBody(b []byte) string {
	s := strings.TrimSpace(string(b))
	if len(s) > 256 {
		s = s[:256] + "..."
	}
	return s
}

// answerError builds the Error of an HTTP answer (Outcome left to the caller).
func (c *Client) answerError(op, method, u string, resp *http.Response, body []byte) *Error {
	h := resp.Header
	ce := &Error{
		Op: op, Method: method, URL: u, Status: resp.StatusCode, Header: h,
		NotApplied:          h.Get(streamcore.HdrNotApplied),
		ProducerEpoch:       optInt(h, streamcore.HdrProducerEpoch),
		ProducerSeq:         optInt(h, streamcore.HdrProducerSeq),
		ProducerExpectedSeq: optInt(h, streamcore.HdrProducerExpectedSeq),
		ProducerReceivedSeq: optInt(h, streamcore.HdrProducerReceivedSeq),
		ProducerClosedEpoch: optInt(h, streamcore.HdrProducerClosedEpoch),
		ProducerClosedSeq:   optInt(h, streamcore.HdrProducerClosedSeq),
		ProducerOutcome:     h.Get(streamcore.HdrProducerOutcome),
		StreamLastSeq:       h.Get(streamcore.HdrStreamLastSeq),
		StreamNextOffset:    h.Get(streamcore.HdrStreamNextOff),
		StreamClosed:        flag(h, streamcore.HdrStreamClosed),
		Incarnation:         h.Get(streamcore.HdrIncarnation),
		SnapshotOffset:      h.Get(streamcore.HdrSnapshotOffset),
		SnapshotDigest:      h.Get(streamcore.HdrSnapshotDigest),
		RetryAfter:          retryAfter(h.Get(streamcore.HdrRetryAfter)),
		Location:            h.Get("Location"),
		MaxRequestBytes:     optInt(h, streamcore.HdrMaxRequestBytes),
	}
	if d, ok := streamcore.ParseErrorBody(body); ok {
		ce.Code, ce.Message = d.Code, d.Message
	} else if len(body) > 0 {
		ce.Message = clipBody(body)
	} else {
		ce.Message = http.StatusText(resp.StatusCode)
	}
	return ce
}

func writeResult(resp *http.Response) *WriteResult {
	h := resp.Header
	po := h.Get(streamcore.HdrProducerOutcome)
	r := &WriteResult{
		Status:              resp.StatusCode,
		Header:              h,
		Created:             resp.StatusCode == http.StatusCreated,
		Location:            h.Get("Location"),
		ContentType:         h.Get(streamcore.HdrContentType),
		Offset:              h.Get(streamcore.HdrStreamOffset),
		NextOffset:          h.Get(streamcore.HdrStreamNextOff),
		Closed:              flag(h, streamcore.HdrStreamClosed),
		Incarnation:         h.Get(streamcore.HdrIncarnation),
		ProducerEpoch:       optInt(h, streamcore.HdrProducerEpoch),
		ProducerSeq:         optInt(h, streamcore.HdrProducerSeq),
		ProducerClosedEpoch: optInt(h, streamcore.HdrProducerClosedEpoch),
		ProducerClosedSeq:   optInt(h, streamcore.HdrProducerClosedSeq),
		ReceiptEvicted:      OutcomeToken(po) == "receipt-evicted",
		SnapshotOffset:      h.Get(streamcore.HdrSnapshotOffset),
		SnapshotDigest:      h.Get(streamcore.HdrSnapshotDigest),
		SnapshotPart:        h.Get(streamcore.HdrSnapshotPart),
		RetainedOffset:      h.Get(streamcore.HdrRetainedOffset),
	}
	r.Duplicate = resp.StatusCode == http.StatusNoContent && h.Get(streamcore.HdrProducerEpoch) != ""
	return r
}

func flag(h http.Header, name string) bool { return strings.EqualFold(h.Get(name), "true") }

// optInt parses a canonical non-negative decimal header; -1 when absent or malformed.
func optInt(h http.Header, name string) int64 {
	v := h.Get(name)
	if v == "" {
		return -1
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil || n < 0 {
		return -1
	}
	return n
}

// retryAfter parses Retry-After: delay seconds or an HTTP date; 0 when absent or invalid.
func retryAfter(v string) time.Duration {
	if v == "" {
		return 0
	}
	if n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64); err == nil {
		if n < 0 {
			return 0
		}
		return time.Duration(n) * time.Second
	}
	if t, err := http.ParseTime(v); err == nil {
		if d := time.Until(t); d > 0 {
			return d
		}
	}
	return 0
}

// readAllInto reads r to the end, appending to buf (sized up front from n when known).
func readAllInto(buf []byte, r io.Reader, n int64) ([]byte, error) {
	if n > 0 && int64(cap(buf)-len(buf)) < n && n <= streamcore.MaxRequestBytes {
		nb := make([]byte, len(buf), int64(len(buf))+n)
		copy(nb, buf)
		buf = nb
	}
	for {
		if len(buf) == cap(buf) {
			buf = append(buf, 0)[:len(buf)]
		}
		m, err := r.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+m]
		if err == io.EOF {
			return buf, nil
		}
		if err != nil {
			return buf, err
		}
	}
}
