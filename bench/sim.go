package bench

import (
	"context"
	"fmt"
	"sync"

	"github.com/kvmesh/kvmesh/prefixhash"
)

// SimOptions configures the simulated cluster.
type SimOptions struct {
	// Nodes is the number of simulated nodes. Default 4.
	Nodes int
	// CapacityBlocks is each node's capacity in blocks. Required.
	CapacityBlocks int
	// LocalOnly makes every node a private cache: a node holds what its own
	// requests computed and a lookup sees that node only. Otherwise the cache
	// is pooled: every block lives on the owner of its placement chunk
	// (rendezvous hashing of the chunk key) and any node's lookup sees all.
	LocalOnly bool
	// ChunkBlocks is the placement chunk size in blocks. Default
	// prefixhash.ChunkBlocks(TraceBlockTokens, 0), one 512-token block.
	ChunkBlocks int
	// Eviction is each node's eviction policy: EvictLRU (default), the
	// prefix-aware LRU kvmesh runs, or EvictOptimum, the offline optimum,
	// which needs Future.
	Eviction string
	// Future is the workload the replay will play, for EvictOptimum: the
	// optimum evicts the block whose next use is farthest, and does not
	// admit a block used later than everything it holds.
	Future *Workload
}

// Simulated eviction policies.
const (
	EvictLRU     = "lru"
	EvictOptimum = "optimum"
	// EvictDepthLRU is LRU with a penalty for chain depth (depthLRU).
	EvictDepthLRU = "lru-depth"
)

// depthCache is a simCache that uses a block's position in its chain.
type depthCache interface {
	touchAt(k prefixhash.Key, now, depth int)
	insertAt(k prefixhash.Key, now, depth int)
}

// EnsureDefaults fills zero fields with their defaults.
func (o *SimOptions) EnsureDefaults() {
	if o.Nodes == 0 {
		o.Nodes = 4
	}
	if o.ChunkBlocks == 0 {
		o.ChunkBlocks = prefixhash.ChunkBlocks(TraceBlockTokens, 0)
	}
	if o.Eviction == "" {
		o.Eviction = EvictLRU
	}
}

// Validate names the first field that is out of range.
func (o *SimOptions) Validate() error {
	switch {
	case o.Nodes < 1:
		return fmt.Errorf("bench: sim: nodes %d must be at least 1", o.Nodes)
	case o.CapacityBlocks < 1:
		return fmt.Errorf("bench: sim: capacity_blocks %d must be at least 1", o.CapacityBlocks)
	case o.ChunkBlocks < 1:
		return fmt.Errorf("bench: sim: chunk_blocks %d must be at least 1", o.ChunkBlocks)
	case o.Eviction != EvictLRU && o.Eviction != EvictOptimum && o.Eviction != EvictDepthLRU:
		return fmt.Errorf("bench: sim: eviction %q: want %s, %s or %s", o.Eviction, EvictLRU, EvictDepthLRU, EvictOptimum)
	case o.Eviction == EvictOptimum && o.Future == nil:
		return fmt.Errorf("bench: sim: eviction %s needs the workload's future", EvictOptimum)
	}
	return nil
}

// Sim is an in-process model of a kvmesh cluster for trace replays: each
// node is an LRU of block keys bounded in blocks, with kvmesh's placement
// (rendezvous hashing of chunk keys, replication 1) and its prefix-aware
// recency (lookups and puts touch a chain deepest-first, so a node evicts
// descendants before their ancestors). It moves no bytes and has no
// network: its hit ratios show what placement and capacity allow, its
// latencies are those of a map. Its figures are reported with backend
// "simulation" and are never kvmesh measurements. A Sim is safe for
// concurrent use.
type Sim struct {
	opts   SimOptions
	caches []simCache
	nodes  []Node
}

// simCache is one simulated node's cache of keys; now is the index of the
// request in the trace (Prompt.Request).
type simCache interface {
	contains(k prefixhash.Key) bool
	touch(k prefixhash.Key, now int)
	insert(k prefixhash.Key, now int)
	len() int
	evictions() int
}

var _ Cluster = (*Sim)(nil)

// NewSim returns a simulated cluster.
func NewSim(o SimOptions) (*Sim, error) {
	o.EnsureDefaults()
	if err := o.Validate(); err != nil {
		return nil, err
	}
	s := &Sim{opts: o}
	var uses map[prefixhash.Key][]int32
	if o.Eviction == EvictOptimum {
		uses = o.Future.uses()
	}
	for i := range o.Nodes {
		switch o.Eviction {
		case EvictOptimum:
			s.caches = append(s.caches, newOptimum(o.CapacityBlocks, uses))
		case EvictDepthLRU:
			s.caches = append(s.caches, newDepthLRU(o.CapacityBlocks))
		default:
			s.caches = append(s.caches, newLRU(o.CapacityBlocks))
		}
		s.nodes = append(s.nodes, &simNode{sim: s, id: i})
	}
	return s, nil
}

// SimCluster is a ClusterFactory that starts a Sim.
func SimCluster(_ context.Context, spec ClusterSpec) (Cluster, error) {
	return NewSim(SimOptions{Nodes: spec.Nodes, CapacityBlocks: spec.CapacityBlocks, LocalOnly: spec.LocalOnly})
}

// Nodes returns the simulated nodes.
func (s *Sim) Nodes() []Node { return s.nodes }

// Backend returns BackendSimulation.
func (s *Sim) Backend() string { return BackendSimulation }

// Close does nothing: a Sim holds no resources but memory.
func (s *Sim) Close() error { return nil }

// Evictions returns the number of blocks each node evicted.
func (s *Sim) Evictions() []int {
	out := make([]int, len(s.caches))
	for i, c := range s.caches {
		out[i] = c.evictions()
	}
	return out
}

// Len returns the number of blocks each node holds.
func (s *Sim) Len() []int {
	out := make([]int, len(s.caches))
	for i, c := range s.caches {
		out[i] = c.len()
	}
	return out
}

// owner returns the node that holds block i of chain, asked by node from.
func (s *Sim) owner(from int, chain []prefixhash.Key, i int) int {
	if s.opts.LocalOnly {
		return from
	}
	k := prefixhash.ChunkKey(chain, i, s.opts.ChunkBlocks)
	return rendezvous(k.Hi()^k.Lo(), len(s.caches))
}

type simNode struct {
	sim *Sim
	id  int
}

func (n *simNode) LongestPrefix(ctx context.Context, p Prompt) (int, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	s, keys := n.sim, p.Keys
	hit := 0
	for hit < len(keys) && s.caches[s.owner(n.id, keys, hit)].contains(keys[hit]) {
		hit++
	}
	for i := hit - 1; i >= 0; i-- {
		c := s.caches[s.owner(n.id, keys, i)]
		if d, ok := c.(depthCache); ok {
			d.touchAt(keys[i], p.Request, i)
		} else {
			c.touch(keys[i], p.Request)
		}
	}
	return hit, nil
}

func (n *simNode) Put(ctx context.Context, p Prompt, blocks []Block) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	s, chain := n.sim, p.Keys
	for k := len(blocks) - 1; k >= 0; k-- {
		b := &blocks[k]
		if b.Index < 0 || b.Index >= len(chain) || chain[b.Index] != b.Key {
			return fmt.Errorf("bench: sim: block %d is not chain[%d]", k, b.Index)
		}
		c := s.caches[s.owner(n.id, chain, b.Index)]
		if d, ok := c.(depthCache); ok {
			d.insertAt(b.Key, p.Request, b.Index)
		} else {
			c.insert(b.Key, p.Request)
		}
	}
	return nil
}

// lru is a set of keys bounded in count, evicting the least recently used.
// Entries live in one slice linked by index, so a cache of millions of keys
// is a few allocations.
type lru struct {
	capacity int
	mu       struct {
		sync.Mutex
		index   map[prefixhash.Key]int32
		entries []lruEntry // entries[0] is the sentinel: next is the most recent
		free    []int32
		evicted int
	}
}

type lruEntry struct {
	key        prefixhash.Key
	prev, next int32
}

func newLRU(capacity int) *lru {
	l := &lru{capacity: capacity}
	l.mu.index = make(map[prefixhash.Key]int32, min(capacity, 1<<20))
	l.mu.entries = make([]lruEntry, 1, min(capacity, 1<<20)+1)
	return l
}

func (l *lru) contains(k prefixhash.Key) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	_, ok := l.mu.index[k]
	return ok
}

// touch makes k the most recent entry, if present.
func (l *lru) touch(k prefixhash.Key, _ int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if i, ok := l.mu.index[k]; ok {
		l.moveToFrontLocked(i)
	}
}

// insert adds k as the most recent entry, evicting the least recent when full.
func (l *lru) insert(k prefixhash.Key, _ int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if i, ok := l.mu.index[k]; ok {
		l.moveToFrontLocked(i)
		return
	}
	if len(l.mu.index) >= l.capacity {
		oldest := l.mu.entries[0].prev
		l.unlinkLocked(oldest)
		delete(l.mu.index, l.mu.entries[oldest].key)
		l.mu.free = append(l.mu.free, oldest)
		l.mu.evicted++
	}
	var i int32
	if n := len(l.mu.free); n > 0 {
		i = l.mu.free[n-1]
		l.mu.free = l.mu.free[:n-1]
	} else {
		l.mu.entries = append(l.mu.entries, lruEntry{})
		i = int32(len(l.mu.entries) - 1)
	}
	l.mu.entries[i].key = k
	l.mu.index[k] = i
	l.pushFrontLocked(i)
}

func (l *lru) moveToFrontLocked(i int32) {
	l.unlinkLocked(i)
	l.pushFrontLocked(i)
}

func (l *lru) unlinkLocked(i int32) {
	e := &l.mu.entries[i]
	l.mu.entries[e.prev].next = e.next
	l.mu.entries[e.next].prev = e.prev
}

func (l *lru) pushFrontLocked(i int32) {
	head := &l.mu.entries[0]
	e := &l.mu.entries[i]
	e.prev, e.next = 0, head.next
	l.mu.entries[head.next].prev = i
	l.mu.entries[0].next = i
}

func (l *lru) len() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.mu.index)
}

func (l *lru) evictions() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.mu.evicted
}
