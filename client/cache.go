package client

import (
	"context"
	"fmt"

	"github.com/kvmesh/kvmesh/prefixhash"
	kvmeshv1 "github.com/kvmesh/kvmesh/proto/kvmesh/v1"
)

// CachedBlock is one block of a cached prefix and where it lives.
type CachedBlock struct {
	Key    prefixhash.Key
	NodeID string
	Tier   string // "hbm", "dram" or "nvme"
}

// Lookup is the answer to "how much of this prompt is cached".
type Lookup struct {
	PromptTokens, PromptBlocks int // the prompt, and its full blocks
	CachedTokens, CachedBlocks int // the longest cached prefix
	Blocks                     []CachedBlock
}

// Lookup returns the longest cached prefix of tokens under ns.
func (c *Client) Lookup(ctx context.Context, ns prefixhash.Namespace, tokens []uint32) (Lookup, error) {
	if err := checkNamespace(ns); err != nil {
		return Lookup{}, err
	}
	req := &kvmeshv1.LookupRequest{Namespace: NamespaceProto(ns), Tokens: tokens}
	var resp *kvmeshv1.LookupResponse
	err := c.retry(ctx, func(ctx context.Context) (err error) {
		resp, err = c.cache.Lookup(ctx, req)
		return err
	})
	if err != nil {
		return Lookup{}, fmt.Errorf("client: lookup: %w", err)
	}
	l := Lookup{
		PromptTokens: int(resp.GetPromptTokens()), PromptBlocks: int(resp.GetPromptBlocks()),
		CachedTokens: int(resp.GetCachedTokens()), CachedBlocks: int(resp.GetCachedBlocks()),
		Blocks: make([]CachedBlock, 0, len(resp.GetBlocks())),
	}
	for _, b := range resp.GetBlocks() {
		var k prefixhash.Key
		copy(k[:], b.GetKey())
		l.Blocks = append(l.Blocks, CachedBlock{Key: k, NodeID: b.GetNodeId(), Tier: b.GetTier()})
	}
	return l, nil
}

// Block is a block read from the cache.
type Block struct {
	// Index is the block's position in the request: the block index in the
	// prompt for Get, the position in keys for GetKeys.
	Index int
	Key   prefixhash.Key
	// Found is false for a miss; the other fields are then empty.
	Found  bool
	Parent prefixhash.Key
	Tokens []uint32
	// Payload is the block's K/V, [layer][K|V][token][kv_head][head_dim].
	Payload []byte
}

// Get returns the blocks of the longest cached prefix of tokens under ns,
// in prompt order (none when the first block is not cached). The blocks'
// payloads are the caller's.
func (c *Client) Get(ctx context.Context, ns prefixhash.Namespace, tokens []uint32) ([]Block, error) {
	if err := checkNamespace(ns); err != nil {
		return nil, err
	}
	keys := prefixhash.Keys(ns, tokens)
	var out []Block
	err := c.getKeys(ctx, ns, keys, c.chunkKeys(ctx, ns, keys), true, true, func(b Block) error {
		if b.Found {
			out = append(out, b)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("client: get: %w", err)
	}
	return out, nil
}

// GetKeys reads blocks by key and calls fn for each, in key order, misses
// included (Found false). b.Payload and b.Tokens are valid only during the
// call: the buffer is reused for the next block. An error from fn ends the
// stream and is returned.
func (c *Client) GetKeys(ctx context.Context, ns prefixhash.Namespace, keys []prefixhash.Key, fn func(b Block) error) error {
	if err := checkNamespace(ns); err != nil {
		return err
	}
	if err := c.getKeys(ctx, ns, keys, nil, false, false, fn); err != nil {
		return fmt.Errorf("client: get: %w", err)
	}
	return nil
}

// getKeys splits keys into batches, each read with retries that resume after
// the last block delivered. chunkKeys, when not nil, place keys.
func (c *Client) getKeys(ctx context.Context, ns prefixhash.Namespace, keys, chunkKeys []prefixhash.Key, prefix, fresh bool, fn func(Block) error) error {
	ctx, cancel := c.withTimeout(ctx)
	defer cancel()
	next := 0 // keys[:next] are delivered
	stop := false
	for next < len(keys) && !stop {
		before := next
		err := c.retry(ctx, func(ctx context.Context) error {
			end := min(len(keys), next+c.opts.MaxBatchBlocks)
			batch := keys[next:end]
			var cks []prefixhash.Key
			if chunkKeys != nil {
				cks = chunkKeys[next:end]
			}
			base := next
			return c.bulk.get(ctx, ns, batch, cks, prefix, fresh, func(b Block) error {
				b.Index += base
				if err := fn(b); err != nil {
					return &callbackError{err}
				}
				next = b.Index + 1
				if !b.Found && prefix {
					stop = true
				}
				return nil
			})
		})
		if cb, ok := err.(*callbackError); ok {
			return cb.err
		}
		if err != nil {
			return err
		}
		if !stop && next < min(len(keys), before+c.opts.MaxBatchBlocks) {
			panic(fmt.Sprintf("client: bulk get answered %d of %d blocks without an error", next-before, len(keys)-before))
		}
	}
	return nil
}

// callbackError carries the caller's own error through the retry loop,
// which never retries it.
type callbackError struct{ err error }

func (e *callbackError) Error() string { return e.err.Error() }

// Put publishes blocks of the prompt tokens under ns: payloads[i] is the
// payload of block i (tokens[i*B:(i+1)*B]) and must be ns.BlockBytes()
// long; a nil payload skips its block (it is cached already). len(payloads)
// is at most the number of full blocks. Put returns the keys of the blocks
// it stored. payloads are not retained after Put returns.
//
// Put is idempotent and retried on Unavailable; a failed Put may have
// stored some of the blocks.
func (c *Client) Put(ctx context.Context, ns prefixhash.Namespace, tokens []uint32, payloads [][]byte) ([]prefixhash.Key, error) {
	if err := checkNamespace(ns); err != nil {
		return nil, err
	}
	keys := prefixhash.Keys(ns, tokens)
	if len(payloads) > len(keys) {
		return nil, fmt.Errorf("%w: %d payloads for %d full blocks of tokens", ErrInvalid, len(payloads), len(keys))
	}
	for i, p := range payloads {
		if p != nil && len(p) != ns.BlockBytes() {
			return nil, fmt.Errorf("%w: payload %d is %d bytes; blocks of %s hold %d", ErrInvalid, i, len(p), ns, ns.BlockBytes())
		}
	}
	chunks := c.chunkKeys(ctx, ns, keys[:len(payloads)])
	var items []putItem
	parent := ns.Root()
	for i, p := range payloads {
		if p != nil {
			it := putItem{parent: parent, tokens: tokens[i*ns.BlockTokens : (i+1)*ns.BlockTokens], payload: p}
			if chunks != nil {
				it.chunk = chunks[i]
			}
			items = append(items, it)
		}
		parent = keys[i]
	}
	var stored []prefixhash.Key
	for len(items) > 0 {
		batch := items[:min(len(items), c.opts.MaxBatchBlocks)]
		var got []prefixhash.Key
		err := c.retry(ctx, func(ctx context.Context) (err error) {
			got, err = c.bulk.put(ctx, ns, batch)
			return err
		})
		if err != nil {
			return stored, fmt.Errorf("client: put: %w", err)
		}
		stored = append(stored, got...)
		items = items[len(batch):]
	}
	return stored, nil
}

// Exists reports which keys the node holds.
func (c *Client) Exists(ctx context.Context, keys []prefixhash.Key) ([]bool, error) {
	req := &kvmeshv1.ExistsRequest{Keys: make([][]byte, len(keys))}
	for i := range keys {
		req.Keys[i] = keys[i][:]
	}
	var resp *kvmeshv1.ExistsResponse
	err := c.retry(ctx, func(ctx context.Context) (err error) {
		resp, err = c.cache.Exists(ctx, req)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("client: exists: %w", err)
	}
	if len(resp.GetPresent()) != len(keys) {
		return nil, fmt.Errorf("client: exists: %d answers for %d keys", len(resp.GetPresent()), len(keys))
	}
	return resp.GetPresent(), nil
}

// Stats returns the node's cache counters.
func (c *Client) Stats(ctx context.Context) (*kvmeshv1.StatsResponse, error) {
	var resp *kvmeshv1.StatsResponse
	err := c.retry(ctx, func(ctx context.Context) (err error) {
		resp, err = c.cache.Stats(ctx, &kvmeshv1.StatsRequest{})
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("client: stats: %w", err)
	}
	return resp, nil
}

// Members lists the nodes the node knows, itself first.
func (c *Client) Members(ctx context.Context) (*kvmeshv1.MembersResponse, error) {
	var resp *kvmeshv1.MembersResponse
	err := c.retry(ctx, func(ctx context.Context) (err error) {
		resp, err = c.admin.Members(ctx, &kvmeshv1.MembersRequest{})
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("client: members: %w", err)
	}
	return resp, nil
}

// BlockInfo describes one cached block (NotFound when it is not cached).
func (c *Client) BlockInfo(ctx context.Context, key prefixhash.Key) (*kvmeshv1.BlockInfoResponse, error) {
	var resp *kvmeshv1.BlockInfoResponse
	err := c.retry(ctx, func(ctx context.Context) (err error) {
		resp, err = c.admin.BlockInfo(ctx, &kvmeshv1.BlockInfoRequest{Key: key[:]})
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("client: block info: %w", err)
	}
	return resp, nil
}

// DropNamespace removes every block of ns from the node and returns how
// many it removed. It is not retried.
func (c *Client) DropNamespace(ctx context.Context, ns prefixhash.Namespace) (int, error) {
	if err := checkNamespace(ns); err != nil {
		return 0, err
	}
	var resp *kvmeshv1.DropNamespaceResponse
	err := c.once(ctx, func(ctx context.Context) (err error) {
		resp, err = c.admin.DropNamespace(ctx, &kvmeshv1.DropNamespaceRequest{Namespace: NamespaceProto(ns)})
		return err
	})
	if err != nil {
		return 0, fmt.Errorf("client: drop namespace: %w", err)
	}
	return int(resp.GetDroppedBlocks()), nil
}

// Quota bounds the encoded block bytes one namespace may hold in each tier
// of one node; 0 is unlimited.
type Quota struct {
	DRAMBytes, NVMeBytes int64
}

// SetQuota sets ns's own quota on the node (in place of the node's default;
// kept across its restarts) and returns the namespace's usage and quota
// after the change. Quotas are per node. It is retried: setting a quota
// twice is harmless.
func (c *Client) SetQuota(ctx context.Context, ns prefixhash.Namespace, q Quota) (*kvmeshv1.NamespaceQuota, error) {
	return c.setQuota(ctx, ns, &kvmeshv1.Quota{DramBytes: uint64(max(q.DRAMBytes, 0)), NvmeBytes: uint64(max(q.NVMeBytes, 0))})
}

// ClearQuota removes ns's own quota on the node: its default applies again.
func (c *Client) ClearQuota(ctx context.Context, ns prefixhash.Namespace) (*kvmeshv1.NamespaceQuota, error) {
	return c.setQuota(ctx, ns, nil)
}

func (c *Client) setQuota(ctx context.Context, ns prefixhash.Namespace, q *kvmeshv1.Quota) (*kvmeshv1.NamespaceQuota, error) {
	if err := checkNamespace(ns); err != nil {
		return nil, err
	}
	req := &kvmeshv1.SetQuotaRequest{Namespace: NamespaceProto(ns), Quota: q, Clear: q == nil}
	var resp *kvmeshv1.SetQuotaResponse
	err := c.retry(ctx, func(ctx context.Context) (err error) {
		resp, err = c.admin.SetQuota(ctx, req)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("client: set quota: %w", err)
	}
	return resp.GetNamespace(), nil
}

// Quotas returns the node's default quota and every namespace's usage and
// quota there.
func (c *Client) Quotas(ctx context.Context) (*kvmeshv1.QuotasResponse, error) {
	var resp *kvmeshv1.QuotasResponse
	err := c.retry(ctx, func(ctx context.Context) (err error) {
		resp, err = c.admin.Quotas(ctx, &kvmeshv1.QuotasRequest{})
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("client: quotas: %w", err)
	}
	return resp, nil
}
