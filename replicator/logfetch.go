package replicator

import (
	"context"

	"github.com/ursula-go/ursula/client"
	"github.com/ursula-go/ursula/streamcore"
)

// The log after a snapshot is fetched in windows of readChunk (the server's cap on one
// read), logInFlight at a time, and handed to the decoder in order: a long tail replays
// at the speed of the decoder rather than one read's round trip after another.
const logInFlight = 4

type logWindow struct {
	data []byte
	err  error
}

// fetchLog reads [from, to) of the stream. next returns the windows in order (nil, nil
// after the last); stop cancels what is in flight. A window answered short is completed
// by further reads of its own range.
func fetchLog(ctx context.Context, c *client.Client, url string, from, to uint64) (next func() ([]byte, error), stop func()) {
	ctx, cancel := context.WithCancel(ctx)
	queue := make(chan chan logWindow, logInFlight-1)
	go func() {
		defer close(queue)
		for lo := from; lo < to; lo += readChunk {
			hi := min(lo+readChunk, to)
			ch := make(chan logWindow, 1)
			select {
			case queue <- ch:
			case <-ctx.Done():
				return
			}
			go func() {
				var buf []byte
				for pos := lo; pos < hi; {
					rr, err := c.Read(ctx, url, client.ReadOptions{Offset: streamcore.FormatOffset(pos), MaxBytes: int(hi - pos)})
					if err != nil {
						ch <- logWindow{err: err}
						return
					}
					if len(rr.Data) == 0 {
						ch <- logWindow{err: newError(KindUnavailable, ActionRetry, nil, "stream read at %d returned nothing before %d", pos, to)}
						return
					}
					part := rr.Data[:min(uint64(len(rr.Data)), hi-pos)]
					if buf == nil && pos+uint64(len(part)) == hi {
						buf = part // the usual case: one read fills the window, no copy
					} else {
						buf = append(buf, part...)
					}
					pos += uint64(len(rr.Data))
				}
				ch <- logWindow{data: buf}
			}()
		}
	}()
	next = func() ([]byte, error) {
		ch, ok := <-queue
		if !ok {
			return nil, ctx.Err()
		}
		w := <-ch
		return w.data, w.err
	}
	stop = func() {
		cancel()
		for range queue { // let the dispatcher end
		}
	}
	return next, stop
}
