package node

import (
	"context"
	"errors"

	"github.com/kvmesh/kvmesh/prefixhash"
)

// Cache is the node's local cache as the services use it: store.Local, seen
// through a thin adapter. Blocks go in and come out encoded (store.Encode):
// a header that names the key, parent, tokens and layout, then the payload.
//
// All methods are safe for concurrent use.
type Cache interface {
	// Put verifies and stores an encoded block. block is not retained after
	// Put returns. Errors wrap ErrFull when there is no room (after
	// eviction), store.ErrTooLarge or store.ErrCorrupt (also for a block
	// that does not fit its namespace's layout), ErrClosed after Close.
	Put(ctx context.Context, block []byte) error
	// Get returns the encoded block stored under key, verified, pinned until
	// Ref.Release. A miss is an error wrapping ErrNotFound.
	Get(ctx context.Context, key prefixhash.Key) (Ref, error)
	// Contains reports whether key is cached.
	Contains(key prefixhash.Key) bool
	// LongestPrefix returns how many leading keys of a chain are cached.
	LongestPrefix(keys []prefixhash.Key) int
	// Info describes a cached block without reading it.
	Info(key prefixhash.Key) (BlockInfo, bool)
	// DropNamespace removes every block whose header carries the namespace
	// digest and returns how many it removed.
	DropNamespace(digest uint64) (int, error)
	// Stats returns the cache's counters.
	Stats() CacheStats
	// Close releases the cache; persistent tiers are made durable first.
	Close() error
}

// Ref pins one block read from a Cache.
type Ref interface {
	// Bytes returns the encoded block. The slice is owned by the cache and
	// valid until Release; the caller must not modify it.
	Bytes() []byte
	// Release unpins the block. Call it exactly once.
	Release()
}

// Errors a Cache returns, wrapped.
var (
	ErrNotFound = errors.New("node: block not cached")
	ErrFull     = errors.New("node: cache full")
	ErrClosed   = errors.New("node: cache closed")
)

// BlockInfo describes a cached block.
type BlockInfo struct {
	Tier string // "hbm", "dram" or "nvme"
	Size int    // encoded bytes, header and payload
}

// TierStats describe one tier's contents.
type TierStats struct {
	Name     string
	Blocks   int64
	Bytes    int64 // encoded bytes held
	Capacity int64 // configured limit in bytes
}

// NamespaceStats describe one namespace's blocks.
type NamespaceStats struct {
	Digest                uint64
	Blocks, Bytes, Tokens int64
}

// CacheStats are a Cache's counters. Counts are totals since the cache was
// opened.
type CacheStats struct {
	Tiers                                          []TierStats
	Hits, Misses, Evictions, Demotions, Promotions int64
	Namespaces                                     []NamespaceStats
}
