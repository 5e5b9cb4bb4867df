package tiers

import (
	"testing"

	"github.com/kvmesh/kvmesh/internal/invariants"
	"github.com/kvmesh/kvmesh/internal/testkit"
)

// The invariants build's checks at the tiers' operations, each shown to
// fire: the state a past bug left behind is made on purpose in a child
// process (the check panics), and the parent expects the crash and its
// message. A normal build compiles the checks away; these tests skip there.

// TestInvariantDRAMReadOfFreedSlot: a read through an index that kept a
// freed slot's location panics, where it would return the slot's stale
// bytes.
func TestInvariantDRAMReadOfFreedSlot(t *testing.T) {
	if testkit.InChild(t) {
		d := newTestDRAM(t, DRAMOptions{Capacity: 4 << 20, SlabSize: 1 << 20})
		loc, err := d.Put(testKey(1), make([]byte, 1000))
		if err != nil {
			t.Fatal(err)
		}
		d.Free(loc)
		_ = d.Read(loc, make([]byte, 1000)) // the slot's old bytes, without the check
		return
	}
	skipWithoutInvariants(t)
	testkit.ExpectCrash(t, "tiers: dram: location", "holds no value: an index names a freed slot")
}

// TestInvariantNVMeFreeOfDeadLocation: freeing a location the tier no
// longer holds (freed before, or in a dropped segment: the store's bug that
// reclaim raced) panics, where the real tier logged nothing.
func TestInvariantNVMeFreeOfDeadLocation(t *testing.T) {
	if testkit.InChild(t) {
		n := openTestNVMe(t, nvmeTestOptions(t.TempDir()))
		defer n.Close()
		k := nvmeTestKey(1)
		loc, err := n.Put(k, nvmeTestVal(k, 5000))
		if err != nil {
			t.Fatal(err)
		}
		n.Free(loc)
		n.Free(loc)
		return
	}
	skipWithoutInvariants(t)
	testkit.ExpectCrash(t, "tiers: nvme: free of segment", "which holds no value: an index names a dead location")
}

// TestHolds: Holds answers for a live slot of the key only, whatever the
// location.
func TestHolds(t *testing.T) {
	d := newTestDRAM(t, DRAMOptions{Capacity: 4 << 20, SlabSize: 1 << 20})
	loc, err := d.Put(testKey(1), make([]byte, 1000))
	if err != nil {
		t.Fatal(err)
	}
	if !d.Holds(loc, testKey(1)) || d.Holds(loc, testKey(2)) {
		t.Fatal("Holds of a live value: want true for its key only")
	}
	d.Free(loc)
	for _, l := range []Loc{loc, 0, ^Loc(0)} {
		if d.Holds(l, testKey(1)) {
			t.Errorf("Holds(%#x) = true: a freed or foreign location", uint64(l))
		}
	}
	again, err := d.Put(testKey(3), make([]byte, 1000))
	if err != nil || again != loc {
		t.Fatalf("Put after Free = %#x, %v; want the freed slot %#x again", uint64(again), err, uint64(loc))
	}
	if d.Holds(loc, testKey(1)) {
		t.Error("Holds of a slot freed and taken by another key = true")
	}
}

func skipWithoutInvariants(t *testing.T) {
	t.Helper()
	if !invariants.Enabled {
		t.Skip("the check runs in the invariants build only (-race or -tags invariants)")
	}
}
