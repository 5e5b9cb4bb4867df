package store

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvmesh/kvmesh/block"
	"github.com/kvmesh/kvmesh/prefixhash"
)

// Membership is what a Cluster needs to know about the other nodes. The node
// implements it with memberlist.
type Membership interface {
	// LocalID returns this node's member id.
	LocalID() string
	// Members returns the members believed alive, this node included, and
	// a version that changes whenever the list does.
	Members() ([]Member, uint64)
}

// Peers reaches the other members. The node implements it with the transfer
// engine for bytes and gRPC for the rest. Every call must return by ctx's
// deadline; an error is treated as a miss, never passed to the caller.
type Peers interface {
	// Lookup asks member id, for each run of consecutive chain keys, how
	// many leading keys of the run it holds.
	Lookup(ctx context.Context, id string, runs [][]prefixhash.Key) ([]int, error)
	// Get fetches encoded blocks from member id: blocks[i] is the block of
	// keys[i] or nil on a miss. The blocks are valid until release is
	// called (release may be nil).
	Get(ctx context.Context, id string, keys []prefixhash.Key) (blocks [][]byte, release func(), err error)
	// Put pushes encoded blocks to member id.
	Put(ctx context.Context, id string, blocks [][]byte) error
	// Remove asks member id to drop keys (Local.Remove) and returns per
	// key whether it held it.
	Remove(ctx context.Context, id string, keys []prefixhash.Key) ([]bool, error)
	// Retain asks member id to set the retention of keys (Local.Retain)
	// and returns per key whether it applied it. A refusal over a limit
	// wraps ErrQuota or ErrRetentionTTL.
	Retain(ctx context.Context, id string, keys []prefixhash.Key, r block.Retention) ([]bool, error)
}

// ClusterOptions configure a Cluster. Zero fields take the defaults. Every
// member must use the same ChunkTokens and Replicas, or lookups miss blocks
// that are there.
type ClusterOptions struct {
	// ChunkTokens is the size of a placement chunk in tokens: every block
	// of a chunk is placed by the key of the chunk's first block. Default
	// prefixhash.DefaultChunkTokens (512).
	ChunkTokens int
	// Replicas is R, the number of owners of a chunk. Default 1.
	Replicas int
	// LookupTimeout bounds the remote rounds of LongestPrefix, all of them
	// together; a peer that has not answered by then counts as a miss.
	// Default 100ms.
	LookupTimeout time.Duration
	// LookupRoundPeers bounds the fan-out of a long lookup (see rounds in
	// cluster_lookup.go): a lookup whose chunks have at most this many
	// owners besides this node asks them all in one round; one with more
	// asks the first chunk's owners, then up to this many more peers, then
	// the rest, stopping at the first round that finds the prefix's end.
	// Default 16; negative: one round always, whatever the fan-out.
	LookupRoundPeers int
	// GetTimeout bounds the remote round of Get. Default 2s.
	GetTimeout time.Duration
	// PushTimeout bounds one push of a batch to an owner. Default 5s.
	PushTimeout time.Duration
	// PushQueueBytes bounds the bytes queued for one peer; blocks that do
	// not fit are dropped and counted (a Put never waits for a peer).
	// Default 64 MiB.
	PushQueueBytes int64
	// PushBatchBytes is the most one push carries. Default 16 MiB.
	PushBatchBytes int64
	// PushYield is the longest a push batch waits for the node's
	// foreground work (gets, lookups, what Foreground marks) to end before
	// it goes anyway, so that pushes yield to serving but never starve. A
	// queue at least half full (PushQueueBytes) goes without waiting, so
	// yielding never drops a block. Default 0: pushes do not wait (the
	// gain is not shown on a 2-core machine: BENCHMARKS.md); 2s is a sane
	// bound where it helps. Negative: the same as 0.
	PushYield time.Duration
	// PushBytesPerSec bounds the rate of pushes to owners, all owners
	// together on average (each batch waits its size over the rate); a
	// queue at least half full goes without waiting. Default 0: no bound.
	PushBytesPerSec int64
	// KeepRemote caches blocks fetched from peers in the local tiers too.
	// Default false: pooled capacity then holds each block once (R times),
	// which is what gives random routing its hit ratio.
	KeepRemote bool
}

// DefaultLookupRoundPeers is ClusterOptions.LookupRoundPeers' default.
const DefaultLookupRoundPeers = 16

// EnsureDefaults fills zero fields with their defaults.
func (o *ClusterOptions) EnsureDefaults() {
	if o.ChunkTokens == 0 {
		o.ChunkTokens = prefixhash.DefaultChunkTokens
	}
	if o.Replicas == 0 {
		o.Replicas = 1
	}
	if o.LookupTimeout == 0 {
		o.LookupTimeout = 100 * time.Millisecond
	}
	if o.LookupRoundPeers == 0 {
		o.LookupRoundPeers = DefaultLookupRoundPeers
	}
	if o.GetTimeout == 0 {
		o.GetTimeout = 2 * time.Second
	}
	if o.PushTimeout == 0 {
		o.PushTimeout = 5 * time.Second
	}
	if o.PushQueueBytes == 0 {
		o.PushQueueBytes = 64 << 20
	}
	if o.PushBatchBytes == 0 {
		o.PushBatchBytes = 16 << 20
	}
}

// Validate reports the first field that makes o unusable.
func (o *ClusterOptions) Validate() error {
	switch {
	case o.ChunkTokens < 1:
		return fmt.Errorf("store: cluster options: ChunkTokens: %d must be positive", o.ChunkTokens)
	case o.Replicas < 1 || o.Replicas > 8:
		return fmt.Errorf("store: cluster options: Replicas: %d is outside 1..8", o.Replicas)
	case o.LookupTimeout <= 0 || o.GetTimeout <= 0 || o.PushTimeout <= 0:
		return errors.New("store: cluster options: LookupTimeout, GetTimeout and PushTimeout must be positive")
	case o.PushQueueBytes < 1 || o.PushBatchBytes < 1:
		return errors.New("store: cluster options: PushQueueBytes and PushBatchBytes must be positive")
	case o.PushBytesPerSec < 0:
		return fmt.Errorf("store: cluster options: PushBytesPerSec: %d must not be negative", o.PushBytesPerSec)
	}
	return nil
}

// ClusterStats count what the cluster layer did, on top of Local's Stats.
type ClusterStats struct {
	RemoteLookups     uint64 // lookup RPCs sent
	RemoteLookupFails uint64 // lookup RPCs that failed or timed out (counted as misses)
	RemoteGets        uint64 // get RPCs sent
	RemoteGetFails    uint64 // get RPCs that failed or timed out (counted as misses)
	RemoteHits        uint64 // blocks served by peers
	RemoteMisses      uint64 // blocks asked of peers that they did not have
	RemoteCorrupt     uint64 // blocks from peers that failed verification (dropped)
	Pushed            uint64 // blocks pushed to their owners
	PushDropped       uint64 // blocks not pushed: queue full or owner gone
	PushFailed        uint64 // blocks whose push failed
	PushYields        uint64 // push batches that waited for foreground work
	PushYieldTimeouts uint64 // of those, the ones that went after PushYield with foreground work still in flight
	PushWorkers       uint64 // push workers running now: one per owner with a queue (a goroutine and its queue each)
}

// Cluster is the cache of the whole cluster as one node sees it: blocks are
// placed on owners by rendezvous hashing of their placement-chunk keys; a
// lookup asks every owner at once; a get reads local tiers first, then the
// owners; a put keeps the blocks locally and pushes them to their owners in
// the background, yielding to the node's serving work (see Foreground). Peer
// failures become misses within the deadlines, never errors or hangs. All
// methods are safe for concurrent use.
//
// Placement needs each block's chunk key, which a block does not carry (it
// does not know its position in its prompt). Methods take a chain from
// block 0 (LongestPrefix, Locate, Get), from which chunk keys follow, or
// keys with their chunk keys (GetKeys, Exists, Put, Publish). GetKeys and
// Exists also accept keys alone: they then ask every member, one more round.
type Cluster struct {
	local   *Local
	members Membership
	peers   Peers
	opts    ClusterOptions
	self    string

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	fg    foreground
	after func(time.Duration) <-chan time.Time // time.After; tests replace it

	mu struct {
		sync.Mutex
		version   uint64
		placement *Placement
		queues    map[string]*pushQueue
		closed    bool
	}
	c struct {
		remoteLookups, remoteLookupFails, remoteGets, remoteGetFails atomic.Uint64
		remoteHits, remoteMisses, remoteCorrupt                      atomic.Uint64
		pushed, pushDropped, pushFailed                              atomic.Uint64
		pushYields, pushYieldTimeouts                                atomic.Uint64
	}
}

// NewCluster returns a Cluster over local. The caller keeps ownership of
// local, members and peers, and closes the Cluster before them.
func NewCluster(local *Local, members Membership, peers Peers, opts ClusterOptions) (*Cluster, error) {
	opts.EnsureDefaults()
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	c := &Cluster{local: local, members: members, peers: peers, opts: opts, self: members.LocalID(), after: time.After}
	c.ctx, c.cancel = context.WithCancel(context.Background())
	c.mu.queues = make(map[string]*pushQueue)
	return c, nil
}

// Local returns the node's own store.
func (c *Cluster) Local() *Local { return c.local }

// ChunkBlocks returns C for blocks of blockTokens tokens.
func (c *Cluster) ChunkBlocks(blockTokens int) int {
	return prefixhash.ChunkBlocks(blockTokens, c.opts.ChunkTokens)
}

// placement returns the placement for the current membership, rebuilt only
// when the membership version changed.
func (c *Cluster) placement() *Placement {
	ms, v := c.members.Members()
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.mu.placement == nil || v != c.mu.version {
		c.mu.placement = NewPlacement(ms, c.opts.Replicas)
		c.mu.version = v
		// Wake the push workers of owners that left, so that they retire.
		for id, q := range c.mu.queues {
			if !slices.ContainsFunc(ms, func(m Member) bool { return m.ID == id }) {
				select {
				case q.wake <- struct{}{}:
				default:
				}
			}
		}
	}
	return c.mu.placement
}

// Owners returns the owners of the chunk whose placement key is chunkKey,
// best first.
func (c *Cluster) Owners(chunkKey prefixhash.Key) []string {
	return c.placement().Owners(nil, chunkKey)
}

// ChunkKeys returns the placement key of each of blocks from..to-1 of chain.
func (c *Cluster) ChunkKeys(chain []prefixhash.Key, blockTokens, from, to int) []prefixhash.Key {
	cb := c.ChunkBlocks(blockTokens)
	out := make([]prefixhash.Key, 0, to-from)
	for i := from; i < to; i++ {
		out = append(out, prefixhash.ChunkKey(chain, i, cb))
	}
	return out
}

// Stats returns the cluster layer's counters.
func (c *Cluster) Stats() ClusterStats {
	c.mu.Lock()
	workers := len(c.mu.queues)
	c.mu.Unlock()
	return ClusterStats{PushWorkers: uint64(workers),
		RemoteLookups: c.c.remoteLookups.Load(), RemoteLookupFails: c.c.remoteLookupFails.Load(),
		RemoteGets: c.c.remoteGets.Load(), RemoteGetFails: c.c.remoteGetFails.Load(),
		RemoteHits: c.c.remoteHits.Load(), RemoteMisses: c.c.remoteMisses.Load(), RemoteCorrupt: c.c.remoteCorrupt.Load(),
		Pushed: c.c.pushed.Load(), PushDropped: c.c.pushDropped.Load(), PushFailed: c.c.pushFailed.Load(),
		PushYieldTimeouts: c.c.pushYieldTimeouts.Load(), PushYields: c.c.pushYields.Load(), // never fewer yields than timeouts
	}
}

// Close stops the push workers, dropping what is still queued (counted).
// Call Flush first to push it. The local store stays open.
func (c *Cluster) Close() error {
	c.mu.Lock()
	if c.mu.closed {
		c.mu.Unlock()
		return nil
	}
	c.mu.closed = true
	c.mu.Unlock()
	c.cancel()
	c.wg.Wait()
	return nil
}
