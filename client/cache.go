package client

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"unsafe"

	"github.com/kvmesh/kvmesh/block"
	"github.com/kvmesh/kvmesh/prefixhash"
	kvmeshv1 "github.com/kvmesh/kvmesh/proto/kvmesh/v1"
)

// CachedBlock is one block of a cached prefix and where it lives.
type CachedBlock struct {
	Key    prefixhash.Key
	NodeID string
	Tier   string // "hbm", "dram" or "nvme"; empty when another node holds it
}

// Run is a run of consecutive cached blocks that one node holds.
type Run struct {
	Start, Blocks int // the blocks [Start, Start+Blocks) of the prompt
	NodeID        string
	// Tier is "hbm", "dram" or "nvme" when NodeID is the node asked; empty
	// when another node holds the run.
	Tier string
}

// Lookup is the answer to "how much of this prompt is cached".
type Lookup struct {
	PromptTokens, PromptBlocks int // the prompt, and its full blocks
	CachedTokens, CachedBlocks int // the longest cached prefix
	// Keys are the keys of the prompt's full blocks in order (PromptBlocks
	// of them; from LookupTokens, only the CachedBlocks the node listed):
	// Keys[:CachedBlocks] is the cached prefix, ready for GetKeys. The
	// slice is the caller's.
	Keys []prefixhash.Key
	// Runs say where the cached blocks are, in prompt order: the first
	// starts at block 0 and their Blocks add up to CachedBlocks.
	Runs []Run
}

// Blocks lists the cached prefix block by block (CachedBlocks of them).
func (l Lookup) Blocks() []CachedBlock {
	out := make([]CachedBlock, 0, l.CachedBlocks)
	for _, r := range l.Runs {
		for i := r.Start; i < r.Start+r.Blocks; i++ {
			out = append(out, CachedBlock{Key: l.Keys[i], NodeID: r.NodeID, Tier: r.Tier})
		}
	}
	return out
}

// Lookup returns the longest cached prefix of tokens under ns. The client
// hashes the prompt and sends its chain (16 bytes a block), and the node
// answers with counts and runs; neither side encodes a token or lists a
// block. That is what an inference worker asks before every prefill.
func (c *Client) Lookup(ctx context.Context, ns prefixhash.Namespace, tokens []uint32) (Lookup, error) {
	return c.LookupExtra(ctx, ns, tokens, nil)
}

// LookupExtra is Lookup for a prompt whose blocks carry extra keys
// (prefixhash.ExtraKeys, such as a multimodal input's hash and offset):
// extra[i] are block i's, extra may be shorter than the prompt's blocks.
// Equal tokens with other extra keys are other blocks.
func (c *Client) LookupExtra(ctx context.Context, ns prefixhash.Namespace, tokens []uint32, extra []prefixhash.ExtraKeys) (Lookup, error) {
	ns, err := c.Namespace(ctx, ns)
	if err != nil {
		return Lookup{}, err
	}
	keys, err := prefixhash.KeysExtra(ns, tokens, extra)
	if err != nil {
		return Lookup{}, fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	req := &kvmeshv1.LookupRequest{Namespace: NamespaceProto(ns), Chain: chainBytes(keys), PromptTokens: uint64(len(tokens)), Summary: true}
	resp, err := c.lookup(ctx, req)
	if err != nil {
		return Lookup{}, err
	}
	if len(keys) > 0 && resp.GetPromptBlocks() == 0 {
		// A node older than LookupRequest.chain saw an empty prompt: ask
		// it with the tokens.
		req = &kvmeshv1.LookupRequest{Namespace: req.GetNamespace(), Tokens: tokens, ExtraKeys: extraKeysProto(extra)}
		if resp, err = c.lookup(ctx, req); err != nil {
			return Lookup{}, err
		}
	}
	return lookupAnswer(resp, keys)
}

// LookupTokens is Lookup the way the node's API first had it, and the way
// clients that cannot hash ask: it sends the tokens, the node hashes them
// and lists every cached block. It answers as Lookup does, at several times
// the cost for long prompts; it is kept for comparison (kvmesh bench
// lookup) and to check a node's hashing against the client's.
func (c *Client) LookupTokens(ctx context.Context, ns prefixhash.Namespace, tokens []uint32) (Lookup, error) {
	ns, err := c.Namespace(ctx, ns)
	if err != nil {
		return Lookup{}, err
	}
	resp, err := c.lookup(ctx, &kvmeshv1.LookupRequest{Namespace: NamespaceProto(ns), Tokens: tokens})
	if err != nil {
		return Lookup{}, err
	}
	return lookupAnswer(resp, nil)
}

// extraKeysProto is the wire form of per-block extra keys: the blocks
// that have any.
func extraKeysProto(extra []prefixhash.ExtraKeys) []*kvmeshv1.BlockExtraKeys {
	var out []*kvmeshv1.BlockExtraKeys
	for i, e := range extra {
		if len(e) > 0 {
			out = append(out, &kvmeshv1.BlockExtraKeys{Block: uint32(i), Keys: e})
		}
	}
	return out
}

func (c *Client) lookup(ctx context.Context, req *kvmeshv1.LookupRequest) (*kvmeshv1.LookupResponse, error) {
	var resp *kvmeshv1.LookupResponse
	err := c.retry(ctx, func(ctx context.Context) (err error) {
		resp, err = c.cache.Lookup(ctx, req)
		return err
	})
	if err != nil {
		return nil, callError("lookup", err)
	}
	return resp, nil
}

// chainBytes views keys as LookupRequest.chain wants them, 16 bytes each,
// concatenated (a Key is a [16]byte, so the slice already is), without a
// copy. The bytes alias keys; the request only reads them.
func chainBytes(keys []prefixhash.Key) []byte {
	if len(keys) == 0 {
		return nil
	}
	return unsafe.Slice(&keys[0][0], len(keys)*prefixhash.KeySize)
}

// errAnswer is wrapped by errors about a node's answer that does not add up.
var errAnswer = errors.New("client: lookup: the node's answer is inconsistent")

// lookupAnswer converts a node's answer. keys are the prompt's keys the
// client computed, nil when it sent tokens: the answer's blocks give the
// cached prefix's keys then. An answer without runs (a node older than
// them) has its runs folded from its blocks.
func lookupAnswer(resp *kvmeshv1.LookupResponse, keys []prefixhash.Key) (Lookup, error) {
	l := Lookup{
		PromptTokens: int(resp.GetPromptTokens()), PromptBlocks: int(resp.GetPromptBlocks()),
		CachedTokens: int(resp.GetCachedTokens()), CachedBlocks: int(resp.GetCachedBlocks()),
		Keys: keys,
	}
	blocks, nodes := resp.GetBlocks(), resp.GetNodes()
	switch {
	case l.CachedBlocks > l.PromptBlocks:
		return Lookup{}, fmt.Errorf("%w: %d of %d blocks cached", errAnswer, l.CachedBlocks, l.PromptBlocks)
	case keys != nil && l.PromptBlocks != len(keys):
		return Lookup{}, fmt.Errorf("%w: %d prompt blocks, the chain has %d", errAnswer, l.PromptBlocks, len(keys))
	case keys == nil && len(blocks) != l.CachedBlocks:
		return Lookup{}, fmt.Errorf("%w: %d cached blocks, %d listed", errAnswer, l.CachedBlocks, len(blocks))
	}
	if keys == nil {
		l.Keys = make([]prefixhash.Key, len(blocks))
		for i, b := range blocks {
			if len(b.GetKey()) != prefixhash.KeySize {
				return Lookup{}, fmt.Errorf("%w: block %d has a key of %d bytes", errAnswer, i, len(b.GetKey()))
			}
			copy(l.Keys[i][:], b.GetKey())
		}
	}
	if len(resp.GetRuns()) == 0 && len(blocks) > 0 {
		for i, b := range blocks {
			if n := len(l.Runs); n > 0 && l.Runs[n-1].NodeID == b.GetNodeId() && l.Runs[n-1].Tier == b.GetTier() {
				l.Runs[n-1].Blocks++
				continue
			}
			l.Runs = append(l.Runs, Run{Start: i, Blocks: 1, NodeID: b.GetNodeId(), Tier: b.GetTier()})
		}
		return l, nil
	}
	l.Runs = make([]Run, 0, len(resp.GetRuns()))
	start := 0
	for i, r := range resp.GetRuns() {
		if r.GetNode() >= uint32(len(nodes)) || r.GetBlocks() == 0 {
			return Lookup{}, fmt.Errorf("%w: run %d names node %d of %d, %d blocks", errAnswer, i, r.GetNode(), len(nodes), r.GetBlocks())
		}
		l.Runs = append(l.Runs, Run{Start: start, Blocks: int(r.GetBlocks()), NodeID: nodes[r.GetNode()], Tier: r.GetTier()})
		start += int(r.GetBlocks())
		if start > l.CachedBlocks {
			break
		}
	}
	if start != l.CachedBlocks {
		return Lookup{}, fmt.Errorf("%w: runs of %d blocks, %d cached", errAnswer, start, l.CachedBlocks)
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
	// Extra are the extra keys the block's key covers, as the namespace
	// makes them (prefixhash.Namespace.BlockExtra).
	Extra prefixhash.ExtraKeys
	// Payload is the block's K/V, [layer][kv_head][K|V][token][head_dim]
	// ([layer][token][latent_dim] for a latent namespace), followed by its
	// float32 scales when the namespace has them (prefixhash.Scales). From
	// GetRank, it is the rank's part of the block (block.Part).
	Payload []byte
}

// Get returns the blocks of the longest cached prefix of tokens under ns,
// in prompt order (none when the first block is not cached). The blocks'
// payloads are the caller's. Every block's tokens and parent are compared
// with the prompt's: a block that differs ends the prefix, as a miss, and
// is counted in RefusedBlocks.
func (c *Client) Get(ctx context.Context, ns prefixhash.Namespace, tokens []uint32) ([]Block, error) {
	return c.GetExtra(ctx, ns, tokens, nil)
}

// GetExtra is Get for a prompt whose blocks carry extra keys, as
// LookupExtra.
func (c *Client) GetExtra(ctx context.Context, ns prefixhash.Namespace, tokens []uint32, extra []prefixhash.ExtraKeys) ([]Block, error) {
	var out []Block
	err := c.getPrefix(ctx, ns, block.Part{}, tokens, extra, -1, true, func(b Block) { out = append(out, b) })
	if err != nil {
		return nil, err
	}
	return out, nil
}

// GetInto reads the longest cached prefix of tokens under ns, as Get does,
// into buffers the caller owns: block i's payload into dst[i], which must be
// ns.BlockBytes() long. It reads at most len(dst) blocks and returns how
// many leading buffers it filled. The client writes into dst only during the
// call and keeps no reference to it; buffers past the returned count hold
// unspecified bytes. Blocks are copied into dst from the transport's own
// buffer (or the node's shared memory), so a worker that reads every prompt
// into the same buffers allocates nothing per block.
func (c *Client) GetInto(ctx context.Context, ns prefixhash.Namespace, tokens []uint32, dst [][]byte) (int, error) {
	return c.getInto(ctx, ns, block.Part{}, tokens, dst)
}

// getInto is GetInto of part of each block (the whole block when part is
// zero).
func (c *Client) getInto(ctx context.Context, ns prefixhash.Namespace, part block.Part, tokens []uint32, dst [][]byte) (int, error) {
	for i, d := range dst {
		if err := checkPayloadLen(ns, part, "dst", i, d); err != nil {
			return 0, err
		}
	}
	n := 0
	err := c.getPrefix(ctx, ns, part, tokens, nil, len(dst), false, func(b Block) {
		copy(dst[b.Index], b.Payload)
		n++
	})
	return n, err
}

// getPrefix reads the cached prefix of tokens (with their blocks' extra
// keys, none when nil) under ns, at most limit blocks (no limit when
// negative), and hands each block to fn in prompt order: part of it when
// part is not zero. With fresh, b.Payload is fn's to keep; otherwise it is
// valid during the call only.
func (c *Client) getPrefix(ctx context.Context, ns prefixhash.Namespace, part block.Part, tokens []uint32, extra []prefixhash.ExtraKeys, limit int, fresh bool, fn func(Block)) error {
	ns, err := c.Namespace(ctx, ns)
	if err != nil {
		return err
	}
	keys, err := prefixhash.KeysExtra(ns, tokens, extra)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	if limit >= 0 && len(keys) > limit {
		keys = keys[:limit]
	}
	root := ns.Root()
	next := 0
	err = c.getKeys(ctx, ns, part, keys, c.chunkKeys(ctx, ns, keys), true, fresh, func(b Block) error {
		if !b.Found {
			return nil
		}
		parent := root
		if b.Index > 0 {
			parent = keys[b.Index-1]
		}
		if b.Index != next || b.Parent != parent || !slices.Equal(b.Tokens, tokens[b.Index*ns.BlockTokens:(b.Index+1)*ns.BlockTokens]) {
			c.refused.Add(1)
			return errPrefixEnds
		}
		fn(b)
		next++
		return nil
	})
	if err != nil && !errors.Is(err, errPrefixEnds) {
		return callError("get", err)
	}
	return nil
}

// errPrefixEnds stops a Get at a refused block: what follows is not the
// prompt's prefix.
var errPrefixEnds = errors.New("client: the cached prefix ends")

// RefusedBlocks returns how many blocks Get received but refused because
// they did not hold the tokens (or parent) of the prompt asked for.
func (c *Client) RefusedBlocks() int64 { return c.refused.Load() }

// GetKeys reads blocks by key and calls fn for each, in key order, misses
// included (Found false). b.Payload and b.Tokens are valid only during the
// call: the buffer is reused for the next block. An error from fn ends the
// stream and is returned.
func (c *Client) GetKeys(ctx context.Context, ns prefixhash.Namespace, keys []prefixhash.Key, fn func(b Block) error) error {
	if err := checkNamespace(ns); err != nil {
		return err
	}
	if err := c.getKeys(ctx, ns, block.Part{}, keys, nil, false, false, fn); err != nil {
		return callError("get", err)
	}
	return nil
}

// getKeys splits keys into batches, each read with retries that resume after
// the last block delivered. chunkKeys, when not nil, place keys. part, when
// not zero, is the part of each block read.
func (c *Client) getKeys(ctx context.Context, ns prefixhash.Namespace, part block.Part, keys, chunkKeys []prefixhash.Key, prefix, fresh bool, fn func(Block) error) error {
	ctx, cancel := c.withTimeout(ctx)
	defer cancel()
	next := 0 // keys[:next] are delivered
	stop := false
	for next < len(keys) && !stop {
		before := next
		err := c.retryIn(ctx, func(ctx context.Context) error {
			end := min(len(keys), next+c.opts.MaxBatchBlocks)
			batch := keys[next:end]
			var cks []prefixhash.Key
			if chunkKeys != nil {
				cks = chunkKeys[next:end]
			}
			base := next
			return c.bulk.get(ctx, ns, part, batch, cks, prefix, fresh, func(b Block) error {
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
// payload of block i (tokens[i*B:(i+1)*B]), its KV bytes then its scales
// if the namespace has them, and must be ns.BlockBytes() long; a nil payload skips its block (it is cached already). len(payloads)
// is at most the number of full blocks. Put returns the keys of the blocks
// it stored. payloads are not retained after Put returns.
//
// Put is idempotent and retried on Unavailable; a failed Put may have
// stored some of the blocks.
func (c *Client) Put(ctx context.Context, ns prefixhash.Namespace, tokens []uint32, payloads [][]byte) ([]prefixhash.Key, error) {
	return c.PutExtra(ctx, ns, tokens, nil, payloads)
}

// PutExtra is Put for a prompt whose blocks carry extra keys, as
// LookupExtra: each block's key covers its extra keys, and the node
// stores them in its header.
func (c *Client) PutExtra(ctx context.Context, ns prefixhash.Namespace, tokens []uint32, extra []prefixhash.ExtraKeys, payloads [][]byte) ([]prefixhash.Key, error) {
	ns, err := c.Namespace(ctx, ns)
	if err != nil {
		return nil, err
	}
	items, err := c.putItems(ctx, ns, block.Part{}, tokens, extra, payloads)
	if err != nil {
		return nil, err
	}
	return c.putBatches(ctx, ns, items)
}

// checkPayloadLen refuses buf, the i-th of what (payloads, dst), unless it
// is the length of part of a block of ns (the whole block when part is
// zero).
func checkPayloadLen(ns prefixhash.Namespace, part block.Part, what string, i int, buf []byte) error {
	if part == (block.Part{}) {
		if len(buf) != ns.BlockBytes() {
			return fmt.Errorf("%w: %s[%d] is %d bytes; blocks of %s hold %d", ErrInvalid, what, i, len(buf), ns, ns.BlockBytes())
		}
		return nil
	}
	if want := block.LayoutOf(ns).PartLen(ns.BlockTokens, part); len(buf) != want {
		return fmt.Errorf("%w: %s[%d] is %d bytes; %s of a block of %s holds %d", ErrInvalid, what, i, len(buf), part, ns, want)
	}
	return nil
}

// putItems checks payloads, part of each block of tokens (the whole block
// when part is zero; nil skips a block), and returns them as items to put,
// under ns as the node keys it for this client (Namespace).
func (c *Client) putItems(ctx context.Context, ns prefixhash.Namespace, part block.Part, tokens []uint32, extra []prefixhash.ExtraKeys, payloads [][]byte) ([]putItem, error) {
	links, err := prefixhash.LinksExtra(ns, tokens, extra)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	keys := make([]prefixhash.Key, len(links))
	for i, l := range links {
		keys[i] = l.Key()
	}
	if len(payloads) > len(keys) {
		return nil, fmt.Errorf("%w: %d payloads for %d full blocks of tokens", ErrInvalid, len(payloads), len(keys))
	}
	for i, p := range payloads {
		if p != nil {
			if err := checkPayloadLen(ns, part, "payload", i, p); err != nil {
				return nil, err
			}
		}
	}
	chunks := c.chunkKeys(ctx, ns, keys[:len(payloads)])
	var items []putItem
	parent := ns.RootLink()
	for i, p := range payloads {
		if p != nil {
			it := putItem{part: part, parent: parent, key: keys[i], tokens: tokens[i*ns.BlockTokens : (i+1)*ns.BlockTokens], payload: p}
			if i < len(extra) {
				it.extra = extra[i]
			}
			if chunks != nil {
				it.chunk = chunks[i]
			}
			items = append(items, it)
		}
		parent = links[i]
	}
	return items, nil
}

// putBatches stores items, MaxBatchBlocks at a time, and returns the keys
// stored.
func (c *Client) putBatches(ctx context.Context, ns prefixhash.Namespace, items []putItem) ([]prefixhash.Key, error) {
	var stored []prefixhash.Key
	for len(items) > 0 {
		batch := items[:min(len(items), c.opts.MaxBatchBlocks)]
		var got []prefixhash.Key
		err := c.retry(ctx, func(ctx context.Context) (err error) {
			got, err = c.bulk.put(ctx, ns, batch)
			return err
		})
		if err != nil {
			return stored, callError("put", err)
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
		return nil, callError("exists", err)
	}
	if len(resp.GetPresent()) != len(keys) {
		return nil, fmt.Errorf("client: exists: %d answers for %d keys", len(resp.GetPresent()), len(keys))
	}
	return resp.GetPresent(), nil
}
