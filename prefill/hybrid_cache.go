package prefill

import (
	"context"
	"errors"
	"fmt"

	"github.com/kvmesh/kvmesh/block"
	"github.com/kvmesh/kvmesh/prefixhash"
)

// The cache path of a hybrid model (Config.LayerTypes): its blocks are
// records of its namespace's groups (Config.groups: the full layers' K/V,
// the sliding layers' K/V, the linear layers' states).
//
// A prefill asks GroupCache.Resume for the hit rule's prefix P
// (prefixhash.Resume: every full block of [0,P), the sliding group's
// blocks of the window before P, the state after block P−1), reads exactly
// those records with one GetRecords, verifies each as a plain block is
// verified (block.Decode, the namespace and the group, parent and tokens,
// key = GroupKey(chain key, group)), and applies the hit rule again over
// what verified: a record that is missing or corrupt makes the prefix
// shorter (down to 0), never wrong. The K/V go to their layers' rows of the
// KV; the state becomes the linear layers' state at P·BlockTokens. With
// linear layers the prefix stops at the last block boundary before the
// prompt's last position, which is always computed (from the state before
// it); the sliding and full layers resume like plain ones.
//
// A prefill publishes every group's record of every new block (a writer
// may keep every group at every boundary; the store retires the windows and
// states a chain has moved past): one Cache.Put per group, in the groups'
// order (the full group's records first, which the others' hang from in a
// store).

// GroupCache is the Cache of an engine that runs a hybrid model. The
// engine publishes through Cache.Put, one call per group: blocks[i] is then
// the group's record of the block chain[from+i] (keyed
// prefixhash.GroupKey(chain[from+i], g), as its header says), placed like
// that block. LongestPrefix and Get are not used for such a model.
type GroupCache interface {
	Cache
	// Resume applies the hit rule of a namespace whose groups are groups
	// to chain, a prompt's keys from block 0 (blocks of blockTokens
	// tokens), over every record the cache reaches. An error reads as 0.
	Resume(ctx context.Context, groups []prefixhash.Group, blockTokens int, chain []prefixhash.Key) (prefixhash.Hit, error)
	// GetRecords returns the encoded records of records (group Group's
	// record of block Block of chain, which places it), in order; a
	// missing record is nil; a shorter slice reads as padded with nils.
	// Release as in Get.
	GetRecords(ctx context.Context, chain []prefixhash.Key, records []prefixhash.Probe) (blocks [][]byte, release func(), err error)
}

// errNoGroupCache is New's error for a hybrid model over a Cache that
// reads no records.
var errNoGroupCache = errors.New("prefill: a hybrid model (layer_types) needs a cache that reads its groups' records (prefill.GroupCache)")

// checkGroupCache returns errNoGroupCache for a hybrid model c over a
// cache that is not a GroupCache.
func checkGroupCache(c Config, cache Cache) error {
	if _, ok := cache.(GroupCache); c.Hybrid() && cache != nil && !ok {
		return errNoGroupCache
	}
	return nil
}

// checkSpeculativeState refuses speculative decoding for a model (or a
// draft) with linear-attention layers: a verification pass advances their
// recurrent state over every guess, and a rejected guess cannot be taken
// back out of it as its K/V can be overwritten. Sliding-window layers
// speculate as full ones do.
func checkSpeculativeState(c Config, s SpeculativeOptions) error {
	if s.Method != SpeculateOff && c.linearLayers() > 0 {
		return fmt.Errorf("%w: speculative.method: %s: the model's linear-attention layers (layer_types %q) carry a recurrent state that a rejected guess cannot be taken back from; use %s",
			ErrInvalidConfig, s.Method, c.LayerTypes, SpeculateOff)
	}
	if d := s.Draft; d != nil && d.Config.linearLayers() > 0 {
		return fmt.Errorf("%w: speculative.draft: a model with linear-attention layers (layer_types %q) cannot be a draft: its recurrent state cannot be taken back to the last accepted guess",
			ErrInvalidConfig, d.Config.LayerTypes)
	}
	return nil
}

// groupCache returns the engine's cache as a GroupCache (New checked it),
// nil without a cache.
func (e *Engine) groupCache() GroupCache {
	gc, _ := e.cache.(GroupCache)
	return gc
}

// loadGroups is load for a hybrid model.
func (e *Engine) loadGroups(ctx context.Context, sc scope, tokens []uint32, capTokens int, res *Result) ([]prefixhash.Key, *KV, int, error) {
	t0 := e.opts.Now()
	keys := prefixhash.Keys(sc.ns, tokens)
	hit := e.resume(ctx, keys, len(tokens))
	if ctx.Err() != nil {
		return nil, nil, 0, e.ctxErr(ctx, "lookup")
	}
	t1 := e.opts.Now()
	res.Timing.Lookup = t1.Sub(t0)
	kv := e.getKV(max(capTokens, len(tokens)))
	loaded := e.fetchGroups(ctx, sc, sc.ns.Groups.All(), keys[:hit], tokens, kv)
	if ctx.Err() != nil {
		e.kvPool.Put(kv)
		return nil, nil, 0, e.ctxErr(ctx, "fetch")
	}
	res.Timing.Fetch = e.opts.Now().Sub(t1)
	return keys, kv, loaded, nil
}

// resume returns the hit rule's prefix of keys, the chain of a prompt of n
// tokens, in blocks (GroupCache.Resume); an error is a miss. With linear
// layers it is at most the last block boundary before the prompt's last
// position, whose state the pass over that position starts from.
func (e *Engine) resume(ctx context.Context, keys []prefixhash.Key, n int) int {
	gc := e.groupCache()
	if e.cfg.linearLayers() > 0 {
		keys = keys[:min(len(keys), (n-1)/e.cfg.BlockTokens)]
	}
	if gc == nil || len(keys) == 0 {
		return 0
	}
	hit, err := gc.Resume(ctx, e.scopeOf(ctx).ns.Groups.All(), e.cfg.BlockTokens, keys)
	if err != nil {
		if ctx.Err() == nil {
			e.stats.lookupErrors.Add(1)
		}
		return 0
	}
	return max(0, min(hit.Blocks, len(keys)))
}

// needed lists the records resuming at block p needs: every full and
// indexer group's blocks [0,p), each sliding group's window before p, each
// state group's record of block p−1.
func needed(groups []prefixhash.Group, blockTokens, p int) []prefixhash.Probe {
	var probes []prefixhash.Probe
	for g, gr := range groups {
		first := 0
		switch gr.Kind {
		case prefixhash.GroupSliding:
			first = max(0, p-gr.WindowBlocks(blockTokens))
		case prefixhash.GroupState:
			first = max(0, p-1)
		}
		for i := first; i < p; i++ {
			probes = append(probes, prefixhash.Probe{Group: g, Block: i})
		}
	}
	return probes
}

// fetchGroups reads what resuming after the blocks of keys (the hit rule's
// prefix of tokens' chain) needs into kv and returns the prefix it loaded:
// len(keys), or the hit rule's answer over the records that were there and
// verified.
func (e *Engine) fetchGroups(ctx context.Context, sc scope, groups []prefixhash.Group, keys []prefixhash.Key, tokens []uint32, kv *KV) int {
	p := len(keys)
	if p == 0 {
		return 0
	}
	probes := needed(groups, e.cfg.BlockTokens, p)
	recs, release, err := e.groupCache().GetRecords(ctx, keys, probes)
	if err != nil {
		if ctx.Err() == nil {
			e.stats.fetchErrors.Add(1)
			e.stats.lost.Add(int64(p))
		}
		return 0
	}
	defer release()
	b := e.cfg.BlockTokens
	good := make(map[prefixhash.Probe]block.Block, len(probes))
	var firstErr error
	missing := false
	for j, pr := range probes {
		if j >= len(recs) || recs[j] == nil {
			missing = true
			continue
		}
		blk, err := e.checkRecord(sc, keys, tokens, pr, recs[j])
		if err != nil {
			if firstErr == nil {
				firstErr = err
			}
			continue
		}
		good[pr] = blk
	}
	// The prefix over what is there: the hit rule again, every record not
	// in good missing.
	lead := make([]int, len(groups))
	for g, gr := range groups {
		for gr.Kind.EveryBlock() && lead[g] < p {
			if _, ok := good[prefixhash.Probe{Group: g, Block: lead[g]}]; !ok {
				break
			}
			lead[g]++
		}
	}
	hit, _ := prefixhash.ResumeFrom(groups, b, p, lead, func(g, i int) prefixhash.Presence {
		if _, ok := good[prefixhash.Probe{Group: g, Block: i}]; ok {
			return prefixhash.Held
		}
		return prefixhash.Missing
	})
	got := hit.Blocks
	if got < p {
		switch {
		case firstErr != nil:
			e.stats.corrupt.Add(1)
			e.opts.Logger.Debug("prefill: dropping a cached record", "err", firstErr)
		case missing:
			e.stats.missing.Add(1)
		}
		e.stats.lost.Add(int64(p - got))
	}
	for _, pr := range needed(groups, b, got) {
		blk := good[pr]
		if groups[pr.Group].Kind == prefixhash.GroupState {
			kv.lin.setState(blk.Payload, got*b)
			continue
		}
		kv.readLayers(groups[pr.Group].Layers, pr.Block*b, b, blk.Payload)
	}
	return got
}

// checkRecord decodes and verifies rec, fetched as record pr of the chain
// keys of tokens.
func (e *Engine) checkRecord(sc scope, keys []prefixhash.Key, tokens []uint32, pr prefixhash.Probe, rec []byte) (block.Block, error) {
	b := e.cfg.BlockTokens
	blk, err := block.Decode(rec, sc.ns.GroupBytes(pr.Group))
	if err == nil {
		err = blk.CheckNamespace(sc.ns)
	}
	if err == nil && blk.Group.Index != pr.Group {
		err = fmt.Errorf("%w: a record of group %d, want group %d", block.ErrCorrupt, blk.Group.Index, pr.Group)
	}
	if err == nil {
		parent := sc.root
		if pr.Block > 0 {
			parent = keys[pr.Block-1]
		}
		err = blk.CheckTokens(parent, tokens[pr.Block*b:(pr.Block+1)*b])
	}
	if want := prefixhash.GroupKey(keys[pr.Block], pr.Group); err == nil && blk.Key != want {
		err = fmt.Errorf("%w: group %d's record of block %d has key %s, want %s", block.ErrCorrupt, pr.Group, pr.Block, blk.Key, want)
	}
	if err == nil && (!blk.Whole() || len(blk.Payload) != sc.ns.GroupBytes(pr.Group)) {
		err = fmt.Errorf("%w: group %d's record of block %d is a part (%d bytes)", block.ErrCorrupt, pr.Group, pr.Block, len(blk.Payload))
	}
	return blk, err
}

// encodeGroups appends to buf every group's records of blocks [from, to)
// of chain (as encode), group after group, and returns buf and the
// records, which alias buf: group g's are records[g·(to−from):(g+1)·(to−from)].
func (e *Engine) encodeGroups(sc scope, buf []byte, recs [][]byte, kv *KV, chain []prefixhash.Key, tokens []uint32, from, to int) ([]byte, [][]byte) {
	b := e.cfg.BlockTokens
	groups := sc.ns.Groups.All()
	need, most := 0, 0
	for g := range groups {
		n := sc.ns.GroupBytes(g)
		need += (to - from) * block.EncodedLen(b, n)
		most = max(most, n)
	}
	if cap(buf) < need {
		buf = make([]byte, 0, need)
	}
	buf, recs = buf[:0], recs[:0]
	ends := make([]int, 0, len(groups)*(to-from))
	scratch := make([]byte, most)
	for g, gr := range groups {
		payload := scratch[:sc.ns.GroupBytes(g)]
		for i := from; i < to; i++ {
			parent := sc.root
			if i > 0 {
				parent = chain[i-1]
			}
			if gr.Kind == prefixhash.GroupState {
				putFloats(payload, kv.lin.snap(i))
			} else {
				kv.writeLayers(payload, gr.Layers, i*b, b)
			}
			j := i - from
			var link prefixhash.Link
			var err error
			buf, link, err = block.EncodeGroup(buf, sc.tag, sc.ns, g, prefixhash.KeyLink(parent), tokens[j*b:(j+1)*b], nil, payload)
			if err != nil || link.Key() != chain[i] {
				panic(fmt.Sprintf("prefill: encoding group %d's record of block %d: key %s, want %s: %v", g, i, link.Key(), chain[i], err))
			}
			ends = append(ends, len(buf))
		}
	}
	at := 0
	for _, end := range ends {
		recs = append(recs, buf[at:end:end])
		at = end
	}
	return buf, recs
}

// putGroups hands recs (encodeGroups') to Cache.Put, one call per group,
// and returns the blocks they are records of.
func (e *Engine) putGroups(ctx context.Context, chain []prefixhash.Key, from int, recs [][]byte) (int, error) {
	g := e.ns.Groups.Len()
	n := len(recs) / g
	for j := range g {
		if err := e.cache.Put(ctx, chain, from, recs[j*n:(j+1)*n]); err != nil {
			return n, err
		}
	}
	return n, nil
}
