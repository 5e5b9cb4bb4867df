package node

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvmesh/kvmesh/auth"
	"github.com/kvmesh/kvmesh/block"
	"github.com/kvmesh/kvmesh/prefixhash"
)

// fakeCache is an in-memory Cache for tests: a map of verified blocks with a
// byte budget, counting pins so that tests can check every Ref is released.
type fakeCache struct {
	capacity    int64
	chunkTokens int // placement chunk size; 0: the default
	pins        atomic.Int64
	gets        atomic.Int64
	// gate, when set, runs before the n-th Get (from 1) and may block it.
	gate   func(ctx context.Context, n int64) error
	closed atomic.Int32

	mu struct {
		sync.Mutex
		blocks       map[prefixhash.Key][]byte
		chunkOf      map[prefixhash.Key]prefixhash.Key // the chunk key each block was put with
		published    map[prefixhash.Key]prefixhash.Key
		bytes        int64
		hits, misses int64
	}
}

func newFakeCache(capacity int64) *fakeCache {
	c := &fakeCache{capacity: capacity}
	c.mu.blocks = make(map[prefixhash.Key][]byte)
	c.mu.chunkOf = make(map[prefixhash.Key]prefixhash.Key)
	c.mu.published = make(map[prefixhash.Key]prefixhash.Key)
	return c
}

func (c *fakeCache) Put(_ context.Context, enc []byte, chunkKey prefixhash.Key) error {
	b, err := block.Decode(enc, 0)
	if err != nil {
		return err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.mu.chunkOf[b.Key] = chunkKey
	if _, ok := c.mu.blocks[b.Key]; ok {
		return nil
	}
	if c.mu.bytes+int64(len(enc)) > c.capacity {
		return fmt.Errorf("fake: %d of %d bytes used: %w", c.mu.bytes, c.capacity, ErrFull)
	}
	c.mu.blocks[b.Key] = append([]byte(nil), enc...)
	c.mu.bytes += int64(len(enc))
	return nil
}

type fakeRef struct {
	c    *fakeCache
	b    []byte
	once sync.Once
}

func (r *fakeRef) Bytes() []byte { return r.b }
func (r *fakeRef) Release()      { r.once.Do(func() { r.c.pins.Add(-1) }) }

func (c *fakeCache) Get(ctx context.Context, key prefixhash.Key) (Ref, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if n := c.gets.Add(1); c.gate != nil {
		if err := c.gate(ctx, n); err != nil {
			return nil, err
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	b, ok := c.mu.blocks[key]
	if !ok {
		c.mu.misses++
		return nil, fmt.Errorf("fake: %s: %w", key, ErrNotFound)
	}
	c.mu.hits++
	c.pins.Add(1)
	return &fakeRef{c: c, b: b}, nil
}

// Read reads keys one by one through Get (and its gate); chunk keys and
// remoteBy do not matter to a single node.
func (c *fakeCache) Read(ctx context.Context, keys, _ []prefixhash.Key, _ time.Time) ([][]byte, func(), error) {
	blocks := make([][]byte, len(keys))
	var refs []Ref
	release := func() {
		for _, r := range refs {
			r.Release()
		}
	}
	for i, k := range keys {
		r, err := c.Get(ctx, k)
		switch {
		case err == nil:
			refs = append(refs, r)
			blocks[i] = r.Bytes()
		case errors.Is(err, ErrNotFound):
		default:
			release()
			return nil, nil, err
		}
	}
	return blocks, release, nil
}

func (c *fakeCache) Exists(_ context.Context, keys, _ []prefixhash.Key) ([]bool, error) {
	out := make([]bool, len(keys))
	for i, k := range keys {
		out[i] = c.Contains(k)
	}
	return out, nil
}

func (c *fakeCache) Locate(_ context.Context, chain []prefixhash.Key, _ int) (int, []Location) {
	n := c.LongestPrefix(auth.Access{}, chain)
	if n == 0 {
		return 0, nil
	}
	return n, []Location{{Tier: "dram", Blocks: n}}
}

func (c *fakeCache) Publish(_ context.Context, keys, chunkKeys []prefixhash.Key) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for i, k := range keys {
		if _, ok := c.mu.blocks[k]; ok {
			c.mu.published[k] = chunkKeys[i]
			n++
		}
	}
	return n, nil
}

func (c *fakeCache) ChunkBlocks(blockTokens int) int {
	return prefixhash.ChunkBlocks(blockTokens, c.chunkTokens)
}

func (c *fakeCache) Contains(key prefixhash.Key) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	_, ok := c.mu.blocks[key]
	return ok
}

// LongestPrefix and Info ignore the access: the fake holds no tenants
// (tenant_test.go runs real nodes).
func (c *fakeCache) LongestPrefix(_ auth.Access, keys []prefixhash.Key) int {
	for i, k := range keys {
		if !c.Contains(k) {
			return i
		}
	}
	return len(keys)
}

func (c *fakeCache) Info(_ auth.Access, key prefixhash.Key) (BlockInfo, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	b, ok := c.mu.blocks[key]
	return BlockInfo{Tier: "dram", Size: len(b)}, ok
}

func (c *fakeCache) DropNamespace(digest uint64) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for k, b := range c.mu.blocks {
		if h, err := block.DecodeHeader(b, 0); err == nil && h.Namespace == digest {
			delete(c.mu.blocks, k)
			c.mu.bytes -= int64(len(b))
			n++
		}
	}
	return n, nil
}

func (c *fakeCache) Stats() CacheStats {
	c.mu.Lock()
	defer c.mu.Unlock()
	return CacheStats{
		Tiers: []TierStats{{Name: "dram", Blocks: int64(len(c.mu.blocks)), Bytes: c.mu.bytes, Capacity: c.capacity}},
		Hits:  c.mu.hits, Misses: c.mu.misses,
	}
}

func (c *fakeCache) Resume(_ context.Context, groups []prefixhash.Group, blockTokens int, chain []prefixhash.Key) (prefixhash.Hit, []Location) {
	hit, _ := prefixhash.Resume(groups, blockTokens, len(chain), func(g, i int) prefixhash.Presence {
		if c.Contains(prefixhash.GroupKey(chain[i], g)) {
			return prefixhash.Held
		}
		return prefixhash.Missing
	})
	var locs []Location
	if hit.Blocks > 0 {
		locs = []Location{{Tier: "dram", Blocks: hit.Blocks}}
	}
	return hit, locs
}

func (c *fakeCache) Close() error {
	c.closed.Add(1)
	return nil
}

var _ Cache = (*fakeCache)(nil)
