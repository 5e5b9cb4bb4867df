package node

import (
	"context"
	"sync"
	"time"

	kvmeshv1 "github.com/kvmesh/kvmesh/proto/kvmesh/v1"
)

// budget bounds the bytes of request buffers the gRPC API holds at once,
// node-wide (Options.Limits.MaxInFlightBytes): BatchPut streams' block buffers. A
// stream is charged a block when the block's first payload bytes arrive, and
// gives it back when the block is stored, so a stream that sent only headers,
// or is between blocks, holds nothing.
type budget struct {
	size int64
	mu   struct {
		sync.Mutex
		used  int64
		freed chan struct{} // closed (and replaced) by every release
	}
}

// budgetWait is how long a request waits for room in the budget (within its
// deadline) before it is refused with ResourceExhausted.
const budgetWait = time.Second

func newBudget(size int64) *budget {
	b := &budget{size: size}
	b.mu.freed = make(chan struct{})
	return b
}

// acquire takes n bytes (at most size), waiting for room up to budgetWait
// or ctx, whichever ends first; it answers ResourceExhausted when there is
// none by then, naming what for.
func (b *budget) acquire(ctx context.Context, n int64, what string) error {
	t := time.NewTimer(budgetWait)
	defer t.Stop()
	for {
		b.mu.Lock()
		if b.mu.used+n <= b.size {
			b.mu.used += n
			b.mu.Unlock()
			return nil
		}
		used, freed := b.mu.used, b.mu.freed
		b.mu.Unlock()
		select {
		case <-freed:
			continue
		case <-ctx.Done():
		case <-t.C:
		}
		return exhausted(kvmeshv1.ErrorReason_ERROR_REASON_NODE_BUSY, limitMeta(int(b.size)), "node:max_inflight_bytes",
			"%s needs %d bytes and the node has %d of its max_inflight_bytes=%d in use by other requests; retry later",
			what, n, used, b.size)
	}
}

// release gives back n bytes taken by acquire.
func (b *budget) release(n int64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.mu.used -= n
	if b.mu.used < 0 {
		panic("node: request budget released more than acquired")
	}
	close(b.mu.freed)
	b.mu.freed = make(chan struct{})
}

func (b *budget) inUse() int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.mu.used
}

// blockBufs pools BatchPut's block buffers (*[]byte), so that a stream
// does not allocate, and clear, a block's bytes for each block.
var blockBufs sync.Pool

func getBlockBuf(n int) []byte {
	if p, ok := blockBufs.Get().(*[]byte); ok && cap(*p) >= n {
		return (*p)[:n]
	}
	return make([]byte, n)
}

func putBlockBuf(b []byte) { blockBufs.Put(&b) }
