// Command ursula-bench is the load generator of the side-by-side benchmark: it measures
// append latency and throughput and SSE fan-out delivery latency against any Durable
// Streams server, and compares runs.
package main

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"runtime"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"github.com/ursula-go/ursula/streamcore"
	"github.com/ursula-go/ursula/tlsfiles"
)

const usage = `ursula-bench: load generator for Durable Streams servers.

Usage:
  ursula-bench --url BASE [--label NAME] [--duration 5s] [--json] [--out FILE] [flags]
  ursula-bench compare [--vs LABEL] A.json B.json [C.json ...]
  ursula-bench merge --out MERGED.json ROUND1.json [ROUND2.json ...]   (medians of one target's rounds)
  ursula-bench baseline [--write] --file BASELINE.json A.json [B.json ...]
  ursula-bench freeport [N]
  ursula-bench wait [--timeout 30s] [--ca-file F] [--ok] URL
  ursula-bench certs DIR           (a throwaway CA and loopback node certificate)
  ursula-bench streams --url BASE [--streams 100000] [--metrics URL]   (scale: many streams)
  ursula-bench sse-idle --url BASE [--readers 10000] [--metrics URL]   (scale: idle SSE readers)
  ursula-bench memory --metrics URL   (the node's RSS and live heap after a collection)

BASE is the URL under which the bench creates its streams, e.g.
  http://127.0.0.1:4437/bench        (Ursula native API: BASE = /{bucket})
  http://127.0.0.1:4438/v1/stream    (reference Node server)

Scenarios (--scenarios, comma separated; default all):
  append-1, append-16, append-64   N concurrent writers, each on its own stream, appending
                                   --body bytes (application/octet-stream) with idempotent
                                   producer headers (Producer-Id/Epoch/Seq incrementing);
                                   latency p50/p99/p99.9 and throughput
  sse-100                          --sse-readers SSE subscribers on one stream; one writer
                                   appends timestamped messages at --sse-rate per second;
                                   delivery latency = receive time - send time

The append scenarios use a lean HTTP/1.1 client by default (--client raw: one persistent
connection per writer, no per-request allocation beyond the buffer), so that on a small
machine the load generator takes little CPU from the server; --client nethttp uses Go's
net/http client instead; --client raw,nethttp runs each append scenario with both (the
nethttp rows are named "append-N nethttp"). Both send the same bytes to every target. For
a node with TLS and auth, --url https://... with --ca-file (the CA to trust) and --token
(a bearer token).

compare prints each scenario of the runs side by side with the ratio of the first run to
each other run (ops/s: higher is better; latency: lower is better); with --vs LABEL, the
ratio of each run to the run labelled LABEL instead.
merge combines rounds of one target (same label) into one run whose every figure is the
median of that figure over the rounds (errors add up).
baseline compares runs with the committed baseline (see baseline.go) and prints a line
starting "REGRESSION:" for every figure more than 20% worse; --write replaces the file.
freeport prints N (default 1) free TCP ports on 127.0.0.1; wait polls URL until any HTTP
answer comes (with --ok, until a 2xx answer).

Flags:
`

type config struct {
	url        string
	label      string
	duration   time.Duration
	warmup     time.Duration
	scenarios  string
	bodySize   int
	sseReaders int
	sseRate    int
	jsonOut    bool
	outFile    string
	clients    []string // raw | nethttp, each append scenario once per client
	caFile     string   // trust these CA certificates for https:// (TLS runs)
	token      string   // bearer token sent on every request (auth runs)
	tls        *tls.Config
}

// Run is the JSON document of one bench run.
type Run struct {
	Label      string    `json:"label"`
	URL        string    `json:"url"`
	Started    time.Time `json:"started"`
	GoMaxProcs int       `json:"gomaxprocs"`
	NumCPU     int       `json:"num_cpu"`
	Results    []Result  `json:"results"`
}

// Result is one scenario of a run.
type Result struct {
	Scenario    string  `json:"scenario"`
	Concurrency int     `json:"concurrency"` // writers, or SSE readers
	Seconds     float64 `json:"seconds"`     // measured window
	Ops         int64   `json:"ops"`         // appends acknowledged, or SSE deliveries
	Errors      int64   `json:"errors"`      // failed requests, or deliveries missing at the end
	OpsPerSec   float64 `json:"ops_per_sec"`
	MBPerSec    float64 `json:"mb_per_sec,omitempty"`
	Sent        int64   `json:"sent,omitempty"` // SSE: messages appended in the window
	P50Ms       float64 `json:"p50_ms"`
	P99Ms       float64 `json:"p99_ms"`
	P999Ms      float64 `json:"p999_ms"`
	MaxMs       float64 `json:"max_ms"`
	MeanMs      float64 `json:"mean_ms"`
	FirstError  string  `json:"first_error,omitempty"`
	Client      string  `json:"client,omitempty"` // append scenarios: raw or nethttp
	Rounds      int     `json:"rounds,omitempty"` // merged: the rounds each figure is the median of
}

// key names a result in tables: the scenario, and the client unless it is the default.
func (r Result) key() string {
	if r.Client == "" || r.Client == "raw" {
		return r.Scenario
	}
	return r.Scenario + " " + r.Client
}

func main() {
	if len(os.Args) > 1 {
		switch os.Args[1] {
		case "baseline":
			os.Exit(baseline(os.Args[2:]))
		case "compare":
			os.Exit(compare(os.Args[2:]))
		case "merge":
			os.Exit(merge(os.Args[2:]))
		case "freeport":
			os.Exit(freeport(os.Args[2:]))
		case "wait":
			os.Exit(wait(os.Args[2:]))
		case "certs":
			os.Exit(certs(os.Args[2:]))
		case "streams":
			os.Exit(streamsCmd(os.Args[2:]))
		case "sse-idle":
			os.Exit(sseIdleCmd(os.Args[2:]))
		case "memory":
			os.Exit(memoryCmd(os.Args[2:]))
		}
	}
	var c config
	fs := flag.NewFlagSet("ursula-bench", flag.ExitOnError)
	fs.Usage = func() { fmt.Fprint(os.Stderr, usage); fs.PrintDefaults() }
	fs.StringVar(&c.url, "url", "", "base URL under which streams are created (required)")
	fs.StringVar(&c.label, "label", "", "name of this run in tables and JSON (default: host:port)")
	fs.DurationVar(&c.duration, "duration", 5*time.Second, "measured time per scenario")
	fs.DurationVar(&c.warmup, "warmup", time.Second, "unmeasured time before each scenario")
	fs.StringVar(&c.scenarios, "scenarios", "append-1,append-16,append-64,sse-100", "scenarios to run")
	fs.IntVar(&c.bodySize, "body", 4096, "append body size in bytes")
	fs.IntVar(&c.sseReaders, "sse-readers", 100, "SSE subscribers in sse-N scenarios given without N")
	fs.IntVar(&c.sseRate, "sse-rate", 50, "messages per second the SSE writer appends")
	clients := fs.String("client", "raw", "HTTP client(s) of the append scenarios, comma separated: raw (lean HTTP/1.1, one connection per writer) and/or nethttp (Go's net/http)")
	fs.BoolVar(&c.jsonOut, "json", false, "print the run as JSON instead of a table")
	fs.StringVar(&c.outFile, "out", "", "also write the run as JSON to this file")
	fs.StringVar(&c.caFile, "ca-file", "", "PEM CA certificates to trust for an https:// --url")
	fs.StringVar(&c.token, "token", "", "bearer token to send with every request")
	cpuprofile := fs.String("cpuprofile", "", "write a CPU profile of the load generator to this file")
	fs.Parse(os.Args[1:])
	if *cpuprofile != "" {
		f, err := os.Create(*cpuprofile)
		if err == nil {
			err = pprof.StartCPUProfile(f)
		}
		if err != nil {
			fmt.Fprintf(os.Stderr, "ursula-bench: cpuprofile: %v\n", err)
			os.Exit(1)
		}
		defer pprof.StopCPUProfile()
	}
	badClient := false
	for _, cl := range strings.Split(*clients, ",") {
		cl = strings.TrimSpace(cl)
		badClient = badClient || cl != "raw" && cl != "nethttp"
		c.clients = append(c.clients, cl)
	}
	if c.url == "" || fs.NArg() > 0 || badClient {
		fs.Usage()
		os.Exit(2)
	}
	c.url = strings.TrimRight(c.url, "/")
	if c.caFile != "" {
		cfg, err := tlsfiles.ClientConfigFromCAFile(c.caFile)
		if err != nil {
			fmt.Fprintf(os.Stderr, "ursula-bench: %v\n", err)
			os.Exit(2)
		}
		c.tls = cfg
	}
	if c.label == "" {
		if u, err := url.Parse(c.url); err == nil {
			c.label = u.Host
		}
	}
	if err := runAll(c); err != nil {
		fmt.Fprintf(os.Stderr, "ursula-bench: %v\n", err)
		pprof.StopCPUProfile()
		os.Exit(1)
	}
}

func runAll(c config) error {
	run := Run{Label: c.label, URL: c.url, Started: time.Now().UTC(), GoMaxProcs: runtime.GOMAXPROCS(0), NumCPU: runtime.NumCPU()}
	b := newBench(c)
	if !c.jsonOut {
		printHeader()
	}
	for _, s := range strings.Split(c.scenarios, ",") {
		s = strings.TrimSpace(s)
		if s == "" {
			continue
		}
		var r Result
		var err error
		switch {
		case strings.HasPrefix(s, "append-"):
			n, perr := strconv.Atoi(strings.TrimPrefix(s, "append-"))
			if perr != nil || n < 1 {
				return fmt.Errorf("bad scenario %q", s)
			}
			for _, cl := range c.clients {
				if r, err = b.appendScenario(s, n, cl); err != nil {
					return fmt.Errorf("%s (%s client): %w", s, cl, err)
				}
				run.Results = append(run.Results, r)
				if !c.jsonOut {
					printRow(c.label, r)
				}
			}
			continue
		case s == "sse" || strings.HasPrefix(s, "sse-"):
			n := c.sseReaders
			if s != "sse" {
				var perr error
				if n, perr = strconv.Atoi(strings.TrimPrefix(s, "sse-")); perr != nil || n < 1 {
					return fmt.Errorf("bad scenario %q", s)
				}
			}
			r, err = b.sseScenario(s, n)
		default:
			return fmt.Errorf("unknown scenario %q", s)
		}
		if err != nil {
			return fmt.Errorf("%s: %w", s, err)
		}
		run.Results = append(run.Results, r)
		if !c.jsonOut {
			printRow(c.label, r)
		}
	}
	doc, _ := json.MarshalIndent(run, "", "  ")
	if c.jsonOut {
		os.Stdout.Write(append(doc, '\n'))
	}
	if c.outFile != "" {
		if err := os.WriteFile(c.outFile, append(doc, '\n'), 0o644); err != nil {
			return err
		}
	}
	return nil
}

// ---------------------------------------------------------------------------------------

type bench struct {
	cfg   config
	hc    *http.Client
	runID string
	body  []byte
}

func newBench(c config) *bench {
	tr := &http.Transport{
		DialContext:         (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		MaxIdleConns:        4096,
		MaxIdleConnsPerHost: 4096,
		// Under the 5 s after which Node's HTTP server (the reference) closes an idle
		// connection: a connection left idle between scenarios is dropped here first, not
		// reused as the server closes it (a request sent on it meets a reset).
		IdleConnTimeout:    4 * time.Second,
		DisableCompression: true,
		WriteBufferSize:    16 << 10,
		ReadBufferSize:     16 << 10,
		TLSClientConfig:    c.tls,
	}
	var rt http.RoundTripper = tr
	if c.token != "" {
		rt = bearerTransport{tr, "Bearer " + c.token}
	}
	var id [4]byte
	rand.Read(id[:])
	body := make([]byte, c.bodySize)
	rand.Read(body)
	return &bench{
		cfg:   c,
		hc:    &http.Client{Transport: rt, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }},
		runID: hex.EncodeToString(id[:]),
		body:  body,
	}
}

// bearerTransport adds the Authorization header to every request.
type bearerTransport struct {
	next http.RoundTripper
	auth string
}

func (t bearerTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", t.auth)
	return t.next.RoundTrip(r)
}

func (b *bench) streamURL(name string) string { return b.cfg.url + "/" + name }

// create makes a stream and returns its tail offset.
func (b *bench) create(u, contentType string) (string, error) {
	req, err := http.NewRequest(http.MethodPut, u, nil)
	if err != nil {
		return "", err
	}
	req.Header.Set("Content-Type", contentType)
	// A create is idempotent: net/http may send it again on a fresh connection when a
	// reused one turns out closed (a nil Idempotency-Key marks it so, and is not sent).
	req.Header["Idempotency-Key"] = nil
	resp, err := b.hc.Do(req)
	if err != nil {
		return "", err
	}
	msg, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
	resp.Body.Close()
	if resp.StatusCode != http.StatusCreated && resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("create %s: %d %s", u, resp.StatusCode, strings.TrimSpace(string(msg)))
	}
	return resp.Header.Get(streamcore.HdrStreamNextOff), nil
}

// phases of a scenario: warmup (unrecorded), measure, stop.
const (
	phaseWarmup int32 = iota
	phaseMeasure
	phaseStop
)

// bodyReader is a request body over a shared, read-only byte slice.
type bodyReader struct {
	b   []byte
	off int
}

func (r *bodyReader) Read(p []byte) (int, error) {
	if r.off >= len(r.b) {
		return 0, io.EOF
	}
	n := copy(p, r.b[r.off:])
	r.off += n
	return n, nil
}

func (r *bodyReader) Close() error { return nil }

type writerStats struct {
	lat    []int64 // nanoseconds, measured phase only
	errors int64
	first  string
}

func (b *bench) appendScenario(name string, writers int, client string) (Result, error) {
	urls := make([]*url.URL, writers)
	for i := range urls {
		// Own streams per client: each writer's producer sequence starts at 0 again.
		u := b.streamURL(fmt.Sprintf("b%s-%s-%s-w%d", b.runID, name, client, i))
		if _, err := b.create(u, "application/octet-stream"); err != nil {
			return Result{}, err
		}
		pu, err := url.Parse(u)
		if err != nil {
			return Result{}, err
		}
		urls[i] = pu
	}
	var phase atomic.Int32
	stats := make([]writerStats, writers)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range writers {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			st := &stats[i]
			st.lat = make([]int64, 0, 1<<14)
			u := urls[i]
			pidText := fmt.Sprintf("bench-%s-%d", b.runID, i)
			send := b.netHTTPAppender(u, pidText)
			if client == "raw" {
				rc, err := newRawConn(u, "application/octet-stream", pidText, len(b.body), b.cfg.tls, b.cfg.token)
				if err != nil {
					st.first, st.errors = err.Error(), 1
					<-start
					return
				}
				defer rc.close()
				send = func(seq uint64) (rawAnswer, error) { return rc.append(seq, b.body) }
			}
			<-start
			for seq := uint64(0); ; seq++ {
				p := phase.Load()
				if p == phaseStop {
					return
				}
				t0 := time.Now()
				ans, err := send(seq)
				lat := time.Since(t0)
				if err == nil && (ans.status == http.StatusOK || ans.status == http.StatusNoContent) {
					if p == phaseMeasure {
						st.lat = append(st.lat, int64(lat))
					}
					continue
				}
				st.errors++
				// Resend this seq (an unknown outcome repeats its key), or resync to the
				// seq the server expects after a gap.
				if err == nil && ans.status == http.StatusConflict {
					if exp, perr := strconv.ParseUint(ans.expectedSeq, 10, 64); perr == nil {
						seq = exp
					}
				}
				seq--
				if st.first == "" {
					if err != nil {
						st.first = err.Error()
					} else {
						st.first = fmt.Sprintf("append answered %d", ans.status)
					}
				}
				if err != nil {
					time.Sleep(10 * time.Millisecond) // do not spin on a dead server
				}
			}
		}(i)
	}
	close(start)
	time.Sleep(b.cfg.warmup)
	phase.Store(phaseMeasure)
	t0 := time.Now()
	time.Sleep(b.cfg.duration)
	phase.Store(phaseStop)
	secs := time.Since(t0).Seconds()
	wg.Wait()

	var all []int64
	r := Result{Scenario: name, Client: client, Concurrency: writers, Seconds: secs}
	for i := range stats {
		all = append(all, stats[i].lat...)
		r.Errors += stats[i].errors
		if r.FirstError == "" {
			r.FirstError = stats[i].first
		}
	}
	r.Ops = int64(len(all))
	r.OpsPerSec = float64(r.Ops) / secs
	r.MBPerSec = r.OpsPerSec * float64(len(b.body)) / 1e6
	fillLatency(&r, all)
	return r, nil
}

// netHTTPAppender sends appends with Go's net/http client (--client nethttp).
func (b *bench) netHTTPAppender(u *url.URL, producerID string) func(seq uint64) (rawAnswer, error) {
	pid := []string{producerID}
	epoch := []string{"0"}
	ct := []string{"application/octet-stream"}
	seqBuf := make([]byte, 0, 20)
	return func(seq uint64) (rawAnswer, error) {
		seqBuf = strconv.AppendUint(seqBuf[:0], seq, 10)
		req := &http.Request{
			Method: http.MethodPost, URL: u, Host: u.Host,
			Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
			Header: http.Header{
				"Content-Type":   ct,
				"Producer-Id":    pid,
				"Producer-Epoch": epoch,
				"Producer-Seq":   {string(seqBuf)},
			},
			Body: &bodyReader{b: b.body}, ContentLength: int64(len(b.body)),
			GetBody: func() (io.ReadCloser, error) { return &bodyReader{b: b.body}, nil },
		}
		resp, err := b.hc.Do(req)
		if err != nil {
			return rawAnswer{}, err
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return rawAnswer{status: resp.StatusCode, expectedSeq: resp.Header.Get(streamcore.HdrProducerExpectedSeq)}, nil
	}
}

// sseScenario: readers subscribe to one text/plain stream; one writer appends
// "<unix nanos>\n" messages at cfg.sseRate per second.
func (b *bench) sseScenario(name string, readers int) (Result, error) {
	u := b.streamURL(fmt.Sprintf("b%s-%s", b.runID, name))
	tail, err := b.create(u, "text/plain")
	if err != nil {
		return Result{}, err
	}
	if tail == "" {
		tail = "now"
	}
	var measureFrom atomic.Int64 // unix nanos; messages sent before are warmup
	measureFrom.Store(1<<63 - 1)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	type readerStats struct {
		lat []int64
		got atomic.Int64 // measured messages received
		err error
	}
	stats := make([]readerStats, readers)
	var ready, done sync.WaitGroup
	for i := range readers {
		ready.Add(1)
		done.Add(1)
		go func(st *readerStats) {
			defer done.Done()
			readySignalled := false
			signal := func() {
				if !readySignalled {
					readySignalled = true
					ready.Done()
				}
			}
			defer signal()
			st.lat = make([]int64, 0, 1<<12)
			req, err := http.NewRequestWithContext(ctx, http.MethodGet, u+"?offset="+url.QueryEscape(tail)+"&live=sse", nil)
			if err != nil {
				st.err = err
				return
			}
			req.Header.Set("Accept", "text/event-stream")
			resp, err := b.hc.Do(req)
			if err != nil {
				st.err = err
				return
			}
			defer resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				st.err = fmt.Errorf("subscribe answered %d", resp.StatusCode)
				return
			}
			b64 := strings.EqualFold(resp.Header.Get(streamcore.HdrSSEEncoding), "base64")
			sr := streamcore.NewSSEReader(resp.Body)
			for {
				ev, err := sr.Next()
				now := time.Now().UnixNano()
				if err != nil {
					if ctx.Err() == nil {
						st.err = err
					}
					return
				}
				switch ev.Type {
				case "control":
					signal()
				case "data":
					data, err := streamcore.DecodeSSEData(ev, b64)
					if err != nil {
						st.err = err
						return
					}
					from := measureFrom.Load()
					for len(data) > 0 {
						line := data
						if i := indexByte(data, '\n'); i >= 0 {
							line, data = data[:i], data[i+1:]
						} else {
							data = nil
						}
						ts, ok := parseInt(line)
						if !ok || ts < from {
							continue
						}
						st.lat = append(st.lat, now-ts)
						st.got.Add(1)
					}
				case "error":
					st.err = fmt.Errorf("error event: %s", ev.Data)
					return
				}
			}
		}(&stats[i])
	}
	ready.Wait()
	for i := range stats {
		if stats[i].err != nil {
			return Result{}, fmt.Errorf("reader %d: %w", i, stats[i].err)
		}
	}

	// The writer: a message every 1/rate seconds; warmup first, then the measured window.
	pu, err := url.Parse(u)
	if err != nil {
		return Result{}, err
	}
	var sent, werrs int64
	var firstErr string
	interval := time.Second / time.Duration(max(b.cfg.sseRate, 1))
	tick := time.NewTicker(interval)
	defer tick.Stop()
	begin := time.Now()
	measureStart := begin.Add(b.cfg.warmup)
	end := measureStart.Add(b.cfg.duration)
	measureFrom.Store(measureStart.UnixNano())
	msg := make([]byte, 0, 24)
	ct := []string{"text/plain"}
	for now := begin; now.Before(end); now = <-tick.C {
		ts := time.Now().UnixNano()
		msg = strconv.AppendInt(msg[:0], ts, 10)
		msg = append(msg, '\n')
		body := &bodyReader{b: msg}
		req := &http.Request{Method: http.MethodPost, URL: pu, Host: pu.Host, Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
			Header: http.Header{"Content-Type": ct}, Body: body, ContentLength: int64(len(msg))}
		resp, err := b.hc.Do(req)
		if err == nil {
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
		ok := err == nil && resp.StatusCode/100 == 2
		if ok && ts >= measureStart.UnixNano() {
			sent++
		}
		if !ok {
			werrs++
			if firstErr == "" {
				if err != nil {
					firstErr = err.Error()
				} else {
					firstErr = fmt.Sprintf("append answered %d", resp.StatusCode)
				}
			}
		}
	}
	secs := time.Since(measureStart).Seconds()

	// Let the last deliveries arrive (at most 3 s), then end the subscriptions.
	want := sent * int64(readers)
	deadline := time.Now().Add(3 * time.Second)
	for time.Now().Before(deadline) {
		var got int64
		for i := range stats {
			got += stats[i].got.Load()
		}
		if got >= want {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	cancel()
	done.Wait()

	var all []int64
	r := Result{Scenario: name, Concurrency: readers, Seconds: secs, Sent: sent, Errors: werrs, FirstError: firstErr}
	for i := range stats {
		all = append(all, stats[i].lat...)
		if stats[i].err != nil && r.FirstError == "" {
			r.FirstError = stats[i].err.Error()
		}
	}
	r.Ops = int64(len(all))
	if missing := want - r.Ops; missing > 0 {
		r.Errors += missing
		if r.FirstError == "" {
			r.FirstError = fmt.Sprintf("%d deliveries missing", missing)
		}
	}
	r.OpsPerSec = float64(r.Ops) / secs
	fillLatency(&r, all)
	return r, nil
}

func indexByte(b []byte, c byte) int {
	for i, x := range b {
		if x == c {
			return i
		}
	}
	return -1
}

func parseInt(b []byte) (int64, bool) {
	if len(b) == 0 || len(b) > 19 {
		return 0, false
	}
	var v int64
	for _, c := range b {
		if c < '0' || c > '9' {
			return 0, false
		}
		v = v*10 + int64(c-'0')
	}
	return v, true
}

func fillLatency(r *Result, lat []int64) {
	if len(lat) == 0 {
		return
	}
	slices.Sort(lat)
	ms := func(ns int64) float64 { return float64(ns) / 1e6 }
	pct := func(q float64) int64 {
		i := int(q*float64(len(lat))+0.999999) - 1
		return lat[min(max(i, 0), len(lat)-1)]
	}
	var sum float64
	for _, v := range lat {
		sum += float64(v)
	}
	r.P50Ms, r.P99Ms, r.P999Ms = ms(pct(0.50)), ms(pct(0.99)), ms(pct(0.999))
	r.MaxMs = ms(lat[len(lat)-1])
	r.MeanMs = sum / float64(len(lat)) / 1e6
}

// ---------------------------------------------------------------------------------------
// Output

// Rows print as each scenario ends, so the columns have fixed widths.
const rowFormat = "%-12s %-18s %5v %9v %9v %7v %9v %9v %9v %9v %7v\n"

func printHeader() {
	fmt.Printf(rowFormat, "label", "scenario", "conc", "ops", "ops/s", "MB/s", "p50", "p99", "p99.9", "max", "errors")
}

func printRow(label string, r Result) {
	mb := "-"
	if r.MBPerSec > 0 {
		mb = fmt.Sprintf("%.2f", r.MBPerSec)
	}
	fmt.Printf(rowFormat, label, r.key(), r.Concurrency, r.Ops, fmt.Sprintf("%.0f", r.OpsPerSec), mb,
		fmtMs(r.P50Ms), fmtMs(r.P99Ms), fmtMs(r.P999Ms), fmtMs(r.MaxMs), r.Errors)
	if r.FirstError != "" {
		fmt.Fprintf(os.Stderr, "  %s %s: first error: %s\n", label, r.key(), r.FirstError)
	}
}

func fmtMs(v float64) string {
	switch {
	case v == 0:
		return "-"
	case v < 1:
		return fmt.Sprintf("%.3fms", v)
	case v < 100:
		return fmt.Sprintf("%.2fms", v)
	}
	return fmt.Sprintf("%.0fms", v)
}

func compare(args []string) int {
	fs := flag.NewFlagSet("compare", flag.ExitOnError)
	vs := fs.String("vs", "", "ratio of each run to the run with this label (default: the first run to each other)")
	fs.Parse(args)
	if fs.NArg() < 1 {
		fmt.Fprint(os.Stderr, "usage: ursula-bench compare [--vs LABEL] A.json [B.json ...]\n")
		return 2
	}
	runs, err := loadRuns(fs.Args())
	if err != nil {
		fmt.Fprintf(os.Stderr, "ursula-bench compare: %v\n", err)
		return 1
	}
	// pairs of (numerator, denominator) run indexes for the ratio columns
	var pairs [][2]int
	if *vs != "" {
		base := slices.IndexFunc(runs, func(r Run) bool { return r.Label == *vs })
		if base < 0 {
			fmt.Fprintf(os.Stderr, "ursula-bench compare: no run labelled %q\n", *vs)
			return 2
		}
		for i := range runs {
			if i != base {
				pairs = append(pairs, [2]int{i, base})
			}
		}
	} else {
		for i := 1; i < len(runs); i++ {
			pairs = append(pairs, [2]int{0, i})
		}
	}
	order := resultKeys(runs)
	tw := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprint(tw, "scenario\tmetric\t")
	for _, r := range runs {
		fmt.Fprintf(tw, "%s\t", r.Label)
	}
	for _, p := range pairs {
		fmt.Fprintf(tw, "%s/%s\t", runs[p[0]].Label, runs[p[1]].Label)
	}
	fmt.Fprintln(tw)
	for _, s := range order {
		for _, m := range metrics {
			fmt.Fprintf(tw, "%s\t%s\t", s, m.name)
			vals := make([]float64, len(runs))
			oks := make([]bool, len(runs))
			for i, r := range runs {
				res, ok := findResult(r, s)
				vals[i], oks[i] = m.get(res), ok
				switch {
				case !ok:
					fmt.Fprint(tw, "-\t")
				case m.ms:
					fmt.Fprintf(tw, "%s\t", fmtMs(vals[i]))
				default:
					fmt.Fprintf(tw, "%.0f\t", vals[i])
				}
			}
			for _, p := range pairs {
				a, b := p[0], p[1]
				if m.name == "errors" || !oks[a] || !oks[b] || vals[b] == 0 {
					fmt.Fprint(tw, "-\t")
					continue
				}
				fmt.Fprintf(tw, "%.2fx\t", vals[a]/vals[b])
			}
			fmt.Fprintln(tw)
		}
	}
	tw.Flush()
	fmt.Println("ratios: ops/s higher is better, latency lower is better")
	printGoals(os.Stdout, runs)
	return 0
}

// metric is one figure of a result in the tables.
type metric struct {
	name string
	get  func(Result) float64
	ms   bool // a latency: lower is better
}

var metrics = []metric{
	{"ops/s", func(r Result) float64 { return r.OpsPerSec }, false},
	{"p50", func(r Result) float64 { return r.P50Ms }, true},
	{"p99", func(r Result) float64 { return r.P99Ms }, true},
	{"p99.9", func(r Result) float64 { return r.P999Ms }, true},
	{"errors", func(r Result) float64 { return float64(r.Errors) }, false},
}

func loadRuns(paths []string) ([]Run, error) {
	runs := make([]Run, len(paths))
	for i, p := range paths {
		b, err := os.ReadFile(p)
		if err == nil {
			err = json.Unmarshal(b, &runs[i])
		}
		if err != nil {
			return nil, fmt.Errorf("%s: %w", p, err)
		}
		if runs[i].Label == "" {
			runs[i].Label = p
		}
	}
	return runs, nil
}

// resultKeys lists the result keys of runs in first-seen order.
func resultKeys(runs []Run) []string {
	var order []string
	seen := map[string]bool{}
	for _, r := range runs {
		for _, res := range r.Results {
			if k := res.key(); !seen[k] {
				seen[k] = true
				order = append(order, k)
			}
		}
	}
	return order
}

func findResult(r Run, key string) (Result, bool) {
	for _, res := range r.Results {
		if res.key() == key {
			return res, true
		}
	}
	return Result{}, false
}

// ---------------------------------------------------------------------------------------
// Helpers for scripts

func freeport(args []string) int {
	n := 1
	if len(args) > 0 {
		v, err := strconv.Atoi(args[0])
		if err != nil || v < 1 {
			fmt.Fprint(os.Stderr, "usage: ursula-bench freeport [N]\n")
			return 2
		}
		n = v
	}
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			fmt.Fprintf(os.Stderr, "ursula-bench freeport: %v\n", err)
			return 1
		}
		ls = append(ls, l)
		fmt.Println(l.Addr().(*net.TCPAddr).Port)
	}
	return 0
}

func wait(args []string) int {
	fs := flag.NewFlagSet("wait", flag.ExitOnError)
	timeout := fs.Duration("timeout", 30*time.Second, "give up after this long")
	caFile := fs.String("ca-file", "", "PEM CA certificates to trust for an https:// URL")
	ok := fs.Bool("ok", false, "wait for a 2xx answer (e.g. readiness), not just any answer")
	fs.Parse(args)
	if fs.NArg() != 1 {
		fmt.Fprint(os.Stderr, "usage: ursula-bench wait [--timeout 30s] [--ca-file F] [--ok] URL\n")
		return 2
	}
	tlsCfg, err := tlsfiles.ClientConfigFromCAFile(*caFile)
	if err != nil {
		fmt.Fprintf(os.Stderr, "ursula-bench wait: %v\n", err)
		return 2
	}
	hc := &http.Client{Timeout: time.Second, Transport: &http.Transport{TLSClientConfig: tlsCfg}}
	deadline := time.Now().Add(*timeout)
	var last error
	for time.Now().Before(deadline) {
		resp, err := hc.Get(fs.Arg(0))
		if err == nil {
			resp.Body.Close()
			if !*ok || resp.StatusCode/100 == 2 {
				return 0
			}
			err = errors.New(resp.Status)
		}
		last = err
		time.Sleep(20 * time.Millisecond)
	}
	if last == nil {
		last = errors.New("timed out")
	}
	fmt.Fprintf(os.Stderr, "ursula-bench wait: %s: %v\n", fs.Arg(0), last)
	return 1
}
