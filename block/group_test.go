package block_test

import (
	"encoding/binary"
	"encoding/hex"
	"errors"
	"flag"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/kvmesh/kvmesh/block"
	"github.com/kvmesh/kvmesh/block/blocktest"
	"github.com/kvmesh/kvmesh/prefixhash"
)

// TestGroupRecords: every group's record of a two-block chain encodes and
// decodes; its key is GroupKey of the chain key, its layout the group's,
// CheckNamespace accepts it against its namespace only, and LinkParent
// names what a store hangs it from.
func TestGroupRecords(t *testing.T) {
	ns := blocktest.Hybrid()
	rng := rand.New(rand.NewPCG(31, 2))
	tokens := [][]uint32{{1, 2, 3, 4}, {5, 6, 7, 8}}
	chain := prefixhash.Keys(ns, append(tokens[0], tokens[1]...))
	anchor := ns.Groups.Anchor()
	for g, gr := range ns.Groups.All() {
		parent := ns.RootLink()
		for i := range tokens {
			rec, link := blocktest.Record(t, rng, ns, g, parent, tokens[i])
			if link.Key() != chain[i] {
				t.Fatalf("group %d block %d: link %s, chain key %s", g, i, link.Key(), chain[i])
			}
			blk, err := block.Decode(rec, 0)
			if err != nil {
				t.Fatalf("group %d block %d: %v", g, i, err)
			}
			h := blk.Header
			if h.Key != prefixhash.GroupKey(chain[i], g) || h.Chain != chain[i] || h.Parent != parent.Key() {
				t.Fatalf("group %d block %d: key %s chain %s parent %s", g, i, h.Key, h.Chain, h.Parent)
			}
			if h.Group != block.GroupRefOf(ns, g) || h.Layout != block.GroupLayout(ns, g) || !h.Whole() || len(blk.Payload) != ns.GroupBytes(g) {
				t.Fatalf("group %d: group %+v layout %+v payload %d", g, h.Group, h.Layout, len(blk.Payload))
			}
			if err := h.CheckNamespace(ns); err != nil {
				t.Fatalf("group %d: %v", g, err)
			}
			var want prefixhash.Key
			switch {
			case gr.Kind.EveryBlock():
				want = prefixhash.GroupKey(parent.Key(), g)
			default:
				want = prefixhash.GroupKey(chain[i], anchor)
			}
			if got := h.LinkParent(); got != want {
				t.Fatalf("group %d (%s) block %d: LinkParent %s, want %s", g, gr.Kind, i, got, want)
			}
			if err := h.CheckTokens(parent.Key(), tokens[i]); err != nil {
				t.Fatal(err)
			}
			parent = link
		}
	}
	// Another namespace, or the namespace's other groups, do not accept it.
	rec, _ := blocktest.Record(t, rng, ns, 2, ns.RootLink(), tokens[0])
	h, _ := block.DecodeHeader(rec, 0)
	plain := blocktest.NS()
	if h.CheckNamespace(plain) == nil {
		t.Fatal("a group's record checks against a namespace without groups")
	}
	h.Group.Index = 1
	if h.CheckNamespace(ns) == nil {
		t.Fatal("a state record checks as the sliding group's")
	}
	// A block without groups links to its parent and has no group.
	b, _, _, _ := blocktest.Random(t, rng, plain, plain.Root())
	ph, _ := block.DecodeHeader(b, 0)
	if ph.Group.Set || ph.LinkParent() != plain.Root() || ph.Chain != ph.Key {
		t.Fatalf("plain header: group %+v, link %s, chain %s", ph.Group, ph.LinkParent(), ph.Chain)
	}
}

// TestGroupRecordErrors: a record of a group the namespace lacks, a state
// of the wrong size, and group fields edited on the wire are refused.
func TestGroupRecordErrors(t *testing.T) {
	ns := blocktest.Hybrid()
	tokens := []uint32{1, 2, 3, 4}
	if _, _, err := block.EncodeGroup(nil, 0, ns, 4, ns.RootLink(), tokens, nil, nil); err == nil || !strings.Contains(err.Error(), "group 4") {
		t.Errorf("group 4 of 4: %v", err)
	}
	_, _, err := block.EncodeGroup(nil, 0, ns, 2, ns.RootLink(), tokens, nil, make([]byte, ns.GroupBytes(2)-4))
	if err == nil || !strings.Contains(err.Error(), "groups[2].state_bytes") {
		t.Errorf("a short state: %v", err)
	}
	if _, _, err := block.Encode(nil, ns, ns.Root(), tokens, nil); err == nil || !strings.Contains(err.Error(), "has groups") {
		t.Errorf("a block of a namespace with groups encoded without a group: %v", err)
	}
	plain := blocktest.NS()
	if _, _, err := block.EncodeGroup(nil, 0, plain, 0, plain.RootLink(), tokens, nil, make([]byte, plain.BlockBytes())); err == nil {
		t.Error("a group's record of a namespace without groups")
	}

	rng := rand.New(rand.NewPCG(7, 7))
	for _, tc := range []struct {
		name string
		edit func(b []byte)
	}{
		{"group dropped", func(b []byte) { b[59] = 0 }},
		{"other group", func(b []byte) { b[59] = 2 }},
		{"kind", func(b []byte) { b[76] = 9 }},
		{"kind full with a state", func(b []byte) { b[76] = 1; b[77] = 0 }},
		{"window on a state", func(b []byte) { binary.LittleEndian.PutUint16(b[78:], 3) }},
		{"fields without a group", func(b []byte) { b[59] = 0; b[7] = 0 }},
		{"group beyond the limit", func(b []byte) { b[59] = prefixhash.MaxGroups + 1 }},
	} {
		rec, _ := blocktest.Record(t, rng, ns, 2, ns.RootLink(), tokens)
		tc.edit(rec)
		blocktest.Reseal(rec)
		if _, err := block.Decode(rec, 0); !errors.Is(err, block.ErrCorrupt) {
			t.Errorf("%s: %v, want ErrCorrupt", tc.name, err)
		}
	}
}

// TestGroupParts: every rank's part of every group's record, for TP 1, 2
// and 4 and PP 1 to 3, covers the record exactly once (a stage without any
// of a group's layers holds an empty part), and a state record splits by
// heads like a split one.
func TestGroupParts(t *testing.T) {
	ns := blocktest.Hybrid()
	for g := range ns.Groups.Len() {
		lay := block.GroupLayout(ns, g)
		layers, heads := lay.Cells()
		for _, tp := range []int{1, 2, 4} {
			for pp := 1; pp <= 3; pp++ {
				covered := make([]int, layers*heads)
				for r := range tp * pp {
					p, err := block.RankGroupPart(ns, g, r%tp, tp, r/tp, pp)
					if err != nil {
						t.Fatalf("group %d tp %d pp %d rank %d: %v", g, tp, pp, r, err)
					}
					if p.Empty() {
						continue
					}
					if lay.PartLen(ns.BlockTokens, p) < 0 {
						t.Fatalf("group %d: invalid part %s", g, p)
					}
					for l := p.L0; l < p.L1; l++ {
						for h := p.H0; h < p.H1; h++ {
							covered[l*heads+h]++
						}
					}
				}
				for c, n := range covered {
					if want := max(1, tp/heads); n != want && !(heads > tp && n == 1) {
						t.Fatalf("group %d tp %d pp %d: cell %d covered %d times", g, tp, pp, c, n)
					}
				}
			}
		}
	}
	if _, err := block.RankGroupPart(ns, 9, 0, 1, 0, 1); !errors.Is(err, block.ErrBadPart) {
		t.Errorf("group 9: %v", err)
	}
	if _, err := block.RankPart(ns, 0, 1, 0, 1); !errors.Is(err, block.ErrBadPart) {
		t.Errorf("RankPart of a namespace with groups: %v", err)
	}
}

var updateGroups = flag.Bool("update-groups", false, "rewrite testdata/groups.json (only when the block format changes on purpose)")

// goldenGroupRecord is one record of testdata/groups.json.
type goldenGroupRecord struct {
	Group   int      `json:"group"`
	Block   int      `json:"block"`
	Tokens  []uint32 `json:"tokens"`
	TPRank  int      `json:"tp_rank"`
	TPSize  int      `json:"tp_size"`
	PPRank  int      `json:"pp_rank"`
	PPSize  int      `json:"pp_size"`
	Part    [4]int   `json:"part"`
	Whole   string   `json:"whole_payload"`
	Encoded string   `json:"encoded"`
}

// TestGoldenGroupRecords pins group records byte for byte for other
// implementations (the Python library checks the file): every group's
// whole record of two chained blocks of blocktest.Hybrid, and TP/PP parts.
func TestGoldenGroupRecords(t *testing.T) {
	ns := blocktest.Hybrid()
	rng := rand.New(rand.NewPCG(31, 31))
	tokens := [][]uint32{{0, 0xffffffff, 7, 1 << 20}, {9, 8, 7, 6}}
	var recs []goldenGroupRecord
	for g := range ns.Groups.Len() {
		parent := ns.RootLink()
		for i, tk := range tokens {
			payload := randBytes(rng, ns.GroupBytes(g))
			for _, r := range [][4]int{{0, 1, 0, 1}, {1, 2, 0, 1}, {0, 2, 1, 2}} {
				p, err := block.RankGroupPart(ns, g, r[0], r[1], r[2], r[3])
				if err != nil {
					t.Fatal(err)
				}
				if p.Empty() {
					continue
				}
				lay := block.GroupLayout(ns, g)
				part := lay.ExtractPart(nil, payload, ns.BlockTokens, p)
				hdr, _, err := block.AppendGroupHeader(nil, 0xabcdef, ns, g, parent, tk, nil, p, part)
				if err != nil {
					t.Fatal(err)
				}
				recs = append(recs, goldenGroupRecord{Group: g, Block: i, Tokens: tk, TPRank: r[0], TPSize: r[1], PPRank: r[2], PPSize: r[3],
					Part: [4]int{p.L0, p.L1, p.H0, p.H1}, Whole: hex.EncodeToString(payload), Encoded: hex.EncodeToString(append(hdr, part...))})
			}
			parent = prefixhash.BlockLink(ns.Scheme, parent, tk, nil)
		}
	}
	const path = "testdata/groups.json"
	var file struct{ Records []goldenGroupRecord }
	goldenJSON(t, path, *updateGroups, map[string]any{
		"comment": "kvmesh block format 4 records of a namespace with groups (blocktest.Hybrid: the namespace below), generated by " +
			"`go test ./block -run TestGoldenGroupRecords -update-groups`. Every implementation must reproduce `part` from the " +
			"group and rank (RankGroupPart) and `encoded` from the namespace, group, tokens, tenant 0xabcdef, part and the whole " +
			"payload; block 0 chains from the namespace root, block 1 from block 0.",
		"namespace": map[string]any{"model": ns.Model, "dtype": ns.DType.String(), "block_tokens": ns.BlockTokens, "layers": ns.Layers,
			"groups": goldenGroups(ns)},
		"records": recs}, &file)
	if len(file.Records) != len(recs) {
		t.Fatalf("golden file has %d records, the test makes %d", len(file.Records), len(recs))
	}
	for i, r := range recs {
		if file.Records[i].Encoded != r.Encoded || file.Records[i].Part != r.Part {
			t.Errorf("record %d (group %d block %d, rank %d/%d %d/%d): encoding differs from the golden file", i, r.Group, r.Block, r.TPRank, r.TPSize, r.PPRank, r.PPSize)
		}
		rec, _ := hex.DecodeString(r.Encoded)
		if _, err := block.Decode(rec, 0); err != nil {
			t.Errorf("record %d: %v", i, err)
		}
	}
}

// goldenGroups describes ns's groups field by field, as
// prefixhash/testdata/groups.json does.
func goldenGroups(ns prefixhash.Namespace) []map[string]any {
	var out []map[string]any
	for _, g := range ns.Groups.All() {
		out = append(out, map[string]any{"kind": g.Kind.String(), "window": g.Window, "layers": g.Layers,
			"kv_layout": g.Layout.String(), "dtype": g.DType.String(), "kv_heads": g.KVHeads, "head_dim": g.HeadDim,
			"latent_dim": g.LatentDim, "state_bytes": g.StateBytes, "scales": g.Scales.String()})
	}
	return out
}
