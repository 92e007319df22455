package raftengine

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"net"
	"reflect"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/raft"
)

func TestLinkCodecRoundTrip(t *testing.T) {
	at := time.Unix(1700000000, 123456789)
	hdr := raft.RPCHeader{ProtocolVersion: raft.ProtocolVersionMax, ID: []byte("1"), Addr: []byte("127.0.0.1:4437")}
	for _, tc := range []struct {
		name string
		req  raft.AppendEntriesRequest
	}{
		{"heartbeat shape", raft.AppendEntriesRequest{RPCHeader: hdr, Term: 3}},
		{"no header", raft.AppendEntriesRequest{Term: 1, PrevLogEntry: 9, PrevLogTerm: 1, LeaderCommitIndex: 8}},
		{"entries", raft.AppendEntriesRequest{RPCHeader: hdr, Term: 7, Leader: []byte("127.0.0.1:4437"),
			PrevLogEntry: 41, PrevLogTerm: 6, LeaderCommitIndex: 40, Entries: []*raft.Log{
				{Index: 42, Term: 7, Type: raft.LogCommand, Data: []byte("a body"), AppendedAt: at},
				{Index: 43, Term: 7, Type: raft.LogNoop},
				{Index: 44, Term: 7, Type: raft.LogConfiguration, Data: bytes.Repeat([]byte{0xff}, 70000), Extensions: []byte("ext")},
			}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := appendAppendRequest(nil, &tc.req)
			got, err := decodeAppendRequest(b)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(*got, tc.req) {
				t.Fatalf("decoded\n%+v\nwant\n%+v", *got, tc.req)
			}
			// Every strict prefix and any trailing byte is refused.
			for i := range len(b) {
				if _, err := decodeAppendRequest(b[:i]); err == nil {
					t.Fatalf("prefix of %d/%d bytes decoded", i, len(b))
				}
			}
			if _, err := decodeAppendRequest(append(b[:len(b):len(b)], 0)); err == nil {
				t.Fatal("trailing byte accepted")
			}
		})
	}
	for _, resp := range []raft.AppendEntriesResponse{
		{},
		{RPCHeader: hdr, Term: 7, LastLog: 44, Success: true},
		{RPCHeader: hdr, Term: 8, LastLog: 40, NoRetryBackoff: true},
	} {
		var got raft.AppendEntriesResponse
		if err := decodeAppendResponse(appendAppendResponse(nil, &resp), &got); err != nil || !reflect.DeepEqual(got, resp) {
			t.Fatalf("response %+v decoded as %+v (%v)", resp, got, err)
		}
	}
	if err := decodeAppendResponse([]byte{0, 0, 0, 1, 2, 9, 9}, new(raft.AppendEntriesResponse)); err == nil {
		t.Fatal("response with trailing bytes accepted")
	}
}

func TestLinkFrameBounds(t *testing.T) {
	for _, tc := range []struct {
		name string
		in   []byte
	}{
		{"short header", []byte{0, 0, 0, 13, 1}},
		{"length below header", []byte{0, 0, 0, 3, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}},
		{"length above bound", []byte{0x7f, 0xff, 0xff, 0xff, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}},
		{"body cut", []byte{0, 0, 0, 20, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 2}},
	} {
		if _, _, _, _, err := readLinkFrame(bufio.NewReader(bytes.NewReader(tc.in))); err == nil {
			t.Errorf("%s: accepted", tc.name)
		}
	}
	var buf bytes.Buffer
	c1, c2 := net.Pipe()
	defer c1.Close()
	defer c2.Close()
	go func() {
		w := &frameWriter{c: c1}
		w.send(frameAppendResp, 7, 99, func(b []byte) []byte { return append(b, "xyz"...) })
	}()
	kind, group, id, body, err := readLinkFrame(bufio.NewReader(c2))
	buf.Write(body)
	if err != nil || kind != frameAppendResp || group != 7 || id != 99 || buf.String() != "xyz" {
		t.Fatalf("frame: %d %d %d %q %v", kind, group, id, body, err)
	}
}

func FuzzDecodeAppendRequest(f *testing.F) {
	f.Add(appendAppendRequest(nil, &raft.AppendEntriesRequest{Term: 2, Entries: []*raft.Log{{Index: 1, Term: 2, Data: []byte("x")}}}))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		req, err := decodeAppendRequest(b)
		if err != nil {
			return
		}
		// What decodes survives a round trip.
		again, err := decodeAppendRequest(appendAppendRequest(nil, req))
		if err != nil || !reflect.DeepEqual(again, req) {
			t.Fatalf("%x: %+v then %+v (%v)", b, req, again, err)
		}
	})
}

// TestFramedPipelineReplicates: in a three-voter cluster, steady replication to the
// followers travels on the links (their served-request count grows) and every
// acknowledged append reaches each follower in order.
func TestFramedPipelineReplicates(t *testing.T) {
	es := threeVoters(t)
	ctx := context.Background()
	key := "b/link"
	g := es[0].GroupOf(key)
	L := es[es[0].LeaderOf(g)-1]
	if _, err := L.Propose(ctx, create(key)); err != nil {
		t.Fatal(err)
	}
	want := ""
	for i := range 40 {
		s := fmt.Sprintf("%d,", i)
		if _, err := L.Propose(ctx, appendCmd(key, s)); err != nil {
			t.Fatal(err)
		}
		want += s
	}
	for _, e := range es {
		if e == L {
			continue
		}
		deadline := time.Now().Add(20 * time.Second)
		for read(e, key) != want {
			if time.Now().After(deadline) {
				t.Fatalf("node %d has %q", e.cfg.NodeID, read(e, key))
			}
			time.Sleep(20 * time.Millisecond)
		}
		if n := e.mux.LinkRequests(); n == 0 {
			t.Fatalf("node %d answered no framed AppendEntries", e.cfg.NodeID)
		}
	}
}

// oldTransport stands for the NetworkTransport under a framed transport.
type oldTransport struct {
	raft.Transport
	piped chan raft.ServerAddress
}

func (o *oldTransport) Consumer() <-chan raft.RPC { return make(chan raft.RPC) }
func (o *oldTransport) AppendEntriesPipeline(_ raft.ServerID, target raft.ServerAddress) (raft.AppendPipeline, error) {
	o.piped <- target
	return nil, raft.ErrPipelineReplicationNotSupported
}

// TestLinkRefusedFallsBack: a peer that closes the link preamble (an older version) is
// no link; the group's pipeline to it is the inner transport's.
func TestLinkRefusedFallsBack(t *testing.T) {
	old, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer old.Close()
	go func() {
		for {
			c, err := old.Accept()
			if err != nil {
				return
			}
			var pre [8]byte
			c.Read(pre[:])
			c.Close() // an unknown preamble
		}
	}()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	m := NewMux(ln, "")
	defer m.Close()
	stop := make(chan struct{})
	defer close(stop)
	inner := &oldTransport{piped: make(chan raft.ServerAddress, 1)}
	ft := m.Framed(3, inner, stop)
	if _, err := m.link(old.Addr().String()); err == nil {
		t.Fatal("a link to a peer that closed the preamble")
	}
	target := raft.ServerAddress(old.Addr().String())
	if _, err := ft.AppendEntriesPipeline("2", target); err != raft.ErrPipelineReplicationNotSupported {
		t.Fatalf("pipeline: %v", err)
	}
	if got := <-inner.piped; got != target {
		t.Fatalf("inner pipeline to %q", got)
	}
}

// countingConn is a net.Conn whose writes never block and are counted and kept.
type countingConn struct {
	net.Conn
	mu     sync.Mutex
	writes int
	buf    bytes.Buffer
}

func (c *countingConn) Write(b []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.writes++
	return c.buf.Write(b)
}
func (c *countingConn) SetWriteDeadline(time.Time) error { return nil }

// TestFrameWriterTakesRunnableFrames: on a busy link, the sender that finds no write in
// progress yields once, so the frames of goroutines that were already runnable leave in
// its write. With one processor and no yield, each sender would write its own frame
// alone. A write of one frame alone does not make the link busy.
func TestFrameWriterTakesRunnableFrames(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	defer func(w time.Duration) { linkBusyWindow = w }(linkBusyWindow)
	linkBusyWindow = time.Minute // a slow machine may take the window to start the senders
	c := &countingConn{}
	w := &frameWriter{c: c}
	if err := w.send(frameAppendResp, 9, 9, func(b []byte) []byte { return append(b, 9) }); err != nil || !w.companyAt.IsZero() {
		t.Fatalf("a lone frame: %v, link busy since %v", err, w.companyAt)
	}
	c.writes = 0
	c.buf.Reset()
	w.companyAt = time.Now() // as after a write of several frames
	const senders = 8
	var wg sync.WaitGroup
	for g := uint32(1); g <= senders; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := w.send(frameAppendResp, g, uint64(g), func(b []byte) []byte { return append(b, byte(g)) }); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	if c.writes > 2 {
		t.Errorf("%d frames took %d writes, want at most 2", senders, c.writes)
	}
	r := bufio.NewReader(&c.buf)
	seen := map[uint32]bool{}
	for range senders {
		kind, group, id, body, err := readLinkFrame(r)
		if err != nil || kind != frameAppendResp || uint64(group) != id || !bytes.Equal(body, []byte{byte(group)}) || seen[group] {
			t.Fatalf("frame: %d %d %d %v %v", kind, group, id, body, err)
		}
		seen[group] = true
	}
}
