package store

import (
	"bytes"
	"context"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/kvmesh/kvmesh/auth"
	"github.com/kvmesh/kvmesh/block"
	"github.com/kvmesh/kvmesh/block/blocktest"
	"github.com/kvmesh/kvmesh/prefixhash"
)

// hybridWorld is a tree of blocks of a namespace with groups: each block
// has a record per group, made when first asked for.
type hybridWorld struct {
	t      testing.TB
	byLink map[prefixhash.Link]int
	rng    *rand.Rand
	ns     prefixhash.Namespace
	groups []prefixhash.Group
	blocks []hblock
}

type hblock struct {
	parent int // -1: the root
	link   prefixhash.Link
	tokens []uint32
	recs   [][]byte // by group; nil until made
}

func newHybridWorld(t testing.TB, seed uint64) *hybridWorld {
	ns := blocktest.Hybrid()
	return &hybridWorld{t: t, byLink: map[prefixhash.Link]int{}, rng: rand.New(rand.NewPCG(seed, 31)), ns: ns, groups: ns.Groups.All()}
}

// extend adds a block under parent (-1: the root) and returns its index.
func (w *hybridWorld) extend(parent int) int {
	pl := w.ns.RootLink()
	if parent >= 0 {
		pl = w.blocks[parent].link
	}
	tokens := make([]uint32, w.ns.BlockTokens)
	for i := range tokens {
		tokens[i] = w.rng.Uint32N(4) // few values: prompts share prefixes
	}
	link := prefixhash.BlockLink(w.ns.Scheme, pl, tokens, nil)
	if i, ok := w.byLink[link]; ok {
		return i // the same block: the same parent and tokens
	}
	w.blocks = append(w.blocks, hblock{parent: parent, link: link, tokens: tokens, recs: make([][]byte, len(w.groups))})
	w.byLink[link] = len(w.blocks) - 1
	return len(w.blocks) - 1
}

// record returns group g's encoded record of block i.
func (w *hybridWorld) record(i, g int) []byte {
	b := &w.blocks[i]
	if b.recs[g] == nil {
		pl := w.ns.RootLink()
		if b.parent >= 0 {
			pl = w.blocks[b.parent].link
		}
		b.recs[g], _ = blocktest.Record(w.t, w.rng, w.ns, g, pl, b.tokens)
	}
	return b.recs[g]
}

// chain returns the chain keys from the root down to block i.
func (w *hybridWorld) chain(i int) []prefixhash.Key {
	var ks []prefixhash.Key
	for ; i >= 0; i = w.blocks[i].parent {
		ks = append(ks, w.blocks[i].link.Key())
	}
	slices.Reverse(ks)
	return ks
}

// TestLocalResumeModel gives the store and a set of held records the same
// random puts of random groups' records of a tree of prompts, in a store
// that never needs room, and requires Local.Resume to answer as the hit
// rule over the set; reads return the bytes put, and another tenant's
// request sees nothing.
func TestLocalResumeModel(t *testing.T) {
	w := newHybridWorld(t, 1)
	l := openLocal(t, Options{DRAM: newFakeMem(64<<10, 512, 256, 512, 1024, 2048)})
	ctx := context.Background()
	held := map[[2]int]bool{}
	for range 6 {
		w.extend(-1)
	}
	for step := range 3000 {
		switch op := w.rng.IntN(10); {
		case op < 2:
			w.extend(w.rng.IntN(len(w.blocks)))
		case op < 6:
			i, g := w.rng.IntN(len(w.blocks)), w.rng.IntN(len(w.groups))
			if err := l.Put(ctx, w.record(i, g)); err != nil {
				t.Fatalf("step %d: put block %d group %d: %v", step, i, g, err)
			}
			held[[2]int{i, g}] = true
		case op < 7:
			i, g := w.rng.IntN(len(w.blocks)), w.rng.IntN(len(w.groups))
			r, err := l.Get(ctx, prefixhash.GroupKey(w.blocks[i].link.Key(), g))
			if (err == nil) != held[[2]int{i, g}] {
				t.Fatalf("step %d: Get of block %d group %d: %v, held %v", step, i, g, err, held[[2]int{i, g}])
			}
			if err == nil {
				if !bytes.Equal(r.Bytes(), w.record(i, g)) {
					t.Fatalf("step %d: other bytes", step)
				}
				r.Release()
			}
		default:
			last := w.rng.IntN(len(w.blocks))
			var path []int
			for i := last; i >= 0; i = w.blocks[i].parent {
				path = append(path, i)
			}
			slices.Reverse(path)
			chain := w.chain(last)
			got := l.Resume(auth.Access{}, w.groups, w.ns.BlockTokens, chain)
			want, _ := prefixhash.Resume(w.groups, w.ns.BlockTokens, len(chain), func(g, i int) prefixhash.Presence {
				if held[[2]int{path[i], g}] {
					return prefixhash.Held
				}
				return prefixhash.Missing
			})
			if got.Blocks != want.Blocks || !slices.Equal(got.Groups, want.Groups) {
				t.Fatalf("step %d: Resume %+v, model %+v", step, got, want)
			}
			if other := l.Resume(auth.Access{Scoped: true, Tag: 7}, w.groups, w.ns.BlockTokens, chain); other.Blocks != 0 {
				t.Fatalf("step %d: another tenant resumes at %d", step, other.Blocks)
			}
		}
	}
	if err := l.Stats().Check(); err != nil {
		t.Fatal(err)
	}
	// Stats count every group's records as blocks, group 0's tokens once.
	st := l.Stats()
	full := 0
	for k := range held {
		if k[1] == 0 {
			full++
		}
	}
	if len(st.Namespaces) != 1 || st.Namespaces[0].Blocks != int64(len(held)) || st.Namespaces[0].Tokens != int64(full*w.ns.BlockTokens) {
		t.Fatalf("stats %+v; %d records held, %d of group 0", st.Namespaces, len(held), full)
	}
}

// TestLocalGroupsShorterHit: a prompt with every record is a full hit; a
// missing state or a missing window block makes it shorter, with the
// reason in the per-group answer; a dropped full block drops the windows
// and states that hang from it.
func TestLocalGroupsShorterHit(t *testing.T) {
	w := newHybridWorld(t, 2)
	l := openLocal(t, Options{DRAM: newFakeMem(64<<10, 64, 256, 512, 1024, 2048)})
	ctx := context.Background()
	// Every record of blocks 0..7, but the state only at block 3 and the
	// sliding window (6 tokens: 2 blocks) missing block 6.
	last := -1
	for i := range 8 {
		last = w.extend(last)
		for g, gr := range w.groups {
			if gr.Kind == prefixhash.GroupState && i != 3 || gr.Kind == prefixhash.GroupSliding && i == 6 {
				continue
			}
			if err := l.Put(ctx, w.record(last, g)); err != nil {
				t.Fatal(err)
			}
		}
	}
	chain := w.chain(last)
	hit := l.Resume(auth.Access{}, w.groups, w.ns.BlockTokens, chain)
	// full 8, sliding alone 6 (window [4,6)), state alone 4, indexer 8.
	if hit.Blocks != 4 || !slices.Equal(hit.Groups, []int{8, 6, 4, 8}) {
		t.Fatalf("Resume = %+v, want 4 blocks, groups [8 6 4 8]", hit)
	}
	// The state at block 7 makes the window the limit.
	if err := l.Put(ctx, w.record(last, 2)); err != nil {
		t.Fatal(err)
	}
	if hit = l.Resume(auth.Access{}, w.groups, w.ns.BlockTokens, chain); hit.Blocks != 4 || hit.Groups[2] != 8 {
		t.Fatalf("with the last state: %+v", hit)
	}
	if err := l.Put(ctx, w.record(6, 1)); err != nil {
		t.Fatal(err)
	}
	if hit = l.Resume(auth.Access{}, w.groups, w.ns.BlockTokens, chain); hit.Blocks != 8 {
		t.Fatalf("complete: %+v", hit)
	}
	// Losing block 5's full record drops what hangs from it: its own
	// window block and state, and the chain after it.
	key := prefixhash.GroupKey(chain[5], 0)
	l.mu.Lock()
	var fr []freeLoc
	l.dropLocked(l.mu.x.find(key), reasonEvict, &fr)
	l.mu.Unlock()
	l.freeAll(fr)
	for i := 5; i < 8; i++ {
		for g := range w.groups {
			if g != 3 && l.Contains(auth.Access{}, prefixhash.GroupKey(chain[i], g)) {
				t.Fatalf("block %d group %d outlived block 5's full record", i, g)
			}
		}
	}
	if hit = l.Resume(auth.Access{}, w.groups, w.ns.BlockTokens, chain); hit.Blocks != 4 || hit.Groups[0] != 5 {
		t.Fatalf("after dropping block 5: %+v", hit)
	}
}

// TestLocalGroupsBytesKept: a writer puts every group's record of a long
// prompt, block by block, into a memory tier with room for about 1.2× what
// a reader needs at the prompt's end (full and indexer blocks, one window,
// one state) and far less than everything written. The store keeps the
// whole prompt resumable, and at most 1.1× the bytes a reader needs plus
// a slab per size class of slack. It is resumable at its end after every
// block. Under the lru and the reuse eviction policies.
func TestLocalGroupsBytesKept(t *testing.T) {
	for _, ev := range []Eviction{EvictLRU, EvictReuse} {
		t.Run(string(ev), func(t *testing.T) { testGroupsBytesKept(t, ev) })
	}
}

// testGroupsBytesKept is TestLocalGroupsBytesKept under eviction policy
// ev. Each newest state is read once before the chain moves past it, so
// that under EvictReuse it is marked reused when it is retired: the bound
// holds all the same.
func testGroupsBytesKept(t *testing.T, ev Eviction) {
	w := newHybridWorld(t, 3)
	ns := w.ns
	hl := block.NamespaceHeaderLen(ns)
	size := func(g int) int { return hl + ns.GroupBytes(g) }
	const n = 96
	wb := w.groups[1].WindowBlocks(ns.BlockTokens)
	need := n*(size(0)+size(3)) + wb*size(1) + size(2)
	all := n * (size(0) + size(1) + size(2) + size(3))
	const slab = 4096
	slabs := need*6/5/slab + 1
	l := openLocal(t, Options{DRAM: newFakeMem(slab, slabs, size(2), size(3), size(0), size(1)), Eviction: ev})
	last := -1
	for i := range n {
		last = w.extend(last)
		for g := range w.groups {
			if err := l.Put(context.Background(), w.record(last, g)); err != nil {
				t.Fatalf("block %d group %d: %v", last, g, err)
			}
		}
		if r, err := l.Get(context.Background(), prefixhash.GroupKey(w.chain(last)[i], 2)); err == nil {
			r.Release()
		} else {
			t.Fatalf("block %d's state: %v", i, err)
		}
		if h := l.Resume(auth.Access{}, w.groups, ns.BlockTokens, w.chain(last)); h.Blocks != i+1 {
			t.Fatalf("after block %d the prompt resumes at %+v", i, h)
		}
	}
	hit := l.Resume(auth.Access{}, w.groups, ns.BlockTokens, w.chain(last))
	if hit.Blocks != n {
		t.Fatalf("the prompt resumes at %d of %d blocks (%+v)", hit.Blocks, n, hit)
	}
	s := l.Stats()
	kept := s.Tiers[0].Bytes
	t.Logf("kept %d bytes: %.3f× what a reader needs (%d), written %d (%.2f×), %d retired, %d evicted",
		kept, float64(kept)/float64(need), need, all, float64(all)/float64(need), s.Retired, s.Evictions)
	if float64(kept) > 1.1*float64(need)+float64(4*slab) {
		t.Fatalf("kept %d bytes, want at most 1.1 × %d + slack", kept, need)
	}
	if s.Retired == 0 || s.Evictions == 0 {
		t.Fatalf("nothing retired (%d) or evicted (%d)", s.Retired, s.Evictions)
	}
	if err := s.Check(); err != nil {
		t.Fatal(err)
	}
}

// TestLocalGroupsParts: groups' records put as TP/PP parts count only once
// every part of them is in: a prefix whose newest state or window block is
// half written resumes shorter, and complete once the last part lands.
func TestLocalGroupsParts(t *testing.T) {
	w := newHybridWorld(t, 4)
	l := openLocal(t, Options{DRAM: newFakeMem(64<<10, 64, 256, 512, 1024, 2048)})
	ctx := context.Background()
	last := -1
	for range 4 {
		last = w.extend(last)
	}
	path := w.path(last)
	putParts := func(i, g, tp, pp int, ranks ...int) {
		t.Helper()
		b := w.blocks[path[i]]
		pl := w.ns.RootLink()
		if i > 0 {
			pl = w.blocks[path[i-1]].link
		}
		whole, err := block.Decode(w.record(path[i], g), 0)
		if err != nil {
			t.Fatal(err)
		}
		lay := block.GroupLayout(w.ns, g)
		for _, r := range ranks {
			p, err := block.RankGroupPart(w.ns, g, r%tp, tp, r/tp, pp)
			if err != nil {
				t.Fatal(err)
			}
			if p.Empty() {
				continue
			}
			part := lay.ExtractPart(nil, whole.Payload, w.ns.BlockTokens, p)
			rec, _, err := block.AppendGroupHeader(nil, 0, w.ns, g, pl, b.tokens, nil, p, part)
			if err != nil {
				t.Fatal(err)
			}
			if err := l.Put(ctx, append(rec, part...)); err != nil {
				t.Fatalf("block %d group %d rank %d: %v", i, g, r, err)
			}
		}
	}
	// Whole records of everything but the last block's state and window
	// block, which ranks write in parts: the state by TP 2 (its two heads),
	// the window block by PP 2 (its layers 0, 2, 3 on stage 0, 5 on 1).
	for i := range 4 {
		for g := range w.groups {
			if i == 3 && (g == 1 || g == 2) {
				continue
			}
			if err := l.Put(ctx, w.record(path[i], g)); err != nil {
				t.Fatal(err)
			}
		}
	}
	chain := w.chain(last)
	resume := func() int { return l.Resume(auth.Access{}, w.groups, w.ns.BlockTokens, chain).Blocks }
	putParts(3, 2, 2, 1, 0)
	putParts(3, 1, 1, 2, 0)
	if got := resume(); got != 3 {
		t.Fatalf("with half of the last state and window block: resumes at %d, want 3", got)
	}
	putParts(3, 2, 2, 1, 1)
	if got := resume(); got != 3 {
		t.Fatalf("with the whole state, half the window block: resumes at %d, want 3", got)
	}
	putParts(3, 1, 1, 2, 1)
	if got := resume(); got != 4 {
		t.Fatalf("with every part: resumes at %d, want 4", got)
	}
	r, err := l.Get(ctx, prefixhash.GroupKey(chain[3], 2))
	if err != nil {
		t.Fatal(err)
	}
	defer r.Release()
	if !bytes.Equal(r.Bytes(), w.record(path[3], 2)) {
		t.Fatal("the state assembled from parts is not the whole record")
	}
}

// TestLocalGroupsRetainedNotRetired: a state record under a hard pin stays
// an ordinary record when its chain moves past it, where an unpinned one
// is retired (listed cold, dropped first for room).
func TestLocalGroupsRetainedNotRetired(t *testing.T) {
	ctx := context.Background()
	w := newHybridWorld(t, 5)
	hl := block.NamespaceHeaderLen(w.ns)
	size := func(g int) int { return hl + w.ns.GroupBytes(g) }
	l := openLocal(t, Options{DRAM: newFakeMem(1<<16, 32, size(2), size(3), size(0), size(1)), MaxPinnedFraction: 0.5})
	const state = 2 // blocktest.Hybrid's groups: full, sliding, state, indexer
	last := -1
	var states []prefixhash.Key
	for i := range 4 {
		last = w.extend(last)
		for g := range w.groups {
			if err := l.Put(ctx, w.record(last, g)); err != nil {
				t.Fatalf("block %d group %d: %v", last, g, err)
			}
		}
		states = append(states, prefixhash.GroupKey(w.chain(last)[i], state))
		if i == 0 {
			if got, err := l.Retain(ctx, states[:1], block.Retention{Pin: block.PinHard}); err != nil || !got[0] {
				t.Fatalf("pin block 0's state: %v %v", got, err)
			}
		}
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	bit := func(k prefixhash.Key) (retired, retained bool) {
		i := l.mu.x.find(k)
		if i == 0 {
			t.Fatalf("state %s not cached", k)
		}
		return l.mu.x.at(i).retired(), l.mu.x.at(i).retained()
	}
	if retired, retained := bit(states[0]); retired || !retained {
		t.Fatalf("pinned state: retired %v retained %v, want an ordinary retained record", retired, retained)
	}
	if retired, _ := bit(states[1]); !retired {
		t.Fatal("the unpinned state the chain moved past is not retired")
	}
}
