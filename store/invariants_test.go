package store

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/kvmesh/kvmesh/block/blocktest"
	"github.com/kvmesh/kvmesh/internal/invariants"
	"github.com/kvmesh/kvmesh/internal/testkit"
	"github.com/kvmesh/kvmesh/prefixhash"
	"github.com/kvmesh/kvmesh/tiers"
)

// The checks of the store's own invariants, each shown to fire: the state a
// past bug left behind is made on purpose in a child process, and the
// parent expects the crash and its message. The checks at operations run in
// the invariants build only (-race, or -tags invariants; a normal build
// compiles them away), the model tests' check after each operation in every
// build.

// TestInvariantReleaseWithChildren: an entry released while a child still
// hangs from it panics; the child would name a parent that is gone, and
// once the slot is reused, another block.
func TestInvariantReleaseWithChildren(t *testing.T) {
	if testkit.InChild(t) {
		rng := rand.New(rand.NewPCG(1, 2))
		var x index
		p, c := x.alloc(randKey(rng)), x.alloc(randKey(rng))
		x.insert(p)
		x.insert(c)
		x.link(c, p)
		x.remove(x.at(p).key)
		x.release(p)
		return
	}
	skipWithoutInvariants(t)
	testkit.ExpectCrash(t, "store: releasing entry 1", "still has children")
}

// TestInvariantLinkToMissingParent: linking a block to an entry that is no
// block in the table (dropped, released) panics.
func TestInvariantLinkToMissingParent(t *testing.T) {
	if testkit.InChild(t) {
		rng := rand.New(rand.NewPCG(1, 2))
		var x index
		p, c := x.alloc(randKey(rng)), x.alloc(randKey(rng))
		x.insert(c) // p never made it into the table
		x.link(c, p)
		return
	}
	skipWithoutInvariants(t)
	testkit.ExpectCrash(t, "store: linking entry 2", "to parent entry 1, which is no block in the table")
}

// TestInvariantRefsBelowZero: releasing a Ref the store did not count (a
// Ref released twice, in effect) panics instead of taking a pin from
// another reader.
func TestInvariantRefsBelowZero(t *testing.T) {
	if testkit.InChild(t) {
		// No Close at cleanup: the panic leaves the store's lock held.
		l, err := Open(Options{DRAM: newFakeMem(64<<10, 16, 1024)})
		if err != nil {
			t.Fatal(err)
		}
		w := newWorld(t, 3, blocktest.NS())
		b := w.blocks[w.extend(-1)]
		if err := l.Put(context.Background(), b.enc); err != nil {
			t.Fatal(err)
		}
		r, err := l.Get(context.Background(), b.key)
		if err != nil {
			t.Fatal(err)
		}
		l.mu.Lock()
		l.mu.refs = 0
		l.mu.Unlock()
		r.Release()
		return
	}
	skipWithoutInvariants(t)
	testkit.ExpectCrash(t, "store: -1 live Refs")
}

// TestInvariantOperationEndedTwice: an operation that ends without having
// begun (or ends twice) panics: Close counts on the count to know when the
// tiers are idle.
func TestInvariantOperationEndedTwice(t *testing.T) {
	if testkit.InChild(t) {
		l, err := Open(Options{DRAM: newFakeMem(64<<10, 16, 1024)}) // no Close: the panic leaves the lock held
		if err != nil {
			t.Fatal(err)
		}
		l.exit()
		return
	}
	skipWithoutInvariants(t)
	testkit.ExpectCrash(t, "store: -1 operations in flight")
}

// TestModelCheckFires: checkAccounting, which the model tests run after
// each operation, fails on each way the store can disagree with itself or
// its tiers: a block counted that is not there, an indexed DRAM slot that
// was freed (the real DRAM tier answers), two blocks on one slot, a child
// hanging from a parent that left the table.
func TestModelCheckFires(t *testing.T) {
	for _, c := range []struct {
		name     string
		sabotage func(l *Local, keys []prefixhash.Key)
		want     string
		// unheld: a memory tier that cannot say what a location holds
		// (as the NVMe and HBM tiers cannot), so that the check of
		// distinct locations is the one that sees the sabotage.
		unheld bool
	}{
		{"counts", func(l *Local, _ []prefixhash.Key) { l.mu.c.puts++ }, "blocks came in", false},
		{"freed slot indexed, taken again", func(l *Local, keys []prefixhash.Key) {
			// The slot of block 1 freed under the index and taken by
			// another value: the counts still add up.
			e := l.mu.x.at(l.mu.x.find(keys[1]))
			l.mem.Free(e.getLoc())
			if loc, err := l.mem.Put(prefixhash.Key{9}, make([]byte, blockBytes)); err != nil || loc != e.getLoc() {
				panic(fmt.Sprintf("the freed slot was not taken again: %#x, %v", uint64(loc), err))
			}
		}, "an index entry whose location is dead", false},
		{"one slot, two blocks", func(l *Local, keys []prefixhash.Key) {
			// Block 1 names block 0's slot; its own slot, freed, is
			// taken by another value, so that the counts add up.
			a, b := l.mu.x.at(l.mu.x.find(keys[0])), l.mu.x.at(l.mu.x.find(keys[1]))
			old := b.getLoc()
			b.setLoc(a.getLoc())
			l.mem.Free(old)
			if _, err := l.mem.Put(keys[1], make([]byte, blockBytes)); err != nil {
				panic(err)
			}
		}, "both name location", true},
		{"orphaned child", func(l *Local, keys []prefixhash.Key) {
			p := l.mu.x.find(keys[0])
			l.mu.x.remove(keys[0]) // out of the table, its child still hanging from it
			l.mu.x.at(p).set(flagDropped)
		}, "which is no block in the table", false},
	} {
		t.Run(c.name, func(t *testing.T) {
			if testkit.InChild(t) {
				var mem tiers.Tier = realDRAM(t, 4<<20, 1<<20)
				if c.unheld {
					mem = unheldMem{fakeMem: newFakeMem(64<<10, 16, 1024)}
				}
				l := openLocal(t, Options{DRAM: mem})
				w := newWorld(t, 5, blocktest.NS())
				var keys []prefixhash.Key
				for i := range 3 {
					b := w.blocks[w.extend(i-1)] // a chain
					if err := l.Put(context.Background(), b.enc); err != nil {
						t.Fatal(err)
					}
					keys = append(keys, b.key)
				}
				checkAccounting(t, 0, l)
				l.mu.Lock()
				c.sabotage(l, keys)
				l.mu.Unlock()
				checkAccounting(t, 1, l)
				return
			}
			testkit.ExpectCrash(t, "step 1: ", c.want)
		})
	}
}

var _ holder = (*tiers.DRAM)(nil)

// unheldMem is fakeMem without Holds (the field hides the method), as a
// tier that cannot say what a location holds.
type unheldMem struct {
	*fakeMem
	Holds struct{}
}

func skipWithoutInvariants(t *testing.T) {
	t.Helper()
	if !invariants.Enabled {
		t.Skip("the check runs in the invariants build only (-race or -tags invariants)")
	}
}
