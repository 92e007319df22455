package raftengine

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"sync"

	"github.com/hashicorp/raft"

	"github.com/ursula-go/ursula/streamcore"
)

// Proposal batching (Config.BatchProposals; cmd/ursula turns it on when the node log
// fsyncs every append). Concurrent proposals to one group are collected into one Raft log
// entry (entryBatch) with one FSM apply that answers each command in order. A group has
// at most maxInflight batches in flight; proposals arriving meanwhile queue, and when a
// batch has applied, its lead takes everything queued (up to the batch bounds) as the
// next batch. Batches are handed to Raft in the order they were taken, so commands reach
// the log in the order they reached Propose and each stream's commands apply in that
// order. Each command goes through streamcore's apply exactly as it would alone
// (producer dedup, receipts): batching changes how many commands share an entry, never
// what each one does.
//
// No goroutine is added: the first proposal of a batch is its lead. It waits for the
// entry, answers the other proposals of the batch, and starts the next batch before it
// answers its own caller. A lead whose batch another goroutine started is woken once,
// which it would have been anyway for its answer.
//
// A batch of one command is written as a plain entryCommand entry, the format of a lone
// write, so a node under light load writes what it always wrote.

const (
	// maxBatchCommands and maxBatchBytes bound one batch entry. A command larger than
	// maxBatchBytes goes alone.
	maxBatchCommands = 128
	maxBatchBytes    = 1 << 20
	// maxInflight batches per group keep Raft's stages (journal write, FSM apply) busy
	// at once while later proposals gather into the next batch.
	maxInflight = 2
)

// proposal is one command waiting in a group's queue. data is the encoded command with
// its entryCommand prefix.
type proposal struct {
	data []byte
	done chan struct{} // one signal: made lead of a batch, or answered

	batch []*proposal // set on the lead of a batch: wait for f and answer the batch
	f     raft.ApplyFuture

	answered bool
	res      streamcore.Result
	err      error
}

var proposalPool = sync.Pool{New: func() any { return &proposal{done: make(chan struct{}, 1)} }}

// batcher is a group's proposal queue.
type batcher struct {
	mu       sync.Mutex
	queue    []*proposal
	inflight int        // batches taken and not yet answered
	order    sync.Mutex // held from taking a batch until Raft has it: log order = take order
}

// propose queues data (an entryCommand entry) and returns its outcome once its batch has
// applied.
func (g *group) propose(ctx context.Context, data []byte) (streamcore.Result, error) {
	p := proposalPool.Get().(*proposal)
	p.data = data
	b := &g.batch
	b.mu.Lock()
	b.queue = append(b.queue, p)
	leads := false
	if b.inflight < maxInflight {
		b.inflight++
		leads = g.start(ctx, p) // unlocks b.mu
	} else {
		b.mu.Unlock()
	}
	if !leads {
		<-p.done // answered, or made lead of its batch
		leads = !p.answered
	}
	if leads {
		g.lead(ctx, p) // the batch holds p: p is answered after it
	}
	res, err := p.res, p.err
	*p = proposal{done: p.done}
	proposalPool.Put(p)
	return res, err
}

// start takes the next batch off the queue and hands it to Raft. Called with b.mu held
// and an inflight slot reserved for the batch; returns with b.mu released. The batch's
// first proposal becomes its lead: start reports whether that is self, the caller's own,
// and otherwise signals it.
func (g *group) start(ctx context.Context, self *proposal) bool {
	b := &g.batch
	batch := b.take()
	b.order.Lock()
	b.mu.Unlock()
	var data []byte
	if len(batch) == 1 {
		data = batch[0].data
	} else {
		data = encodeBatch(batch)
	}
	f := g.enqueue(ctx, data)
	b.order.Unlock()
	l := batch[0]
	l.batch, l.f = batch, f
	if l == self {
		return true
	}
	l.done <- struct{}{}
	return false
}

// lead waits for p's batch, answers it, and starts the next batch or frees the slot.
func (g *group) lead(ctx context.Context, p *proposal) {
	batch, f := p.batch, p.f
	p.batch, p.f = nil, nil
	resp, err := g.outcome(f)
	switch {
	case err != nil:
		for _, q := range batch {
			q.err = err
		}
	case len(batch) == 1:
		batch[0].res, batch[0].err = answer(resp)
	default:
		rs, ok := resp.(batchAnswer)
		if !ok {
			// Not a batch's answer: the group refused the whole entry (APPLY_STOPPED).
			for _, q := range batch {
				q.res, q.err = answer(resp)
			}
			break
		}
		for i, q := range batch {
			if i >= len(rs) {
				q.err = errors.New("raftengine: batch answer is short")
				continue
			}
			q.res, q.err = answer(rs[i])
		}
	}
	b := &g.batch
	b.mu.Lock()
	if len(b.queue) > 0 {
		g.start(ctx, p) // the slot passes to the next batch; p is answered, never its lead
	} else {
		b.inflight--
		b.mu.Unlock()
	}
	for _, q := range batch {
		q.answered = true
		if q != p {
			q.done <- struct{}{}
		}
	}
}

// take removes the next batch from the queue. Called with b.mu held.
func (b *batcher) take() []*proposal {
	n, size := 0, 0
	for n < len(b.queue) && n < maxBatchCommands {
		size += len(b.queue[n].data)
		if n > 0 && size > maxBatchBytes {
			break
		}
		n++
	}
	batch := make([]*proposal, n)
	copy(batch, b.queue)
	rest := copy(b.queue, b.queue[n:])
	clear(b.queue[rest:])
	b.queue = b.queue[:rest]
	return batch
}

// batchAnswer is the FSM's response to an entryBatch entry: one streamcore.Result or
// error per command, in order.
type batchAnswer []any

// answer converts one FSM response to Propose's outcome.
func answer(r any) (streamcore.Result, error) {
	switch r := r.(type) {
	case streamcore.Result:
		return r, nil
	case error:
		return streamcore.Result{}, r
	}
	return streamcore.Result{}, errors.New("raftengine: unexpected apply response")
}

// encodeBatch is an entryBatch entry: the kind byte, the command count (uvarint), then
// each command as its length (uvarint) and its AppendCommand bytes (without the
// entryCommand prefix the lone form carries).
func encodeBatch(batch []*proposal) []byte {
	n := 1 + binary.MaxVarintLen64
	for _, p := range batch {
		n += binary.MaxVarintLen64 + len(p.data) - 1
	}
	b := make([]byte, 0, n)
	b = append(b, entryBatch)
	b = binary.AppendUvarint(b, uint64(len(batch)))
	for _, p := range batch {
		b = binary.AppendUvarint(b, uint64(len(p.data)-1))
		b = append(b, p.data[1:]...)
	}
	return b
}

// decodeBatch splits an entryBatch payload (after the kind byte) into its encoded
// commands. It refuses a count or a length that overruns the entry.
func decodeBatch(b []byte) ([][]byte, error) {
	count, n := binary.Uvarint(b)
	if n <= 0 || count > uint64(len(b)) {
		return nil, fmt.Errorf("%w: batch count", streamcore.ErrCodec)
	}
	b = b[n:]
	out := make([][]byte, 0, count)
	for range count {
		l, n := binary.Uvarint(b)
		if n <= 0 || l > uint64(len(b)-n) {
			return nil, fmt.Errorf("%w: batch command length", streamcore.ErrCodec)
		}
		out = append(out, b[n:n+int(l)])
		b = b[n+int(l):]
	}
	if len(b) != 0 {
		return nil, fmt.Errorf("%w: %d bytes after the batch", streamcore.ErrCodec, len(b))
	}
	return out, nil
}
