package node

import (
	"context"
	"sync"
	"time"

	kvmeshv1 "github.com/kvmesh/kvmesh/proto/kvmesh/v1"
)

// budget bounds the bytes of request buffers the gRPC API holds at once,
// node-wide (Options.Limits.MaxInFlightBytes): BatchPut streams' block
// buffers. A stream is charged a block when the block's first payload bytes
// arrive, and gives it back when the block is stored, so a stream that sent
// only headers, or is between blocks, holds nothing. One tenant's streams
// hold at most a share of it (a quarter), so a tenant whose streams stall
// (each held until Options.Limits.ReceiveTimeout) cannot keep other writers
// out; node-wide callers (a shared token, the cluster) may take all of it.
type budget struct {
	size  int64
	share int64 // the most one tenant holds
	mu    struct {
		sync.Mutex
		used    int64
		tenants map[string]int64 // what each tenant holds
		freed   chan struct{}    // closed (and replaced) by every release
	}
}

// budgetWait is how long a request waits for room in the budget (within its
// deadline) before it is refused with ResourceExhausted.
const budgetWait = time.Second

func newBudget(size int64) *budget {
	b := &budget{size: size, share: size / 4}
	b.mu.freed = make(chan struct{})
	b.mu.tenants = make(map[string]int64)
	return b
}

// acquire takes n bytes (at most size) for tenant ("" for a node-wide
// caller), waiting for room up to budgetWait or ctx, whichever ends first;
// it answers ResourceExhausted when there is none by then, naming what for.
// A tenant's request is held to the tenant's share, except that one
// request always fits when the tenant holds nothing (a block may be larger
// than the share).
func (b *budget) acquire(ctx context.Context, tenant string, n int64, what string) error {
	t := time.NewTimer(budgetWait)
	defer t.Stop()
	for {
		b.mu.Lock()
		held := b.mu.tenants[tenant]
		fits := b.mu.used+n <= b.size && (tenant == "" || held == 0 || held+n <= b.share)
		if fits {
			b.mu.used += n
			if tenant != "" {
				b.mu.tenants[tenant] = held + n
			}
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
		if tenant != "" && held+n > b.share {
			return exhausted(kvmeshv1.ErrorReason_ERROR_REASON_NODE_BUSY, limitMeta(int(b.size)), "node:max_inflight_bytes",
				"%s needs %d bytes and tenant %s holds %d, its share (a quarter) of the node's max_inflight_bytes=%d, in other requests; retry later",
				what, n, tenant, held, b.size)
		}
		return exhausted(kvmeshv1.ErrorReason_ERROR_REASON_NODE_BUSY, limitMeta(int(b.size)), "node:max_inflight_bytes",
			"%s needs %d bytes and the node has %d of its max_inflight_bytes=%d in use by other requests; retry later",
			what, n, used, b.size)
	}
}

// release gives back n bytes that acquire took for tenant.
func (b *budget) release(tenant string, n int64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.mu.used -= n
	if tenant != "" {
		if b.mu.tenants[tenant] -= n; b.mu.tenants[tenant] == 0 {
			delete(b.mu.tenants, tenant)
		} else if b.mu.tenants[tenant] < 0 {
			panic("node: request budget released more than a tenant acquired")
		}
	}
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
