package bench

import (
	"context"
	"errors"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"

	"github.com/kvmesh/kvmesh/block"
	"github.com/kvmesh/kvmesh/prefixhash"
)

func workload(t *testing.T, tr *Trace) *Workload {
	t.Helper()
	w, err := NewWorkload(context.Background(), tr, TraceNamespace(), 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	return w
}

func replaySim(t *testing.T, w *Workload, so SimOptions, ro ReplayOptions) (ReplayStats, *Sim) {
	t.Helper()
	sim, err := NewSim(so)
	if err != nil {
		t.Fatal(err)
	}
	st, err := Replay(context.Background(), w, sim.Nodes(), sim.Backend(), ro)
	if err != nil {
		t.Fatal(err)
	}
	if st.Backend != BackendSimulation {
		t.Fatalf("backend %q, want %q", st.Backend, BackendSimulation)
	}
	for n, l := range sim.Len() {
		if l > so.CapacityBlocks {
			t.Fatalf("node %d holds %d blocks, capacity %d", n, l, so.CapacityBlocks)
		}
	}
	return st, sim
}

func TestSimSmallTraceReachesIdeal(t *testing.T) {
	w := workload(t, loadSmall(t))
	for _, p := range Policies() {
		st, _ := replaySim(t, w, SimOptions{Nodes: 3, CapacityBlocks: 100}, ReplayOptions{Routing: p})
		// Worked by hand: 6 full-block hits of 15 hash ids, 10 full blocks.
		if st.HitBlocks != 6 || st.HitRatio != 0.4 || st.FullBlockHitRatio != 0.6 || st.CachedTokens != 6*512 {
			t.Errorf("%s: %d hits, hit_ratio %v, full %v, cached %d; want 6, 0.4, 0.6, 3072", p, st.HitBlocks,
				st.HitRatio, st.FullBlockHitRatio, st.CachedTokens)
		}
		if st.IdealHitRatio != 8.0/15 || st.Requests != 6 || st.Blocks != 15 {
			t.Errorf("%s: ideal %v, %d requests, %d blocks", p, st.IdealHitRatio, st.Requests, st.Blocks)
		}
	}
}

func TestSimPooledVersusLocalOnly(t *testing.T) {
	tr := synthTrace(200, 8, 3)
	w := workload(t, tr)
	ideal := w.Ideal()
	enough := ideal.DistinctFullBlocks
	pooled, _ := replaySim(t, w, SimOptions{Nodes: 4, CapacityBlocks: enough}, ReplayOptions{Routing: RoutingRandom})
	if pooled.HitBlocks != ideal.FullHitBlocks {
		t.Errorf("pooled, random, enough capacity: %d hits, the ideal over full blocks is %d", pooled.HitBlocks, ideal.FullHitBlocks)
	}
	if pooled.RatioVsIdeal < 0.98 {
		t.Errorf("pooled random ratio_vs_ideal %.3f < 0.98", pooled.RatioVsIdeal)
	}
	local, _ := replaySim(t, w, SimOptions{Nodes: 4, CapacityBlocks: enough, LocalOnly: true}, ReplayOptions{Routing: RoutingRandom})
	if local.RatioVsIdeal > 0.75 {
		t.Errorf("local-only random ratio_vs_ideal %.3f, want far below the ideal", local.RatioVsIdeal)
	}
	// Session affinity keeps a conversation on one node: local caches lose
	// only the shared block 0's first visit to each node.
	sess, _ := replaySim(t, w, SimOptions{Nodes: 4, CapacityBlocks: enough, LocalOnly: true}, ReplayOptions{Routing: RoutingSession})
	if sess.HitBlocks < ideal.FullHitBlocks-4 {
		t.Errorf("local-only session-affinity: %d hits, want at least %d", sess.HitBlocks, ideal.FullHitBlocks-4)
	}
	// A small pool evicts and hits less.
	small, sim := replaySim(t, w, SimOptions{Nodes: 4, CapacityBlocks: enough / 20}, ReplayOptions{Routing: RoutingRandom})
	if small.HitRatio >= pooled.HitRatio || slices.Max(sim.Evictions()) == 0 {
		t.Errorf("a pool of 1/20 the trace: hit ratio %.3f (enough: %.3f), evictions %v", small.HitRatio, pooled.HitRatio, sim.Evictions())
	}
}

func TestSimKeepsAncestors(t *testing.T) {
	// One node, capacity 5, a chain of 10: whatever is evicted, the node
	// keeps a prefix, never a descendant without its ancestor.
	sim, err := NewSim(SimOptions{Nodes: 1, CapacityBlocks: 5})
	if err != nil {
		t.Fatal(err)
	}
	chain := prefixhash.Keys(TraceNamespace(), make([]uint32, 10*TraceBlockTokens))
	var blocks []Block
	for i, k := range chain {
		blocks = append(blocks, Block{Index: i, Key: k})
	}
	ctx := context.Background()
	n := sim.Nodes()[0]
	if err := n.Put(ctx, Prompt{Keys: chain}, blocks); err != nil {
		t.Fatal(err)
	}
	if got, _ := n.LongestPrefix(ctx, Prompt{Keys: chain}); got != 5 {
		t.Fatalf("after putting 10 blocks into 5: longest prefix %d, want 5", got)
	}
	// A second chain sharing the first 2 blocks: the lookup touches the
	// shared blocks, so they outlive the first chain's leaves.
	ones := make([]uint32, 3*TraceBlockTokens)
	for i := range ones {
		ones[i] = 1
	}
	other := prefixhash.AppendKeys(slices.Clone(chain[:2]), chain[1], TraceBlockTokens, ones)
	var ob []Block
	for i := 2; i < len(other); i++ {
		ob = append(ob, Block{Index: i, Key: other[i]})
	}
	if got, _ := n.LongestPrefix(ctx, Prompt{Keys: other}); got != 2 {
		t.Fatalf("shared prefix: %d, want 2", got)
	}
	if err := n.Put(ctx, Prompt{Keys: other}, ob); err != nil {
		t.Fatal(err)
	}
	if got, _ := n.LongestPrefix(ctx, Prompt{Keys: other}); got != 5 {
		t.Fatalf("second chain: %d cached, want 5", got)
	}
	if got, _ := n.LongestPrefix(ctx, Prompt{Keys: chain}); got != 2 {
		t.Fatalf("first chain after eviction: %d cached, want its 2 shared blocks", got)
	}
	if err := n.Put(ctx, Prompt{Keys: chain}, []Block{{Index: 3, Key: chain[2]}}); err == nil {
		t.Fatal("Put accepted a block that is not chain[Index]")
	}
}

// TestLRUModel checks the LRU against a 20-line model under random operations.
func TestLRUModel(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 5))
	for iter := range 50 {
		capacity := 1 + rng.IntN(8)
		l := newLRU(capacity)
		var model []prefixhash.Key // most recent last
		find := func(k prefixhash.Key) int { return slices.Index(model, k) }
		for range 300 {
			k := prefixhash.Key{byte(rng.IntN(16))}
			switch rng.IntN(3) {
			case 0:
				if l.contains(k) != (find(k) >= 0) {
					t.Fatalf("iter %d: contains(%v) disagrees with the model %v", iter, k[0], model)
				}
			case 1:
				l.touch(k, 0)
				if i := find(k); i >= 0 {
					model = append(slices.Delete(model, i, i+1), k)
				}
			case 2:
				l.insert(k, 0)
				if i := find(k); i >= 0 {
					model = slices.Delete(model, i, i+1)
				} else if len(model) == capacity {
					model = model[1:]
				}
				model = append(model, k)
			}
			if l.len() != len(model) {
				t.Fatalf("iter %d: %d entries, model %d", iter, l.len(), len(model))
			}
		}
	}
}

// recordingNode checks every published block and can fail on demand.
type recordingNode struct {
	t          *testing.T
	ns         prefixhash.Namespace
	failLookup bool
	mu         sync.Mutex
	puts       int
}

func (n *recordingNode) LongestPrefix(ctx context.Context, p Prompt) (int, error) {
	if len(p.Tokens) != len(p.Keys)*TraceBlockTokens || !slices.Equal(prefixhash.Keys(n.ns, p.Tokens), p.Keys) {
		n.t.Errorf("request %d: %d tokens do not hash to its %d keys", p.Request, len(p.Tokens), len(p.Keys))
	}
	if n.failLookup {
		return 0, errors.New("peer unreachable")
	}
	return 0, nil
}

func (n *recordingNode) Put(ctx context.Context, p Prompt, blocks []Block) error {
	chain := p.Keys
	for _, b := range blocks {
		blk, err := block.Decode(b.Encoded, 1<<20)
		if err != nil {
			n.t.Errorf("block %d does not decode: %v", b.Index, err)
			continue
		}
		if blk.Key != b.Key || blk.Key != chain[b.Index] || blk.Parent != b.Parent || !slices.Equal(blk.Tokens, b.Tokens) {
			n.t.Errorf("block %d: decoded key/parent/tokens differ from the block's", b.Index)
		}
		if !slices.Equal(blk.Payload, b.Payload) || !slices.Equal(p.Tokens[b.Index*TraceBlockTokens:(b.Index+1)*TraceBlockTokens], b.Tokens) {
			n.t.Errorf("block %d: payload or tokens differ from the encoded block's, or from the prompt's", b.Index)
		}
		if err := blk.CheckNamespace(n.ns); err != nil {
			n.t.Errorf("block %d: %v", b.Index, err)
		}
	}
	n.mu.Lock()
	n.puts++
	n.mu.Unlock()
	return nil
}

func TestReplayEncodesBlocks(t *testing.T) {
	w := workload(t, loadSmall(t))
	node := &recordingNode{t: t, ns: TraceNamespace()}
	st, err := Replay(context.Background(), w, []Node{node}, "test", ReplayOptions{Encode: true})
	if err != nil {
		t.Fatal(err)
	}
	if node.puts != 5 || st.HitBlocks != 0 { // request 5 has no full block
		t.Fatalf("%d puts, %d hits; want 5 and 0", node.puts, st.HitBlocks)
	}
}

func TestReplayCountsFailuresAsMisses(t *testing.T) {
	w := workload(t, loadSmall(t))
	node := &recordingNode{t: t, ns: TraceNamespace(), failLookup: true}
	st, err := Replay(context.Background(), w, []Node{node}, "test", ReplayOptions{Encode: true})
	if err != nil {
		t.Fatalf("a failing node failed the replay: %v", err)
	}
	if st.LookupErrors != 6 || st.HitBlocks != 0 {
		t.Fatalf("lookup errors %d, hits %d; want 6 and 0", st.LookupErrors, st.HitBlocks)
	}
}

func TestReplayHonoursTimestamps(t *testing.T) {
	w := workload(t, loadSmall(t)) // 40 ms of trace
	fast, _ := replaySim(t, w, SimOptions{Nodes: 2, CapacityBlocks: 100}, ReplayOptions{})
	timed, _ := replaySim(t, w, SimOptions{Nodes: 2, CapacityBlocks: 100}, ReplayOptions{Speedup: 4})
	if timed.HitBlocks != fast.HitBlocks || timed.Requests != 6 {
		t.Fatalf("timed replay: %d hits of %d requests, as fast as possible %d", timed.HitBlocks, timed.Requests, fast.HitBlocks)
	}
	if timed.WallSeconds < 0.01 { // 40 ms / 4: the replay waited for the clock
		t.Fatalf("timed replay took %.3fs, faster than the trace allows", timed.WallSeconds)
	}
}

func TestReplayCancelled(t *testing.T) {
	w := workload(t, loadSmall(t))
	sim, _ := NewSim(SimOptions{CapacityBlocks: 10})
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := Replay(ctx, w, sim.Nodes(), sim.Backend(), ReplayOptions{}); !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v, want context.Canceled", err)
	}
	if _, err := Replay(context.Background(), w, sim.Nodes(), sim.Backend(), ReplayOptions{Concurrency: -1}); err == nil {
		t.Fatal("negative concurrency accepted")
	}
}

func TestConversationTraceHeadOnSim(t *testing.T) {
	tr, err := conversationTrace()
	if err != nil {
		t.Fatal(err)
	}
	w := workload(t, tr.Head(600))
	enough := w.Ideal().DistinctFullBlocks
	pooled, _ := replaySim(t, w, SimOptions{Nodes: 4, CapacityBlocks: enough}, ReplayOptions{Routing: RoutingRandom})
	local, _ := replaySim(t, w, SimOptions{Nodes: 4, CapacityBlocks: enough, LocalOnly: true}, ReplayOptions{Routing: RoutingRandom})
	if pooled.RatioVsIdeal < 0.98 || local.RatioVsIdeal > 0.8 {
		t.Fatalf("first 600 requests: pooled random %.3f of the ideal, local-only random %.3f", pooled.RatioVsIdeal, local.RatioVsIdeal)
	}
}
