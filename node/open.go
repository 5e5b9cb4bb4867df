package node

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/kvmesh/kvmesh/prefixhash"
	"github.com/kvmesh/kvmesh/store"
	"github.com/kvmesh/kvmesh/tiers"
)

// Open opens the node's cache, store.Local over a DRAM tier of DRAMBytes and
// an NVMe tier of NVMeBytes under DataDir/nvme (recovering what an earlier
// run left there), and returns the node serving it, ready to Serve.
func Open(opts Options) (*Node, error) {
	opts.EnsureDefaults()
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(opts.DataDir, 0o755); err != nil {
		return nil, fmt.Errorf("node: data dir: %w", err)
	}
	// A slot of either tier must hold the largest block and the tier's
	// 64-byte slot header.
	const slotHeader = 64
	dramOpts := tiers.DRAMOptions{Capacity: opts.DRAMBytes}
	if need := int64(opts.MaxBlockBytes) + slotHeader; need > tiers.DefaultSlabSize {
		dramOpts.SlabSize = roundUp(need, 64*KiB)
	}
	dram, err := tiers.NewDRAM(dramOpts)
	if err != nil {
		return nil, fmt.Errorf("node: DRAM tier of %d bytes: %w", opts.DRAMBytes, err)
	}
	nvmeOpts := tiers.NVMeOptions{Dir: filepath.Join(opts.DataDir, "nvme"), Capacity: opts.NVMeBytes, Logger: opts.Logger}
	if need := int64(opts.MaxBlockBytes) + slotHeader; need > 64*MiB {
		nvmeOpts.SegmentSize = roundUp(need, 4*KiB)
	}
	nvme, err := tiers.OpenNVMe(nvmeOpts)
	if err != nil {
		dram.Close()
		return nil, fmt.Errorf("node: NVMe tier in %s: %w", nvmeOpts.Dir, err)
	}
	local, err := store.Open(store.Options{DRAM: dram, NVMe: nvme, MaxBlockBytes: opts.MaxBlockBytes})
	if err != nil {
		dram.Close()
		nvme.Close()
		return nil, fmt.Errorf("node: open cache: %w", err)
	}
	return New(opts, localCache{local})
}

func roundUp(n, to int64) int64 { return (n + to - 1) / to * to }

// localCache adapts store.Local to Cache.
type localCache struct{ l *store.Local }

var _ Cache = localCache{}

// cacheError translates store's sentinels into the Cache contract's.
func cacheError(err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, store.ErrNotFound):
		return fmt.Errorf("%w: %w", ErrNotFound, err)
	case errors.Is(err, store.ErrFull):
		return fmt.Errorf("%w: %w", ErrFull, err)
	case errors.Is(err, store.ErrLayout):
		return fmt.Errorf("%w: %w", store.ErrCorrupt, err)
	case errors.Is(err, store.ErrClosed):
		return fmt.Errorf("%w: %w", ErrClosed, err)
	}
	return err
}

func (c localCache) Put(ctx context.Context, block []byte) error {
	return cacheError(c.l.Put(ctx, block))
}

func (c localCache) Get(ctx context.Context, key prefixhash.Key) (Ref, error) {
	r, err := c.l.Get(ctx, key)
	if err != nil {
		return nil, cacheError(err)
	}
	return r, nil
}

func (c localCache) Contains(key prefixhash.Key) bool        { return c.l.Contains(key) }
func (c localCache) LongestPrefix(keys []prefixhash.Key) int { return c.l.LongestPrefix(keys) }

func (c localCache) Info(key prefixhash.Key) (BlockInfo, bool) {
	i, ok := c.l.Info(key)
	return BlockInfo{Tier: i.Tier, Size: i.Size}, ok
}

func (c localCache) DropNamespace(digest uint64) (int, error) {
	n, err := c.l.DropNamespace(digest)
	return n, cacheError(err)
}

func (c localCache) Stats() CacheStats {
	s := c.l.Stats()
	out := CacheStats{Hits: s.Hits, Misses: s.Misses, Evictions: s.Evictions, Demotions: s.Demotions, Promotions: s.Promotions}
	for _, t := range s.Tiers {
		out.Tiers = append(out.Tiers, TierStats{Name: t.Name, Blocks: t.Blocks, Bytes: t.Bytes, Capacity: t.Capacity})
	}
	for _, n := range s.Namespaces {
		out.Namespaces = append(out.Namespaces, NamespaceStats{Digest: n.Digest, Blocks: n.Blocks, Bytes: n.Bytes, Tokens: n.Tokens})
	}
	return out
}

func (c localCache) Close() error { return c.l.Close() }
