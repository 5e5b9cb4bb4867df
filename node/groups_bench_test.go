package node

import (
	"context"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/block"
	"github.com/kvmesh/kvmesh/client"
	"github.com/kvmesh/kvmesh/internal/testkit"
	"github.com/kvmesh/kvmesh/prefixhash"
	kvmeshv1 "github.com/kvmesh/kvmesh/proto/kvmesh/v1"
)

// BenchmarkLookupHybrid128k compares the lookup of a 128k-token prompt
// (8192 blocks of 16 tokens) of a hybrid namespace (a full layer, five
// sliding layers with a 1024-token window, a state layer; every group's
// record at every block) with that of the same prompt in a namespace
// without groups, on a 4-node cluster, through the nodes that did not
// produce them (in turn), in the same run: "cluster" is store.Cluster.Resume against
// Locate given the chain (both say where the prefix is, as Lookup needs); "grpc-tokens-summary" the node's Lookup
// with the prompt's tokens (the chain hashed on the node, the answer
// without a listing). Target: hybrid ≤ 1.2× plain. It reports p50, p99 and
// the CPU time (client and all four nodes: this process's) per lookup.
func BenchmarkLookupHybrid128k(b *testing.B) {
	split := func(kind prefixhash.GroupKind, window int, layers ...int) prefixhash.Group {
		return prefixhash.Group{Kind: kind, Window: window, Layers: layers, Layout: prefixhash.SplitKV, DType: prefixhash.Float16, KVHeads: 1, HeadDim: 4}
	}
	hybrid := prefixhash.Namespace{Model: "bench/lookup-hybrid", DType: prefixhash.Float16, BlockTokens: 16, Layers: 7, Groups: prefixhash.MustGroups(
		split(prefixhash.GroupFull, 0, 5), split(prefixhash.GroupSliding, 1024, 0, 1, 2, 3, 4),
		prefixhash.Group{Kind: prefixhash.GroupState, Layers: []int{6}, Layout: prefixhash.StateKV, DType: prefixhash.Float16, KVHeads: 1, StateBytes: 64})}
	plain := prefixhash.Namespace{Model: "bench/lookup-plain", DType: prefixhash.Float16, BlockTokens: 16, Layers: 6, KVHeads: 1, HeadDim: 4}
	nodes := startClusterNodes(b, 4, func(_ int, o *Options) {
		o.Cluster.ChunkTokens, o.Cluster.LookupTimeout, o.Limits.MaxMessageBytes, o.Limits.ChunkBytes = 512, time.Second, 8*MiB, 1*MiB
		o.Tiers.DRAMBytes = 5 * 17 * MiB // a slab per size class
	})
	tokens := make([]uint32, 128<<10)
	for i := range tokens {
		tokens[i] = uint32(i * 2654435761)
	}
	ctx := context.Background()
	cl := nodes[0].cluster.cluster
	put := func(ns prefixhash.Namespace) []prefixhash.Key {
		chain := prefixhash.Keys(ns, tokens)
		cks := cl.ChunkKeys(chain, ns.BlockTokens, 0, len(chain))
		var recs [][]byte
		var rcks []prefixhash.Key
		for g := range max(1, ns.Groups.Len()) { // group by group
			parent := ns.RootLink()
			for i := range chain {
				tk := tokens[i*16 : (i+1)*16]
				var r []byte
				var err error
				if ns.Groups.IsZero() {
					r, _, err = block.Encode(nil, ns, parent.Key(), tk, make([]byte, ns.BlockBytes()))
				} else {
					r, _, err = block.EncodeGroup(nil, 0, ns, g, parent, tk, nil, make([]byte, ns.GroupBytes(g)))
				}
				if err != nil {
					b.Fatal(err)
				}
				recs, rcks = append(recs, r), append(rcks, cks[i])
				parent = prefixhash.KeyLink(chain[i])
			}
		}
		if err := cl.Put(ctx, recs, rcks); err != nil {
			b.Fatal(err)
		}
		if err := cl.Flush(ctx); err != nil {
			b.Fatal(err)
		}
		return chain
	}
	pchain, hchain := put(plain), put(hybrid)
	if st := cl.Stats(); st.PushDropped+st.PushFailed > 0 {
		b.Fatalf("pushes failed: %+v", st)
	}
	groups := hybrid.Groups.All()
	others := nodes[1:] // not the producer, which holds every record
	for _, d := range others {
		testkit.WaitFor(b, d.ID()+" to find both prompts whole", func() bool {
			hit, _ := d.cluster.cluster.Resume(ctx, groups, 16, hchain)
			return d.cluster.cluster.LongestPrefix(ctx, pchain, 16) == len(pchain) && hit.Blocks == len(hchain)
		})
	}
	raws := make([]api, len(others))
	for k, d := range others {
		raws[k] = rawAPI(b, d.GRPCAddr())
	}
	// Each lookup goes through the next of the three nodes that did not
	// produce the prompts: which chunks a node holds itself varies with
	// the prompt, and so does the cost of its lookup.
	op := 0
	next := func() int { op++; return op % len(others) }
	// Interleaved, so that the machine's other load weighs on all alike:
	// each iteration looks both prompts up by both paths, through the next
	// node, and times each.
	forms := []struct {
		name   string
		lookup func() (int, error)
	}{
		{"cluster_plain", func() (int, error) { n, _ := others[next()].cluster.cluster.Locate(ctx, pchain, 16); return n, nil }},
		{"cluster_hybrid", func() (int, error) {
			hit, _ := others[next()].cluster.cluster.Resume(ctx, groups, 16, hchain)
			return hit.Blocks, nil
		}},
		{"grpc_plain", func() (int, error) {
			l, err := raws[next()].cache.Lookup(ctx, &kvmeshv1.LookupRequest{Namespace: client.NamespaceProto(plain), Tokens: tokens, Summary: true})
			return int(l.GetCachedBlocks()), err
		}},
		{"grpc_hybrid", func() (int, error) {
			l, err := raws[next()].cache.Lookup(ctx, &kvmeshv1.LookupRequest{Namespace: client.NamespaceProto(hybrid), Tokens: tokens, Summary: true})
			return int(l.GetCachedBlocks()), err
		}},
	}
	lat := make([][]time.Duration, len(forms))
	for b.Loop() {
		for f, form := range forms {
			t0 := time.Now()
			if n, err := form.lookup(); err != nil || n != len(pchain) {
				b.Fatalf("%s found %d of %d blocks, %v", form.name, n, len(pchain), err)
			}
			lat[f] = append(lat[f], time.Since(t0))
		}
	}
	for f, form := range forms {
		b.ReportMetric(float64(quantile(lat[f], 0.5).Microseconds())/1000, form.name+"_p50_ms")
	}
	b.ReportMetric(float64(quantile(lat[1], 0.5))/float64(quantile(lat[0], 0.5)), "cluster_hybrid_per_plain")
	b.ReportMetric(float64(quantile(lat[3], 0.5))/float64(quantile(lat[2], 0.5)), "grpc_hybrid_per_plain")
}
