package block_test

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"math/rand/v2"
	"os"
	"strings"
	"testing"

	"github.com/kvmesh/kvmesh/block"
	"github.com/kvmesh/kvmesh/block/blocktest"
	"github.com/kvmesh/kvmesh/prefixhash"
)

// partNamespaces are namespaces whose blocks parallel ranks split: split
// KV with and without per-head scales, latent with per-block scales.
func partNamespaces() map[string]prefixhash.Namespace {
	split := prefixhash.Namespace{Model: "kvmesh/parts", DType: prefixhash.Float16, BlockTokens: 4, Layers: 5, KVHeads: 8, HeadDim: 4}
	int8 := split
	int8.DType, int8.Scales = prefixhash.Int8, prefixhash.ScalesPerHead
	latent := prefixhash.Namespace{Model: "kvmesh/mla", DType: prefixhash.Float8E4M3, BlockTokens: 4, Layers: 5,
		Layout: prefixhash.LatentKV, LatentDim: 12, Scales: prefixhash.ScalesPerBlock}
	return map[string]prefixhash.Namespace{"split": split, "int8-per-head": int8, "latent": latent}
}

// TestPartsAssemble: for every TP size (1, 2, 4, 8, and 16 with replicated
// heads) and PP size (1, 2, 3), every rank's part is extracted from a whole
// payload, encoded as a part record that decodes as that part, and placed
// back: the assembled payload is the whole one, and sealing a part's
// header over it gives exactly the whole block's encoding. A part read at
// any other layout is the same bytes as extracted from the whole.
func TestPartsAssemble(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for name, ns := range partNamespaces() {
		lay := block.LayoutOf(ns)
		tokens := []uint32{5, 6, 7, 8}
		payload := randBytes(rng, ns.BlockBytes())
		whole, _, err := block.EncodeTenant(nil, 3, ns, ns.Root(), tokens, payload)
		if err != nil {
			t.Fatal(err)
		}
		for _, tp := range []int{1, 2, 4, 8, 16} {
			for _, pp := range []int{1, 2, 3} {
				got := make([]byte, len(payload))
				var last []byte
				for pr := range pp {
					for tr := range tp {
						p, err := block.RankPart(ns, tr, tp, pr, pp)
						if err != nil {
							t.Fatalf("%s tp %d/%d pp %d/%d: %v", name, tr, tp, pr, pp, err)
						}
						part := lay.ExtractPart(nil, payload, ns.BlockTokens, p)
						if len(part) != lay.PartLen(ns.BlockTokens, p) {
							t.Fatalf("%s %s: %d bytes, PartLen %d", name, p, len(part), lay.PartLen(ns.BlockTokens, p))
						}
						hdr, link, err := block.AppendPartHeaderExt(nil, 3, ns, ns.RootLink(), tokens, nil, p, part)
						if err != nil {
							t.Fatal(err)
						}
						rec, err := block.Decode(append(hdr, part...), 0)
						if err != nil {
							t.Fatalf("%s %s: %v", name, p, err)
						}
						if rec.Part != p || rec.Whole() != (p == lay.Whole()) || rec.Key != link.Key() || !bytes.Equal(rec.Payload, part) {
							t.Fatalf("%s %s: decoded part %s whole %v", name, p, rec.Part, rec.Whole())
						}
						lay.PlacePart(got, part, ns.BlockTokens, p)
						last = hdr
					}
				}
				if !bytes.Equal(got, payload) {
					t.Fatalf("%s tp %d pp %d: assembled payload differs", name, tp, pp)
				}
				sealed := append(bytes.Clone(last), got...)
				if err := block.Seal(sealed); err != nil {
					t.Fatal(err)
				}
				if !bytes.Equal(sealed, whole) {
					t.Fatalf("%s tp %d pp %d: sealed block differs from the whole block's encoding", name, tp, pp)
				}
			}
		}
	}
}

// TestPartOverlap: ComparePart sees a difference in any covered cell, KV
// or scale, and ignores cells not covered.
func TestPartOverlap(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	ns := partNamespaces()["int8-per-head"]
	lay := block.LayoutOf(ns)
	payload := randBytes(rng, ns.BlockBytes())
	p := block.Part{L0: 1, L1: 3, H0: 4, H1: 8}
	part := lay.ExtractPart(nil, payload, ns.BlockTokens, p)
	all := func(int, int) bool { return true }
	if !lay.ComparePart(payload, part, ns.BlockTokens, p, all) {
		t.Fatal("a part differs from the payload it came from")
	}
	for _, i := range []int{0, len(part)/2 - 1, len(part) - 1} {
		bad := bytes.Clone(part)
		bad[i] ^= 1
		if lay.ComparePart(payload, bad, ns.BlockTokens, p, all) {
			t.Errorf("byte %d of the part flipped: still equal", i)
		}
		if !lay.ComparePart(payload, bad, ns.BlockTokens, p, func(int, int) bool { return false }) {
			t.Errorf("byte %d flipped, nothing covered: reported different", i)
		}
	}
}

// TestBadParts: every invalid range is ErrBadPart, not ErrCorrupt, and
// names the valid ranges; a record claiming one does not decode.
func TestBadParts(t *testing.T) {
	nss := partNamespaces()
	perBlock := nss["split"]
	perBlock.DType, perBlock.Scales = prefixhash.Int8, prefixhash.ScalesPerBlock
	for _, c := range []struct {
		name string
		ns   prefixhash.Namespace
		p    block.Part
		want string
	}{
		{"layers past the end", nss["split"], block.Part{L0: 3, L1: 6, H0: 0, H1: 8}, "inside [0,5)"},
		{"no layers", nss["split"], block.Part{L0: 2, L1: 2, H0: 0, H1: 8}, "non-empty"},
		{"unaligned heads", nss["split"], block.Part{L0: 0, L1: 5, H0: 2, H1: 5}, "width 4: [0,4), [4,8)"},
		{"width not dividing", nss["split"], block.Part{L0: 0, L1: 5, H0: 0, H1: 3}, "equal slices"},
		{"heads past the end", nss["split"], block.Part{L0: 0, L1: 5, H0: 8, H1: 16}, "equal slices"},
		{"latent heads", nss["latent"], block.Part{L0: 0, L1: 5, H0: 0, H1: 2}, "no heads to split"},
		{"per-block scales split", perBlock, block.Part{L0: 0, L1: 5, H0: 0, H1: 4}, "per-block scales"},
	} {
		err := block.LayoutOf(c.ns).CheckPart(c.p)
		if !errors.Is(err, block.ErrBadPart) || errors.Is(err, block.ErrCorrupt) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want ErrBadPart naming %q", c.name, err, c.want)
		}
		if block.LayoutOf(c.ns).PartLen(4, c.p) != -1 {
			t.Errorf("%s: PartLen of a bad part is not -1", c.name)
		}
	}
	for _, c := range []struct {
		tr, ts, pr, ps int
		want           string
	}{
		{0, 3, 0, 1, "valid: 1, 2, 4, 8, or a multiple of 8"},
		{2, 2, 0, 1, "0 <= rank < size"},
		{0, 1, 0, 6, "at least one layer"},
		{0, 0, 0, 1, "0 <= rank < size"},
	} {
		_, err := block.RankPart(nss["split"], c.tr, c.ts, c.pr, c.ps)
		if !errors.Is(err, block.ErrBadPart) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("RankPart(tp %d/%d, pp %d/%d) = %v, want %q", c.tr, c.ts, c.pr, c.ps, err, c.want)
		}
	}
	// A record whose header claims a bad part is corrupt.
	ns := nss["split"]
	payload := make([]byte, ns.BlockBytes())
	b, _, err := block.Encode(nil, ns, ns.Root(), []uint32{1, 2, 3, 4}, payload)
	if err != nil {
		t.Fatal(err)
	}
	b[112] = 3 // heads [3,8)
	blocktest.Reseal(b)
	if _, err := block.DecodeHeader(b, 0); !errors.Is(err, block.ErrCorrupt) {
		t.Fatalf("a header with heads [3,8) decodes: %v", err)
	}
}

// TestRankPartLayers: pipeline stages split the layers as vLLM does by
// default (the extra layers go to the stages before the last), and tensor
// ranks beyond the KV heads share replicated heads.
func TestRankPartLayers(t *testing.T) {
	ns := prefixhash.Namespace{Model: "m", DType: prefixhash.BFloat16, BlockTokens: 16, Layers: 61, KVHeads: 8, HeadDim: 128}
	want := [][2]int{{0, 15}, {15, 30}, {30, 46}, {46, 61}}
	for r, w := range want {
		p, err := block.RankPart(ns, 0, 1, r, 4)
		if err != nil || p.L0 != w[0] || p.L1 != w[1] {
			t.Errorf("stage %d of 4: %s, %v; want layers [%d,%d)", r, p, err, w[0], w[1])
		}
	}
	for r, h := range []int{0, 0, 1, 1, 2} {
		p, err := block.RankPart(ns, r, 16, 0, 1)
		if err != nil || p.H0 != h || p.H1 != h+1 {
			t.Errorf("tp rank %d of 16: %s, %v; want head %d", r, p, err, h)
		}
	}
	p, err := block.RankPart(ns, 3, 4, 1, 2)
	if err != nil || p != (block.Part{L0: 31, L1: 61, H0: 6, H1: 8}) {
		t.Errorf("tp 3/4 pp 1/2: %s, %v", p, err)
	}
}

var updateParts = flag.Bool("update-parts", false, "rewrite testdata/golden_v4.json (only when the block format changes on purpose)")

type goldenRecord struct {
	Name string `json:"name"`
	// Namespace fields, as prefixhash/testdata/golden.json names them.
	Model       string   `json:"model"`
	DType       string   `json:"dtype"`
	BlockTokens int      `json:"block_tokens"`
	Layers      int      `json:"layers"`
	KVHeads     int      `json:"kv_heads"`
	HeadDim     int      `json:"head_dim"`
	Layout      string   `json:"kv_layout"`
	LatentDim   int      `json:"latent_dim"`
	Scales      string   `json:"scales"`
	Tokens      []uint32 `json:"tokens"`
	Tenant      uint64   `json:"tenant"`
	// Rank: the record holds what RankPart(tp_rank, tp_size, pp_rank,
	// pp_size) names, extracted from Whole.
	TPRank  int    `json:"tp_rank"`
	TPSize  int    `json:"tp_size"`
	PPRank  int    `json:"pp_rank"`
	PPSize  int    `json:"pp_size"`
	Part    [4]int `json:"part"` // l0, l1, h0, h1
	Whole   string `json:"whole_payload"`
	Encoded string `json:"encoded"`
}

// TestGoldenRecords pins format 4 byte for byte, whole blocks and parts,
// for other implementations (the Python library checks the same file).
func TestGoldenRecords(t *testing.T) {
	var recs []goldenRecord
	names := []string{"split", "int8-per-head", "latent"}
	ranks := [][4]int{{0, 1, 0, 1}, {1, 2, 0, 1}, {3, 4, 1, 2}, {5, 16, 0, 1}, {1, 8, 2, 3}}
	for i, name := range names {
		ns := partNamespaces()[name]
		rng := rand.New(rand.NewPCG(uint64(i), 99))
		payload := randBytes(rng, ns.BlockBytes())
		tokens := []uint32{uint32(i), 0xffffffff, 7, 1 << 20}
		for _, r := range ranks {
			p, err := block.RankPart(ns, r[0], r[1], r[2], r[3])
			if err != nil {
				t.Fatal(err)
			}
			part := block.LayoutOf(ns).ExtractPart(nil, payload, ns.BlockTokens, p)
			hdr, _, err := block.AppendPartHeaderExt(nil, 0xabcdef, ns, ns.RootLink(), tokens, nil, p, part)
			if err != nil {
				t.Fatal(err)
			}
			recs = append(recs, goldenRecord{Name: name, Model: ns.Model, DType: ns.DType.String(), BlockTokens: ns.BlockTokens,
				Layers: ns.Layers, KVHeads: ns.KVHeads, HeadDim: ns.HeadDim, Layout: ns.Layout.String(), LatentDim: ns.LatentDim,
				Scales: ns.Scales.String(), Tokens: tokens, Tenant: 0xabcdef, TPRank: r[0], TPSize: r[1], PPRank: r[2], PPSize: r[3],
				Part: [4]int{p.L0, p.L1, p.H0, p.H1}, Whole: hex.EncodeToString(payload), Encoded: hex.EncodeToString(append(hdr, part...))})
		}
	}
	const path = "testdata/golden_v4.json"
	var file struct{ Records []goldenRecord }
	goldenJSON(t, path, *updateParts, map[string]any{
		"comment": "kvmesh block format 4 golden records (whole blocks and parallel ranks' parts), generated by " +
			"`go test ./block -run TestGoldenRecords -update-parts`. Every implementation must reproduce `part` from the rank " +
			"and `encoded` from the namespace, tokens, tenant, part and the whole payload (the record's payload is the part " +
			"extracted from it); every block is the first of its chain (parent = the namespace root).",
		"records": recs}, &file)
	if len(file.Records) != len(recs) {
		t.Fatalf("golden file has %d records, the test makes %d", len(file.Records), len(recs))
	}
	for i, r := range recs {
		if file.Records[i].Encoded != r.Encoded || file.Records[i].Part != r.Part {
			t.Errorf("record %d (%s, rank %d/%d %d/%d): encoding differs from the golden file", i, r.Name, r.TPRank, r.TPSize, r.PPRank, r.PPSize)
		}
	}
}

// TestAppendPartRecord: the record a node builds from a stored whole block
// for a read of any rank's part is byte for byte the record that rank
// would have written (AppendPartHeaderExt over ExtractPart), decodes as
// that part, and PartRecordLen says its length. A bad range is ErrBadPart
// and appends nothing; a part record is not a whole block.
func TestAppendPartRecord(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for name, ns := range partNamespaces() {
		lay := block.LayoutOf(ns)
		tokens := []uint32{9, 8, 7, 6}
		payload := randBytes(rng, ns.BlockBytes())
		whole, _, err := block.EncodeTenant(nil, 5, ns, ns.Root(), tokens, payload)
		if err != nil {
			t.Fatal(err)
		}
		for _, tp := range []int{1, 2, 4, 8} {
			for _, pp := range []int{1, 2} {
				for r := range tp * pp {
					p, err := block.RankPart(ns, r%tp, tp, r/tp, pp)
					if err != nil {
						t.Fatal(err)
					}
					prefix := []byte("kept")
					got, err := block.AppendPartRecord(prefix, whole, p)
					if err != nil {
						t.Fatalf("%s %s: %v", name, p, err)
					}
					if string(got[:4]) != "kept" {
						t.Fatalf("%s %s: dst's bytes overwritten", name, p)
					}
					rec := got[4:]
					part := lay.ExtractPart(nil, payload, ns.BlockTokens, p)
					want, _, err := block.AppendPartHeaderExt(nil, 5, ns, ns.RootLink(), tokens, nil, p, part)
					if err != nil {
						t.Fatal(err)
					}
					want = append(want, part...)
					if !bytes.Equal(rec, want) {
						t.Fatalf("%s %s: record differs from the rank's own encoding", name, p)
					}
					b, err := block.Decode(rec, 0)
					if err != nil || b.Part != p || b.Whole() != (p == lay.Whole()) {
						t.Fatalf("%s %s: decodes as %v, %v", name, p, b.Part, err)
					}
					if n, err := block.PartRecordLen(whole, p); err != nil || n != len(rec) {
						t.Fatalf("%s %s: PartRecordLen %d, %v; record is %d bytes", name, p, n, err, len(rec))
					}
				}
			}
		}
		bad := block.Part{L0: 0, L1: lay.Layers + 1, H0: 0, H1: 1}
		if got, err := block.AppendPartRecord([]byte("x"), whole, bad); !errors.Is(err, block.ErrBadPart) || string(got) != "x" {
			t.Fatalf("%s: bad part gave %q, %v", name, got, err)
		}
		if _, err := block.PartRecordLen(whole, bad); !errors.Is(err, block.ErrBadPart) {
			t.Fatalf("%s: PartRecordLen of a bad part: %v", name, err)
		}
		half := block.Part{L0: 0, L1: 1, H0: 0, H1: lay.Whole().H1}
		rec, err := block.AppendPartRecord(nil, whole, half)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := block.AppendPartRecord(nil, rec, half); !errors.Is(err, block.ErrCorrupt) {
			t.Fatalf("%s: a part record taken as a whole block: %v", name, err)
		}
		if _, err := block.PartRecordLen(whole[:len(whole)-1], half); !errors.Is(err, block.ErrCorrupt) {
			t.Fatalf("%s: a truncated block: %v", name, err)
		}
	}
}

// goldenJSON writes content to path as indented JSON when update is set,
// then reads path into out.
func goldenJSON(t *testing.T, path string, update bool, content any, out any) {
	t.Helper()
	if update {
		b, err := json.MarshalIndent(content, "", "  ")
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, append(b, '\n'), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(raw, out); err != nil {
		t.Fatal(err)
	}
}
