package prefixhash

import (
	"encoding/hex"
	"fmt"
	"path/filepath"
	"reflect"
	"testing"
)

// groupsFile is testdata/groups.json: golden vectors for namespaces with
// groups (hybrid models), self-describing like golden.json, so that the
// Python client checks its encoding, group keys and hit rule against it.
type groupsFile struct {
	Comment    string `json:"comment"`
	KeyVersion int    `json:"key_version"`
	Encoding   string `json:"groups_encoding"`
	GroupKey   string `json:"group_key"`
	HitRule    string `json:"hit_rule"`
	// Masks[g] is M_g, hex.
	Masks   []string       `json:"masks"`
	Vectors []groupsVector `json:"vectors"`
}

type groupsVector struct {
	Name      string          `json:"name"`
	Namespace goldenNamespace `json:"namespace"`
	Groups    []goldenGroup   `json:"groups"`
	Tokens    []uint32        `json:"tokens"`
	Encoding  string          `json:"encoding"` // hex
	Root      string          `json:"root"`
	Digest    string          `json:"digest"`
	Keys      []string        `json:"keys"`
	// GroupKeys[g][i] is GroupKey(keys[i], g).
	GroupKeys [][]string `json:"group_keys"`
	// RecordBytes[g] is group g's record payload size.
	RecordBytes []int       `json:"record_bytes"`
	Hits        []goldenHit `json:"hits"`
}

type goldenGroup struct {
	Kind       string `json:"kind"`
	Window     int    `json:"window,omitempty"`
	Layers     []int  `json:"layers"`
	Layout     string `json:"kv_layout"`
	DType      string `json:"dtype"`
	KVHeads    int    `json:"kv_heads,omitempty"`
	HeadDim    int    `json:"head_dim,omitempty"`
	LatentDim  int    `json:"latent_dim,omitempty"`
	StateBytes int    `json:"state_bytes,omitempty"`
	Scales     string `json:"scales,omitempty"`
}

// goldenHit is one case of the hit rule: held[g] lists the blocks whose
// group-g record is held; blocks and groups are Resume's answer.
type goldenHit struct {
	Held   [][]int `json:"held"`
	Blocks int     `json:"blocks"`
	Groups []int   `json:"groups"`
}

func (g goldenGroup) group(t *testing.T) Group {
	k, err1 := ParseGroupKind(g.Kind)
	l, err2 := ParseKVLayout(g.Layout)
	d, err3 := ParseDType(g.DType)
	var sc Scales
	var err4 error
	if g.Scales != "" {
		sc, err4 = ParseScales(g.Scales)
	}
	for _, err := range []error{err1, err2, err3, err4} {
		if err != nil {
			t.Fatal(err)
		}
	}
	return Group{Kind: k, Window: g.Window, Layers: g.Layers, Layout: l, DType: d, KVHeads: g.KVHeads,
		HeadDim: g.HeadDim, LatentDim: g.LatentDim, StateBytes: g.StateBytes, Scales: sc}
}

func toGoldenGroup(g Group) goldenGroup {
	return goldenGroup{Kind: g.Kind.String(), Window: g.Window, Layers: g.Layers, Layout: g.Layout.String(),
		DType: g.DType.String(), KVHeads: g.KVHeads, HeadDim: g.HeadDim, LatentDim: g.LatentDim,
		StateBytes: g.StateBytes, Scales: optName(g.Scales)}
}

// groupsInputs: a Gemma-3-style plan (five sliding layers to each full
// one), a Qwen3-Next-style plan (gated linear attention states beside full
// attention), a DeepSeek-sparse-style latent with an indexer, and a
// salted vLLM-keyed one; hit cases cover missing windows and states.
func groupsInputs() []groupsVector {
	gemma := Namespace{Model: "google/gemma-3-27b-it", DType: BFloat16, BlockTokens: 16, Layers: 12, Groups: MustGroups(
		Group{Kind: GroupFull, Layers: []int{5, 11}, Layout: SplitKV, DType: BFloat16, KVHeads: 16, HeadDim: 128},
		Group{Kind: GroupSliding, Window: 40, Layers: []int{0, 1, 2, 3, 4, 6, 7, 8, 9, 10}, Layout: SplitKV, DType: BFloat16, KVHeads: 16, HeadDim: 128},
	)}
	qwen := Namespace{Model: "Qwen/Qwen3-Next-80B-A3B-Instruct", DType: BFloat16, BlockTokens: 4, Layers: 8, Groups: MustGroups(
		Group{Kind: GroupState, Layers: []int{0, 1, 2, 4, 5, 6}, Layout: StateKV, DType: Float32, KVHeads: 16, StateBytes: 8192},
		Group{Kind: GroupFull, Layers: []int{3, 7}, Layout: SplitKV, DType: BFloat16, KVHeads: 2, HeadDim: 256},
	)}
	dsa := Namespace{Model: "deepseek-ai/DeepSeek-V3.2-Exp", DType: Float8E4M3, BlockTokens: 3, Layers: 4, TenantSalt: "t", Groups: MustGroups(
		Group{Kind: GroupFull, Layers: []int{0, 1, 2, 3}, Layout: LatentKV, DType: Float8E4M3, LatentDim: 576, Scales: ScalesPerBlock},
		Group{Kind: GroupIndexer, Layers: []int{0, 1, 2, 3}, Layout: LatentKV, DType: Float8E4M3, LatentDim: 132},
	)}
	mixed := Namespace{Model: "kvmesh/hybrid", DType: Float16, BlockTokens: 2, Layers: 6, Scheme: SchemeVLLM, HashSeed: "0", LoRA: "a", Groups: MustGroups(
		Group{Kind: GroupFull, Layers: []int{0}, Layout: SplitKV, DType: Float16, KVHeads: 1, HeadDim: 8},
		Group{Kind: GroupSliding, Window: 3, Layers: []int{1, 2}, Layout: SplitKV, DType: Float16, KVHeads: 1, HeadDim: 8},
		Group{Kind: GroupState, Layers: []int{3}, Layout: StateKV, DType: Float16, KVHeads: 1, StateBytes: 64},
		Group{Kind: GroupIndexer, Layers: []int{5}, Layout: LatentKV, DType: Float16, LatentDim: 4},
	)}
	v := func(name string, ns Namespace, tokens []uint32, hits ...[][]int) groupsVector {
		gv := groupsVector{Name: name, Namespace: goldenNS(ns), Tokens: tokens}
		for _, g := range ns.Groups.All() {
			gv.Groups = append(gv.Groups, toGoldenGroup(g))
		}
		for _, h := range hits {
			gv.Hits = append(gv.Hits, goldenHit{Held: h})
		}
		return gv
	}
	all := func(n int) []int {
		out := make([]int, n)
		for i := range out {
			out[i] = i
		}
		return out
	}
	return []groupsVector{
		v("gemma3-style-5-sliding-to-1-full", gemma, goldenTokens(100, 21),
			[][]int{all(6), all(6)},
			[][]int{all(6), {0, 1, 2, 4, 5}},
			[][]int{all(6), {0, 1}},
			[][]int{all(4), {1, 2, 3, 4, 5}}),
		v("qwen3-next-style-state-and-full", qwen, goldenTokens(30, 22),
			[][]int{all(7), all(7)},
			[][]int{{2, 4}, all(7)},
			[][]int{{6}, all(5)},
			[][]int{{}, all(7)}),
		v("dsa-style-latent-and-indexer-salted", dsa, goldenTokens(20, 23),
			[][]int{all(6), all(6)},
			[][]int{all(6), {0, 1, 3, 4, 5}}),
		v("vllm-scheme-every-kind", mixed, goldenTokens(21, 24),
			[][]int{all(10), all(10), all(10), all(10)},
			[][]int{all(10), {0, 1, 2, 3, 4, 5, 6, 8, 9}, {2, 5, 9}, all(10)},
			[][]int{all(8), {4, 5, 6, 7}, {1, 7}, all(9)}),
	}
}

func (g *groupsVector) namespace(t *testing.T) Namespace {
	ns := g.Namespace.namespace(t)
	var gs []Group
	for _, gg := range g.Groups {
		gs = append(gs, gg.group(t))
	}
	var err error
	if ns.Groups, err = NewGroups(gs...); err != nil {
		t.Fatal(err)
	}
	if err := ns.Validate(); err != nil {
		t.Fatalf("%s: %v", g.Name, err)
	}
	return ns
}

func (g *groupsVector) compute(t *testing.T) {
	ns := g.namespace(t)
	g.Encoding = hex.EncodeToString(ns.AppendEncoding(nil))
	g.Root = ns.Root().String()
	g.Digest = fmt.Sprintf("%016x", ns.Digest())
	keys := Keys(ns, g.Tokens)
	g.Keys, g.GroupKeys, g.RecordBytes = []string{}, nil, nil
	for _, k := range keys {
		g.Keys = append(g.Keys, k.String())
	}
	groups := ns.Groups.All()
	for gi := range groups {
		var gk []string
		for _, k := range keys {
			gk = append(gk, GroupKey(k, gi).String())
		}
		g.GroupKeys = append(g.GroupKeys, gk)
		g.RecordBytes = append(g.RecordBytes, ns.GroupBytes(gi))
	}
	for hi := range g.Hits {
		h := &g.Hits[hi]
		held := make([]map[int]bool, len(groups))
		for gi := range held {
			held[gi] = map[int]bool{}
			for _, i := range h.Held[gi] {
				held[gi][i] = true
			}
		}
		hit, _ := Resume(groups, ns.BlockTokens, len(keys), func(gi, i int) Presence {
			if held[gi][i] {
				return Held
			}
			return Missing
		})
		h.Blocks, h.Groups = hit.Blocks, hit.Groups
	}
}

func groupsHeader() groupsFile {
	f := groupsFile{
		Comment: "kvmesh golden vectors for namespaces with groups (hybrid models), generated by " +
			"`go test ./prefixhash -run TestGroupsGolden -update`. Every implementation must reproduce encoding, root, digest, " +
			"keys, group keys, record sizes and the hit rule's answers from each vector's inputs. Keys as in golden.json.",
		KeyVersion: KeyVersion,
		Encoding: "the namespace encoding of golden.json (kv_heads, head_dim 0; no kv_layout or scales field), then after every " +
			"other optional field: u8 6 ‖ u8 group count ‖ per group: u8 kind (full 0, sliding 1, state 2, indexer 3) ‖ u32 window ‖ " +
			"u8 kv_layout (split 0, latent 1, state 2) ‖ u8 dtype_id ‖ u8 scales ‖ u32 kv_heads ‖ u32 head_dim ‖ u32 latent_dim ‖ " +
			"u32 state_bytes ‖ u32 layer count ‖ u32 per layer (ascending)",
		GroupKey: "group g's record of block i is stored under k_i XOR M_g, M_0 = 16 zero bytes, M_g (g > 0) = first 16 bytes of " +
			"SHA-256(\"kvmesh/group/v1\" ‖ u32 little-endian g)",
		HitRule: "the longest P (blocks) such that every full and indexer group holds blocks [0,P), every sliding group " +
			"blocks [max(0, P - ceil(window/block_tokens)), P), every state group block P-1 (P = 0 always qualifies); " +
			"groups[g] is a full/indexer group's leading blocks held, or for sliding/state the largest P' no longer than " +
			"every full/indexer group's leading run at which that group alone holds what P' needs",
	}
	for g := range MaxGroups {
		f.Masks = append(f.Masks, GroupKey(Key{}, g).String())
	}
	return f
}

// TestGroupsGolden pins the keys, record sizes and hit rule of namespaces
// with groups, as TestGolden does for the rest.
func TestGroupsGolden(t *testing.T) {
	path := filepath.Join("testdata", "groups.json")
	if *update {
		f := groupsHeader()
		f.Vectors = groupsInputs()
		for i := range f.Vectors {
			f.Vectors[i].compute(t)
		}
		writeJSON(t, path, f)
	}
	var f groupsFile
	readJSON(t, path, &f)
	want := groupsHeader()
	if f.KeyVersion != want.KeyVersion || f.Encoding != want.Encoding || f.GroupKey != want.GroupKey ||
		f.HitRule != want.HitRule || !reflect.DeepEqual(f.Masks, want.Masks) {
		t.Error("groups.json's description or masks differ from the test's: regenerate with -update if the format changed on purpose")
	}
	inputs := groupsInputs()
	if len(f.Vectors) != len(inputs) {
		t.Fatalf("groups.json has %d vectors, the test %d", len(f.Vectors), len(inputs))
	}
	for i, w := range f.Vectors {
		in := inputs[i]
		if w.Name != in.Name || w.Namespace != in.Namespace || !reflect.DeepEqual(w.Groups, in.Groups) ||
			!reflect.DeepEqual(w.Tokens, in.Tokens) || len(w.Hits) != len(in.Hits) {
			t.Errorf("vector %d (%s): inputs differ from the test's", i, w.Name)
			continue
		}
		got := w
		got.Hits = append([]goldenHit(nil), w.Hits...)
		got.compute(t)
		if !reflect.DeepEqual(got, w) {
			t.Errorf("%s: computed\n%+v\ngolden\n%+v", w.Name, got, w)
		}
	}
}
