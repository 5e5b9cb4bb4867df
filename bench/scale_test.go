package bench

import (
	"context"
	"log/slog"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/client"
	"github.com/kvmesh/kvmesh/gossip"
	"github.com/kvmesh/kvmesh/gossip/gossiptest"
	"github.com/kvmesh/kvmesh/internal/testkit"
	"github.com/kvmesh/kvmesh/node"
	"github.com/kvmesh/kvmesh/prefixhash"
	"github.com/kvmesh/kvmesh/store"
)

// servedNode serves a node of a cluster on loopback ports until the test
// ends.
func servedNode(t *testing.T, id string, join ...string) *node.Node {
	t.Helper()
	n, err := node.Open(node.Options{
		NodeID: id, DataDir: t.TempDir(),
		Listen:  node.ListenOptions{GRPCAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0", DataAddr: "127.0.0.1:0"},
		Cluster: node.ClusterOptions{GossipAddr: "127.0.0.1:0", Join: join, GossipProfile: "local"},
		Tiers:   node.TierOptions{DRAMBytes: 64 << 20},
		Logger:  slog.New(slog.DiscardHandler),
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- n.Serve(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("node %s: %v", id, err)
		}
	})
	return n
}

// TestScaleSimMatchesCluster checks the scale harness against a real
// cluster of three nodes (node.Open: memberlist on loopback, the TCP data
// plane) holding the same prompt: the simulated data plane of three nodes
// with the same ids places every chunk on the owner the real cluster
// reports, and answers the same lookups (a whole prompt, and one that
// shares only its first 1k tokens) with the same counts, asking as many
// peers.
func TestScaleSimMatchesCluster(t *testing.T) {
	ctx := context.Background()
	ns := lookupNamespace(scaleBlockTokens)
	rng := rand.New(rand.NewPCG(3, 3))
	tokens := make([]uint32, 4096)
	for i := range tokens {
		tokens[i] = uint32(rng.IntN(DefaultVocab))
	}
	other := slices.Clone(tokens)
	for i := partialTokens; i < len(other); i++ {
		other[i]++
	}

	// The real cluster: the prompt put through n0000, looked up from n0001.
	a := servedNode(t, simNodeID(0))
	servedNode(t, simNodeID(1), a.GossipAddr())
	c := servedNode(t, simNodeID(2), a.GossipAddr())
	pool := &clientPool{opts: client.Options{MaxRetries: -1}}
	defer pool.Close()
	ca, err := pool.get(a.GRPCAddr())
	if err != nil {
		t.Fatal(err)
	}
	cc, err := pool.get(c.GRPCAddr())
	if err != nil {
		t.Fatal(err)
	}
	payloads := make([][]byte, len(tokens)/scaleBlockTokens)
	for i := range payloads {
		payloads[i] = make([]byte, ns.BlockBytes())
	}
	var real client.Lookup
	testkit.WaitFor(t, "three members, and the prompt at its owners", func() bool {
		if _, err := ca.Put(ctx, ns, client.Prompt{Tokens: tokens}, payloads); err != nil {
			t.Fatal(err)
		}
		real, err = cc.Lookup(ctx, ns, client.Prompt{Tokens: tokens})
		return err == nil && real.CachedBlocks == len(payloads)
	})
	realPartial, err := cc.Lookup(ctx, ns, client.Prompt{Tokens: other})
	if err != nil {
		t.Fatal(err)
	}
	// The peers each lookup asks, as n0002 counts its calls.
	asks := func(p client.Prompt) float64 {
		t.Helper()
		calls := func() float64 {
			mf, err := nodeMetrics(ctx, c.HTTPAddr())
			if err != nil {
				t.Fatal(err)
			}
			return mf["kvmesh_cluster_remote_lookups_total"].GetMetric()[0].GetCounter().GetValue()
		}
		before := calls()
		if _, err := cc.Lookup(ctx, ns, p); err != nil {
			t.Fatal(err)
		}
		return calls() - before
	}
	realAsks, realPartialAsks := asks(client.Prompt{Tokens: tokens}), asks(client.Prompt{Tokens: other})

	// The simulation: three nodes of the same ids (and equal weights, as
	// the real ones have), the same prompt put through n0000.
	links := gossiptest.Links{}
	links.EnsureDefaults()
	ds, err := newDataSim(3, &links, store.ClusterOptions{}, 64<<20)
	if err != nil {
		t.Fatal(err)
	}
	defer ds.Close()
	var s scaleLookup
	p, err := s.publishTokens(ctx, ds, ns, 0, tokens, other)
	if err != nil {
		t.Fatal(err)
	}
	if err := flushAll(ctx, ds); err != nil {
		t.Fatal(err)
	}
	from := ds.byID[simNodeID(2)]
	vctx, vc := withVClock(ctx, time.Second)
	if got := from.cluster.LongestPrefix(vctx, p.chain, scaleBlockTokens); got != real.CachedBlocks {
		t.Errorf("simulated lookup of the whole prompt found %d blocks, the cluster %d", got, real.CachedBlocks)
	}
	if _, calls, _, _ := vc.result(); float64(calls) != realAsks {
		t.Errorf("simulated lookup of the whole prompt asked %d peers, the cluster %v", calls, realAsks)
	}
	vctx, vc = withVClock(ctx, time.Second)
	if got := from.cluster.LongestPrefix(vctx, p.partial, scaleBlockTokens); got != realPartial.CachedBlocks || got != partialTokens/scaleBlockTokens {
		t.Errorf("simulated lookup of the 1k-shared prompt found %d blocks, the cluster %d, want %d", got, realPartial.CachedBlocks, partialTokens/scaleBlockTokens)
	}
	if _, calls, _, _ := vc.result(); float64(calls) != realPartialAsks {
		t.Errorf("simulated lookup of the 1k-shared prompt asked %d peers, the cluster %v", calls, realPartialAsks)
	}
	placement := store.NewPlacement(ds.members.Load().members, 1)
	cb := prefixhash.ChunkBlocks(scaleBlockTokens, prefixhash.DefaultChunkTokens)
	for _, b := range real.Blocks() {
		i := slices.Index(p.chain, b.Key)
		want := placement.Owner(p.chain[prefixhash.ChunkStart(i, cb)])
		if b.NodeID != want {
			t.Fatalf("block %d: the cluster has it on %q, the simulation's placement on %q", i, b.NodeID, want)
		}
	}
}

// TestScaleVClock checks the virtual clock of the data-plane model: one
// lookup round costs its slowest link's round trip, and peers are counted.
func TestScaleVClock(t *testing.T) {
	ctx := context.Background()
	links := gossiptest.Links{MedianRTT: time.Millisecond, Spread: -1, SlowFraction: -1}
	ds, err := newDataSim(8, &links, store.ClusterOptions{}, 16<<20)
	if err != nil {
		t.Fatal(err)
	}
	defer ds.Close()
	var s scaleLookup
	ns := lookupNamespace(scaleBlockTokens)
	tokens := make([]uint32, 16<<10)
	for i := range tokens {
		tokens[i] = uint32(i)
	}
	p, err := s.publishTokens(ctx, ds, ns, 0, tokens, tokens)
	if err != nil {
		t.Fatal(err)
	}
	if err := flushAll(ctx, ds); err != nil {
		t.Fatal(err)
	}
	vctx, vc := withVClock(ctx, time.Second)
	if got := ds.nodes[1].cluster.LongestPrefix(vctx, p.chain, scaleBlockTokens); got != len(p.chain) {
		t.Fatalf("found %d of %d blocks", got, len(p.chain))
	}
	net, calls, peers, rounds := vc.result()
	if net != time.Millisecond || rounds != 1 || calls != peers || peers < 2 || peers > 7 {
		t.Fatalf("virtual time %v, %d calls to %d peers in %d rounds; want 1ms, one call a peer, one round", net, calls, peers, rounds)
	}
}

// TestScaleGossip runs the membership simulation small: members join, see
// each other, and see a crash.
func TestScaleGossip(t *testing.T) {
	links := gossiptest.Links{}
	links.EnsureDefaults()
	g := newGossipSim(gossipSimOptions{Links: links, Dilation: 1, Seed: 1, Profile: "local", Log: slog.New(slog.DiscardHandler)})
	defer g.Close()
	ctx, cancel := context.WithTimeout(context.Background(), testkit.WaitLimit)
	defer cancel()
	if _, err := g.grow(ctx, 5, nopBar{}); err != nil {
		t.Fatal(err)
	}
	id := g.pick()
	g.crash(id)
	seen, err := g.watch(ctx, lacks(id), time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if len(seen) != 4 {
		t.Fatalf("%d members watched, want the 4 left", len(seen))
	}
	_, ms := g.live()
	for _, m := range ms {
		if got, _ := m.Members(); len(got) != 4 || slices.ContainsFunc(got, func(mi gossip.MemberInfo) bool { return mi.ID == id }) {
			t.Fatalf("%s sees %d members after %s crashed", m.LocalID(), len(got), id)
		}
	}
	if c := g.counters(); c.Packets == 0 || c.StreamBytes == 0 {
		t.Fatalf("counters %+v: no gossip counted", c)
	}
}
