package store

import (
	"context"
	"sync"

	"github.com/kvmesh/kvmesh/prefixhash"
)

// maxResumeRounds bounds the rounds Resume spends on the records of
// sliding and state groups after the full groups' lookup; what is still
// unknown after them counts as missing (a shorter hit, never a wrong one).
const maxResumeRounds = 8

// Resume applies the hit rule (prefixhash.Resume) to chain, the keys of a
// prompt's blocks from block 0 in a namespace with groups (blocks of
// blockTokens tokens), over every record the cluster holds: here, or on an
// owner of the record's placement chunk (a group's record is placed by its
// block's chunk key, with the other groups' records of that block).
//
// Every full and indexer group's leading records are found as Locate finds
// a prefix, in one parallel round (one lookup per such group, at once);
// spans are the anchor's (the first full group's, else the first
// indexer's), cut at the answer. Then the states and windows the answer
// needs are asked of their owners: one round for the records at the full
// groups' prefix, usually; each further round asks twice as far back. A
// peer that fails or is late counts as not holding its records.
func (c *Cluster) Resume(ctx context.Context, groups []prefixhash.Group, blockTokens int, chain []prefixhash.Key) (prefixhash.Hit, []Span) {
	c.fg.begin()
	defer c.fg.end()
	anchor := -1
	for _, k := range [...]prefixhash.GroupKind{prefixhash.GroupFull, prefixhash.GroupIndexer} {
		for g, gr := range groups {
			if anchor < 0 && gr.Kind == k {
				anchor = g
			}
		}
	}
	lead := make([]int, len(groups))
	var spans []Span
	var wg sync.WaitGroup
	for g, gr := range groups {
		if !gr.Kind.EveryBlock() {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			keys := prefixhash.GroupKeys(make([]prefixhash.Key, 0, len(chain)), chain, g)
			var sp []Span
			lead[g], sp = c.lookup(ctx, chain, keys, blockTokens, g == anchor)
			if g == anchor {
				spans = sp
			}
		}()
	}
	wg.Wait()

	known := map[prefixhash.Probe]bool{}
	held := func(g, i int) prefixhash.Presence {
		if groups[g].Kind.EveryBlock() {
			if i < lead[g] {
				return prefixhash.Held
			}
			return prefixhash.Missing
		}
		h, ok := known[prefixhash.Probe{Group: g, Block: i}]
		switch {
		case !ok:
			return prefixhash.Unknown
		case h:
			return prefixhash.Held
		}
		return prefixhash.Missing
	}
	hit, need := prefixhash.Resume(groups, blockTokens, len(chain), held)
	for round, back := 0, 8; len(need) > 0 && round < maxResumeRounds; round, back = round+1, 2*back {
		// Ask for what the walk needs, and for the records a further
		// step down would need: states and window blocks below them.
		var probes []prefixhash.Probe
		for _, p := range need {
			for i := p.Block; i >= max(0, p.Block-back); i-- {
				q := prefixhash.Probe{Group: p.Group, Block: i}
				if _, ok := known[q]; !ok {
					known[q] = false
					probes = append(probes, q)
				}
			}
		}
		for k, h := range c.holds(ctx, chain, blockTokens, probes) {
			known[probes[k]] = h
		}
		hit, need = prefixhash.Resume(groups, blockTokens, len(chain), held)
	}
	if len(need) > 0 {
		// Out of rounds: what is still unknown is missing.
		hit, _ = prefixhash.Resume(groups, blockTokens, len(chain), func(g, i int) prefixhash.Presence {
			if p := held(g, i); p != prefixhash.Unknown {
				return p
			}
			return prefixhash.Missing
		})
	}
	return hit, cutSpans(spans, hit.Blocks)
}

// holds reports, for each probe, whether its record (of a block of chain)
// is held here or by an owner of its block's chunk (Exists).
func (c *Cluster) holds(ctx context.Context, chain []prefixhash.Key, blockTokens int, probes []prefixhash.Probe) []bool {
	keys := make([]prefixhash.Key, len(probes))
	cks := make([]prefixhash.Key, len(probes))
	cb := c.ChunkBlocks(blockTokens)
	for k, p := range probes {
		keys[k] = prefixhash.GroupKey(chain[p.Block], p.Group)
		cks[k] = prefixhash.ChunkKey(chain, p.Block, cb)
	}
	held, _ := c.Exists(ctx, keys, cks) // a failed peer is a miss
	return held
}

// cutSpans returns the spans of the first n blocks of spans.
func cutSpans(spans []Span, n int) []Span {
	out := spans[:0]
	for _, s := range spans {
		if n <= 0 {
			break
		}
		s.Blocks = min(s.Blocks, n)
		n -= s.Blocks
		out = append(out, s)
	}
	return out
}
