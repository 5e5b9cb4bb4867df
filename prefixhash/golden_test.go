package prefixhash

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"testing"
)

var update = flag.Bool("update", false, "rewrite testdata/golden.json (only when the key format changes on purpose)")

// goldenFile is testdata/golden.json: self-describing, so that a client in
// another language (the Python library) can check its keys against it
// without reading this file. Each vector gives the namespace by field, the
// tokens, and what every implementation must compute from them.
type goldenFile struct {
	Comment    string         `json:"comment"`
	KeyVersion int            `json:"key_version"`
	Encoding   string         `json:"namespace_encoding"`
	Root       string         `json:"root"`
	Digest     string         `json:"digest"`
	BlockKey   string         `json:"block_key"`
	Vectors    []goldenVector `json:"vectors"`
}

type goldenVector struct {
	Name      string          `json:"name"`
	Namespace goldenNamespace `json:"namespace"`
	Tokens    []uint32        `json:"tokens"`
	Encoding  string          `json:"encoding"` // hex
	Root      string          `json:"root"`
	Digest    string          `json:"digest"`
	Keys      []string        `json:"keys"`
}

type goldenNamespace struct {
	Model       string `json:"model"`
	DType       string `json:"dtype"`
	DTypeID     uint8  `json:"dtype_id"`
	BlockTokens int    `json:"block_tokens"`
	LayerStart  int    `json:"layer_start"`
	LayerEnd    int    `json:"layer_end"`
	KVHeads     int    `json:"kv_heads"`
	HeadDim     int    `json:"head_dim"`
	TPRank      int    `json:"tp_rank"`
	TPSize      int    `json:"tp_size"`
	TenantSalt  string `json:"tenant_salt"`
}

func (g goldenNamespace) namespace(t *testing.T) Namespace {
	d, err := ParseDType(g.DType)
	if err != nil || uint8(d) != g.DTypeID {
		t.Fatalf("golden dtype %q/%d: %v", g.DType, g.DTypeID, err)
	}
	return Namespace{Model: g.Model, DType: d, BlockTokens: g.BlockTokens, LayerStart: g.LayerStart, LayerEnd: g.LayerEnd,
		KVHeads: g.KVHeads, HeadDim: g.HeadDim, TPRank: g.TPRank, TPSize: g.TPSize, TenantSalt: g.TenantSalt}
}

func goldenNS(ns Namespace) goldenNamespace {
	return goldenNamespace{Model: ns.Model, DType: ns.DType.String(), DTypeID: uint8(ns.DType), BlockTokens: ns.BlockTokens,
		LayerStart: ns.LayerStart, LayerEnd: ns.LayerEnd, KVHeads: ns.KVHeads, HeadDim: ns.HeadDim,
		TPRank: ns.TPRank, TPSize: ns.TPSize, TenantSalt: ns.TenantSalt}
}

// goldenTokens returns n tokens over the whole uint32 range, extremes
// included, from a fixed recurrence (no RNG whose output could change).
func goldenTokens(n int, seed uint32) []uint32 {
	edge := []uint32{0, 1, 0xffffffff, 0x80000000, 0x7fffffff, 128255, 0xdeadbeef, 0x00010000}
	t := make([]uint32, n)
	x := seed
	for i := range t {
		x = x*1664525 + 1013904223
		if i%5 == 2 {
			t[i] = edge[(i/5)%len(edge)]
		} else {
			t[i] = x
		}
	}
	return t
}

// goldenInputs are the vectors' inputs. Block sizes 1, 3, 16 and 256; salts
// empty and not; layers, heads, dims and TP varied; partial tails and
// prompts shorter than a block (no keys, still a root).
func goldenInputs() []goldenVector {
	llama := Namespace{Model: "meta-llama/Llama-3.1-8B", DType: BFloat16, BlockTokens: 16, LayerStart: 0, LayerEnd: 32,
		KVHeads: 8, HeadDim: 128, TPSize: 1}
	salted := llama
	salted.TenantSalt = "tenant-a"
	qwen := Namespace{Model: "Qwen/Qwen2.5-0.5B-Instruct", DType: Float32, BlockTokens: 1, LayerStart: 0, LayerEnd: 24,
		KVHeads: 2, HeadDim: 64, TPRank: 1, TPSize: 2, TenantSalt: "t"}
	mistral := Namespace{Model: "mistralai/Mistral-7B-v0.3", DType: Float8E4M3, BlockTokens: 3, LayerStart: 8, LayerEnd: 16,
		KVHeads: 8, HeadDim: 128, TPRank: 3, TPSize: 4, TenantSalt: "tenant/ü-ß-☃"}
	deepseek := Namespace{Model: "deepseek-ai/DeepSeek-V3", DType: Int8, BlockTokens: 256, LayerStart: 0, LayerEnd: 61,
		KVHeads: 1, HeadDim: 576, TPSize: 8}
	fp16 := Namespace{Model: "kvmesh/test", DType: Float16, BlockTokens: 16, LayerStart: 2, LayerEnd: 3,
		KVHeads: 4, HeadDim: 64, TPSize: 0}
	e5m2 := Namespace{Model: "kvmesh/tes", DType: Float8E5M2, BlockTokens: 16, LayerStart: 0, LayerEnd: 2,
		KVHeads: 4, HeadDim: 64, TPSize: 1, TenantSalt: "t"}
	v := func(name string, ns Namespace, tokens []uint32) goldenVector {
		return goldenVector{Name: name, Namespace: goldenNS(ns), Tokens: tokens}
	}
	return []goldenVector{
		v("llama-bf16-b16", llama, goldenTokens(70, 1)),
		v("llama-bf16-b16-salted", salted, goldenTokens(70, 1)),
		v("llama-bf16-b16-all-max", llama, []uint32{0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff,
			0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff}),
		v("qwen-f32-b1-tp1of2-salted", qwen, goldenTokens(7, 2)),
		v("mistral-fp8e4m3-b3-layers8-16-tp3of4-unicode-salt", mistral, goldenTokens(11, 3)),
		v("deepseek-int8-b256-mla-tp8", deepseek, goldenTokens(600, 4)),
		v("test-f16-b16-tpsize0", fp16, goldenTokens(33, 5)),
		v("test-fp8e5m2-b16-salt-boundary", e5m2, goldenTokens(32, 5)),
		v("llama-bf16-b16-shorter-than-a-block", llama, goldenTokens(15, 6)),
		v("llama-bf16-b16-empty", llama, []uint32{}),
	}
}

func (g *goldenVector) compute(t *testing.T) {
	ns := g.Namespace.namespace(t)
	if err := ns.Validate(); err != nil {
		t.Fatalf("%s: %v", g.Name, err)
	}
	g.Encoding = hex.EncodeToString(ns.AppendEncoding(nil))
	g.Root = ns.Root().String()
	g.Digest = fmt.Sprintf("%016x", ns.Digest())
	g.Keys = []string{}
	for _, k := range Keys(ns, g.Tokens) {
		g.Keys = append(g.Keys, k.String())
	}
}

func goldenHeader() goldenFile {
	return goldenFile{
		Comment: "kvmesh block-key golden vectors, generated by `go test ./prefixhash -run TestGolden -update`. " +
			"Every implementation of kvmesh keys must reproduce encoding, root, digest and keys from each vector's namespace and tokens.",
		KeyVersion: KeyVersion,
		Encoding: "string(magic \"kvmesh/ns/v2\") ‖ string(model) ‖ u8 dtype_id ‖ u32 block_tokens ‖ u32 layer_start ‖ u32 layer_end ‖ " +
			"u32 kv_heads ‖ u32 head_dim ‖ u32 tp_rank ‖ u32 max(tp_size,1) ‖ string(tenant_salt); " +
			"integers little-endian, string(s) = u32 little-endian byte length ‖ UTF-8 bytes",
		Root:     "k_0 = first 16 bytes of SHA-256(encoding), 32 lowercase hex digits",
		Digest:   "uint64 read little-endian from the first 8 bytes of SHA-256(encoding), as 16 lowercase hex digits of that integer",
		BlockKey: "k_i = first 16 bytes of SHA-256(k_{i-1} ‖ tokens of block i as little-endian uint32); only full blocks of block_tokens tokens are keyed",
	}
}

// TestGolden pins keys: they must be identical across processes, machines,
// languages, Go versions and restarts, or every cached block silently
// misses. Each vector is recomputed from its own inputs as read from the
// file (as another client would), and the inputs must be this test's.
func TestGolden(t *testing.T) {
	path := filepath.Join("testdata", "golden.json")
	if *update {
		f := goldenHeader()
		f.Vectors = goldenInputs()
		for i := range f.Vectors {
			f.Vectors[i].compute(t)
		}
		var buf bytes.Buffer
		enc := json.NewEncoder(&buf)
		enc.SetEscapeHTML(false)
		enc.SetIndent("", "  ")
		if err := enc.Encode(f); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, buf.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var f goldenFile
	if err := json.Unmarshal(b, &f); err != nil {
		t.Fatal(err)
	}
	if f.KeyVersion != KeyVersion {
		t.Fatalf("golden file is key version %d, this build is %d", f.KeyVersion, KeyVersion)
	}
	if want := goldenHeader(); f.Encoding != want.Encoding || f.Root != want.Root || f.Digest != want.Digest || f.BlockKey != want.BlockKey {
		t.Error("golden file's description of the scheme differs from the test's: regenerate with -update if the format changed on purpose")
	}
	inputs := goldenInputs()
	if len(f.Vectors) != len(inputs) {
		t.Fatalf("golden file has %d vectors, test has %d", len(f.Vectors), len(inputs))
	}
	for i, w := range f.Vectors {
		if w.Name != inputs[i].Name || w.Namespace != inputs[i].Namespace || !reflect.DeepEqual(w.Tokens, inputs[i].Tokens) {
			t.Errorf("vector %d (%s): inputs differ from the test's", i, w.Name)
		}
		got := w
		got.compute(t)
		if got.Encoding != w.Encoding {
			t.Errorf("%s: encoding %s, golden %s: the namespace encoding changed", w.Name, got.Encoding, w.Encoding)
		}
		if got.Root != w.Root || got.Digest != w.Digest {
			t.Errorf("%s: root/digest = %s/%s, golden %s/%s: the namespace hash changed", w.Name, got.Root, got.Digest, w.Root, w.Digest)
		}
		if len(got.Keys) != len(w.Keys) || len(w.Keys) != len(w.Tokens)/w.Namespace.BlockTokens {
			t.Errorf("%s: %d keys, golden %d, for %d tokens", w.Name, len(got.Keys), len(w.Keys), len(w.Tokens))
			continue
		}
		for j := range w.Keys {
			if got.Keys[j] != w.Keys[j] {
				t.Errorf("%s: key %d = %s, golden %s: the key format changed", w.Name, j, got.Keys[j], w.Keys[j])
			}
		}
	}
}
