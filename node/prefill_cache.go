package node

import (
	"context"

	"github.com/kvmesh/kvmesh/prefill"
	"github.com/kvmesh/kvmesh/prefixhash"
)

// engineCache adapts the node's Cache to prefill.Cache: the engine reads
// and publishes through whatever cache the node serves, so when the node's
// cache reaches the cluster, the engine's prefix hits do too. A cache error
// on a read is a miss from that block on (the engine recomputes); Put stops
// at the first block the cache refuses.
type engineCache struct{ c Cache }

var _ prefill.Cache = engineCache{}

func (a engineCache) LongestPrefix(_ context.Context, keys []prefixhash.Key) (int, error) {
	return a.c.LongestPrefix(keys), nil
}

// Get pins the leading cached blocks of keys, stopping at the first miss.
func (a engineCache) Get(ctx context.Context, keys []prefixhash.Key) ([][]byte, func(), error) {
	refs := make([]Ref, 0, len(keys))
	release := func() {
		for _, r := range refs {
			r.Release()
		}
	}
	blocks := make([][]byte, len(keys))
	for i, k := range keys {
		r, err := a.c.Get(ctx, k)
		if err != nil {
			if ctx.Err() != nil {
				release()
				return nil, nil, ctx.Err()
			}
			break // a miss, or a block the cache refused: recompute from here
		}
		refs = append(refs, r)
		blocks[i] = r.Bytes()
	}
	return blocks, release, nil
}

// Put stores blocks, the blocks of chain[from:]. The cache copies them.
func (a engineCache) Put(ctx context.Context, _ []prefixhash.Key, _ int, blocks [][]byte) error {
	for _, b := range blocks {
		if err := a.c.Put(ctx, b); err != nil {
			return err
		}
	}
	return nil
}
