package tiers

import (
	"fmt"
	"strings"
	"testing"
)

// blockHeader512 is block.HeaderLen(512): the header of a 512-token block.
const blockHeader512 = 2112

func TestSlabClasses(t *testing.T) {
	for _, slab := range []int64{4096, 64 << 10, 16 << 20, DefaultSlabSize, MaxSlabSize} {
		cs := slabClasses(slab)
		if len(cs) == 0 || len(cs) >= 1<<locClassBits {
			t.Fatalf("slab %d: %d classes", slab, len(cs))
		}
		if cs[0] != minSlot {
			t.Errorf("slab %d: smallest slot %d, want %d", slab, cs[0], minSlot)
		}
		if want := slab / slotAlign * slotAlign; cs[len(cs)-1] != want {
			t.Errorf("slab %d: largest slot %d, want %d", slab, cs[len(cs)-1], want)
		}
		for i, s := range cs {
			k := slab / s
			if s%slotAlign != 0 || k*s > slab || slab-k*s >= k*slotAlign {
				t.Fatalf("slab %d: class %d: slot %d (%d per slab) wastes %d bytes", slab, i, s, k, slab-k*s)
			}
			if i == 0 {
				continue
			}
			if s <= cs[i-1] {
				t.Fatalf("slab %d: classes not ascending at %d", slab, i)
			}
			// Below the 16 largest classes, adjacent classes are at most
			// ~1/16 apart (plus 64-byte rounding).
			if i < len(cs)-16 && float64(s) > float64(cs[i-1])*(1+1.0/classGrowth)+2*slotAlign {
				t.Errorf("slab %d: class %d is %d, %.3f× class %d", slab, i, s, float64(s)/float64(cs[i-1]), i-1)
			}
		}
		t.Logf("slab %d: %d classes", slab, len(cs))
	}
}

func TestSizeClass(t *testing.T) {
	a := newSlabAlloc(DefaultSlabSize, 1)
	max := a.maxValue()
	for _, tc := range []struct{ n, want int }{
		{-1, -1},
		{0, 0},
		{64, 0},
		{65, 1},
		{max, len(a.classes) - 1},
		{max + 1, -1},
	} {
		if got := a.sizeClass(tc.n); got != tc.want {
			t.Errorf("sizeClass(%d) = %d, want %d", tc.n, got, tc.want)
		}
	}
	// Every class boundary: the largest value of a class is in it, one
	// byte more is in the next.
	for c, s := range a.classes {
		n := int(s - slotHeaderLen)
		if got := a.sizeClass(n); got != c {
			t.Fatalf("sizeClass(%d) = %d, want %d", n, got, c)
		}
		if c+1 < len(a.classes) {
			if got := a.sizeClass(n + 1); got != c+1 {
				t.Fatalf("sizeClass(%d) = %d, want %d", n+1, got, c+1)
			}
		}
	}
}

// usable is the fraction of a slab that values of n bytes fill.
func usable(a *slabAlloc, n int) float64 {
	c := a.sizeClass(n)
	return float64(a.perSlab[c]) * float64(n) / float64(a.slabSize)
}

// TestUsableFraction pins the fraction of the default slab filled by
// power-of-two payloads plus a 512-token block header, the typical KV block.
func TestUsableFraction(t *testing.T) {
	def, pow2 := newSlabAlloc(DefaultSlabSize, 1), newSlabAlloc(16<<20, 1)
	var b strings.Builder
	for _, payload := range []int{64 << 10, 1 << 20, 4 << 20} {
		n := payload + blockHeader512
		got := usable(def, n)
		fmt.Fprintf(&b, "\n%4d KiB + %d B: %d per slab, %.4f usable (16 MiB slab: %d per slab, %.4f)",
			payload>>10, blockHeader512, def.perSlab[def.sizeClass(n)], got, pow2.perSlab[pow2.sizeClass(n)], usable(pow2, n))
		if got < 0.98 {
			t.Errorf("%d-byte values fill %.4f of a default slab, want >= 0.98", n, got)
		}
	}
	t.Log(b.String())
}

func TestLocRoundTrip(t *testing.T) {
	for _, tc := range []struct{ slab, class, slot int }{
		{0, 0, 0},
		{maxSlabs - 1, 1<<locClassBits - 1, 1<<locSlotBits - 1},
		{12345, 17, 31},
	} {
		loc := makeLoc(tc.slab, tc.class, tc.slot)
		if loc == 0 {
			t.Fatalf("%+v: zero Loc", tc)
		}
		slab, class, slot := splitLoc(loc)
		if slab != tc.slab || class != tc.class || slot != tc.slot {
			t.Fatalf("splitLoc(makeLoc(%+v)) = %d, %d, %d", tc, slab, class, slot)
		}
	}
	// The slot of the smallest class of the largest slab fits its field.
	if n := MaxSlabSize / minSlot; n > 1<<locSlotBits {
		t.Fatalf("%d slots overflow the slot field", n)
	}
	a := newSlabAlloc(4096, 2)
	for _, loc := range []Loc{0, makeLoc(2, 0, 0), makeLoc(0, len(a.classes), 0), makeLoc(0, 0, int(a.perSlab[0]))} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("split(%#x) did not panic", uint64(loc))
				}
			}()
			a.split(loc)
		}()
	}
}
