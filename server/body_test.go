package server

import (
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/ursula-go/ursula/engine"
	raftengine "github.com/ursula-go/ursula/engine/raft"
)

// deadlineRecorder is a ResponseWriter whose read and write deadlines a
// ResponseController moves; it records every move.
type deadlineRecorder struct {
	httptest.ResponseRecorder
	reads, writes []time.Time
}

func (d *deadlineRecorder) SetReadDeadline(t time.Time) error {
	d.reads = append(d.reads, t)
	return nil
}

func (d *deadlineRecorder) SetWriteDeadline(t time.Time) error {
	d.writes = append(d.writes, t)
	return nil
}

// chunkReader returns its chunks in separate reads, then io.EOF with the last bytes.
type chunkReader struct{ chunks [][]byte }

func (c *chunkReader) Read(p []byte) (int, error) {
	if len(c.chunks) == 0 {
		return 0, io.EOF
	}
	n := copy(p, c.chunks[0])
	if c.chunks[0] = c.chunks[0][n:]; len(c.chunks[0]) == 0 {
		c.chunks = c.chunks[1:]
	}
	if len(c.chunks) == 0 {
		return n, io.EOF
	}
	return n, nil
}

func (c *chunkReader) Close() error { return nil }

// A body that comes in quick reads moves the read deadline once (then clears it), and
// keeps the write deadline set at the start; each deadline in force is no later than the
// exact one the pace asks for.
func TestPacedBodyMovesDeadlinesOnce(t *testing.T) {
	rec := &deadlineRecorder{}
	rc := http.NewResponseController(rec)
	start := time.Now()
	idle, wt := 10*time.Second, time.Minute
	p := &pacedBody{body: &chunkReader{chunks: [][]byte{make([]byte, 3000), make([]byte, 1000), make([]byte, 96)}},
		rc: rc, start: start, idle: idle, minRate: 4 << 10, writeTimeout: wt}
	before := time.Now()
	got, err := io.ReadAll(p)
	if err != nil || len(got) != 4096 {
		t.Fatalf("read %d bytes, %v", len(got), err)
	}
	if len(rec.reads) != 2 || !rec.reads[1].IsZero() {
		t.Fatalf("read deadlines %v, want one deadline then the clear", rec.reads)
	}
	if exact := before.Add(idle); rec.reads[0].After(time.Now().Add(idle)) || rec.reads[0].Before(exact.Add(-idle/deadlineSlack)) {
		t.Fatalf("read deadline %v not within idle/64 before the exact one", rec.reads[0])
	}
	if len(rec.writes) != 0 {
		t.Fatalf("write deadline moved %d times for a body that came at once", len(rec.writes))
	}
	// A body that took longer than the slack restarts the write deadline.
	rec2 := &deadlineRecorder{}
	p2 := &pacedBody{body: &chunkReader{chunks: [][]byte{make([]byte, 10)}}, rc: http.NewResponseController(rec2),
		start: time.Now().Add(-2 * time.Second), idle: idle, writeTimeout: wt}
	io.ReadAll(p2)
	if len(rec2.writes) != 1 || rec2.writes[0].Before(time.Now().Add(wt-time.Second)) {
		t.Fatalf("write deadlines %v, want one restart from the body's end", rec2.writes)
	}
}

func TestScratchClasses(t *testing.T) {
	for _, c := range []struct{ n, class, capacity int }{
		{1, 0, 4 << 10}, {4096, 0, 4 << 10}, {4097, 1, 8 << 10}, {16 << 10, 2, 16 << 10},
		{40000, 4, 64 << 10}, {bodyChunk, 4, bodyChunk},
	} {
		sb := getScratch(c.n)
		if sb.class != c.class || len(sb.buf) != c.n || cap(sb.buf) != c.capacity {
			t.Errorf("getScratch(%d): class %d len %d cap %d; want class %d cap %d", c.n, sb.class, len(sb.buf), cap(sb.buf), c.class, c.capacity)
		}
		putScratch(sb)
	}
}

// Append bodies are read into pooled buffers reused by later requests: concurrent
// writers of distinct bodies of several sizes must each find exactly their bytes in their
// stream, on both engines (neither may keep a body past its proposal).
func TestPooledAppendBodiesIntact(t *testing.T) {
	mem := engine.NewMemory(0)
	t.Cleanup(func() { mem.Close() })
	re, err := raftengine.Open(raftengine.Config{NodeID: 1, GroupCount: 2, RaftLog: io.Discard})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { re.Close() })
	for _, tc := range []struct {
		name string
		eng  engine.Engine
	}{{"memory", mem}, {"raft", re}} {
		t.Run(tc.name, func(t *testing.T) {
			base := "http://" + newWrappedServer(t, New(tc.eng, Config{ClusterID: "c"}))
			const writers, appends = 6, 20
			// A single-voter group elects itself within moments: poll the first create.
			deadline := time.Now().Add(30 * time.Second)
			for w := 0; w < writers; w++ {
				for {
					res, b := coldDo(t, "PUT", fmt.Sprintf("%s/pool/s%d", base, w), nil, "Content-Type", "application/octet-stream")
					if res.StatusCode == http.StatusCreated {
						break
					}
					if time.Now().After(deadline) {
						t.Fatalf("create: %d %s", res.StatusCode, b)
					}
					time.Sleep(50 * time.Millisecond)
				}
			}
			bodyOf := func(w, i int) []byte {
				n := 100 + (w*appends+i)*977%9000 // 100 B to 9 KB: several scratch classes
				return bytes.Repeat([]byte{byte('a' + w), byte('0' + i%10)}, n/2)
			}
			var wg sync.WaitGroup
			errs := make(chan string, writers)
			for w := 0; w < writers; w++ {
				wg.Add(1)
				go func(w int) {
					defer wg.Done()
					for i := 0; i < appends; i++ {
						req, _ := http.NewRequest("POST", fmt.Sprintf("%s/pool/s%d", base, w), bytes.NewReader(bodyOf(w, i)))
						req.Header.Set("Content-Type", "application/octet-stream")
						req.Header.Set("Producer-Id", "p")
						req.Header.Set("Producer-Epoch", "0")
						req.Header.Set("Producer-Seq", strconv.Itoa(i))
						res, err := http.DefaultClient.Do(req)
						if err != nil {
							errs <- err.Error()
							return
						}
						io.Copy(io.Discard, res.Body)
						res.Body.Close()
						if res.StatusCode != http.StatusOK {
							errs <- fmt.Sprintf("append %d/%d: %d", w, i, res.StatusCode)
							return
						}
					}
				}(w)
			}
			wg.Wait()
			close(errs)
			for e := range errs {
				t.Fatal(e)
			}
			for w := 0; w < writers; w++ {
				var want []byte
				for i := 0; i < appends; i++ {
					want = append(want, bodyOf(w, i)...)
				}
				_, got := coldDo(t, "GET", fmt.Sprintf("%s/pool/s%d?offset=-1", base, w), nil)
				if !bytes.Equal(got, want) {
					t.Fatalf("stream %d holds %d bytes that differ from the %d appended", w, len(got), len(want))
				}
			}
		})
	}
}

// A body over bodyChunk is read into chunks and, once half of a declared length came,
// straight into one exact buffer: every size and split gives back exactly the bytes sent,
// a body shorter than declared is refused, and the budget holds nothing afterwards.
func TestLargeBodiesReadExactly(t *testing.T) {
	mem := engine.NewMemory(0)
	t.Cleanup(func() { mem.Close() })
	s := New(mem, Config{ClusterID: "c"})
	for _, tc := range []struct {
		size     int
		declared bool
		short    bool // the sender stops before its declared length
		piece    int
		cut      int // how many bytes short (1 when 0)
	}{
		{bodyChunk + 1, true, false, 7000, 0}, {200_000, true, false, 65536, 0}, {1<<20 + 13, true, false, 100_000, 0},
		{4 * bodyChunk, true, false, bodyChunk, 0}, {200_000, false, false, 30000, 0}, {1 << 20, true, true, 50_000, 0},
		{3 * bodyChunk, true, true, 1, 0}, {1 << 20, true, true, 65536, 900_000}, {1 << 20, true, true, 10_000, 1<<20 - bodyChunk - 5},
	} {
		t.Run(fmt.Sprintf("%d-declared=%t-short=%d", tc.size, tc.declared, tc.cut), func(t *testing.T) {
			body := make([]byte, tc.size)
			for i := range body {
				body[i] = byte(i*31 + i>>16)
			}
			sent := body
			if tc.short {
				sent = body[:len(body)-max(1, tc.cut)]
			}
			var pieces [][]byte
			for rest := sent; len(rest) > 0; {
				n := min(tc.piece, len(rest))
				pieces = append(pieces, rest[:n])
				rest = rest[n:]
			}
			r := httptest.NewRequest("POST", "/b/s", &chunkReader{chunks: pieces})
			r.ContentLength = -1
			if tc.declared {
				r.ContentLength = int64(len(body))
			}
			got, e := s.readBody(httptest.NewRecorder(), r)
			switch {
			case tc.short && e == nil:
				t.Fatalf("a body short of its Content-Length was read (%d bytes)", len(got))
			case !tc.short && e != nil:
				t.Fatalf("read: %v", e)
			case !tc.short && !bytes.Equal(got, body):
				t.Fatalf("read %d bytes that differ from the %d sent", len(got), len(body))
			}
			if u := s.bodies.used.Load(); u != 0 {
				t.Fatalf("the body budget still holds %d bytes", u)
			}
		})
	}
}

// A body cut off mid-way (the sender's connection closes before its declared length or
// its last chunk) appends nothing, whatever point it is cut at: a retry of the same
// producer seq would otherwise be answered as a duplicate of the cut body.
func TestCutBodiesAppendNothing(t *testing.T) {
	mem := engine.NewMemory(0)
	t.Cleanup(func() { mem.Close() })
	addr := newWrappedServer(t, New(mem, Config{ClusterID: "c"}))
	base := "http://" + addr
	if res, b := coldDo(t, "PUT", base+"/cuts/s", nil, "Content-Type", "application/octet-stream"); res.StatusCode != http.StatusCreated {
		t.Fatalf("create: %d %s", res.StatusCode, b)
	}
	for _, tc := range []struct {
		name    string
		head    string
		payload []byte
	}{
		{"declared, cut before half", "Content-Length: 1048576\r\n", bytes.Repeat([]byte("a"), 3*bodyChunk+17)},
		{"declared, cut after half", "Content-Length: 1048576\r\n", bytes.Repeat([]byte("b"), 900_000)},
		{"declared, cut at a chunk boundary", "Content-Length: 1048576\r\n", bytes.Repeat([]byte("c"), 2*bodyChunk)},
		{"chunked, no last chunk", "Transfer-Encoding: chunked\r\n", []byte(fmt.Sprintf("%x\r\n%s\r\n", 3*bodyChunk, bytes.Repeat([]byte("d"), 3*bodyChunk)))},
		{"chunked, cut in a chunk", "Transfer-Encoding: chunked\r\n", []byte(fmt.Sprintf("%x\r\n%s", 3*bodyChunk, bytes.Repeat([]byte("e"), bodyChunk+9)))},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := net.Dial("tcp", addr)
			if err != nil {
				t.Fatal(err)
			}
			fmt.Fprintf(c, "POST /cuts/s HTTP/1.1\r\nHost: x\r\nContent-Type: application/octet-stream\r\nProducer-Id: p\r\nProducer-Epoch: 0\r\nProducer-Seq: 0\r\n%s\r\n", tc.head)
			c.Write(tc.payload)
			c.(*net.TCPConn).CloseWrite()
			io.Copy(io.Discard, c) // whatever the answer, once the server is done with it
			c.Close()
			res, b := coldDo(t, "GET", base+"/cuts/s?offset=-1", nil)
			if res.StatusCode != http.StatusOK || len(b) != 0 {
				t.Fatalf("after a cut body the stream answers %d with %d bytes", res.StatusCode, len(b))
			}
		})
	}
}
