package store

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/auth"
	"github.com/kvmesh/kvmesh/block"
	"github.com/kvmesh/kvmesh/block/blocktest"
	"github.com/kvmesh/kvmesh/prefixhash"
	"github.com/kvmesh/kvmesh/tiers"
)

// The eviction policies (evict.go): lru is the reference, dedup evicts
// copies first and never links them, reuse also gives blocks asked for again
// a second chance.

func forEachEviction(t *testing.T, f func(t *testing.T, ev Eviction)) {
	for _, ev := range EvictionPolicies() {
		t.Run(string(ev), func(t *testing.T) { f(t, ev) })
	}
}

// evictLocal opens a memory-only Local holding at most max blocks under ev,
// and a world of blocks for it.
func evictLocal(t *testing.T, seed uint64, max int, ev Eviction) (*world, *Local) {
	w := newWorld(t, seed, blocktest.NS())
	return w, openLocal(t, Options{DRAM: newFakeMem(64<<10, 64, 1024), MaxBlocks: max, Eviction: ev})
}

// putFresh puts n new blocks, each a chain of its own.
func putFresh(t *testing.T, w *world, l *Local, n int) {
	t.Helper()
	for range n {
		if err := l.Put(context.Background(), w.blocks[w.extend(-1)].enc); err != nil {
			t.Fatal(err)
		}
	}
}

func cached(l *Local, key prefixhash.Key) bool { return l.Contains(auth.Access{}, key) }

func info(t *testing.T, l *Local, key prefixhash.Key) BlockInfo {
	t.Helper()
	bi, ok := l.Info(auth.Access{}, key)
	if !ok {
		t.Fatalf("block %s is not cached", key)
	}
	return bi
}

// TestEvictionCopiesFirst: a full node under dedup evicts its copies before
// any block it owns, however recently the copies were put; under lru the
// oldest blocks go, copies or not.
func TestEvictionCopiesFirst(t *testing.T) {
	forEachEviction(t, func(t *testing.T, ev Eviction) {
		const max = 8
		w, l := evictLocal(t, 5, max, ev)
		ctx := context.Background()
		var owned, copies []int
		for k := range max {
			b := w.extend(-1)
			put := l.Put
			if k >= max/2 {
				put = l.PutCopy
				copies = append(copies, b)
			} else {
				owned = append(owned, b)
			}
			if err := put(ctx, w.blocks[b].enc); err != nil {
				t.Fatal(err)
			}
		}
		for _, b := range copies {
			if got := info(t, l, w.blocks[b].key).Copy; got != ev.keepsCopies() {
				t.Fatalf("Info.Copy of a PutCopy block = %v under %s", got, ev)
			}
		}
		// Four more owned blocks make room for themselves.
		for range max / 2 {
			b := w.extend(-1)
			owned = append(owned, b)
			if err := l.Put(ctx, w.blocks[b].enc); err != nil {
				t.Fatal(err)
			}
		}
		if n := totalBlocks(l.Stats()); n != max {
			t.Fatalf("%d blocks cached, want %d", n, max)
		}
		gone := owned[:max/2] // lru: the four oldest
		kept := slices.Concat(owned[max/2:], copies)
		if ev.keepsCopies() {
			gone, kept = copies, owned
		}
		for _, b := range gone {
			if cached(l, w.blocks[b].key) {
				t.Errorf("%s kept block %d, which it should have evicted", ev, b)
			}
		}
		for _, b := range kept {
			if !cached(l, w.blocks[b].key) {
				t.Errorf("%s evicted block %d, which it should have kept", ev, b)
			}
		}
	})
}

// TestEvictionCopyIsNotLinked: under dedup a copy is neither a child nor a
// parent in the index, so evicting it drops nothing else; a Put of the copy
// (its owner's push) makes it an ordinary, linked block. Under lru PutCopy
// is Put.
func TestEvictionCopyIsNotLinked(t *testing.T) {
	forEachEviction(t, func(t *testing.T, ev Eviction) {
		w, l := evictLocal(t, 6, 64, ev)
		ctx := context.Background()
		a := w.extend(-1)
		b := w.extend(a) // a copy under a
		c := w.extend(b) // owned under the copy
		for _, p := range []struct {
			i    int
			copy bool
		}{{a, false}, {b, true}, {c, false}} {
			put := l.Put
			if p.copy {
				put = l.PutCopy
			}
			if err := put(ctx, w.blocks[p.i].enc); err != nil {
				t.Fatal(err)
			}
		}
		linked := ev == EvictLRU
		if got := info(t, l, w.blocks[b].key); got.Parent != linked || (got.Children == 1) != linked {
			t.Fatalf("%s: the copy's info %+v: linked to parent and child should be %v", ev, got, linked)
		}
		if got := info(t, l, w.blocks[c].key); got.Parent != linked {
			t.Fatalf("%s: the copy's child is linked: %v, want %v", ev, got.Parent, linked)
		}
		// The owner's push makes the copy ordinary (and links it to a).
		if err := l.Put(ctx, w.blocks[b].enc); err != nil {
			t.Fatal(err)
		}
		if got := info(t, l, w.blocks[b].key); got.Copy || !got.Parent {
			t.Fatalf("%s: after Put the copy's info is %+v, want ordinary and linked to its parent", ev, got)
		}
		// A copy put again as a copy of an ordinary block stays ordinary.
		if err := l.PutCopy(ctx, w.blocks[a].enc); err != nil {
			t.Fatal(err)
		}
		if info(t, l, w.blocks[a].key).Copy {
			t.Fatalf("%s: PutCopy turned an ordinary block into a copy", ev)
		}
	})
	// Under dedup, evicting a copy leaves the block put under it.
	w, l := evictLocal(t, 7, 3, EvictDedup)
	ctx := context.Background()
	a := w.extend(-1)
	b := w.extend(a)
	for _, err := range []error{l.PutCopy(ctx, w.blocks[a].enc), l.Put(ctx, w.blocks[b].enc)} {
		if err != nil {
			t.Fatal(err)
		}
	}
	putFresh(t, w, l, 2)
	if cached(l, w.blocks[a].key) || !cached(l, w.blocks[b].key) {
		t.Fatalf("copy cached %v, its child cached %v: want the copy evicted and the child kept",
			cached(l, w.blocks[a].key), cached(l, w.blocks[b].key))
	}
	if st := l.Stats(); st.Evictions != 1 {
		t.Fatalf("%d evictions, want 1 (no cascade from a copy)", st.Evictions)
	}
}

// TestEvictionSkipsPinned: a block read through a live Ref is never evicted,
// under any policy, however much is put after it; once released it goes.
func TestEvictionSkipsPinned(t *testing.T) {
	forEachEviction(t, func(t *testing.T, ev Eviction) {
		const max = 4
		w, l := evictLocal(t, 8, max, ev)
		ctx := context.Background()
		owned, cp := w.extend(-1), w.extend(-1)
		if err := l.Put(ctx, w.blocks[owned].enc); err != nil {
			t.Fatal(err)
		}
		if err := l.PutCopy(ctx, w.blocks[cp].enc); err != nil {
			t.Fatal(err)
		}
		var refs []*Ref
		for _, b := range []int{owned, cp} {
			r, err := l.Get(ctx, w.blocks[b].key)
			if err != nil {
				t.Fatal(err)
			}
			refs = append(refs, r)
		}
		putFresh(t, w, l, 8*max)
		for k, b := range []int{owned, cp} {
			if !cached(l, w.blocks[b].key) {
				t.Fatalf("%s evicted pinned block %d", ev, b)
			}
			if !bytes.Equal(refs[k].Bytes(), w.blocks[b].enc) {
				t.Fatalf("%s: pinned block %d changed under its Ref", ev, b)
			}
			refs[k].Release()
		}
		putFresh(t, w, l, 2*max)
		for _, b := range []int{owned, cp} {
			if cached(l, w.blocks[b].key) {
				t.Fatalf("%s kept block %d after its release and %d puts", ev, b, 2*max)
			}
		}
	})
}

// TestEvictionLeavesFirst: under pressure a chain loses its deepest blocks
// first: whatever is left of it is always a prefix, under every policy.
// (Only a copy may go before its children, and it is not linked to them.)
func TestEvictionLeavesFirst(t *testing.T) {
	forEachEviction(t, func(t *testing.T, ev Eviction) {
		const n = 8
		w, l := evictLocal(t, 9, n, ev)
		last := w.putChain(t, l, n)
		chain := w.chain(last)
		// A lookup touches the chain deepest-first.
		if got := l.LongestPrefix(auth.Access{}, chain); got != n {
			t.Fatalf("prefix %d of %d", got, n)
		}
		for k := range n {
			putFresh(t, w, l, 1)
			held, prefix := 0, 0
			for d, key := range chain {
				if cached(l, key) { // Contains: no touch
					held++
					if prefix == d {
						prefix++
					}
				}
			}
			if prefix != held {
				t.Fatalf("%s: after %d puts the chain holds %d blocks but only %d from its root: a parent went before its child", ev, k+1, held, prefix)
			}
			if held != n-k-1 {
				t.Fatalf("%s: after %d puts the chain holds %d blocks, want %d", ev, k+1, held, n-k-1)
			}
		}
	})
}

// TestEvictionCopiesAreNotDemoted: DRAM pressure drops copies instead of
// writing them to NVMe (their owners hold them); owned blocks are demoted.
func TestEvictionCopiesAreNotDemoted(t *testing.T) {
	for _, copies := range []bool{false, true} {
		t.Run(fmt.Sprintf("copies=%v", copies), func(t *testing.T) {
			w := newWorld(t, 10, blocktest.NS())
			l := openLocal(t, Options{DRAM: newFakeMem(4*1024, 2, 1024), NVMe: newFakeVolume(64<<10, 8).open(),
				DemoteBatchBytes: 1, Eviction: EvictDedup})
			ctx := context.Background()
			put := l.Put
			if copies {
				put = l.PutCopy
			}
			for range 32 {
				if err := put(ctx, w.blocks[w.extend(-1)].enc); err != nil {
					t.Fatal(err)
				}
			}
			st := l.Stats()
			if st.Evictions+st.Demotions == 0 {
				t.Fatalf("no pressure: %+v", st)
			}
			if copies && (st.Demotions != 0 || st.Evictions == 0) {
				t.Fatalf("copies: %d demoted, %d evicted; want none demoted", st.Demotions, st.Evictions)
			}
			if !copies && (st.Demotions == 0 || st.Evictions != 0) {
				t.Fatalf("owned: %d demoted, %d evicted; want them demoted", st.Demotions, st.Evictions)
			}
		})
	}
}

// TestEvictionOption: an unknown policy is refused with the field's name;
// the default is DefaultEviction.
func TestEvictionOption(t *testing.T) {
	_, err := Open(Options{DRAM: newFakeMem(64<<10, 4, 1024), Eviction: "fifo"})
	if err == nil || !strings.Contains(err.Error(), "Eviction") || !strings.Contains(err.Error(), "fifo") {
		t.Fatalf("Open with Eviction fifo: %v, want an error naming the field and the value", err)
	}
	o := Options{DRAM: newFakeMem(64<<10, 4, 1024)}
	o.EnsureDefaults()
	if o.Eviction != DefaultEviction {
		t.Fatalf("default eviction %q, want %q", o.Eviction, DefaultEviction)
	}
	for _, ev := range EvictionPolicies() {
		if got, err := ParseEviction(string(ev)); err != nil || got != ev {
			t.Fatalf("ParseEviction(%q) = %q, %v", ev, got, err)
		}
	}
}

// TestEvictionDeterministic: the same seeded sequence of puts, copies and
// lookups leaves the same blocks cached, under every policy.
func TestEvictionDeterministic(t *testing.T) {
	forEachEviction(t, func(t *testing.T, ev Eviction) {
		run := func() ([]prefixhash.Key, Stats) {
			w, l := evictLocal(t, 11, 24, ev)
			rng := rand.New(rand.NewPCG(12, 12))
			ctx := context.Background()
			for range 600 {
				switch r := rng.IntN(10); {
				case r < 5:
					if err := l.Put(ctx, w.blocks[w.grow()].enc); err != nil {
						t.Fatal(err)
					}
				case r < 8:
					if err := l.PutCopy(ctx, w.blocks[w.grow()].enc); err != nil {
						t.Fatal(err)
					}
				default:
					l.LongestPrefix(auth.Access{}, w.chain(w.randomBlock()))
				}
			}
			var keys []prefixhash.Key
			for _, b := range w.blocks {
				if cached(l, b.key) {
					keys = append(keys, b.key)
				}
			}
			return keys, l.Stats()
		}
		k1, s1 := run()
		k2, s2 := run()
		if !slices.Equal(k1, k2) || s1.Evictions != s2.Evictions || s1.Evictions == 0 {
			t.Fatalf("%s: two seeded runs differ (or evicted nothing): %d vs %d blocks, %d vs %d evictions",
				ev, len(k1), len(k2), s1.Evictions, s2.Evictions)
		}
	})
}

// TestClusterPutKeepsCopies: the producer stores what another node owns as
// a copy (under dedup), its owners as ordinary blocks, and a copy evicted at
// once still reaches its owner.
func TestClusterPutKeepsCopies(t *testing.T) {
	tc := newTestClusterWith(t, 4, ClusterOptions{ChunkTokens: 4}, Options{MaxBlocks: 2, Eviction: EvictDedup})
	ns := clusterNS()
	chain, blocks := prompt(t, rand.New(rand.NewPCG(13, 13)), ns, 12)
	a := tc.nodes[0]
	cks := a.ChunkKeys(chain, ns.BlockTokens, 0, len(chain))
	n, err := a.PublishBlocks(blocks, cks)
	if err != nil {
		t.Fatal(err)
	}
	flush(t, a)
	want := 0
	for _, ck := range cks {
		if !a.Owns(ck) {
			want++
		}
	}
	if n != want || want == 0 {
		t.Fatalf("PublishBlocks queued %d blocks, want %d (those n0 does not own)", n, want)
	}
	if _, err := a.PublishBlocks(blocks, cks[:1]); err == nil {
		t.Fatal("PublishBlocks with too few chunk keys accepted")
	}

	tc = newTestClusterWith(t, 4, ClusterOptions{ChunkTokens: 4}, Options{Eviction: EvictDedup})
	a = tc.nodes[0]
	if err := a.Put(context.Background(), blocks, cks); err != nil {
		t.Fatal(err)
	}
	flush(t, a)
	for i, key := range chain {
		bi := info(t, a.Local(), key)
		if bi.Copy == a.Owns(cks[i]) {
			t.Fatalf("block %d: copy %v on n0, which owns it: %v", i, bi.Copy, a.Owns(cks[i]))
		}
		for _, c := range tc.nodes[1:] {
			if c.Owns(cks[i]) && info(t, c.Local(), key).Copy {
				t.Fatalf("block %d is a copy on its owner %s", i, c.self)
			}
		}
	}
	if got := tc.nodes[2].LongestPrefix(context.Background(), chain, ns.BlockTokens); got != len(chain) {
		t.Fatalf("prefix %d of %d", got, len(chain))
	}
}

// TestEvictionModel gives every policy the same random puts, lookups, reads,
// readers that hold a prompt's prefix (GetMany, as an engine reads it) or
// one block alone across later operations, and hard pins with a TTL, on a
// node far too small for them. A reference tracks what must never be
// evicted: every block a reader holds stays cached, with its bytes, until
// released; a pinned block stays until its TTL lapses; a block put under a
// cached parent never outlives it; the accounting adds up after every step
// (checkInvariants).
func TestEvictionModel(t *testing.T) {
	forEachEviction(t, func(t *testing.T, ev Eviction) {
		clock := &fakeClock{now: time.Unix(1000, 0)}
		l := openLocal(t, Options{DRAM: newFakeMem(4096, 8, 1024), MaxBlocks: 24, Eviction: ev, Now: clock.Now, MaxPinnedFraction: 0.25})
		w := newWorld(t, 31, blocktest.NS())
		ctx := context.Background()
		linked := map[prefixhash.Key]bool{}
		pinned := map[prefixhash.Key]time.Time{} // until
		type reader struct {
			keys []prefixhash.Key
			refs []*Ref
		}
		var readers []reader
		for step := range 2500 {
			switch op := w.rng.IntN(14); {
			case op < 5 || len(w.blocks) == 0:
				i := w.grow()
				if w.rng.IntN(5) == 0 {
					i = w.randomBlock()
				}
				b := w.blocks[i]
				was := l.Contains(auth.Access{}, b.key)
				if err := l.Put(ctx, b.enc); err != nil && !errors.Is(err, tiers.ErrFull) {
					t.Fatalf("step %d: Put: %v", step, err)
				}
				if !was && l.Contains(auth.Access{}, b.key) {
					linked[b.key] = b.parent >= 0 && l.Contains(auth.Access{}, w.blocks[b.parent].key)
				}
			case op < 8:
				l.LongestPrefix(auth.Access{}, w.chain(w.randomBlock()))
			case op == 12:
				key := w.blocks[w.randomBlock()].key
				until := clock.Now().Add(time.Duration(1+w.rng.IntN(4)) * time.Minute)
				got, err := l.Retain(ctx, []prefixhash.Key{key}, block.Retention{Pin: block.PinHard, TTL: until.Sub(clock.Now())})
				if err != nil && !errors.Is(err, ErrQuota) {
					t.Fatalf("step %d: Retain: %v", step, err)
				}
				if err == nil && got[0] {
					pinned[key] = until
				}
			case op == 13:
				clock.advance(time.Minute)
			case op < 10 && len(readers) < 3:
				keys := w.chain(w.randomBlock())
				keys = keys[:l.LongestPrefix(auth.Access{}, keys)]
				if len(keys) > 1 && w.rng.IntN(3) == 0 {
					keys = keys[len(keys)-1:] // a leaf alone, without its prefix
				}
				refs, err := l.GetMany(ctx, keys)
				if err != nil {
					t.Fatalf("step %d: GetMany: %v", step, err)
				}
				readers = append(readers, reader{keys, refs})
			case len(readers) > 0:
				r := readers[0]
				readers = readers[1:]
				for _, ref := range r.refs {
					ref.Release()
				}
			}
			for _, r := range readers {
				for k, ref := range r.refs {
					if ref == nil {
						continue
					}
					if !l.Contains(auth.Access{}, r.keys[k]) {
						t.Fatalf("step %d: %s evicted block %s while a reader holds it", step, ev, r.keys[k])
					}
					if !bytes.Equal(ref.Bytes(), w.blocks[w.byKey[r.keys[k]]].enc) {
						t.Fatalf("step %d: a held block's bytes changed", step)
					}
				}
			}
			for key, until := range pinned {
				if !clock.Now().Before(until) {
					delete(pinned, key)
				} else if !l.Contains(auth.Access{}, key) {
					t.Fatalf("step %d: %s evicted block %s under a hard pin", step, ev, key)
				}
			}
			if len(readers) == 0 {
				checkInvariants(t, step, l, w, linked)
			}
		}
		for _, r := range readers {
			for _, ref := range r.refs {
				ref.Release()
			}
		}
		if s := l.Stats(); s.Evictions == 0 || (ev == EvictReuse && s.SecondChances == 0) || s.Tiers[0].Evicted.Expired == 0 {
			t.Fatalf("%s: the test exerted no pressure: %+v", ev, s)
		}
	})
}

// BenchmarkEvictionPolicy measures one access as a trace replay makes it
// on a full node, under each policy: a lookup of a prompt of 8 blocks (half
// the prompts come back: their blocks are found, and under reuse touched
// and marked), then a put of a new block, which evicts one. ns/op is the
// policy's CPU cost per access beside LRU's.
func BenchmarkEvictionPolicy(b *testing.B) {
	for _, ev := range EvictionPolicies() {
		b.Run(string(ev), func(b *testing.B) {
			const capacity = 4096
			w := newWorld(b, 51, blocktest.NS())
			l, err := Open(Options{DRAM: newFakeMem(1<<20, 64, 1024), MaxBlocks: capacity, Eviction: ev})
			if err != nil {
				b.Fatal(err)
			}
			defer l.Close()
			ctx := context.Background()
			var prompts [][]prefixhash.Key
			for range 4 * capacity {
				i := w.grow()
				if err := l.Put(ctx, w.blocks[i].enc); err != nil {
					b.Fatal(err)
				}
				prompts = append(prompts, w.chain(i))
			}
			fresh := make([][]byte, 1<<14)
			for k := range fresh {
				fresh[k] = w.blocks[w.extend(-1)].enc
			}
			rng := rand.New(rand.NewPCG(1, 2))
			b.ResetTimer()
			for k := range b.N {
				p := prompts[len(prompts)-1-rng.IntN(min(len(prompts), 2*capacity))]
				l.LongestPrefix(auth.Access{}, p[:min(len(p), 8)])
				if err := l.Put(ctx, fresh[k%len(fresh)]); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
