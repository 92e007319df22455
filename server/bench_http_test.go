//go:build linux

package server

import (
	"bufio"
	"bytes"
	"net"
	"net/http"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/ursula-go/ursula/engine"
)

// BenchmarkAppendHTTP measures a 4 KiB producer append through the whole HTTP path the
// node serves (net/http over loopback TCP, the connection limit and the JSON refusal
// wrappers), from a lean client on one keep-alive connection: allocs/op is the server's.
func BenchmarkAppendHTTP(b *testing.B) {
	eng := engine.NewMemory(0)
	srv := New(eng, Config{ClusterID: "bench"})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	hs := &http.Server{Handler: srv, ReadHeaderTimeout: 10 * time.Second, MaxHeaderBytes: 64 << 10}
	go hs.Serve(JSONRefusals(hs, LimitConnections(ln, 100)))
	defer hs.Close()
	base := "http://" + ln.Addr().String()
	req, _ := http.NewRequest("PUT", base+"/bench/s", nil)
	req.Header.Set("Content-Type", "application/octet-stream")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		b.Fatal(err)
	}
	resp.Body.Close()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	br := bufio.NewReaderSize(c, 16<<10)
	body := bytes.Repeat([]byte("x"), 4096)
	head := "POST /bench/s HTTP/1.1\r\nHost: bench\r\nContent-Type: application/octet-stream\r\nContent-Length: 4096\r\nProducer-Id: p\r\nProducer-Epoch: 0\r\nProducer-Seq: "
	var buf []byte
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	cpu0 := processCPU()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		buf = append(buf[:0], head...)
		buf = strconv.AppendInt(buf, int64(i), 10)
		buf = append(buf, "\r\n\r\n"...)
		buf = append(buf, body...)
		if _, err := c.Write(buf); err != nil {
			b.Fatal(err)
		}
		// The answer has no body (Content-Length: 0): its status line, then headers up to
		// the empty line.
		line, err := br.ReadSlice('\n')
		if err != nil || !bytes.HasPrefix(line, []byte("HTTP/1.1 200 ")) {
			b.Fatal(string(line), err)
		}
		for len(line) > 2 {
			if line, err = br.ReadSlice('\n'); err != nil {
				b.Fatal(err)
			}
		}
	}
	// Process CPU time per append (server and this lean client), which a loaded machine
	// distorts less than the wall time.
	b.ReportMetric(float64(processCPU()-cpu0)/float64(b.N), "cpu-ns/op")
}

func processCPU() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
