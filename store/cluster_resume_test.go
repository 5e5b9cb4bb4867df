package store

import (
	"bytes"
	"context"
	"slices"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/auth"
	"github.com/kvmesh/kvmesh/prefixhash"
)

// putRecords puts group g's records of blocks idx of w's chain ending at
// last through c, placed by their blocks' chunk keys.
func putRecords(t *testing.T, c *Cluster, w *hybridWorld, last, g int, idx ...int) {
	t.Helper()
	chain := w.chain(last)
	path := w.path(last)
	var recs [][]byte
	var cks []prefixhash.Key
	for _, i := range idx {
		recs = append(recs, w.record(path[i], g))
		cks = append(cks, prefixhash.ChunkKey(chain, i, c.ChunkBlocks(w.ns.BlockTokens)))
	}
	if err := c.Put(context.Background(), recs, cks); err != nil {
		t.Fatal(err)
	}
}

// path returns the world's blocks from the root down to block last.
func (w *hybridWorld) path(last int) []int {
	var p []int
	for i := last; i >= 0; i = w.blocks[i].parent {
		p = append(p, i)
	}
	slices.Reverse(p)
	return p
}

func upTo(n int) []int {
	out := make([]int, n)
	for i := range out {
		out[i] = i
	}
	return out
}

// TestClusterResumeModel: random groups' records of random blocks of a
// prompt, put through random nodes, are found by Resume through any node
// as the hit rule finds them over everything put.
func TestClusterResumeModel(t *testing.T) {
	tc := newTestCluster(t, 4, ClusterOptions{ChunkTokens: 8}) // 2 blocks per chunk
	w := newHybridWorld(t, 5)
	ctx := context.Background()
	held := map[[2]int]bool{} // world block, group: prompts share blocks
	for iter := range 40 {
		last := -1
		n := 1 + w.rng.IntN(20)
		for range n {
			last = w.extend(last)
		}
		path := w.path(last)
		n = len(path)
		density := 0.6 + 0.4*w.rng.Float64()
		for g := range w.groups {
			for i := range n {
				if w.rng.Float64() < density {
					putRecords(t, tc.nodes[w.rng.IntN(4)], w, last, g, i)
					held[[2]int{path[i], g}] = true
				}
			}
		}
		flush(t, tc.nodes...)
		want, _ := prefixhash.Resume(w.groups, w.ns.BlockTokens, n, func(g, i int) prefixhash.Presence {
			if held[[2]int{path[i], g}] {
				return prefixhash.Held
			}
			return prefixhash.Missing
		})
		for k, c := range tc.nodes {
			got, spans := c.Resume(ctx, w.groups, w.ns.BlockTokens, w.chain(last))
			if got.Blocks != want.Blocks || !slices.Equal(got.Groups, want.Groups) {
				t.Fatalf("iter %d node %d: Resume %+v, model %+v", iter, k, got, want)
			}
			sum := 0
			for _, s := range spans {
				sum += s.Blocks
			}
			if sum != got.Blocks {
				t.Fatalf("iter %d node %d: spans %+v cover %d blocks of %d", iter, k, spans, sum, got.Blocks)
			}
		}
	}
}

// TestClusterResumeKilledState: a prompt written through node 0, with its
// newest state put through the owner of its last chunk only, resumes at its
// end through any node; once that owner is dead (as after kill -9) the hit
// is shorter (the state before it), never longer, and the records it names
// are read back through another node byte for byte.
func TestClusterResumeKilledState(t *testing.T) {
	tc := newTestCluster(t, 4, ClusterOptions{ChunkTokens: 8, LookupTimeout: time.Second})
	w := newHybridWorld(t, 6)
	ctx := context.Background()
	const n = 12
	last := -1
	for range n {
		last = w.extend(last)
	}
	chain := w.chain(last)
	a := tc.nodes[0]
	cb := a.ChunkBlocks(w.ns.BlockTokens)
	owner := a.Owners(prefixhash.ChunkKey(chain, n-1, cb))[0]
	var x *Cluster
	for k, c := range tc.nodes {
		if tc.members[k].self == owner {
			x = c
		}
	}
	if owner == "n0" {
		t.Skip("the last chunk's owner is the writer; pick another seed")
	}
	for g, gr := range w.groups {
		if gr.Kind == prefixhash.GroupState {
			putRecords(t, a, w, last, g, upTo(n-1)...)
			putRecords(t, x, w, last, g, n-1)
		} else {
			putRecords(t, a, w, last, g, upTo(n)...)
		}
	}
	flush(t, tc.nodes...)
	for k, c := range tc.nodes {
		if hit, _ := c.Resume(ctx, w.groups, w.ns.BlockTokens, chain); hit.Blocks != n {
			t.Fatalf("node %d: %+v before the kill", k, hit)
		}
	}
	tc.net.mu.Lock()
	tc.net.fault[owner] = "dead"
	tc.net.mu.Unlock()
	hit, _ := a.Resume(ctx, w.groups, w.ns.BlockTokens, chain)
	if hit.Blocks != n-1 || hit.Groups[2] != n-1 {
		t.Fatalf("after the kill: %+v, want %d blocks (the state before)", hit, n-1)
	}
	// Through node 0, which holds copies of the rest, every record the hit
	// names reads back as put.
	path := w.path(last)
	for g, gr := range w.groups {
		var idx []int
		switch gr.Kind {
		case prefixhash.GroupState:
			idx = []int{hit.Blocks - 1}
		case prefixhash.GroupSliding:
			idx = upTo(hit.Blocks)[hit.Blocks-gr.WindowBlocks(w.ns.BlockTokens):]
		default:
			idx = upTo(hit.Blocks)
		}
		keys := make([]prefixhash.Key, len(idx))
		cks := make([]prefixhash.Key, len(idx))
		for j, i := range idx {
			keys[j] = prefixhash.GroupKey(chain[i], g)
			cks[j] = prefixhash.ChunkKey(chain, i, cb)
		}
		f, err := a.GetKeys(ctx, keys, cks, time.Time{})
		if err != nil {
			t.Fatal(err)
		}
		for j, i := range idx {
			if b := f.Blocks[j]; b == nil || !bytes.Equal(b, w.record(path[i], g)) {
				t.Fatalf("group %d block %d: read %d bytes, not the record put", g, i, len(b))
			}
		}
		f.Release()
	}
}

// TestClusterGroupsHandoff: a node leaving gracefully hands every group's
// records to their new owners, placed by their blocks' chain keys: the
// prompt still resumes whole through the remaining nodes.
func TestClusterGroupsHandoff(t *testing.T) {
	tc := newTestCluster(t, 3, ClusterOptions{ChunkTokens: 8})
	w := newHybridWorld(t, 7)
	const n = 24
	last := -1
	for range n {
		last = w.extend(last)
	}
	for g := range w.groups {
		putRecords(t, tc.nodes[0], w, last, g, upTo(n)...)
	}
	flush(t, tc.nodes...)
	leaving := tc.nodes[1]
	if held := leaving.Local().Stats().Tiers[0].Blocks; held == 0 {
		t.Fatal("n1 holds nothing: the test proves nothing")
	}
	leaving.Handoff(context.Background(), 1<<30)
	for _, sm := range tc.members {
		sm.set([]Member{{ID: "n0", Weight: 1}, {ID: "n2", Weight: 1}})
	}
	tc.net.mu.Lock()
	tc.net.fault["n1"] = "dead"
	tc.net.mu.Unlock()
	// Every record of a chunk that moved from n1 to n2 is on n2 (n0 wrote
	// them all and holds copies, which prove nothing), and the prompt
	// resumes whole through n2.
	after := NewPlacement([]Member{{ID: "n0", Weight: 1}, {ID: "n2", Weight: 1}}, 1)
	before := NewPlacement([]Member{{ID: "n0", Weight: 1}, {ID: "n1", Weight: 1}, {ID: "n2", Weight: 1}}, 1)
	chain := w.chain(last)
	moved := 0
	for i := range chain {
		ck := prefixhash.ChunkKey(chain, i, 2)
		if before.Owner(ck) != "n1" || after.Owner(ck) != "n2" {
			continue
		}
		for g := range w.groups {
			moved++
			if !tc.net.nodes["n2"].Contains(auth.Access{}, prefixhash.GroupKey(chain[i], g)) {
				t.Fatalf("block %d group %d moved from n1 to n2, which does not hold it", i, g)
			}
		}
	}
	if moved == 0 {
		t.Fatal("no record moved from n1 to n2: the test proves nothing")
	}
	if hit, _ := tc.nodes[2].Resume(context.Background(), w.groups, w.ns.BlockTokens, chain); hit.Blocks != n {
		t.Fatalf("after n1 left: %+v", hit)
	}
}

// TestClusterResumeNoAnchor: a namespace of sliding and state groups only
// (no full group: every layer windowed, as Mistral 7B v0.1) resumes where
// the window and the state are, asking owners in one round of its own.
func TestClusterResumeNoAnchor(t *testing.T) {
	tc := newTestCluster(t, 4, ClusterOptions{ChunkTokens: 8})
	ns := prefixhash.Namespace{Model: "kvmesh/windowed", DType: prefixhash.Float16, BlockTokens: 4, Layers: 3, Groups: prefixhash.MustGroups(
		prefixhash.Group{Kind: prefixhash.GroupSliding, Window: 8, Layers: []int{0, 1}, Layout: prefixhash.SplitKV, DType: prefixhash.Float16, KVHeads: 1, HeadDim: 4},
		prefixhash.Group{Kind: prefixhash.GroupState, Layers: []int{2}, Layout: prefixhash.StateKV, DType: prefixhash.Float16, KVHeads: 1, StateBytes: 8},
	)}
	w := newHybridWorld(t, 8)
	w.ns, w.groups = ns, ns.Groups.All()
	const n = 12
	last := -1
	for range n {
		last = w.extend(last)
	}
	// Windows of blocks 6.. and states at 7 and 9 only.
	putRecords(t, tc.nodes[0], w, last, 0, 6, 7, 8, 9, 10, 11)
	putRecords(t, tc.nodes[1], w, last, 1, 7, 9)
	flush(t, tc.nodes...)
	for k, c := range tc.nodes {
		hit, spans := c.Resume(context.Background(), w.groups, ns.BlockTokens, w.chain(last))
		// At 10: window [8,10) and the state at 9.
		if hit.Blocks != 10 || !slices.Equal(hit.Groups, []int{12, 10}) || len(spans) != 0 {
			t.Fatalf("node %d: %+v, spans %+v; want 10 blocks, groups [12 10]", k, hit, spans)
		}
	}
}
