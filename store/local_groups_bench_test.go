package store

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/auth"
	"github.com/kvmesh/kvmesh/block"
	"github.com/kvmesh/kvmesh/prefixhash"
)

// issueHybrid is the model of issue 31's example: five sliding-window
// layers (W = 1024 tokens) to every full-attention layer, and one state
// group: 6 attention layers of 2 KV heads of 64 bf16 (8 KiB a layer a
// block of 16 tokens), one state layer of 4 heads of 4 KiB.
func issueHybrid() prefixhash.Namespace {
	split := func(kind prefixhash.GroupKind, window int, layers ...int) prefixhash.Group {
		return prefixhash.Group{Kind: kind, Window: window, Layers: layers, Layout: prefixhash.SplitKV,
			DType: prefixhash.BFloat16, KVHeads: 2, HeadDim: 64}
	}
	return prefixhash.Namespace{Model: "bench/hybrid-5to1", DType: prefixhash.BFloat16, BlockTokens: 16, Layers: 7,
		Groups: prefixhash.MustGroups(
			split(prefixhash.GroupFull, 0, 5),
			split(prefixhash.GroupSliding, 1024, 0, 1, 2, 3, 4),
			prefixhash.Group{Kind: prefixhash.GroupState, Layers: []int{6}, Layout: prefixhash.StateKV, DType: prefixhash.Float32, KVHeads: 4, StateBytes: 4096},
		)}
}

// BenchmarkGroupsBytesKept32k: a writer stores every group's record at
// every block of a 32k-token prompt (2048 blocks) of issueHybrid into a
// node whose DRAM holds 1.3× what a reader needs to resume at its end (every
// full block, the window's blocks, one state) and about a fifth of what is
// written. After a memory-pressure pass (what the store drops first when a
// write needs memory) it reports the bytes kept against that need
// (kept_per_need, target ≤ 1.1; prepass_per_need before the pass) and the
// blocks the prompt resumes at (resume_blocks, all 2048 wanted). The peer, in the same run and tier, is the same model
// cached as if every attention layer were full (a namespace without
// groups, 6 layers, and a state kept beside each block): what it would
// need for the same hit (asfull_per_need), and the blocks it resumes at
// with the same memory (asfull_blocks).
func BenchmarkGroupsBytesKept32k(b *testing.B) {
	ns := issueHybrid()
	const n = 2048
	tokens := make([]uint32, n*ns.BlockTokens)
	for i := range tokens {
		tokens[i] = uint32(i*2654435761) >> 8
	}
	chain := prefixhash.Keys(ns, tokens)
	hl := block.NamespaceHeaderLen(ns)
	size := func(g int) int { return hl + ns.GroupBytes(g) }
	groups := ns.Groups.All()
	wb := groups[1].WindowBlocks(ns.BlockTokens)
	need := n*size(0) + wb*size(1) + size(2)
	written := n * (size(0) + size(1) + size(2))
	payloads := make([][]byte, len(groups))
	for g := range payloads {
		payloads[g] = make([]byte, ns.GroupBytes(g))
		for j := range payloads[g] {
			payloads[g][j] = byte(j * (g + 3))
		}
	}
	// The records, encoded once; the benchmark times the puts.
	recs := make([][]byte, 0, n*len(groups))
	parent := ns.RootLink()
	for i := range n {
		for g := range groups {
			r, _, err := block.EncodeGroup(nil, 0, ns, g, parent, tokens[i*16:(i+1)*16], nil, payloads[g])
			if err != nil {
				b.Fatal(err)
			}
			recs = append(recs, r)
		}
		parent = prefixhash.KeyLink(chain[i])
	}
	const slab = 1 << 20
	capacity := int64(need) * 13 / 10 / slab * slab
	ctx := context.Background()
	var kept, before int64
	var hit prefixhash.Hit
	for b.Loop() {
		l := openLocal(b, Options{DRAM: realDRAM(b, capacity, slab)})
		for _, r := range recs {
			if err := l.Put(ctx, r); err != nil {
				b.Fatal(err)
			}
		}
		before = l.Stats().Tiers[0].Bytes
		// The pressure pass: what the store drops first when a write
		// needs memory (makeMemRoom's first step after incomplete blocks).
		l.dropRetiredForRoom()
		hit = l.Resume(auth.Access{}, groups, ns.BlockTokens, chain)
		kept = l.Stats().Tiers[0].Bytes
		b.StopTimer()
		l.Close()
		b.StartTimer()
	}
	if hit.Blocks != n {
		b.Fatalf("the prompt resumes at %d of %d blocks (%+v)", hit.Blocks, n, hit)
	}
	b.ReportMetric(float64(kept)/float64(need), "kept_per_need")
	b.ReportMetric(float64(before)/float64(need), "prepass_per_need")
	b.ReportMetric(float64(hit.Blocks), "resume_blocks")
	b.ReportMetric(float64(written)/float64(need), "written_per_need")
	b.SetBytes(int64(written))

	// The peer: every attention layer cached as full, beside a state per
	// block (what a store without groups would have to keep to serve the
	// same hit).
	plain := prefixhash.Namespace{Model: ns.Model, DType: prefixhash.BFloat16, BlockTokens: 16, Layers: 6, KVHeads: 2, HeadDim: 64}
	asFull := n * block.EncodedLen(16, plain.BlockBytes())
	b.ReportMetric(float64(asFull+size(2))/float64(need), "asfull_per_need")
	l := openLocal(b, Options{DRAM: realDRAM(b, capacity, slab)})
	pchain := prefixhash.Keys(plain, tokens)
	payload := make([]byte, plain.BlockBytes())
	for i := range n {
		p := plain.Root()
		if i > 0 {
			p = pchain[i-1]
		}
		r, _, err := block.Encode(nil, plain, p, tokens[i*16:(i+1)*16], payload)
		if err != nil {
			b.Fatal(err)
		}
		if err := l.Put(ctx, r); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(l.LongestPrefix(auth.Access{}, pchain)), "asfull_blocks")
	if testing.Verbose() {
		fmt.Printf("need %d, written %d, capacity %d, kept %d before the pass, %d after\n", need, written, capacity, before, kept)
	}
}

// BenchmarkClusterResume128k is the store's part of a 128k-token lookup
// (8192 blocks) on a 4-node loopback cluster (peers called in process, so
// it counts the lookup's own work, not the network's): Resume of a hybrid
// namespace (a full layer, five sliding layers with a 1024-token window, a
// state; every group's record at every block) against Locate of the same
// prompt without groups, each through the three nodes that did not write
// it, in turn, interleaved (hybrid_per_plain; target ≤ 1.2). The records are put group by
// group, as the clients put a prompt; "hybrid-block-major" puts each
// block's records together, which interleaves the groups' index entries
// and makes each probe of the full group's chain touch memory of its own
// (the index allocates entries in the order blocks arrive).
func BenchmarkClusterResume128k(b *testing.B) {
	net := &loopback{nodes: map[string]*Local{}, fault: map[string]string{}, calls: map[string]int{}}
	var ms []Member
	for i := range 4 {
		ms = append(ms, Member{ID: fmt.Sprintf("n%d", i), Weight: 1})
	}
	var nodes []*Cluster
	for i := range 4 {
		l := openLocal(b, Options{DRAM: newFakeMem(1<<20, 256, 512, 2048)})
		l.mem.(*fakeMem).fast = true
		sm := &staticMembers{self: ms[i].ID}
		sm.set(ms)
		c, err := NewCluster(l, sm, loopPeers{net}, ClusterOptions{ChunkTokens: 512})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { c.Close() })
		net.nodes[ms[i].ID] = l
		nodes = append(nodes, c)
	}
	split := func(kind prefixhash.GroupKind, window int, layers ...int) prefixhash.Group {
		return prefixhash.Group{Kind: kind, Window: window, Layers: layers, Layout: prefixhash.SplitKV, DType: prefixhash.Float16, KVHeads: 1, HeadDim: 4}
	}
	hybrid := prefixhash.Namespace{Model: "bench/resume-hybrid", DType: prefixhash.Float16, BlockTokens: 16, Layers: 7, Groups: prefixhash.MustGroups(
		split(prefixhash.GroupFull, 0, 5), split(prefixhash.GroupSliding, 1024, 0, 1, 2, 3, 4),
		prefixhash.Group{Kind: prefixhash.GroupState, Layers: []int{6}, Layout: prefixhash.StateKV, DType: prefixhash.Float16, KVHeads: 1, StateBytes: 64})}
	interleaved := hybrid
	interleaved.Model = "bench/resume-hybrid-block-major"
	plain := prefixhash.Namespace{Model: "bench/resume-plain", DType: prefixhash.Float16, BlockTokens: 16, Layers: 1, KVHeads: 1, HeadDim: 4}
	tokens := make([]uint32, 128<<10)
	for i := range tokens {
		tokens[i] = uint32(i * 2654435761)
	}
	ctx := context.Background()
	w := nodes[0]
	// put writes every record of the prompt in one Put: group by group
	// (every full record, then every window block, then every state), or
	// block by block (each block's records together).
	put := func(ns prefixhash.Namespace, blockMajor bool) []prefixhash.Key {
		chain := prefixhash.Keys(ns, tokens)
		cks := w.ChunkKeys(chain, 16, 0, len(chain))
		type rec struct {
			b  []byte
			ck prefixhash.Key
		}
		byGroup := make([][]rec, max(1, ns.Groups.Len()))
		parent := ns.RootLink()
		for i := range chain {
			tk := tokens[i*16 : (i+1)*16]
			if ns.Groups.IsZero() {
				r, _, err := block.Encode(nil, ns, parent.Key(), tk, make([]byte, ns.BlockBytes()))
				if err != nil {
					b.Fatal(err)
				}
				byGroup[0] = append(byGroup[0], rec{r, cks[i]})
			}
			for g := range ns.Groups.Len() {
				r, _, err := block.EncodeGroup(nil, 0, ns, g, parent, tk, nil, make([]byte, ns.GroupBytes(g)))
				if err != nil {
					b.Fatal(err)
				}
				byGroup[g] = append(byGroup[g], rec{r, cks[i]})
			}
			parent = prefixhash.KeyLink(chain[i])
		}
		var recs [][]byte
		var rcks []prefixhash.Key
		add := func(r rec) { recs, rcks = append(recs, r.b), append(rcks, r.ck) }
		if blockMajor {
			for i := range chain {
				for g := range byGroup {
					add(byGroup[g][i])
				}
			}
		} else {
			for g := range byGroup {
				for _, r := range byGroup[g] {
					add(r)
				}
			}
		}
		if err := w.Put(ctx, recs, rcks); err != nil {
			b.Fatal(err)
		}
		flush(b, w)
		return chain
	}
	pchain, hchain, ichain := put(plain, false), put(hybrid, false), put(interleaved, true)
	groups := hybrid.Groups.All()
	others := nodes[1:]
	// Interleaved, so that the machine's other load weighs on both alike:
	// each iteration looks the prompt up in the three forms, through the
	// next node, and times each; the ratios are per-form totals.
	paths := []func(c *Cluster) int{
		func(c *Cluster) int { n, _ := c.Locate(ctx, pchain, 16); return n },
		func(c *Cluster) int { hit, _ := c.Resume(ctx, groups, 16, hchain); return hit.Blocks },
		func(c *Cluster) int { hit, _ := c.Resume(ctx, groups, 16, ichain); return hit.Blocks },
	}
	var took [3]time.Duration
	k := 0
	for b.Loop() {
		for p, lookup := range paths {
			t0 := time.Now()
			if n := lookup(others[k%len(others)]); n != len(pchain) {
				b.Fatalf("form %d found %d of %d blocks", p, n, len(pchain))
			}
			took[p] += time.Since(t0)
		}
		k++
	}
	b.ReportMetric(float64(took[0].Microseconds())/float64(k), "plain_us")
	b.ReportMetric(float64(took[1].Microseconds())/float64(k), "hybrid_us")
	b.ReportMetric(float64(took[1])/float64(took[0]), "hybrid_per_plain")
	b.ReportMetric(float64(took[2])/float64(took[0]), "blockmajor_per_plain")
}
