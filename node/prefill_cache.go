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
// Peers that fail are misses; the engine recomputes.
type engineCache struct {
	c           Cache
	blockTokens int // the engine's tokens per block
}

var _ prefill.Cache = engineCache{}

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
