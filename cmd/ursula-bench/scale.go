package main

// The scale measurements of make bench (BENCH_SCALE=1): many streams on one node, and many
// idle SSE readers. Both report the server's memory growth from its metrics
// (GET /__ursula/metrics?gc=1 on the admin listener: a collection first, then the live
// heap and the resident set), divided by the number of streams or readers.

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ursula-go/ursula/internal/fdlimit"
	"github.com/ursula-go/ursula/streamcore"
	"github.com/ursula-go/ursula/tlsfiles"
)

// scaleFlags are the flags the scale subcommands share.
type scaleFlags struct {
	url, metrics, caFile, token string
	tls                         *tls.Config
	hc                          *http.Client
}

func (f *scaleFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&f.url, "url", "", "base URL under which streams are created (required)")
	fs.StringVar(&f.metrics, "metrics", "", "the node's metrics URL, e.g. http://127.0.0.1:ADMIN/__ursula/metrics (admin listener: ?gc=1 collects first); empty: no memory figures")
	fs.StringVar(&f.caFile, "ca-file", "", "PEM CA certificates to trust for an https:// --url")
	fs.StringVar(&f.token, "token", "", "bearer token to send with every request")
}

func (f *scaleFlags) setup(concurrency int) error {
	if f.url == "" {
		return errors.New("--url is required")
	}
	f.url = strings.TrimRight(f.url, "/")
	if f.caFile != "" {
		cfg, err := tlsfiles.ClientConfigFromCAFile(f.caFile)
		if err != nil {
			return err
		}
		f.tls = cfg
	}
	tr := &http.Transport{
		MaxIdleConns: concurrency + 8, MaxIdleConnsPerHost: concurrency + 8,
		DisableCompression: true, TLSClientConfig: f.tls,
	}
	var rt http.RoundTripper = tr
	if f.token != "" {
		rt = bearerTransport{tr, "Bearer " + f.token}
	}
	f.hc = &http.Client{Transport: rt, Timeout: 30 * time.Second}
	return nil
}

// memSample is the part of the node's metrics the scale figures use.
type memSample struct {
	Streams    int64 // engine.streams
	LiveReader int64 // live_readers
	RSS        uint64
	HeapLive   uint64
	Goroutines int
}

type metricsDoc struct {
	Engine struct {
		Streams int64 `json:"streams"`
	} `json:"engine"`
	LiveReaders int64 `json:"live_readers"`
	Memory      struct {
		HeapLiveBytes uint64 `json:"heap_live_bytes"`
		RSSBytes      uint64 `json:"rss_bytes"`
		Goroutines    int    `json:"goroutines"`
	} `json:"memory"`
}

// sampleMemory reads the metrics twice a short while apart after a collection each, and
// keeps the second: the first collection frees what the last burst left, the second sees
// the heap settled (finalizers and the sweeper done).
func (f *scaleFlags) sampleMemory() (memSample, error) {
	var m memSample
	if f.metrics == "" {
		return m, nil
	}
	u := f.metrics
	if !strings.Contains(u, "?") {
		u += "?gc=1"
	}
	for i := range 2 {
		if i > 0 {
			time.Sleep(500 * time.Millisecond)
		}
		resp, err := f.hc.Get(u)
		if err != nil {
			return m, err
		}
		var d metricsDoc
		err = json.NewDecoder(resp.Body).Decode(&d)
		resp.Body.Close()
		if err == nil && resp.StatusCode != http.StatusOK {
			err = fmt.Errorf("metrics answered %d", resp.StatusCode)
		}
		if err != nil {
			return m, fmt.Errorf("metrics %s: %w", f.metrics, err)
		}
		m = memSample{Streams: d.Engine.Streams, LiveReader: d.LiveReaders, RSS: d.Memory.RSSBytes,
			HeapLive: d.Memory.HeapLiveBytes, Goroutines: d.Memory.Goroutines}
	}
	return m, nil
}

// perUnit is (after - before) / n in bytes, negative growth reported as such.
func perUnit(after, before uint64, n int) int64 {
	if n <= 0 {
		return 0
	}
	return (int64(after) - int64(before)) / int64(n)
}

// ---------------------------------------------------------------------------------------
// streams: create N streams fast

const streamsUsage = `usage: ursula-bench streams --url BASE [--streams 100000] [--concurrency 64] [--body 64] [--metrics URL]

Creates --streams streams under BASE with --concurrency concurrent PUTs, each PUT carrying
a first append of --body bytes (text/plain), and prints the rate. With --metrics (the
node's admin metrics URL) it prints the node's memory growth per stream (resident set and
live Go heap, each after a collection) and a line for scripts:
  streams=N seconds=S rss_per_stream=B heap_per_stream=B rss_before=B heap_before=B
`

func streamsCmd(args []string) int {
	fs := flag.NewFlagSet("streams", flag.ExitOnError)
	fs.Usage = func() { fmt.Fprint(os.Stderr, streamsUsage); fs.PrintDefaults() }
	var f scaleFlags
	f.register(fs)
	n := fs.Int("streams", 100000, "streams to create")
	conc := fs.Int("concurrency", 64, "concurrent PUTs")
	bodySize := fs.Int("body", 64, "bytes of each stream's first append")
	prefix := fs.String("prefix", "", "stream name prefix (default: s<random>-)")
	fs.Parse(args)
	if fs.NArg() > 0 || *n < 1 || *conc < 1 || *bodySize < 0 {
		fs.Usage()
		return 2
	}
	if err := f.setup(*conc); err != nil {
		fmt.Fprintf(os.Stderr, "ursula-bench streams: %v\n", err)
		return 2
	}
	if *prefix == "" {
		*prefix = "s" + newBench(config{}).runID + "-"
	}
	before, err := f.sampleMemory()
	if err != nil {
		fmt.Fprintf(os.Stderr, "ursula-bench streams: %v\n", err)
		return 1
	}
	t0 := time.Now()
	created, errs, first := createStreams(f.hc, f.url, *prefix, *n, *conc, *bodySize)
	secs := time.Since(t0).Seconds()
	fmt.Printf("created %d streams in %.1f s (%.0f/s, %d concurrent PUTs with a %d B first append), %d errors\n",
		created, secs, float64(created)/secs, *conc, *bodySize, errs)
	if first != "" {
		fmt.Fprintf(os.Stderr, "  first error: %s\n", first)
	}
	if created == 0 {
		return 1
	}
	if f.metrics == "" {
		return 0
	}
	after, err := f.sampleMemory()
	if err != nil {
		fmt.Fprintf(os.Stderr, "ursula-bench streams: %v\n", err)
		return 1
	}
	rss, heap := perUnit(after.RSS, before.RSS, int(created)), perUnit(after.HeapLive, before.HeapLive, int(created))
	fmt.Printf("node memory: %d streams held; RSS %s -> %s (%d B per stream), live heap %s -> %s (%d B per stream)\n",
		after.Streams, mib(before.RSS), mib(after.RSS), rss, mib(before.HeapLive), mib(after.HeapLive), heap)
	fmt.Printf("streams=%d seconds=%.2f rss_per_stream=%d heap_per_stream=%d rss_before=%d heap_before=%d\n",
		created, secs, rss, heap, before.RSS, before.HeapLive)
	if errs > 0 {
		return 1
	}
	return 0
}

func mib(b uint64) string { return fmt.Sprintf("%.1f MiB", float64(b)/(1<<20)) }

// createStreams PUTs n streams named prefix+index with conc workers; it returns how many
// were created, the failures and the first failure's text.
func createStreams(hc *http.Client, base, prefix string, n, conc, bodySize int) (created, errs int64, first string) {
	body := bytes.Repeat([]byte("x"), bodySize)
	if bodySize > 0 {
		body[bodySize-1] = '\n'
	}
	var next atomic.Int64
	var firstOnce sync.Once
	var wg sync.WaitGroup
	var ok, bad atomic.Int64
	for range min(conc, n) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := next.Add(1) - 1
				if i >= int64(n) {
					return
				}
				err := putStream(hc, base+"/"+prefix+strconv.FormatInt(i, 10), body)
				if err != nil {
					bad.Add(1)
					firstOnce.Do(func() { first = err.Error() })
					continue
				}
				ok.Add(1)
			}
		}()
	}
	wg.Wait()
	return ok.Load(), bad.Load(), first
}

func putStream(hc *http.Client, u string, body []byte) error {
	req, err := http.NewRequest(http.MethodPut, u, bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "text/plain")
	resp, err := hc.Do(req)
	if err != nil {
		return err
	}
	msg, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
	resp.Body.Close()
	if resp.StatusCode != http.StatusCreated && resp.StatusCode != http.StatusOK {
		return fmt.Errorf("PUT %s: %d %s", u, resp.StatusCode, strings.TrimSpace(string(msg)))
	}
	return nil
}

// memoryCmd prints the node's memory once (after a collection): for scripts, e.g. after
// a restart.
func memoryCmd(args []string) int {
	fs := flag.NewFlagSet("memory", flag.ExitOnError)
	var f scaleFlags
	fs.StringVar(&f.metrics, "metrics", "", "the node's metrics URL (admin listener: ?gc=1 collects first)")
	fs.StringVar(&f.token, "token", "", "bearer token to send")
	fs.Parse(args)
	if f.metrics == "" || fs.NArg() > 0 {
		fmt.Fprint(os.Stderr, "usage: ursula-bench memory --metrics URL\n")
		return 2
	}
	f.url = "-"
	if err := f.setup(1); err != nil {
		fmt.Fprintf(os.Stderr, "ursula-bench memory: %v\n", err)
		return 2
	}
	m, err := f.sampleMemory()
	if err != nil {
		fmt.Fprintf(os.Stderr, "ursula-bench memory: %v\n", err)
		return 1
	}
	fmt.Printf("streams=%d live_readers=%d rss=%d heap_live=%d goroutines=%d\n", m.Streams, m.LiveReader, m.RSS, m.HeapLive, m.Goroutines)
	return 0
}

// ---------------------------------------------------------------------------------------
// sse-idle: many idle SSE readers

const sseIdleUsage = `usage: ursula-bench sse-idle --url BASE [--readers 10000] [--streams 100] [--metrics URL] [--hold 2s]

Creates --streams text/plain streams, opens --readers SSE readers (live=sse from the
tail) spread over them and waits until each has its first control event; then holds them
idle for --hold and, with --metrics, prints the node's memory growth per reader (resident
set and live Go heap, each after a collection). Last, one message is appended to every
stream and each reader must receive it (delivery p50/p99 over all readers), so the figures
are for readers that work. A line for scripts:
  readers=N rss_per_reader=B heap_per_reader=B goroutines_per_reader=G delivered=D p99_ms=X
`

func sseIdleCmd(args []string) int {
	fs := flag.NewFlagSet("sse-idle", flag.ExitOnError)
	fs.Usage = func() { fmt.Fprint(os.Stderr, sseIdleUsage); fs.PrintDefaults() }
	var f scaleFlags
	f.register(fs)
	readers := fs.Int("readers", 10000, "idle SSE readers to open")
	streams := fs.Int("streams", 100, "streams the readers spread over")
	conc := fs.Int("concurrency", 64, "readers connecting at once")
	hold := fs.Duration("hold", 2*time.Second, "idle time before the memory is read")
	timeout := fs.Duration("timeout", 120*time.Second, "give up when the readers are not all subscribed by then")
	fs.Parse(args)
	if fs.NArg() > 0 || *readers < 1 || *streams < 1 || *conc < 1 {
		fs.Usage()
		return 2
	}
	if err := f.setup(*conc); err != nil {
		fmt.Fprintf(os.Stderr, "ursula-bench sse-idle: %v\n", err)
		return 2
	}
	if lim := fdlimit.Raise(); lim > 0 && lim < uint64(*readers)+256 {
		fmt.Fprintf(os.Stderr, "ursula-bench sse-idle: the descriptor limit %d is too low for %d readers\n", lim, *readers)
		return 1
	}
	if err := sseIdle(&f, *readers, *streams, *conc, *hold, *timeout); err != nil {
		fmt.Fprintf(os.Stderr, "ursula-bench sse-idle: %v\n", err)
		return 1
	}
	return 0
}

// idleReader is one SSE subscription held on its own connection by a lean client: a
// small read buffer and net/http's response parser only, so ten thousand of them fit in
// the load generator too.
type idleReader struct {
	conn net.Conn
	got  chan int64 // receive time (unix nanos) of the first data event after subscribing
	err  error
}

func sseIdle(f *scaleFlags, readers, streams, conc int, hold, timeout time.Duration) error {
	runID := newBench(config{}).runID
	names := make([]string, streams)
	for i := range names {
		names[i] = fmt.Sprintf("idle%s-%d", runID, i)
		if err := putStream(f.hc, f.url+"/"+names[i], []byte("first\n")); err != nil {
			return err
		}
	}
	before, err := f.sampleMemory()
	if err != nil {
		return err
	}
	u, err := url.Parse(f.url)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	rs := make([]*idleReader, readers)
	var subscribed sync.WaitGroup
	var next atomic.Int64
	var failed atomic.Pointer[error]
	t0 := time.Now()
	var dialers sync.WaitGroup
	for range min(conc, readers) {
		dialers.Add(1)
		go func() {
			defer dialers.Done()
			for {
				i := int(next.Add(1) - 1)
				if i >= readers || ctx.Err() != nil || failed.Load() != nil {
					return
				}
				r := &idleReader{got: make(chan int64, 1)}
				rs[i] = r
				ready := make(chan error, 1)
				subscribed.Add(1)
				go r.run(ctx, f, u, names[i%streams], ready, &subscribed)
				if err := <-ready; err != nil {
					failed.CompareAndSwap(nil, &err)
					return
				}
			}
		}()
	}
	dialers.Wait()
	defer func() {
		cancel()
		for _, r := range rs {
			if r != nil && r.conn != nil {
				r.conn.Close()
			}
		}
	}()
	if p := failed.Load(); p != nil {
		return fmt.Errorf("subscribing reader %d: %w", next.Load(), *p)
	}
	if ctx.Err() != nil {
		return fmt.Errorf("%d readers not subscribed within %s", readers-int(next.Load()), timeout)
	}
	fmt.Printf("%d SSE readers on %d streams subscribed in %.1f s\n", readers, streams, time.Since(t0).Seconds())
	time.Sleep(hold)
	after, err := f.sampleMemory()
	if err != nil {
		return err
	}
	// Every reader must still be there: one message per stream, each reader receives it.
	sent := time.Now()
	for _, name := range names {
		if err := postText(f.hc, f.url+"/"+name, strconv.FormatInt(sent.UnixNano(), 10)+"\n"); err != nil {
			return err
		}
	}
	lat := make([]int64, 0, readers)
	deadline := time.After(30 * time.Second)
	missing := 0
	for _, r := range rs {
		select {
		case at := <-r.got:
			lat = append(lat, at-sent.UnixNano())
		case <-deadline:
			missing++
		}
	}
	var res Result
	fillLatency(&res, lat)
	fmt.Printf("delivery of one message per stream to %d readers: %d delivered, p50 %s, p99 %s, max %s\n",
		readers, len(lat), fmtMs(res.P50Ms), fmtMs(res.P99Ms), fmtMs(res.MaxMs))
	if f.metrics != "" {
		rss, heap := perUnit(after.RSS, before.RSS, readers), perUnit(after.HeapLive, before.HeapLive, readers)
		gor := float64(after.Goroutines-before.Goroutines) / float64(readers)
		fmt.Printf("node memory: %d live readers; RSS %s -> %s (%d B per reader), live heap %s -> %s (%d B per reader), %.2f goroutines per reader\n",
			after.LiveReader, mib(before.RSS), mib(after.RSS), rss, mib(before.HeapLive), mib(after.HeapLive), heap, gor)
		fmt.Printf("readers=%d rss_per_reader=%d heap_per_reader=%d goroutines_per_reader=%.2f delivered=%d p99_ms=%.2f\n",
			readers, rss, heap, gor, len(lat), res.P99Ms)
	}
	if missing > 0 {
		return fmt.Errorf("%d readers did not receive the message within 30 s", missing)
	}
	return nil
}

func postText(hc *http.Client, u, text string) error {
	resp, err := hc.Post(u, "text/plain", strings.NewReader(text))
	if err != nil {
		return err
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("POST %s: %d", u, resp.StatusCode)
	}
	return nil
}

// run subscribes, reports on ready once the first control event came (or the failure),
// then reads until the connection ends, sending the receive time of the first data event
// on r.got.
func (r *idleReader) run(ctx context.Context, f *scaleFlags, base *url.URL, stream string, ready chan<- error, subscribed *sync.WaitGroup) {
	signalled := false
	signal := func(err error) {
		if !signalled {
			signalled = true
			r.err = err
			ready <- err
			subscribed.Done()
		}
	}
	defer func() { signal(errors.New("subscription ended before its first control event")) }()
	addr := base.Host
	if base.Port() == "" {
		addr = net.JoinHostPort(base.Hostname(), map[bool]string{true: "443", false: "80"}[base.Scheme == "https"])
	}
	d := net.Dialer{Timeout: 10 * time.Second}
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		signal(err)
		return
	}
	if base.Scheme == "https" {
		cfg := &tls.Config{}
		if f.tls != nil {
			cfg = f.tls.Clone()
		}
		cfg.NextProtos = []string{"http/1.1"}
		if cfg.ServerName == "" {
			cfg.ServerName = base.Hostname()
		}
		conn = tls.Client(conn, cfg)
	}
	r.conn = conn
	auth := ""
	if f.token != "" {
		auth = "Authorization: Bearer " + f.token + "\r\n"
	}
	path := base.EscapedPath() + "/" + stream + "?offset=now&live=sse"
	if _, err := fmt.Fprintf(conn, "GET %s HTTP/1.1\r\nHost: %s\r\n%sAccept: text/event-stream\r\n\r\n", path, base.Host, auth); err != nil {
		signal(err)
		return
	}
	br := bufio.NewReaderSize(conn, 512)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		signal(err)
		return
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		signal(fmt.Errorf("subscribe answered %d", resp.StatusCode))
		return
	}
	sr := streamcore.NewSSEReader(resp.Body)
	for {
		ev, err := sr.Next()
		now := time.Now().UnixNano()
		if err != nil {
			signal(err)
			return
		}
		switch ev.Type {
		case "control":
			signal(nil)
		case "data":
			select {
			case r.got <- now:
			default:
			}
		case "error":
			signal(fmt.Errorf("error event: %s", ev.Data))
			return
		}
	}
}
