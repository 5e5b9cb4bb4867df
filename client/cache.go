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
	// of them; with SendTokens, only the CachedBlocks the node listed):
	// Keys[:CachedBlocks] is the cached prefix, ready for Prompt.Keys. The
	// slice is the caller's.
	Keys []prefixhash.Key
	// Runs say where the cached blocks are, in prompt order: the first
	// starts at block 0 and their Blocks add up to CachedBlocks.
	Runs []Run
	// Groups, in a namespace with groups, say per group what it allows on
	// its own (CachedBlocks is the hit rule's answer over them all), so a
	// prefix shorter than the full-attention blocks says why. Nil
	// otherwise.
	Groups []GroupLookup
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

// Lookup returns the longest cached prefix of the prompt p under ns: how
// many of its blocks and tokens are cached, and where. The client hashes
// the prompt and sends its chain (16 bytes a block), and the node answers
// with counts and runs; neither side encodes a token or lists a block. That
// is what an inference worker asks before every prefill. SendTokens has
// the node hash the tokens instead.
func (c *Client) Lookup(ctx context.Context, ns prefixhash.Namespace, p Prompt, opts ...CallOption) (Lookup, error) {
	o, err := applyOptions("lookup", opts)
	if err != nil {
		return Lookup{}, err
	}
	t, err := c.newTarget(ctx, ns, p, false)
	if err != nil {
		return Lookup{}, err
	}
	if o.sendTokens {
		if !t.byTokens() || p.Parent != nil {
			return Lookup{}, fmt.Errorf("%w: SendTokens sends a Prompt's Tokens, without Parent", ErrInvalid)
		}
		resp, err := c.lookup(ctx, &kvmeshv1.LookupRequest{Namespace: NamespaceProto(t.ns), Tokens: p.Tokens, ExtraKeys: extraKeysProto(p.Extra)})
		if err != nil {
			return Lookup{}, err
		}
		return lookupAnswer(resp, nil)
	}
	chain, promptTokens := t.chain(), len(p.Tokens)
	if !t.byTokens() {
		promptTokens = len(t.keys) * t.ns.BlockTokens
	}
	if p.Parent != nil {
		promptTokens += p.Parent.Tokens()
	}
	req := &kvmeshv1.LookupRequest{Namespace: NamespaceProto(t.ns), Chain: chainBytes(chain), PromptTokens: uint64(promptTokens), Summary: true}
	resp, err := c.lookup(ctx, req)
	if err != nil {
		return Lookup{}, err
	}
	if len(chain) > 0 && resp.GetPromptBlocks() == 0 && t.byTokens() && p.Parent == nil {
		// A node older than LookupRequest.chain saw an empty prompt: ask
		// it with the tokens.
		req = &kvmeshv1.LookupRequest{Namespace: req.GetNamespace(), Tokens: p.Tokens, ExtraKeys: extraKeysProto(p.Extra)}
		if resp, err = c.lookup(ctx, req); err != nil {
			return Lookup{}, err
		}
	}
	l, err := lookupAnswer(resp, chain)
	if err != nil {
		return Lookup{}, err
	}
	return l.after(len(t.before), t.ns.BlockTokens), nil
}

// after returns l, a Lookup of a whole prompt, as one of its blocks from
// block n on: what a Prompt with a Parent of n blocks asked.
func (l Lookup) after(n, blockTokens int) Lookup {
	if n == 0 {
		return l
	}
	l.PromptTokens -= n * blockTokens
	l.PromptBlocks -= n
	l.CachedBlocks = max(0, l.CachedBlocks-n)
	l.CachedTokens = l.CachedBlocks * blockTokens
	l.Keys = l.Keys[n:]
	var runs []Run
	for _, r := range l.Runs {
		end := r.Start + r.Blocks - n
		if end <= 0 {
			continue
		}
		r.Start = max(0, r.Start-n)
		r.Blocks = end - r.Start
		runs = append(runs, r)
	}
	l.Runs = runs
	return l
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
		Keys: keys, Groups: groupLookups(resp),
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
	// Prompt's Tokens, or the position in its Keys.
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
	// a Prompt's Rank, it is the rank's part of the block (block.Part). In
	// a namespace with groups it is group Group's record of the block
	// (block.GroupLayout).
	Payload []byte
	// Group is the group whose record a Get by Tokens in a namespace with
	// groups returned (Index is then its block's); 0 otherwise.
	Group int
}

// Get reads the blocks of p under ns. By Tokens it returns the blocks of
// the prompt's longest cached prefix, in prompt order (none when the first
// block is not cached): every block's tokens and parent are compared with
// the prompt's, and a block that differs ends the prefix, as a miss, and is
// counted in RefusedBlocks. By Keys it returns one Block per key, in order,
// a miss with Found false. With p.Rank, each Payload is the rank's part of
// its block (block.Part's order); only complete blocks count, and the part
// can be read whatever the ranks that wrote the block.
//
// The blocks and their payloads are the caller's; with Into, the payloads
// are in the caller's buffers. View reads in place instead.
//
// By Names it reads objects: one Block per name, in order (Key the
// object's, Payload its whole value, Found false for a miss); with Into,
// dst[i] must hold names[i]'s value, and one that does not is an entry of
// ItemErrors (object.go).
func (c *Client) Get(ctx context.Context, ns prefixhash.Namespace, p Prompt, opts ...CallOption) ([]Block, error) {
	o, err := applyOptions("get", opts)
	if err != nil {
		return nil, err
	}
	switch {
	case o.intoSet && o.each != nil:
		return nil, fmt.Errorf("%w: Get takes Into or Each, not both", ErrInvalid)
	case p.Names != nil && (p.Tokens != nil || p.Keys != nil):
		return nil, fmt.Errorf("%w: Prompt has Names and Tokens or Keys; name its values one way", ErrInvalid)
	case p.Names != nil:
		return c.getObjects(ctx, ns, p.Names, o)
	case o.intoSet:
		return c.getInto(ctx, ns, p, o.into)
	}
	t, err := c.newTarget(ctx, ns, p, false)
	if err != nil {
		return nil, err
	}
	if t.group >= 0 && t.byTokens() {
		return c.getResume(ctx, t, o.each)
	}
	if o.each != nil {
		return nil, c.read(ctx, t, -1, false, o.each)
	}
	var out []Block
	if !t.byTokens() {
		out = make([]Block, 0, len(t.keys))
	}
	err = c.read(ctx, t, -1, true, func(b Block) error { out = append(out, b); return nil })
	if err != nil {
		return nil, err
	}
	return out, nil
}

// getInto is Get with Into(dst).
func (c *Client) getInto(ctx context.Context, ns prefixhash.Namespace, p Prompt, dst [][]byte) ([]Block, error) {
	if !ns.Groups.IsZero() {
		return nil, fmt.Errorf("%w: Into: the records of a namespace with groups have a size per group; Get them without Into", ErrInvalid)
	}
	part, err := rankPart(ns, p.Rank)
	if err != nil {
		return nil, err
	}
	for i, d := range dst {
		if err := checkPayloadLen(ns, part, "dst", i, d); err != nil {
			return nil, err
		}
	}
	t, err := c.newTarget(ctx, ns, p, false)
	if err != nil {
		return nil, err
	}
	out := make([]Block, 0, min(len(dst), len(t.keys)))
	bt := t.ns.BlockTokens
	err = c.read(ctx, t, len(dst), false, func(b Block) error {
		if b.Found {
			b.Payload = dst[b.Index][:copy(dst[b.Index], b.Payload)]
			if t.byTokens() {
				b.Tokens = p.Tokens[b.Index*bt : (b.Index+1)*bt : (b.Index+1)*bt] // equal, and the caller's
			} else {
				b.Tokens = slices.Clone(b.Tokens) // they view the transport's buffer
			}
		}
		out = append(out, b)
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// read reads t's blocks, at most limit of them (no limit when negative),
// and hands each to fn in order: by tokens, the cached prefix's blocks
// that hold the prompt (a miss or a refused block ends it); by keys, every
// block, misses included. With fresh, b.Payload is fn's to keep; otherwise
// it is valid during the call only. An error from fn ends the read and is
// returned.
func (c *Client) read(ctx context.Context, t *target, limit int, fresh bool, fn func(Block) error) error {
	keys := t.keys
	if limit >= 0 && len(keys) > limit {
		keys = keys[:limit]
	}
	if !t.byTokens() {
		if err := c.getKeys(ctx, t.ns, t.part, keys, nil, false, fresh, fn); err != nil {
			return callError("get", err)
		}
		return nil
	}
	next := 0
	cks := c.chunkKeysOf(ctx, t)
	if cks != nil {
		cks = cks[:len(keys)]
	}
	err := c.getKeys(ctx, t.ns, t.part, keys, cks, true, fresh, func(b Block) error {
		if !b.Found {
			return nil
		}
		if b.Index != next || !t.holds(b) {
			c.refused.Add(1)
			return errPrefixEnds
		}
		next++
		return fn(b)
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

// Put stores the blocks of p under ns, which names them by Tokens:
// payloads[i] is the payload of block i (tokens[i*B:(i+1)*B]), its KV bytes
// then its scales if the namespace has them, ns.BlockBytes() long; a nil
// payload skips its block (it is cached already). len(payloads) is at most
// the number of full blocks. Put returns the keys of the blocks it stored.
// payloads are read during the call only.
//
// With p.Rank, payloads[i] is the rank's part of block i, laid out as
// block.Part says (for each of its layers the KV of its heads, then their
// scales), as long as Rank.Part(ns) says. The node keeps the parts of a
// block apart until every rank's is there; only then is the block served
// and counted by Lookup. Put then returns the keys of the blocks whose part
// it sent or found stored (or being sent by another rank). A part several
// ranks hold identically (the latent of an MLA namespace at TPSize > 1;
// replicated KV heads at TPSize > KVHeads) is claimed first: the node says
// which blocks still need it, and only those are sent, so that the bytes
// cross once whatever the number of ranks. A part whose bytes differ from
// what the node holds of its block is refused: *PartConflictError
// (ErrPartConflict, ErrInvalid). A part of a block (not the whole) needs
// the node's data plane.
//
// Put is idempotent and retried on Unavailable; a failed Put may have
// stored some of the blocks.
//
// By Names it stores objects, payloads[i] under Names[i], and returns
// their keys: a name already held keeps its value unless Upsert; Retention
// pins or leases them, PieceBytes sets the pieces they are cut into. An
// object refused (a bad name, no room) is an entry of ItemErrors, its key
// zero (object.go).
func (c *Client) Put(ctx context.Context, ns prefixhash.Namespace, p Prompt, payloads [][]byte, opts ...CallOption) ([]prefixhash.Key, error) {
	o, err := applyOptions("put", opts)
	if err != nil {
		return nil, err
	}
	switch {
	case p.Names != nil && (p.Tokens != nil || p.Keys != nil):
		return nil, fmt.Errorf("%w: Prompt has Names and Tokens or Keys; name its values one way", ErrInvalid)
	case p.Names != nil:
		return c.putObjects(ctx, ns, p.Names, payloads, o)
	case o.retention != (block.Retention{}) || o.upsert || o.pieceBytes != 0:
		return nil, fmt.Errorf("%w: Retention, Upsert and PieceBytes are for objects (Prompt.Names)", ErrInvalid)
	}
	if p.Keys != nil {
		return nil, fmt.Errorf("%w: Put needs a Prompt's Tokens: a block's key is computed from them", ErrInvalid)
	}
	t, err := c.newTarget(ctx, ns, p, true)
	if err != nil {
		return nil, err
	}
	items, err := c.putItems(ctx, t, payloads)
	if err != nil {
		return nil, err
	}
	if t.group >= 0 {
		return c.putBatches(ctx, t.ns, items) // a group's records, or a rank's parts of them, once each
	}
	if !p.Rank.shared(t.ns) {
		return c.putBatches(ctx, t.ns, items)
	}
	keys := make([]prefixhash.Key, len(items))
	for i, it := range items {
		keys[i] = it.key
	}
	part := t.part
	if part == (block.Part{}) {
		part = block.WholePart(t.ns)
	}
	if items, err = c.claim(ctx, part, items); err != nil {
		return nil, err
	}
	if _, err := c.putBatches(ctx, t.ns, items); err != nil {
		return nil, err
	}
	return keys, nil
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

// putItems checks payloads, t's part of each of its blocks by tokens (nil
// skips a block), and returns them as items to put.
func (c *Client) putItems(ctx context.Context, t *target, payloads [][]byte) ([]putItem, error) {
	if len(payloads) > len(t.keys) {
		return nil, fmt.Errorf("%w: %d payloads for %d full blocks of tokens", ErrInvalid, len(payloads), len(t.keys))
	}
	for i, p := range payloads {
		if p != nil {
			if err := t.checkPayloadLen("payload", i, p); err != nil {
				return nil, err
			}
		}
	}
	chunks := c.chunkKeysOf(ctx, t)
	bt := t.ns.BlockTokens
	var items []putItem
	parent := t.parent
	for i, p := range payloads {
		if p != nil {
			it := putItem{part: t.part, parent: parent, key: t.keys[i], tokens: t.p.Tokens[i*bt : (i+1)*bt], payload: p, group: t.group}
			if t.group >= 0 {
				it.key = prefixhash.GroupKey(it.key, t.group)
			}
			if i < len(t.p.Extra) {
				it.extra = t.p.Extra[i]
			}
			if chunks != nil {
				it.chunk = chunks[i]
			}
			items = append(items, it)
		}
		parent = t.links[i]
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
