package bench

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvmesh/kvmesh/prefixhash"
)

// Node is one cache node as a trace replay drives it: the inference worker
// beside it asks how much of a prompt is cached, then publishes the blocks it
// computed. The kvmesh node (through its client) implements it; so does the
// simulation (NewSim).
type Node interface {
	// LongestPrefix returns how many leading blocks of the prompt are
	// cached: cluster-wide for a node of a pooled cluster, on this node
	// alone for a local-only one. p is read-only and valid during the call.
	LongestPrefix(ctx context.Context, p Prompt) (int, error)
	// Put publishes blocks of the prompt (blocks[k] is
	// p.Keys[blocks[k].Index]). p and blocks, with their tokens and bytes,
	// are owned by the caller and valid only during the call: an
	// implementation that keeps them copies them.
	Put(ctx context.Context, p Prompt, blocks []Block) error
}

// Prompt is one request of a replay as a cache sees it.
type Prompt struct {
	// Request is the request's index in the trace.
	Request int
	// Keys is the chain of the prompt's full blocks.
	Keys []prefixhash.Key
	// Tokens are the tokens of the prompt's full blocks
	// (len(Keys)·TraceBlockTokens); nil unless the replay was asked to
	// encode (ReplayOptions.Encode). A partial tail is never cached, so it
	// is not here.
	Tokens []uint32
}

// Block is one block a replay publishes.
type Block struct {
	// Index is the block's position in the prompt's chain.
	Index       int
	Key, Parent prefixhash.Key
	// Tokens are the block's TraceBlockTokens tokens, Encoded the block as
	// block.Encode writes it (header and payload), and Payload the
	// payload, the tail of Encoded; all are nil unless the replay was asked
	// to encode (ReplayOptions.Encode).
	Tokens  []uint32
	Encoded []byte
	Payload []byte
}

// Cluster is a set of nodes a replay routes requests to.
type Cluster interface {
	Nodes() []Node
	// Backend names what is measured, reported with every figure:
	// BackendKvmesh for kvmesh nodes, BackendSimulation for the model.
	Backend() string
	Close() error
}

// Backends of a Cluster.
const (
	BackendKvmesh     = "kvmesh"
	BackendSimulation = "simulation"
)

// ClusterSpec is the cluster a replay needs.
type ClusterSpec struct {
	Nodes int
	// CapacityBlocks is each node's cache capacity in blocks; a kvmesh
	// cluster sizes its tiers to CapacityBlocks × BlockBytes.
	CapacityBlocks int
	// BlockBytes is the size of one encoded block of Namespace.
	BlockBytes int
	// LocalOnly turns cross-node sharing off: a node caches what its own
	// requests computed and looks up only itself.
	LocalOnly bool
	Namespace prefixhash.Namespace
	// Eviction is the nodes' eviction policy (`kvmesh serve --eviction`);
	// "" is their default. The simulation keeps no copies of blocks other
	// nodes own, so store.EvictDedup is EvictLRU there.
	Eviction string
	// DRAMBlocks, when positive, is the part of CapacityBlocks a kvmesh
	// node holds in DRAM (at least 1 MiB of it); the rest overflows to
	// NVMe. Default 0: DRAM holds it all.
	DRAMBlocks int
	// NVMeAdmission is the nodes' `kvmesh serve --nvme-admission`; "" is
	// their default (all).
	NVMeAdmission string
}

// ClusterFactory starts a cluster for a replay; the caller closes it.
type ClusterFactory func(ctx context.Context, spec ClusterSpec) (Cluster, error)

// ReplayOptions says how to replay a workload.
type ReplayOptions struct {
	// Routing is the routing policy. Default RoutingRandom.
	Routing Policy
	// Seed seeds random routing. Default 1.
	Seed uint64
	// Speedup replays honouring the trace's timestamps divided by Speedup
	// (2 replays twice as fast as recorded). 0, the default, replays as
	// fast as possible.
	Speedup float64
	// Concurrency bounds the requests in flight. Default 1 as fast as
	// possible (sequential and deterministic), 256 when honouring timestamps.
	Concurrency int
	// Encode makes every prompt carry its tokens, and every published
	// block its tokens, payload and block.Encode bytes, which a kvmesh
	// cluster needs and the simulation does not.
	Encode bool
	// Bar, if set, advances by one per request.
	Bar Bar
}

// EnsureDefaults fills zero fields with their defaults.
func (o *ReplayOptions) EnsureDefaults() {
	if o.Routing == "" {
		o.Routing = RoutingRandom
	}
	if o.Seed == 0 {
		o.Seed = 1
	}
	if o.Concurrency == 0 {
		o.Concurrency = 1
		if o.Speedup > 0 {
			o.Concurrency = 256
		}
	}
	if o.Bar == nil {
		o.Bar = nopBar{}
	}
}

// Validate names the first field that is out of range.
func (o *ReplayOptions) Validate() error {
	switch {
	case o.Speedup < 0:
		return fmt.Errorf("bench: replay: speedup %v must not be negative", o.Speedup)
	case o.Concurrency < 1 || o.Concurrency > 1<<16:
		return fmt.Errorf("bench: replay: concurrency %d is outside 1..65536", o.Concurrency)
	}
	_, err := ParsePolicy(string(o.Routing))
	return err
}

// ReplayStats is what one replay measured. Hit ratios count blocks: a
// request of m hash ids whose first c full blocks were cached contributes c
// hits out of m. HitRatio therefore has the same denominator as the trace's
// IdealHitRatio (every hash id, partial tails included, which kvmesh never
// caches); FullBlockHitRatio counts full blocks only.
type ReplayStats struct {
	Backend   string `json:"backend"`
	Routing   Policy `json:"routing"`
	Nodes     int    `json:"nodes" table:"-"`
	LocalOnly bool   `json:"local_only"`
	// CapacityBlocksPerNode and PooledCapacityFraction (capacity of all
	// nodes over the trace's distinct full blocks) are filled by the caller
	// that sized the cluster.
	CapacityBlocksPerNode  int     `json:"capacity_blocks_per_node" table:"-"`
	PooledCapacityFraction float64 `json:"pooled_capacity_fraction" table:"-"`

	Requests  int `json:"requests" table:"-"`
	Blocks    int `json:"blocks" table:"-"`
	HitBlocks int `json:"hit_blocks" table:"-"`

	HitRatio      float64 `json:"hit_ratio"`
	IdealHitRatio float64 `json:"ideal_hit_ratio"`
	// RatioVsIdeal = HitRatio / IdealHitRatio: the DESIGN target's figure.
	RatioVsIdeal           float64 `json:"ratio_vs_ideal"`
	FullBlockHitRatio      float64 `json:"full_block_hit_ratio" table:"wide"`
	IdealFullBlockHitRatio float64 `json:"ideal_full_block_hit_ratio" table:"-"`

	PromptTokens int64 `json:"prompt_tokens" table:"-"`
	CachedTokens int64 `json:"cached_tokens"`

	LookupP50MS float64 `json:"lookup_p50_ms" table:"wide"`
	LookupP99MS float64 `json:"lookup_p99_ms"`
	PutP50MS    float64 `json:"put_p50_ms" table:"-"`
	PutP99MS    float64 `json:"put_p99_ms" table:"wide"`

	RequestsPerNode []int   `json:"requests_per_node" table:"-"`
	TokensPerNode   []int64 `json:"tokens_per_node" table:"-"`
	// RequestsMaxOverMean and TokensMaxOverMean measure load balance: 1 is
	// perfect, 2 means one node does twice its share.
	RequestsMaxOverMean float64 `json:"requests_max_over_mean" table:"wide"`
	TokensMaxOverMean   float64 `json:"tokens_max_over_mean" table:"wide"`

	// Tiers are the nodes' tier counters after the replay, summed over
	// the nodes (kvmesh nodes only).
	Tiers []TierCounts `json:"tiers,omitempty" table:"-"`

	LookupErrors int64   `json:"lookup_errors" table:"nonzero"`
	PutErrors    int64   `json:"put_errors" table:"nonzero"`
	WallSeconds  float64 `json:"wall_s" table:"-"`
	RequestsPerS float64 `json:"requests_per_s" table:"-"`
}

// Replay plays w's requests against nodes, routed by o.Routing, and returns
// what it measured. A lookup that fails counts as a miss and a put that
// fails as lost, both counted (a dead peer is a miss, never a failed
// request); Replay returns an error only for bad options or when ctx ends.
// The backend is named by the caller (Cluster.Backend).
func Replay(ctx context.Context, w *Workload, nodes []Node, backend string, o ReplayOptions) (ReplayStats, error) {
	o.EnsureDefaults()
	if err := o.Validate(); err != nil {
		return ReplayStats{}, err
	}
	if len(nodes) == 0 {
		return ReplayStats{}, fmt.Errorf("bench: replay: no nodes")
	}
	t := w.Trace()
	router, err := NewRouter(o.Routing, len(nodes), t, o.Seed)
	if err != nil {
		return ReplayStats{}, err
	}
	r := &replayer{w: w, nodes: nodes, o: o, router: router,
		cached: make([]int32, len(t.Requests)), routed: make([]int32, len(t.Requests)), sem: make(chan struct{}, o.Concurrency)}
	began := time.Now()
	r.dispatch(ctx, began)
	r.wg.Wait()
	if err := ctx.Err(); err != nil {
		return ReplayStats{}, err
	}
	return r.stats(backend, time.Since(began)), nil
}

// replayer is one replay in progress.
type replayer struct {
	w      *Workload
	nodes  []Node
	o      ReplayOptions
	router Router
	// cached and routed are written once per request, read after wg.Wait.
	cached, routed      []int32
	lookup, put         Latency
	lookupErrs, putErrs atomic.Int64
	sem                 chan struct{} // bounds the requests in flight
	wg                  sync.WaitGroup
}

// dispatch routes each request, at its time in the trace scaled by Speedup
// (at once without one), and serves it on a goroutine of its own, at most
// Concurrency at a time. It stops when ctx ends.
func (r *replayer) dispatch(ctx context.Context, began time.Time) {
	t := r.w.Trace()
	var timer *time.Timer
	for i := range t.Requests {
		if r.o.Speedup > 0 {
			due := began.Add(time.Duration(float64(t.Requests[i].Timestamp-t.Requests[0].Timestamp) / r.o.Speedup))
			if d := time.Until(due); d > 0 {
				if timer == nil {
					timer = time.NewTimer(d)
					defer timer.Stop()
				} else {
					timer.Reset(d)
				}
				select {
				case <-timer.C:
				case <-ctx.Done():
				}
			}
		}
		if ctx.Err() != nil {
			break
		}
		select {
		case r.sem <- struct{}{}:
		case <-ctx.Done():
		}
		if ctx.Err() != nil {
			break
		}
		n := r.router.Route(i)
		r.routed[i] = int32(n)
		r.wg.Add(1)
		go r.serve(ctx, i, n)
	}
}

// serve plays request i on node n: a lookup of its prompt, then a put of
// the blocks it missed.
func (r *replayer) serve(ctx context.Context, i, n int) {
	defer r.wg.Done()
	defer func() { <-r.sem }()
	defer r.router.Done(i, n)
	defer r.o.Bar.Add(1)
	keys := r.w.Keys(i)
	p := Prompt{Request: i, Keys: keys}
	if r.o.Encode {
		p.Tokens = r.w.Tokens(make([]uint32, 0, len(keys)*TraceBlockTokens), i)[:len(keys)*TraceBlockTokens]
	}
	start := time.Now()
	c, err := r.nodes[n].LongestPrefix(ctx, p)
	r.lookup.Record(time.Since(start))
	if err != nil {
		r.lookupErrs.Add(1)
		c = 0
	}
	c = min(max(c, 0), len(keys))
	r.cached[i] = int32(c)
	if c == len(keys) || ctx.Err() != nil {
		return
	}
	blocks, _, err := r.w.Blocks(i, c, r.o.Encode, nil)
	if err != nil {
		panic(err) // the workload's own namespace failed to encode: a bug
	}
	start = time.Now()
	if err := r.nodes[n].Put(ctx, p, blocks); err != nil {
		r.putErrs.Add(1)
	}
	r.put.Record(time.Since(start))
}

// stats sums the replay up, beside the trace's ideal.
func (r *replayer) stats(backend string, wall time.Duration) ReplayStats {
	t, nodes := r.w.Trace(), r.nodes
	ideal := r.w.Ideal()
	st := ReplayStats{
		Backend: backend, Routing: r.o.Routing, Nodes: len(nodes), Requests: len(t.Requests),
		Blocks: ideal.Blocks, IdealHitRatio: ideal.HitRatio, IdealFullBlockHitRatio: ideal.FullBlockHitRatio,
		PromptTokens: ideal.PromptTokens,
		LookupP50MS:  r.lookup.Quantile(0.5), LookupP99MS: r.lookup.Quantile(0.99),
		PutP50MS: r.put.Quantile(0.5), PutP99MS: r.put.Quantile(0.99),
		RequestsPerNode: make([]int, len(nodes)), TokensPerNode: make([]int64, len(nodes)),
		LookupErrors: r.lookupErrs.Load(), PutErrors: r.putErrs.Load(),
		WallSeconds: wall.Seconds(), RequestsPerS: float64(len(t.Requests)) / max(wall.Seconds(), 1e-9),
	}
	for i, c := range r.cached {
		st.HitBlocks += int(c)
		st.RequestsPerNode[r.routed[i]]++
		st.TokensPerNode[r.routed[i]] += int64(t.Requests[i].InputLength)
	}
	st.CachedTokens = int64(st.HitBlocks) * TraceBlockTokens
	st.HitRatio = float64(st.HitBlocks) / float64(max(st.Blocks, 1))
	st.FullBlockHitRatio = float64(st.HitBlocks) / float64(max(ideal.FullBlocks, 1))
	if st.IdealHitRatio > 0 {
		st.RatioVsIdeal = st.HitRatio / st.IdealHitRatio
	}
	st.RequestsMaxOverMean = maxOverMean(st.RequestsPerNode)
	st.TokensMaxOverMean = maxOverMean(st.TokensPerNode)
	return st
}

func maxOverMean[T int | int64](xs []T) float64 {
	var sum T
	for _, x := range xs {
		sum += x
	}
	if sum == 0 {
		return 0
	}
	return float64(slices.Max(xs)) * float64(len(xs)) / float64(sum)
}
