package replicator

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"

	"github.com/ursula-go/ursula/client"
	"github.com/ursula-go/ursula/streamcore"
)

// A snapshot is fetched by ranged GETs, several in flight, piped in order into
// readSnapshot: a cold start of a large database is bound by the network and the
// decompressor, not by one request's round trips, and holds only the ranges in flight.
const (
	fetchRangeBytes = 8 << 20
	fetchInFlight   = 4
)

// openSnapshot returns the body of the snapshot at off (a stream offset as the protocol
// writes it) and its size. Errors of the reads are the client's own (*client.Error),
// returned by the first call or by Read of the body.
func openSnapshot(ctx context.Context, c *client.Client, url, off string) (io.ReadCloser, int64, error) {
	rng := func(lo, hi int64) client.SnapshotReadOptions {
		return client.SnapshotReadOptions{Range: fmt.Sprintf("bytes=%d-%d", lo, hi-1)}
	}
	first, err := c.ReadSnapshot(ctx, url, off, rng(0, fetchRangeBytes))
	if err != nil {
		return nil, 0, err
	}
	total, ok := rangeTotal(first.ContentRange)
	if first.Status != http.StatusPartialContent || !ok {
		// No range support: the whole body came back.
		return io.NopCloser(bytes.NewReader(first.Data)), int64(len(first.Data)), nil
	}
	if int64(len(first.Data)) >= total {
		return io.NopCloser(bytes.NewReader(first.Data)), total, nil
	}
	ctx, cancel := context.WithCancel(ctx)
	pr, pw := io.Pipe()
	type result struct {
		data []byte
		err  error
	}
	queue := make(chan chan result, fetchInFlight-1) // bounds the ranges in flight
	go func() {                                      // dispatcher: one goroutine per range, in order
		defer close(queue)
		for lo := int64(len(first.Data)); lo < total; lo += fetchRangeBytes {
			hi := min(lo+fetchRangeBytes, total)
			ch := make(chan result, 1)
			select {
			case queue <- ch:
			case <-ctx.Done():
				return
			}
			go func() {
				sr, err := c.ReadSnapshot(ctx, url, off, rng(lo, hi))
				switch {
				case err != nil:
					ch <- result{err: err}
				case int64(len(sr.Data)) != hi-lo || sr.Digest != first.Digest:
					// Another snapshot (or a short answer): the caller starts over.
					ch <- result{err: &client.Error{Op: "read snapshot", Status: http.StatusNotFound, Code: streamcore.CodeSnapshotNotFound,
						Message: fmt.Sprintf("range %d-%d answered %d bytes of digest %q, want %q", lo, hi, len(sr.Data), sr.Digest, first.Digest)}}
				default:
					ch <- result{data: sr.Data}
				}
			}()
		}
	}()
	go func() { // writer: the ranges in order into the pipe
		if _, err := pw.Write(first.Data); err != nil {
			cancel()
			return
		}
		for ch := range queue {
			var res result
			select {
			case res = <-ch:
			case <-ctx.Done():
				res.err = ctx.Err()
			}
			if res.err == nil {
				_, res.err = pw.Write(res.data)
			}
			if res.err != nil {
				pw.CloseWithError(res.err)
				cancel()
				for range queue { // let the dispatcher finish
				}
				return
			}
		}
		pw.Close()
	}()
	return &fetchBody{PipeReader: pr, cancel: cancel}, total, nil
}

type fetchBody struct {
	*io.PipeReader
	cancel context.CancelFunc
}

func (b *fetchBody) Close() error {
	b.cancel()
	return b.PipeReader.CloseWithError(io.ErrClosedPipe)
}

// rangeTotal parses the complete length of "bytes lo-hi/total".
func rangeTotal(cr string) (int64, bool) {
	i := strings.LastIndexByte(cr, '/')
	if !strings.HasPrefix(cr, "bytes ") || i < 0 {
		return 0, false
	}
	n, err := strconv.ParseInt(cr[i+1:], 10, 64)
	return n, err == nil && n >= 0
}
