package store

import (
	"cmp"
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/cespare/xxhash/v2"

	"github.com/kvmesh/kvmesh/prefixhash"
)

func placementKeys(n int) []prefixhash.Key {
	ns := prefixhash.Namespace{Model: "placement", DType: prefixhash.Float16, BlockTokens: 1, Layers: 1, KVHeads: 1, HeadDim: 1}
	toks := make([]uint32, n)
	for i := range toks {
		toks[i] = uint32(i)
	}
	return prefixhash.Keys(ns, toks)
}

func members(n int, w float64) []Member {
	ms := make([]Member, n)
	for i := range ms {
		ms[i] = Member{ID: fmt.Sprintf("node-%d", i), Weight: w}
	}
	return ms
}

// TestPlacementMovesOnlyChangedOwners: a join moves keys only to the new
// member; a leave moves only the departed member's keys.
func TestPlacementMovesOnlyChangedOwners(t *testing.T) {
	keys := placementKeys(20000)
	before := NewPlacement(members(4, 1), 1)
	joined := NewPlacement(members(5, 1), 1)
	moved := 0
	for _, k := range keys {
		a, b := before.Owner(k), joined.Owner(k)
		if a != b {
			moved++
			if b != "node-4" {
				t.Fatalf("join moved a key from %s to %s, not to the new member", a, b)
			}
		}
	}
	// The new member should take about 1/5 of the keys.
	if f := float64(moved) / float64(len(keys)); f < 0.17 || f > 0.23 {
		t.Errorf("join moved %.3f of keys, want about 0.2", f)
	}
	left := NewPlacement(slices.Delete(members(4, 1), 2, 3), 1) // node-2 leaves
	for _, k := range keys {
		a, b := before.Owner(k), left.Owner(k)
		if a != b && a != "node-2" {
			t.Fatalf("leave of node-2 moved a key owned by %s", a)
		}
	}
}

func TestPlacementWeights(t *testing.T) {
	ms := []Member{{"a", 1}, {"b", 2}, {"c", 1}, {"zero", 0}}
	p := NewPlacement(ms, 1)
	keys := placementKeys(40000)
	count := map[string]int{}
	for _, k := range keys {
		count[p.Owner(k)]++
	}
	if count["zero"] != 0 {
		t.Fatalf("a zero-weight member owns %d keys", count["zero"])
	}
	for id, want := range map[string]float64{"a": 0.25, "b": 0.5, "c": 0.25} {
		got := float64(count[id]) / float64(len(keys))
		if math.Abs(got-want) > 0.02 {
			t.Errorf("%s owns %.3f of keys, want %.2f", id, got, want)
		}
	}
}

func TestPlacementReplicas(t *testing.T) {
	p3 := NewPlacement(members(5, 1), 3)
	p1 := NewPlacement(members(5, 1), 1)
	for _, k := range placementKeys(2000) {
		o := p3.Owners(nil, k)
		if len(o) != 3 || o[0] != p1.Owner(k) {
			t.Fatalf("owners %v: want 3 distinct, primary %s", o, p1.Owner(k))
		}
		if o[0] == o[1] || o[1] == o[2] || o[0] == o[2] {
			t.Fatalf("duplicate owners %v", o)
		}
	}
	if got := NewPlacement(members(2, 1), 3).Owners(nil, placementKeys(1)[0]); len(got) != 2 {
		t.Fatalf("R > members: %v", got)
	}
	if NewPlacement(nil, 1).Owner(placementKeys(1)[0]) != "" {
		t.Fatal("empty placement has an owner")
	}
	// Order and duplicates in the member list do not matter.
	ms := members(4, 1)
	rev := append(slices.Clone(ms), ms[0])
	slices.Reverse(rev)
	a, b := NewPlacement(ms, 2), NewPlacement(rev, 2)
	for _, k := range placementKeys(500) {
		if !slices.Equal(a.Owners(nil, k), b.Owners(nil, k)) {
			t.Fatal("placement depends on member order")
		}
	}
}

func BenchmarkPlacementOwner(b *testing.B) {
	p := NewPlacement(members(4, 1), 1)
	keys := placementKeys(1024)
	i := 0
	for b.Loop() {
		_ = p.Owner(keys[i%len(keys)])
		i++
	}
}

// BenchmarkPlacementOwnerMembers is Owner's cost by cluster size: every
// member is scored for every key (issue 35).
func BenchmarkPlacementOwnerMembers(b *testing.B) {
	for _, n := range []int{16, 256, 1024} {
		b.Run(fmt.Sprint(n), func(b *testing.B) {
			p := NewPlacement(members(n, 1), 1)
			keys := placementKeys(1024)
			i := 0
			for b.Loop() {
				_ = p.Owner(keys[i%len(keys)])
				i++
			}
		})
	}
}

// refOwners is placement by its definition, the reference the fast Owners
// must agree with: every member's score -w / ln(u), u from xxhash64(key ‖
// seed), the R best, ties to the member first in id order.
func refOwners(members []Member, replicas int, key prefixhash.Key) []string {
	ms := slices.Clone(members)
	slices.SortStableFunc(ms, func(a, b Member) int { return strings.Compare(a.ID, b.ID) })
	type scored struct {
		id string
		s  float64
	}
	var all []scored
	for _, m := range ms {
		if !(m.Weight > 0) {
			continue
		}
		var b [prefixhash.KeySize + 8]byte
		copy(b[:], key[:])
		binary.LittleEndian.PutUint64(b[prefixhash.KeySize:], xxhash.Sum64String(m.ID))
		u := (float64(xxhash.Sum64(b[:])>>11) + 0.5) / (1 << 53)
		all = append(all, scored{m.ID, -m.Weight / math.Log(u)})
	}
	slices.SortStableFunc(all, func(a, b scored) int { return cmp.Compare(b.s, a.s) })
	var out []string
	for _, s := range all[:min(replicas, len(all), 8)] {
		out = append(out, s.id)
	}
	return out
}

// TestPlacementMatchesDefinition checks Owners against refOwners on random
// clusters: equal weights, a few node sizes, many (each node its own), some
// without weight, replicas 1 to 8.
func TestPlacementMatchesDefinition(t *testing.T) {
	rng := rand.New(rand.NewPCG(35, 35))
	keys := placementKeys(300)
	for trial := range 60 {
		n := 1 + rng.IntN(200)
		ms := make([]Member, n)
		for i := range ms {
			ms[i] = Member{ID: fmt.Sprintf("m%d-%d", trial, rng.IntN(1<<30))}
			switch trial % 4 {
			case 0:
				ms[i].Weight = 1 << 30
			case 1:
				ms[i].Weight = float64(int64(1) << (30 + rng.IntN(3)))
			case 2:
				ms[i].Weight = float64(1 + rng.IntN(1<<20))
			case 3:
				ms[i].Weight = float64(rng.IntN(3)) // some own nothing
			}
		}
		r := 1 + rng.IntN(8)
		p := NewPlacement(ms, r)
		for _, k := range keys {
			if got, want := p.Owners(nil, k), refOwners(ms, r, k); !slices.Equal(got, want) {
				t.Fatalf("trial %d (%d members, R=%d): owners %v, by definition %v", trial, n, r, got, want)
			}
		}
	}
}

// TestMemberHash: the hash finished from a key's state is xxhash64 of the
// key and the seed.
func TestMemberHash(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for range 1000 {
		var key prefixhash.Key
		for j := range key {
			key[j] = byte(rng.Uint32())
		}
		seed := rng.Uint64()
		var b [prefixhash.KeySize + 8]byte
		copy(b[:], key[:])
		binary.LittleEndian.PutUint64(b[prefixhash.KeySize:], seed)
		if got, want := memberHash(keyState(key), xxRound(seed)), xxhash.Sum64(b[:]); got != want {
			t.Fatalf("memberHash %x, xxhash64 %x", got, want)
		}
	}
}
