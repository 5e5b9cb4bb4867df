package bench

import (
	"math/rand/v2"
	"testing"

	"github.com/kvmesh/kvmesh/prefixhash"
)

// TestDepthLRUKeepsPrefixes replays random chains on one node the way a
// replay does (touch the cached prefix, put the rest deepest-first): the
// cache stays within capacity, and after every request a cached block's
// parent is cached too (a block is never kept past its prefix). The same
// seed gives the same hits.
func TestDepthLRUKeepsPrefixes(t *testing.T) {
	run := func(seed uint64) int {
		rng := rand.New(rand.NewPCG(seed, 7))
		d := newDepthLRU(20)
		parent := map[prefixhash.Key]prefixhash.Key{}
		hits := 0
		for now := range 2000 {
			chain := make([]prefixhash.Key, 1+rng.IntN(12))
			// The chains of a root share their first 4 blocks, then
			// follow one of 3 branches: a key names its parent.
			root, b := byte(rng.IntN(6)), byte(1+rng.IntN(3))
			for i := range chain {
				branch := byte(0)
				if i >= 4 {
					branch = b
				}
				chain[i] = prefixhash.Key{root, byte(i), branch}
				if i > 0 {
					parent[chain[i]] = chain[i-1]
				}
			}
			h := 0
			for h < len(chain) && d.contains(chain[h]) {
				h++
			}
			for i := h - 1; i >= 0; i-- {
				d.touchAt(chain[i], now, i)
			}
			hits += h
			for i := len(chain) - 1; i >= h; i-- {
				d.insertAt(chain[i], now, i)
			}
			if d.len() > 20 {
				t.Fatalf("request %d: %d blocks held, capacity 20", now, d.len())
			}
			for k := range d.mu.score {
				if p, ok := parent[k]; ok && !d.contains(p) {
					t.Fatalf("request %d (chain %d, hit %d): block %v (score %d) held without its parent %v", now, len(chain), h, k, d.mu.score[k], p)
				}
			}
		}
		return hits
	}
	if a, b := run(1), run(1); a != b || a == 0 {
		t.Fatalf("seed 1 gave %d then %d hits", a, b)
	}
}
