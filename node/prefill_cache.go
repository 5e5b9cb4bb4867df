package node

import (
	"context"
	"time"

	"github.com/kvmesh/kvmesh/prefill"
	"github.com/kvmesh/kvmesh/prefixhash"
)

// engineCache adapts the node's Cache to prefill.Cache: the engine reads
// and publishes through the cache the node serves, so in a cluster its
// prefix hits and publications are cluster-wide. Lookups locate the prefix
// on every owner at once (Cache.Locate); reads fetch the blocks from here
// or from their owners, placed by their chunk keys (Cache.Read); puts keep
// each block here and queue it for the owners of its chunk (Cache.Put).
// Peers that fail are misses; the engine recomputes. For a hybrid model
// (prefill.GroupCache) the hit rule runs over the cluster (Cache.Resume)
// and a group's records are read and placed by their block's chunk key.
type engineCache struct {
	c           Cache
	blockTokens int // the engine's tokens per block
}

var _ prefill.GroupCache = engineCache{}

func (a engineCache) chunkKey(chain []prefixhash.Key, i int) prefixhash.Key {
	return prefixhash.ChunkKey(chain, i, a.c.ChunkBlocks(a.blockTokens))
}

func (a engineCache) LongestPrefix(ctx context.Context, keys []prefixhash.Key) (int, error) {
	n, _ := a.c.Locate(ctx, keys, a.blockTokens)
	return n, ctx.Err()
}

// Get reads the blocks of keys, a chain from block 0.
func (a engineCache) Get(ctx context.Context, keys []prefixhash.Key) ([][]byte, func(), error) {
	return a.c.Read(ctx, keys, chainChunkKeys(keys, a.c.ChunkBlocks(a.blockTokens)), time.Time{})
}

// Put stores blocks, the blocks of chain[from:]. The cache copies them.
func (a engineCache) Put(ctx context.Context, chain []prefixhash.Key, from int, blocks [][]byte) error {
	for i, b := range blocks {
		if err := a.c.Put(ctx, b, a.chunkKey(chain, from+i)); err != nil {
			return err
		}
	}
	return nil
}

// Resume applies the hit rule of a hybrid model's groups to chain over the
// cluster.
func (a engineCache) Resume(ctx context.Context, groups []prefixhash.Group, blockTokens int, chain []prefixhash.Key) (prefixhash.Hit, error) {
	hit, _ := a.c.Resume(ctx, groups, blockTokens, chain)
	return hit, ctx.Err()
}

// GetRecords reads group records of chain's blocks, each placed by its
// block's chunk key.
func (a engineCache) GetRecords(ctx context.Context, chain []prefixhash.Key, records []prefixhash.Probe) ([][]byte, func(), error) {
	keys := make([]prefixhash.Key, len(records))
	chunks := make([]prefixhash.Key, len(records))
	for j, r := range records {
		keys[j], chunks[j] = prefixhash.GroupKey(chain[r.Block], r.Group), a.chunkKey(chain, r.Block)
	}
	return a.c.Read(ctx, keys, chunks, time.Time{})
}
