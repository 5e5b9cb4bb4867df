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

// groupKeyBufs pools the group keys of a chain Resume looks up (a
// 128k-token prompt's are 128 KiB); maxPooledGroupKeys bounds what it keeps.
var groupKeyBufs = sync.Pool{New: func() any { return new([]prefixhash.Key) }}

const maxPooledGroupKeys = 1 << 16

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
	// The states and windows that resuming at the chain's end needs, with
	// a few below, are asked in the anchor's round: a prompt that is
	// cached whole takes one round.
	spec := speculate(groups, blockTokens, len(chain), firstBack)
	extra := c.probeKeys(chain, blockTokens, spec)
	lead, spans := c.leads(ctx, groups, blockTokens, chain, extra)
	known := make(map[prefixhash.Probe]bool, len(spec))
	for j, p := range spec {
		known[p] = extra.held[j]
	}
	hit := c.resolve(ctx, groups, blockTokens, chain, lead, known)
	return hit, cutSpans(spans, hit.Blocks)
}

// leads finds every full and indexer group's leading records of chain, one
// lookup each, at once, the anchor's (the first full group's, else the
// first indexer's) here with extra in its round, and returns them with the
// anchor's spans. Without an anchor, extra is asked alone.
func (c *Cluster) leads(ctx context.Context, groups []prefixhash.Group, blockTokens int, chain []prefixhash.Key, extra *extraProbes) ([]int, []Span) {
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
	find := func(g int) {
		buf := groupKeyBufs.Get().(*[]prefixhash.Key)
		keys := chain // group 0's records are under the chain keys
		if g > 0 {
			keys = prefixhash.GroupKeys((*buf)[:0], chain, g)
		}
		var ex *extraProbes
		if g == anchor {
			ex = extra
		}
		var sp []Span
		lead[g], sp = c.lookup(ctx, chain, keys, blockTokens, g == anchor, ex)
		if g == anchor {
			spans = sp
		}
		if g > 0 && cap(keys) <= maxPooledGroupKeys {
			*buf = keys[:0]
			groupKeyBufs.Put(buf)
		}
	}
	var wg sync.WaitGroup
	for g, gr := range groups {
		if gr.Kind.EveryBlock() && g != anchor {
			wg.Add(1)
			go func() {
				defer wg.Done()
				find(g)
			}()
		}
	}
	if anchor >= 0 {
		find(anchor) // here, while the others run
	} else {
		c.holdsInto(ctx, extra)
	}
	wg.Wait()
	return lead, spans
}

// resolve applies the hit rule given the full and indexer groups' leads
// and the states and windows known so far, asking owners in rounds for
// those the answer still needs (each round asks twice as far back); what
// is unknown after maxResumeRounds is missing.
func (c *Cluster) resolve(ctx context.Context, groups []prefixhash.Group, blockTokens int, chain []prefixhash.Key, lead []int, known map[prefixhash.Probe]bool) prefixhash.Hit {
	held := func(g, i int) prefixhash.Presence {
		h, ok := known[prefixhash.Probe{Group: g, Block: i}]
		switch {
		case !ok:
			return prefixhash.Unknown
		case h:
			return prefixhash.Held
		}
		return prefixhash.Missing
	}
	hit, need := prefixhash.ResumeFrom(groups, blockTokens, len(chain), lead, held)
	for round, back := 0, 2*firstBack; len(need) > 0 && round < maxResumeRounds; round, back = round+1, 2*back {
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
		ex := c.probeKeys(chain, blockTokens, probes)
		c.holdsInto(ctx, ex)
		for k, h := range ex.held {
			known[probes[k]] = h
		}
		hit, need = prefixhash.ResumeFrom(groups, blockTokens, len(chain), lead, held)
	}
	if len(need) > 0 {
		hit, _ = prefixhash.ResumeFrom(groups, blockTokens, len(chain), lead, func(g, i int) prefixhash.Presence {
			if p := held(g, i); p != prefixhash.Unknown {
				return p
			}
			return prefixhash.Missing
		})
	}
	return hit
}

// firstBack is how far below the chain's end the first round asks for
// states and window blocks.
const firstBack = 8

// speculate returns the records resuming at n needs (each state group's
// record of block n-1, each sliding group's window before n) and those
// back blocks further down.
func speculate(groups []prefixhash.Group, blockTokens, n, back int) []prefixhash.Probe {
	var out []prefixhash.Probe
	for g, gr := range groups {
		lo := n - 1
		switch gr.Kind {
		case prefixhash.GroupSliding:
			lo = n - gr.WindowBlocks(blockTokens)
		case prefixhash.GroupState:
		default:
			continue
		}
		for i := n - 1; i >= max(0, lo-back); i-- {
			out = append(out, prefixhash.Probe{Group: g, Block: i})
		}
	}
	return out
}

// probeKeys returns the records of probes (of blocks of chain) as extra
// probes of a lookup.
func (c *Cluster) probeKeys(chain []prefixhash.Key, blockTokens int, probes []prefixhash.Probe) *extraProbes {
	ex := &extraProbes{keys: make([]prefixhash.Key, len(probes)), chunks: make([]prefixhash.Key, len(probes)), held: make([]bool, len(probes))}
	cb := c.ChunkBlocks(blockTokens)
	for k, p := range probes {
		ex.keys[k] = prefixhash.GroupKey(chain[p.Block], p.Group)
		ex.chunks[k] = prefixhash.ChunkKey(chain, p.Block, cb)
	}
	return ex
}

// holdsInto finds whether ex's records are held here or by an owner of
// their chunks (Exists; a failed peer is a miss).
func (c *Cluster) holdsInto(ctx context.Context, ex *extraProbes) {
	if len(ex.keys) == 0 {
		return
	}
	held, _ := c.Exists(ctx, ex.keys, ex.chunks)
	copy(ex.held, held)
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
