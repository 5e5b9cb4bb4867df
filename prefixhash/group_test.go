package prefixhash

import (
	"errors"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
)

// hybridNS is a Gemma-style namespace: sliding layers beside full ones, and
// a recurrent state group.
func hybridNS() Namespace {
	return Namespace{Model: "hybrid", DType: BFloat16, BlockTokens: 16, Layers: 8, Groups: MustGroups(
		Group{Kind: GroupFull, Layers: []int{2, 5}, Layout: SplitKV, DType: BFloat16, KVHeads: 2, HeadDim: 64},
		Group{Kind: GroupSliding, Window: 40, Layers: []int{0, 1, 3, 4}, Layout: SplitKV, DType: BFloat16, KVHeads: 2, HeadDim: 64},
		Group{Kind: GroupState, Layers: []int{6}, Layout: StateKV, DType: Float32, KVHeads: 4, StateBytes: 1024},
		Group{Kind: GroupIndexer, Layers: []int{7}, Layout: LatentKV, DType: Float8E4M3, LatentDim: 128},
	)}
}

func TestGroupsRoundTrip(t *testing.T) {
	ns := hybridNS()
	if err := ns.Validate(); err != nil {
		t.Fatal(err)
	}
	all := ns.Groups.All()
	if len(all) != 4 || ns.Groups.Len() != 4 {
		t.Fatalf("%d groups", len(all))
	}
	for i, g := range all {
		if at := ns.Groups.At(i); !slices.Equal(at.Layers, g.Layers) || at.Kind != g.Kind || at.StateBytes != g.StateBytes {
			t.Fatalf("At(%d) = %+v, All has %+v", i, at, g)
		}
	}
	if g := all[1]; g.Kind != GroupSliding || g.Window != 40 || !slices.Equal(g.Layers, []int{0, 1, 3, 4}) || g.WindowBlocks(16) != 3 {
		t.Fatalf("sliding group decoded as %+v", g)
	}
	if got, want := ns.GroupBytes(0), 2*2*16*2*64*2; got != want {
		t.Fatalf("full group record %d bytes, want %d", got, want)
	}
	if got, want := ns.GroupBytes(2), 1*4*1024; got != want {
		t.Fatalf("state record %d bytes, want %d", got, want)
	}
	if got, want := ns.GroupBytes(3), 1*16*128; got != want {
		t.Fatalf("indexer record %d bytes, want %d", got, want)
	}
	if ns.Groups.Anchor() != 0 {
		t.Fatalf("anchor %d", ns.Groups.Anchor())
	}
	if s := ns.String(); !strings.Contains(s, "groups[full:2l:split,sliding(40):4l:split,state:1l:state,indexer:1l:latent]") {
		t.Fatalf("String %q", s)
	}
	// Comparable, and the groups are part of the identity.
	other := hybridNS()
	if other != ns || other.Root() != ns.Root() {
		t.Fatal("equal namespaces differ")
	}
	other.Groups = MustGroups(ns.Groups.All()[:3]...)
	if other == ns || other.Root() == ns.Root() || other.Digest() == ns.Digest() {
		t.Fatal("namespaces with different groups share a root")
	}
	plain := ns
	plain.Groups = Groups{}
	plain.KVHeads, plain.HeadDim = 2, 64
	if plain.Root() == ns.Root() {
		t.Fatal("a namespace with groups keys like one without")
	}
}

func TestGroupsValidate(t *testing.T) {
	mod := func(f func(gs []Group)) Namespace {
		ns := hybridNS()
		gs := ns.Groups.All()
		f(gs)
		ns.Groups = MustGroups(gs...)
		return ns
	}
	for _, tc := range []struct {
		name, field string
		ns          Namespace
	}{
		{"overlap", "groups[1].layers", mod(func(gs []Group) { gs[1].Layers = []int{0, 2} })},
		{"outside", "groups[0].layers", mod(func(gs []Group) { gs[0].Layers = []int{8} })},
		{"unsorted", "groups[0].layers", mod(func(gs []Group) { gs[0].Layers = []int{5, 2} })},
		{"empty", "groups[0].layers", mod(func(gs []Group) { gs[0].Layers = nil })},
		{"window 0", "groups[1].window", mod(func(gs []Group) { gs[1].Window = 0 })},
		{"window on full", "groups[0].window", mod(func(gs []Group) { gs[0].Window = 8 })},
		{"window too long", "groups[1].window", mod(func(gs []Group) { gs[1].Window = 16 << 16 })},
		{"state layout", "groups[2].kv_layout", mod(func(gs []Group) { gs[2].Layout = SplitKV; gs[2].HeadDim = 4 })},
		{"state layout elsewhere", "groups[0].kv_layout", mod(func(gs []Group) { gs[0].Layout = StateKV })},
		{"state size", "groups[2].state_bytes", mod(func(gs []Group) { gs[2].StateBytes = 0 })},
		{"state size dtype", "groups[2].state_bytes", mod(func(gs []Group) { gs[2].StateBytes = 1022 })},
		{"state heads", "groups[2].kv_heads", mod(func(gs []Group) { gs[2].KVHeads = 0 })},
		{"kind", "groups[3].kind", mod(func(gs []Group) { gs[3].Kind = 9 })},
		{"dtype", "groups[3].dtype", mod(func(gs []Group) { gs[3].DType = 0 })},
		{"split shape", "groups[0].head_dim", mod(func(gs []Group) { gs[0].HeadDim = 0 })},
		{"latent shape", "groups[3].latent_dim", mod(func(gs []Group) { gs[3].LatentDim = 0 })},
		{"own shape", "kv_heads", func() Namespace { ns := hybridNS(); ns.KVHeads = 2; return ns }()},
	} {
		err := tc.ns.Validate()
		if !errors.Is(err, ErrInvalidNamespace) || !strings.Contains(err.Error(), ": "+tc.field+": ") {
			t.Errorf("%s: %v, want an error naming %s", tc.name, err, tc.field)
		}
	}
	if _, err := NewGroups(make([]Group, MaxGroups+1)...); err == nil {
		t.Error("NewGroups took more than MaxGroups")
	}
	ns := hybridNS()
	ns.Layout = StateKV
	ns.Groups = Groups{}
	ns.KVHeads, ns.HeadDim = 1, 1
	if err := ns.Validate(); err == nil || !strings.Contains(err.Error(), "kv_layout") {
		t.Errorf("a namespace with the state layout and no groups: %v", err)
	}
}

func TestGroupKey(t *testing.T) {
	ns := hybridNS()
	keys := Keys(ns, make([]uint32, 64))
	seen := map[Key]bool{}
	for _, k := range keys {
		if GroupKey(k, 0) != k {
			t.Fatal("group 0's records are not under the chain keys")
		}
		seen[k] = true
		for g := 1; g < MaxGroups; g++ {
			gk := GroupKey(k, g)
			if GroupKey(gk, g) != k {
				t.Fatalf("GroupKey is not its own inverse for group %d", g)
			}
			if seen[gk] {
				t.Fatalf("group %d's key of %s repeats another key", g, k)
			}
			seen[gk] = true
		}
	}
	if got := GroupKeys(nil, keys, 2); got[3] != GroupKey(keys[3], 2) {
		t.Fatal("GroupKeys differs from GroupKey")
	}
}

// refResume is the hit rule as written in the issue, checked at every
// candidate P from the longest down: the reference the model test holds
// Resume to.
func refResume(groups []Group, b, n int, has func(g, i int) bool) (int, []int) {
	allows := func(g, p int) bool {
		gr := groups[g]
		switch gr.Kind {
		case GroupState:
			return p == 0 || has(g, p-1)
		case GroupSliding:
			for i := max(0, p-(gr.Window+b-1)/b); i < p; i++ {
				if !has(g, i) {
					return false
				}
			}
			return true
		}
		for i := range p {
			if !has(g, i) {
				return false
			}
		}
		return true
	}
	full := n
	per := make([]int, len(groups))
	for g, gr := range groups {
		if gr.Kind.EveryBlock() {
			for per[g] < n && has(g, per[g]) {
				per[g]++
			}
			full = min(full, per[g])
		}
	}
	for g, gr := range groups {
		if !gr.Kind.EveryBlock() {
			for per[g] = full; !allows(g, per[g]); per[g]-- {
			}
		}
	}
	for p := full; ; p-- {
		ok := true
		for g := range groups {
			ok = ok && allows(g, p)
		}
		if ok {
			return p, per
		}
	}
}

// TestResumeModel: random groups and random held records; Resume, asked
// directly and asked in rounds (every record Unknown until a round reveals
// what the last answer needed), agrees with the reference.
func TestResumeModel(t *testing.T) {
	rng := rand.New(rand.NewPCG(31, 1))
	for iter := range 3000 {
		b := 1 + rng.IntN(4)
		var groups []Group
		for range 1 + rng.IntN(4) {
			g := Group{Kind: GroupKind(rng.IntN(int(numKinds)))}
			if g.Kind == GroupSliding {
				g.Window = 1 + rng.IntN(4*b)
			}
			groups = append(groups, g)
		}
		n := rng.IntN(24)
		density := rng.Float64()
		held := make([][]bool, len(groups))
		for g := range held {
			held[g] = make([]bool, n)
			for i := range held[g] {
				held[g][i] = rng.Float64() < density
			}
		}
		has := func(g, i int) bool { return held[g][i] }
		wantP, wantPer := refResume(groups, b, n, has)

		asked := map[Probe]int{}
		hit, need := Resume(groups, b, n, func(g, i int) Presence {
			asked[Probe{g, i}]++
			if has(g, i) {
				return Held
			}
			return Missing
		})
		if need != nil || hit.Blocks != wantP || !slices.Equal(hit.Groups, wantPer) {
			t.Fatalf("iter %d: groups %+v, b %d, held %v: Resume %+v (need %v), reference P %d, per group %v",
				iter, groups, b, held, hit, need, wantP, wantPer)
		}
		for p, c := range asked {
			if c > 1 {
				t.Fatalf("iter %d: record %+v asked %d times", iter, p, c)
			}
		}

		known := map[Probe]bool{}
		for round := 0; ; round++ {
			hit, need = Resume(groups, b, n, func(g, i int) Presence {
				if !known[Probe{g, i}] {
					return Unknown
				}
				if has(g, i) {
					return Held
				}
				return Missing
			})
			if need == nil {
				break
			}
			if round > 4*(n+1)*len(groups) {
				t.Fatalf("iter %d: no answer after %d rounds", iter, round)
			}
			for _, p := range need {
				known[p] = true
			}
		}
		if hit.Blocks != wantP || !slices.Equal(hit.Groups, wantPer) {
			t.Fatalf("iter %d: in rounds Resume %+v, reference P %d, per group %v", iter, hit, wantP, wantPer)
		}
	}
}

func TestParseGroupsJSON(t *testing.T) {
	gs, err := ParseGroupsJSON([]byte(`[{"kind":"full","layers":[2,5],"kv_heads":2,"head_dim":64},
		{"kind":"sliding","window":40,"layers":[0,1,3,4],"kv_heads":2,"head_dim":64},
		{"kind":"state","layers":[6],"dtype":"float32","kv_heads":4,"state_bytes":1024},
		{"kind":"indexer","layers":[7],"kv_layout":"latent","dtype":"fp8_e4m3","latent_dim":128}]`), BFloat16)
	if err != nil {
		t.Fatal(err)
	}
	if gs != hybridNS().Groups {
		t.Fatalf("parsed %s, want %s", gs, hybridNS().Groups)
	}
	for _, bad := range []string{`{}`, `[{"kind":"nope","layers":[0]}]`, `[{"kind":"full","layers":[0],"color":1}]`,
		`[{"kind":"full","layers":[0],"dtype":"f33"}]`} {
		if _, err := ParseGroupsJSON([]byte(bad), BFloat16); !errors.Is(err, ErrInvalidNamespace) {
			t.Errorf("%s: %v", bad, err)
		}
	}
}
