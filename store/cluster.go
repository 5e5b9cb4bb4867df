package store

import (
	"context"
	"errors"
	"fmt"
	"github.com/kvmesh/kvmesh/auth"
	"github.com/kvmesh/kvmesh/block"
	"slices"
	"sync"
	"sync/atomic"
	"time"

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
	// LookupTimeout bounds the remote round of LongestPrefix; a peer that
	// has not answered by then counts as a miss. Default 100ms.
	LookupTimeout time.Duration
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
	// KeepRemote caches blocks fetched from peers in the local tiers too.
	// Default false: pooled capacity then holds each block once (R times),
	// which is what gives random routing its hit ratio.
	KeepRemote bool
}

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
}

// Cluster is the cache of the whole cluster as one node sees it: blocks are
// placed on owners by rendezvous hashing of their placement-chunk keys; a
// lookup asks every owner at once; a get reads local tiers first, then the
// owners; a put keeps the blocks locally and pushes them to their owners in
// the background. Peer failures become misses within the deadlines, never
// errors or hangs. All methods are safe for concurrent use.
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
	}
}

// NewCluster returns a Cluster over local. The caller keeps ownership of
// local, members and peers, and closes the Cluster before them.
func NewCluster(local *Local, members Membership, peers Peers, opts ClusterOptions) (*Cluster, error) {
	opts.EnsureDefaults()
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	c := &Cluster{local: local, members: members, peers: peers, opts: opts, self: members.LocalID()}
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

// LongestPrefix returns how many leading blocks of chain are cached anywhere
// in the cluster. chain holds the keys of a prompt's blocks from block 0, of
// blockTokens tokens each. The local tiers answer first; the rest is asked
// of every owner at once, in one round bounded by LookupTimeout. A peer that
// fails or is late counts as a miss.
func (c *Cluster) LongestPrefix(ctx context.Context, chain []prefixhash.Key, blockTokens int) int {
	n, _ := c.lookup(ctx, chain, blockTokens, false)
	return n
}

// Locate is LongestPrefix that also says where the prefix is: where[i] is the
// id of the member that holds block i (this node's own id for blocks it
// holds), for i < n.
func (c *Cluster) Locate(ctx context.Context, chain []prefixhash.Key, blockTokens int) (n int, where []string) {
	return c.lookup(ctx, chain, blockTokens, true)
}

func (c *Cluster) lookup(ctx context.Context, chain []prefixhash.Key, blockTokens int, locate bool) (int, []string) {
	n := c.local.LongestPrefix(auth.AccessFrom(ctx), chain)
	if n == len(chain) {
		if locate {
			return n, slices.Repeat([]string{c.self}, n)
		}
		return n, nil
	}
	cb := c.ChunkBlocks(blockTokens)
	p := c.placement()

	// The runs from block n on, one per chunk, with who to ask.
	type run struct {
		start, end int
		local      int    // leading blocks held here
		have       int    // best count so far
		by         string // the member that answered have, when more than local
	}
	var runs []run
	asks := map[string][]int{} // owner → indexes into runs
	var owners []string
	for s := prefixhash.ChunkStart(n, cb); s < len(chain); s += cb {
		r := run{start: max(s, n), end: min(s+cb, len(chain))}
		if r.start > n {
			// Blocks beyond the local prefix may still be here (a
			// producer keeps what it computed).
			r.local = c.local.LongestPrefix(auth.AccessFrom(ctx), chain[r.start:r.end])
			r.have = r.local
		}
		runs = append(runs, r)
		owners = p.Owners(owners[:0], chain[s])
		for _, o := range owners {
			if o != c.self {
				asks[o] = append(asks[o], len(runs)-1)
			}
		}
	}
	c.lookupRound(ctx, asks, func(idx []int) [][]prefixhash.Key {
		runsOf := make([][]prefixhash.Key, len(idx))
		for k, ri := range idx {
			runsOf[k] = chain[runs[ri].start:runs[ri].end]
		}
		return runsOf
	}, func(o string, idx, counts []int) {
		for k, ri := range idx {
			if got := min(counts[k], runs[ri].end-runs[ri].start); got > runs[ri].have {
				runs[ri].have, runs[ri].by = got, o
			}
		}
	})
	total := len(chain)
	for _, r := range runs {
		if r.have < r.end-r.start {
			total = r.start + r.have
			break
		}
	}
	if !locate {
		return total, nil
	}
	where := make([]string, n, total) // sized once: 8k appends would copy it a dozen times
	for i := range n {
		where[i] = c.self
	}
	for _, r := range runs {
		for i := r.start; i < min(r.start+r.have, total); i++ {
			if i-r.start < r.local {
				where = append(where, c.self)
			} else {
				where = append(where, r.by)
			}
		}
	}
	return total, where
}

// lookupRound asks every member of asks at once, in one round bounded by
// LookupTimeout: member o gets the runs runsOf(asks[o]) builds, and apply
// records its answer (serialized; a member that fails or is late is not
// applied: a miss for each of its runs).
func (c *Cluster) lookupRound(ctx context.Context, asks map[string][]int, runsOf func(idx []int) [][]prefixhash.Key, apply func(o string, idx, counts []int)) {
	if len(asks) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, c.opts.LookupTimeout)
	defer cancel()
	var mu sync.Mutex
	var wg sync.WaitGroup
	for o, idx := range asks {
		wg.Add(1)
		go func() {
			defer wg.Done()
			counts, ok := c.askLookup(ctx, o, runsOf(idx))
			if !ok {
				return
			}
			mu.Lock()
			apply(o, idx, counts)
			mu.Unlock()
		}()
	}
	wg.Wait()
}

// keyRuns returns keys[k:k+1] for each k of idx: one run per key.
func keyRuns(keys []prefixhash.Key, idx []int) [][]prefixhash.Key {
	runs := make([][]prefixhash.Key, len(idx))
	for j, k := range idx {
		runs[j] = keys[k : k+1]
	}
	return runs
}

// askLookup sends one lookup RPC and counts it; ok is false when it failed
// (a miss for every run).
func (c *Cluster) askLookup(ctx context.Context, id string, runs [][]prefixhash.Key) ([]int, bool) {
	c.c.remoteLookups.Add(1)
	counts, err := c.peers.Lookup(ctx, id, runs)
	if err != nil || len(counts) != len(runs) {
		c.c.remoteLookupFails.Add(1)
		return nil, false
	}
	return counts, true
}

// Fetched holds blocks returned by Cluster.Get. Blocks[i] is the verified
// encoded block of the i-th requested key, or nil on a miss. The bytes are
// valid until Release.
type Fetched struct {
	Blocks   [][]byte
	releases []func()
}

// Release returns every block's memory. The blocks must not be used after.
func (f *Fetched) Release() {
	if f == nil {
		return
	}
	for _, r := range f.releases {
		r()
	}
	f.releases, f.Blocks = nil, nil
}

// Get returns blocks from..to-1 of chain (see LongestPrefix). Local tiers
// answer first; the rest is fetched from the owners in parallel, bounded by
// GetTimeout. Every block from a peer is verified (Decode, and its key must
// be the one asked for); a failed, late or corrupt answer is a miss. The
// error is only the caller's context or a closed store.
func (c *Cluster) Get(ctx context.Context, chain []prefixhash.Key, blockTokens, from, to int) (*Fetched, error) {
	if from < 0 || to > len(chain) || from > to {
		return nil, fmt.Errorf("store: cluster get: range [%d,%d) of a %d-block chain", from, to, len(chain))
	}
	return c.GetKeys(ctx, chain[from:to], c.ChunkKeys(chain, blockTokens, from, to), time.Time{})
}

// GetKeys is Get for keys that need not form a chain. chunkKeys[i] is the
// placement-chunk key of keys[i]; with chunkKeys nil (the caller does not
// know them), the keys missing here are first looked for on every member, in
// one lookup round bounded by LookupTimeout. Remote fetches end by remoteBy,
// or GetTimeout from now when that is sooner (remoteBy zero: GetTimeout), so
// a caller that reads a long list in several calls can bound their remote
// part as a whole. The local tiers answer under ctx alone.
func (c *Cluster) GetKeys(ctx context.Context, keys, chunkKeys []prefixhash.Key, remoteBy time.Time) (*Fetched, error) {
	if chunkKeys != nil && len(chunkKeys) != len(keys) {
		return nil, fmt.Errorf("store: cluster get: %d keys but %d chunk keys", len(keys), len(chunkKeys))
	}
	refs, err := c.local.GetMany(ctx, keys)
	if err != nil {
		return nil, err
	}
	f := &Fetched{Blocks: make([][]byte, len(keys))}
	var missing []int
	for k, r := range refs {
		if r != nil {
			f.Blocks[k] = r.Bytes()
			f.releases = append(f.releases, r.Release)
		} else {
			missing = append(missing, k)
		}
	}
	if len(missing) == 0 {
		return f, nil
	}
	rctx, cancel := remoteContext(ctx, remoteBy, c.opts.GetTimeout)
	defer cancel()
	if chunkKeys != nil {
		// Round r asks each still-missing key's r-th remote owner, so a
		// replica answers for an owner that is dead or lacks the block,
		// within the same deadline.
		p := c.placement()
		remote := make(map[int][]string, len(missing))
		for _, k := range missing {
			for _, o := range p.Owners(nil, chunkKeys[k]) {
				if o != c.self {
					remote[k] = append(remote[k], o)
				}
			}
		}
		for round := 0; rctx.Err() == nil; round++ {
			byOwner := map[string][]int{} // owner → indexes into keys
			for _, k := range missing {
				if os := remote[k]; f.Blocks[k] == nil && round < len(os) {
					byOwner[os[round]] = append(byOwner[os[round]], k)
				}
			}
			if len(byOwner) == 0 {
				break
			}
			c.fetch(rctx, keys, byOwner, f)
		}
	} else {
		byOwner := map[string][]int{} // owner → indexes into keys
		for j, h := range c.whoHas(rctx, keys, missing) {
			if h != "" {
				byOwner[h] = append(byOwner[h], missing[j])
			}
		}
		c.fetch(rctx, keys, byOwner, f)
	}
	if err := ctx.Err(); err != nil {
		f.Release()
		return nil, err
	}
	return f, nil
}

// remoteContext bounds ctx by by and by timeout from now, whichever comes
// first (by zero: timeout alone).
func remoteContext(ctx context.Context, by time.Time, timeout time.Duration) (context.Context, context.CancelFunc) {
	dl := time.Now().Add(timeout)
	if !by.IsZero() && by.Before(dl) {
		dl = by
	}
	return context.WithDeadline(ctx, dl)
}

// fetch reads keys[idx] from each owner in byOwner, in parallel under ctx,
// verifies what arrives and records it in f.
func (c *Cluster) fetch(ctx context.Context, keys []prefixhash.Key, byOwner map[string][]int, f *Fetched) {
	var mu sync.Mutex
	var wg sync.WaitGroup
	for o, idx := range byOwner {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ks := make([]prefixhash.Key, len(idx))
			for j, k := range idx {
				ks[j] = keys[k]
			}
			c.c.remoteGets.Add(1)
			blocks, release, err := c.peers.Get(ctx, o, ks)
			if err != nil || len(blocks) != len(ks) {
				c.c.remoteGetFails.Add(1)
				if release != nil {
					release()
				}
				return
			}
			kept := false
			for j, b := range blocks {
				if b == nil {
					c.c.remoteMisses.Add(1)
					continue
				}
				blk, err := block.Decode(b, c.local.opts.MaxBlockBytes)
				if err != nil || blk.Key != ks[j] {
					c.c.remoteCorrupt.Add(1)
					continue
				}
				c.c.remoteHits.Add(1)
				if c.opts.KeepRemote {
					_ = c.local.Put(ctx, b) // best effort: a full node still serves the copy
				}
				mu.Lock()
				f.Blocks[idx[j]] = b
				mu.Unlock()
				kept = true
			}
			if release != nil {
				if kept {
					mu.Lock()
					f.releases = append(f.releases, release)
					mu.Unlock()
				} else {
					release()
				}
			}
		}()
	}
	wg.Wait()
}

// whoHas asks every other member, in one parallel round bounded by
// LookupTimeout, which of keys[idx] it holds, and returns for each the id of
// a member that does ("" when none answered yes). Members are preferred in id
// order, so the answer does not depend on which replied first.
func (c *Cluster) whoHas(ctx context.Context, keys []prefixhash.Key, idx []int) []string {
	asks := map[string][]int{}
	var others []string
	for _, m := range c.placement().Members() {
		if m.ID != c.self {
			others = append(others, m.ID)
			asks[m.ID] = idx
		}
	}
	answers := map[string][]int{}
	c.lookupRound(ctx, asks, func(idx []int) [][]prefixhash.Key { return keyRuns(keys, idx) },
		func(o string, _, counts []int) { answers[o] = counts })
	out := make([]string, len(idx))
	for j := range idx {
		for _, o := range others {
			if a := answers[o]; a != nil && a[j] > 0 {
				out[j] = o
				break
			}
		}
	}
	return out
}

// Exists reports which keys are cached anywhere in the cluster: here, or on
// an owner of chunkKeys[i] (with chunkKeys nil, on any member). The remote
// part is one parallel round bounded by LookupTimeout; a peer that fails or
// is late counts as not holding its keys.
func (c *Cluster) Exists(ctx context.Context, keys, chunkKeys []prefixhash.Key) ([]bool, error) {
	if chunkKeys != nil && len(chunkKeys) != len(keys) {
		return nil, fmt.Errorf("store: cluster exists: %d keys but %d chunk keys", len(keys), len(chunkKeys))
	}
	present := make([]bool, len(keys))
	var missing []int
	for k, key := range keys {
		if present[k] = c.local.Contains(auth.AccessFrom(ctx), key); !present[k] {
			missing = append(missing, k)
		}
	}
	if len(missing) == 0 {
		return present, nil
	}
	if chunkKeys == nil {
		for j, h := range c.whoHas(ctx, keys, missing) {
			present[missing[j]] = h != ""
		}
		return present, ctx.Err()
	}
	p := c.placement()
	asks := map[string][]int{} // owner → indexes into keys
	var owners []string
	for _, k := range missing {
		owners = p.Owners(owners[:0], chunkKeys[k])
		for _, o := range owners {
			if o != c.self {
				asks[o] = append(asks[o], k)
			}
		}
	}
	c.lookupRound(ctx, asks, func(idx []int) [][]prefixhash.Key { return keyRuns(keys, idx) },
		func(_ string, idx, counts []int) {
			for j, k := range idx {
				present[k] = present[k] || counts[j] > 0
			}
		})
	return present, ctx.Err()
}

// Publish queues the blocks of keys that this node holds for the owners of
// their placement chunks (chunkKeys[i] places keys[i]), as Put does for the
// blocks it stores; keys not held here are skipped. It is for blocks that
// reached the local store without their placement (the data plane carries
// keys and bytes only). It returns how many blocks it queued for at least
// one other owner. Like Put, it never waits for a peer.
func (c *Cluster) Publish(ctx context.Context, keys, chunkKeys []prefixhash.Key) (int, error) {
	if len(chunkKeys) != len(keys) {
		return 0, fmt.Errorf("store: cluster publish: %d keys but %d chunk keys", len(keys), len(chunkKeys))
	}
	p := c.placement()
	var owners []string
	var want []prefixhash.Key
	var wantOwners [][]string
	for k, key := range keys {
		var remote []string
		for _, o := range p.Owners(owners[:0], chunkKeys[k]) {
			if o != c.self {
				remote = append(remote, o)
			}
		}
		if len(remote) > 0 {
			want = append(want, key)
			wantOwners = append(wantOwners, remote)
		}
	}
	if len(want) == 0 {
		return 0, nil
	}
	refs, err := c.local.GetMany(ctx, want)
	if err != nil {
		return 0, err
	}
	n := 0
	for j, r := range refs {
		if r == nil {
			continue
		}
		for _, o := range wantOwners[j] {
			c.enqueue(o, r.Bytes())
		}
		r.Release()
		n++
	}
	return n, nil
}

// Put stores blocks locally (the producer keeps what it computed) and queues
// each for the owners of its placement chunk, whose key is chunkKeys[i].
// Pushes run in the background through a bounded queue per owner: when a
// queue is full the block is dropped and counted; Put never waits for a
// peer. The error is the local store's (see Local.PutMany): a block it
// refused is not pushed.
func (c *Cluster) Put(ctx context.Context, blocks [][]byte, chunkKeys []prefixhash.Key) error {
	if len(blocks) != len(chunkKeys) {
		return fmt.Errorf("store: cluster put: %d blocks but %d chunk keys", len(blocks), len(chunkKeys))
	}
	var errs []error
	p := c.placement()
	var owners []string
	for k, b := range blocks {
		if err := c.local.Put(ctx, b); err != nil {
			if ctx.Err() != nil {
				return errors.Join(append(errs, err)...)
			}
			errs = append(errs, fmt.Errorf("block %d: %w", k, err))
			continue
		}
		owners = p.Owners(owners[:0], chunkKeys[k])
		for _, o := range owners {
			if o != c.self {
				c.enqueue(o, b)
			}
		}
	}
	return errors.Join(errs...)
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
	return ClusterStats{
		RemoteLookups: c.c.remoteLookups.Load(), RemoteLookupFails: c.c.remoteLookupFails.Load(),
		RemoteGets: c.c.remoteGets.Load(), RemoteGetFails: c.c.remoteGetFails.Load(),
		RemoteHits: c.c.remoteHits.Load(), RemoteMisses: c.c.remoteMisses.Load(), RemoteCorrupt: c.c.remoteCorrupt.Load(),
		Pushed: c.c.pushed.Load(), PushDropped: c.c.pushDropped.Load(), PushFailed: c.c.pushFailed.Load(),
	}
}

// Flush waits until every queued push has been attempted, or ctx ends. For
// tests, benchmarks and graceful shutdown.
func (c *Cluster) Flush(ctx context.Context) error {
	c.mu.Lock()
	qs := make([]*pushQueue, 0, len(c.mu.queues))
	for _, q := range c.mu.queues {
		qs = append(qs, q)
	}
	c.mu.Unlock()
	for _, q := range qs {
		if err := q.flush(ctx); err != nil {
			return err
		}
	}
	return nil
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

// pushQueue holds copies of blocks waiting to go to one owner.
type pushQueue struct {
	c  *Cluster
	id string

	mu struct {
		sync.Mutex
		blocks   [][]byte
		bytes    int64
		inflight bool
		dead     bool          // the worker exited: its owner left the membership
		idle     chan struct{} // closed when the queue is empty and nothing is in flight
	}
	wake chan struct{}
}

func (c *Cluster) enqueue(owner string, b []byte) {
	c.mu.Lock()
	if c.mu.closed {
		c.mu.Unlock()
		c.c.pushDropped.Add(1)
		return
	}
	q := c.mu.queues[owner]
	if q == nil {
		q = &pushQueue{c: c, id: owner, wake: make(chan struct{}, 1)}
		c.mu.queues[owner] = q
		c.wg.Add(1)
		go q.run()
	}
	c.mu.Unlock()

	q.mu.Lock()
	if q.mu.dead || q.mu.bytes+int64(len(b)) > c.opts.PushQueueBytes {
		q.mu.Unlock()
		c.c.pushDropped.Add(1)
		return
	}
	q.mu.blocks = append(q.mu.blocks, slices.Clone(b))
	q.mu.bytes += int64(len(b))
	if q.mu.idle == nil {
		q.mu.idle = make(chan struct{})
	}
	q.mu.Unlock()
	select {
	case q.wake <- struct{}{}:
	default:
	}
}

// run pushes batches until the cluster closes. A worker whose owner left the
// membership drops its queue and exits.
func (q *pushQueue) run() {
	defer q.c.wg.Done()
	for {
		select {
		case <-q.c.ctx.Done():
			q.dropAll()
			return
		case <-q.wake:
		}
		for {
			batch := q.take()
			if batch == nil {
				break
			}
			if !q.c.isMember(q.id) {
				q.c.c.pushDropped.Add(uint64(len(batch)))
			} else {
				ctx, cancel := context.WithTimeout(q.c.ctx, q.c.opts.PushTimeout)
				err := q.c.peers.Put(ctx, q.id, batch)
				cancel()
				if err != nil {
					q.c.c.pushFailed.Add(uint64(len(batch)))
				} else {
					q.c.c.pushed.Add(uint64(len(batch)))
				}
			}
			q.done()
		}
		if !q.c.isMember(q.id) && q.retire() {
			return
		}
	}
}

// retire removes an idle queue whose owner left, so workers do not pile up
// with membership churn. It reports whether the queue is gone; a block
// enqueued meanwhile keeps it alive.
func (q *pushQueue) retire() bool {
	q.c.mu.Lock()
	defer q.c.mu.Unlock()
	q.mu.Lock()
	defer q.mu.Unlock()
	if len(q.mu.blocks) > 0 {
		return false
	}
	q.mu.dead = true
	if q.c.mu.queues[q.id] == q {
		delete(q.c.mu.queues, q.id)
	}
	return true
}

// take removes up to PushBatchBytes from the head of the queue.
func (q *pushQueue) take() [][]byte {
	q.mu.Lock()
	defer q.mu.Unlock()
	if len(q.mu.blocks) == 0 {
		return nil
	}
	var n int
	var size int64
	for n < len(q.mu.blocks) && (n == 0 || size+int64(len(q.mu.blocks[n])) <= q.c.opts.PushBatchBytes) {
		size += int64(len(q.mu.blocks[n]))
		n++
	}
	batch := slices.Clone(q.mu.blocks[:n])
	q.mu.blocks = slices.Delete(q.mu.blocks, 0, n)
	q.mu.bytes -= size
	q.mu.inflight = true
	return batch
}

func (q *pushQueue) done() {
	q.mu.Lock()
	q.mu.inflight = false
	if len(q.mu.blocks) == 0 && q.mu.idle != nil {
		close(q.mu.idle)
		q.mu.idle = nil
	}
	q.mu.Unlock()
}

func (q *pushQueue) dropAll() {
	q.mu.Lock()
	q.c.c.pushDropped.Add(uint64(len(q.mu.blocks)))
	q.mu.blocks, q.mu.bytes = nil, 0
	if q.mu.idle != nil {
		close(q.mu.idle)
		q.mu.idle = nil
	}
	q.mu.Unlock()
}

func (q *pushQueue) flush(ctx context.Context) error {
	q.mu.Lock()
	idle := q.mu.idle
	q.mu.Unlock()
	if idle == nil {
		return nil
	}
	select {
	case <-idle:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (c *Cluster) isMember(id string) bool {
	for _, m := range c.placement().Members() {
		if m.ID == id {
			return true
		}
	}
	return false
}

// Handoff pushes the blocks this node holds in memory to the owners they
// will have once it is gone, at most maxBytes of them, and returns how many
// it pushed. Call it on a graceful leave, before leaving the membership, so
// that the hot part of the cache survives the departure. Pushes run in
// parallel per owner; a failed one is counted and skipped.
func (c *Cluster) Handoff(ctx context.Context, maxBytes int64) int {
	p := c.placement()
	var others []Member
	for _, m := range p.Members() {
		if m.ID != c.self {
			others = append(others, m)
		}
	}
	if len(others) == 0 {
		return 0
	}
	next := NewPlacement(others, c.opts.Replicas)
	byOwner := map[string][]prefixhash.Key{}
	var total int64
	for _, b := range c.local.InMemory(func(tokens int) int { return c.ChunkBlocks(tokens) }) {
		if total+int64(b.Size) > maxBytes {
			break
		}
		total += int64(b.Size)
		for _, o := range next.Owners(nil, b.ChunkKey) {
			byOwner[o] = append(byOwner[o], b.Key)
		}
	}
	var pushed atomic.Int64
	var wg sync.WaitGroup
	for o, keys := range byOwner {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for len(keys) > 0 && ctx.Err() == nil {
				var batch [][]byte
				var refs []*Ref
				var size int64
				for len(keys) > 0 && size < c.opts.PushBatchBytes {
					r, err := c.local.Get(ctx, keys[0])
					keys = keys[1:]
					if err != nil {
						continue // evicted since the walk
					}
					refs = append(refs, r)
					batch = append(batch, r.Bytes())
					size += int64(len(r.Bytes()))
				}
				if len(batch) > 0 {
					pctx, cancel := context.WithTimeout(ctx, c.opts.PushTimeout)
					if err := c.peers.Put(pctx, o, batch); err != nil {
						c.c.pushFailed.Add(uint64(len(batch)))
					} else {
						c.c.pushed.Add(uint64(len(batch)))
						pushed.Add(int64(len(batch)))
					}
					cancel()
				}
				for _, r := range refs {
					r.Release()
				}
			}
		}()
	}
	wg.Wait()
	return int(pushed.Load())
}
