package node

import (
	"context"
	"errors"
	"time"

	"github.com/kvmesh/kvmesh/auth"
	"github.com/kvmesh/kvmesh/block"
	"github.com/kvmesh/kvmesh/prefixhash"
	"github.com/kvmesh/kvmesh/store"
)

// Cache is the cache as the services use it: in production the cluster as
// this node sees it (store.Cluster over store.Local, see Open); in tests an
// in-memory fake. Blocks go in and come out encoded (block.Encode): a header
// that names the key, parent, tokens and layout, then the payload.
//
// Placement needs chunk keys (see store.Cluster): a block's chunk key is the
// key of the first block of its placement chunk in its prompt. Methods that
// reach other nodes turn a dead, slow or partitioned peer into a miss within
// their deadline, never into an error.
//
// All methods are safe for concurrent use.
type Cache interface {
	// Put verifies and stores an encoded block here and, in a cluster,
	// queues it for the owners of its placement chunk, chunkKey (it never
	// waits for them). block is not retained after Put returns. Errors wrap
	// ErrFull when there is no room (after eviction), block.ErrTooLarge or
	// block.ErrCorrupt (also for a block that does not fit its namespace's
	// layout), ErrClosed after Close.
	Put(ctx context.Context, block []byte, chunkKey prefixhash.Key) error
	// Get returns the encoded block stored under key on this node,
	// verified, pinned until Ref.Release. A miss is an error wrapping
	// ErrNotFound.
	Get(ctx context.Context, key prefixhash.Key) (Ref, error)
	// Read returns the encoded blocks of keys from wherever the cache
	// reaches: blocks[i] is nil on a miss. chunkKeys[i] places keys[i]; nil
	// means unknown (a cluster then asks every member). Remote reads end by
	// remoteBy (zero: the cache's own timeout). The blocks are read-only and
	// valid until release, which is non-nil when err is nil and must be
	// called once. The error is the context's or ErrClosed.
	Read(ctx context.Context, keys, chunkKeys []prefixhash.Key, remoteBy time.Time) (blocks [][]byte, release func(), err error)
	// Exists reports which keys are cached anywhere the cache reaches;
	// chunkKeys as in Read.
	Exists(ctx context.Context, keys, chunkKeys []prefixhash.Key) ([]bool, error)
	// Locate returns the length n of the longest cached prefix of chain
	// (a prompt's keys from block 0, blocks of blockTokens tokens) and
	// where its blocks are: runs of consecutive blocks in one place, in
	// order, whose Blocks add up to n.
	Locate(ctx context.Context, chain []prefixhash.Key, blockTokens int) (n int, runs []Location)
	// Resume applies the hit rule of a namespace with groups (its groups,
	// in order) to chain: the longest prefix a reader can resume at, what
	// each group allows, and where the anchor group's records of it are
	// (as Locate's runs).
	Resume(ctx context.Context, groups []prefixhash.Group, blockTokens int, chain []prefixhash.Key) (prefixhash.Hit, []Location)
	// Publish queues the blocks of keys held on this node for the owners
	// of their chunks (chunkKeys, one per key) and returns how many it
	// queued. Blocks that arrived through the data plane, which carries no
	// placement, need it.
	Publish(ctx context.Context, keys, chunkKeys []prefixhash.Key) (int, error)
	// ChunkBlocks returns the number of blocks of a placement chunk for
	// blocks of blockTokens tokens.
	ChunkBlocks(blockTokens int) int
	// LongestPrefix returns how many leading keys of keys are cached on
	// this node (its own tiers only: peers ask it this) as blocks that a
	// request with access a may see.
	LongestPrefix(a auth.Access, keys []prefixhash.Key) int
	// Info describes a block cached on this node, if a request with
	// access a may see it, without reading it.
	Info(a auth.Access, key prefixhash.Key) (BlockInfo, bool)
	// DropNamespace removes every block whose header carries the namespace
	// digest from this node and returns how many it removed.
	DropNamespace(digest uint64) (int, error)
	// Stats returns this node's counters.
	Stats() CacheStats
	// Close releases the cache; persistent tiers are made durable first.
	Close() error
}

// Location is where a run of consecutive cached blocks is: on this node
// (Node empty), in Tier, or on another node (Tier unknown, empty).
type Location struct {
	Node   string
	Tier   string
	Blocks int
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
	// ErrQuota comes wrapped with ErrFull: the block's namespace has no
	// room within its quota.
	ErrQuota = store.ErrQuota
)

// BlockInfo describes a cached block.
type BlockInfo struct {
	Tier string // "hbm", "dram" or "nvme"
	Size int    // encoded bytes, header and payload
	// Retention is its pin and the TTL left (store.Local.Retain).
	Retention block.Retention
}

// TierStats describe one tier's contents.
type TierStats struct {
	Name     string
	Blocks   int64
	Bytes    int64 // encoded bytes held
	Capacity int64 // configured limit in bytes
	// Warm is memory the tier keeps for reuse though it holds no block
	// (DRAM's emptied slabs kept warm: tiers.Stats.Warm).
	Warm int64
	// Evicted counts the blocks that left the tier, by reason
	// (store.TierEvictions).
	Evicted store.TierEvictions
	// WrittenBytes counts the bytes written to the tier (NVMe; 0 for
	// the others: store.TierStats.WrittenBytes).
	WrittenBytes int64
}

// NamespaceStats describe one namespace's blocks.
type NamespaceStats struct {
	Digest                uint64
	Tenant                uint64 // tag of the tenant whose blocks these are; 0: none (or not read yet)
	Blocks, Bytes, Tokens int64
	// DRAMBytes and NVMeBytes split Bytes by tier; QuotaDRAM and QuotaNVMe
	// are the namespace's quota in force (0: unlimited). Zero for a cache
	// without tiers or quotas.
	DRAMBytes, NVMeBytes int64
	QuotaDRAM, QuotaNVMe int64
}

// CacheStats are a Cache's counters. Counts are totals since the cache was
// opened.
type CacheStats struct {
	Tiers                                          []TierStats
	Hits, Misses, Evictions, Demotions, Promotions int64
	// PromotionsDeferred counts second hits on NVMe served from the read
	// while another promotion was making room (store.Stats).
	PromotionsDeferred int64
	// QuotaRefused counts writes refused by their namespace's quota;
	// CorruptDrops, blocks dropped because they failed verification when
	// read (counted in Misses too).
	QuotaRefused, CorruptDrops int64
	// Retained values are under a pin or a lease; PinnedBytes is what the
	// hard pins and leases hold; Removed counts values removed by key
	// (objects; store.Stats).
	Retained, PinnedBytes, Removed int64
	Namespaces                     []NamespaceStats
	// Parts are the counters of blocks assembled from the parts of
	// parallel ranks (store.Stats' Part fields).
	Parts PartStats
	// SecondChances and ReusedBlocks are the eviction policy's own signal
	// (store.Stats; zero but under store.EvictReuse); BranchingBlocks are
	// the cached blocks with two or more cached children (store.Stats).
	SecondChances, ReusedBlocks, BranchingBlocks int64
}

// PartStats counts the parts of blocks put by parallel ranks: incomplete
// blocks open and their bytes, parts stored, blocks completed, parts
// refused as conflicting, incomplete blocks expired and dropped for room,
// and claims answered by block.ClaimStatus (write, complete, covered,
// claimed).
type PartStats struct {
	Open                                           int64
	Bytes                                          int64
	Stored, Completed, Conflicts, Expired, Dropped int64
	Claims                                         [4]int64
}
