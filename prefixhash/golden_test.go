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
	// ExtraKeys[i] are block i's extra keys, hex (absent: none).
	ExtraKeys [][]string `json:"extra_keys,omitempty"`
	Encoding  string     `json:"encoding"` // hex
	Root      string     `json:"root"`
	Digest    string     `json:"digest"`
	Keys      []string   `json:"keys"`
}

type goldenNamespace struct {
	Model       string `json:"model"`
	DType       string `json:"dtype"`
	DTypeID     uint8  `json:"dtype_id"`
	BlockTokens int    `json:"block_tokens"`
	Layers      int    `json:"layers"`
	KVHeads     int    `json:"kv_heads"`
	HeadDim     int    `json:"head_dim"`
	TenantSalt  string `json:"tenant_salt"`
	// Optional fields, absent at their defaults.
	Layout    string `json:"kv_layout,omitempty"`
	LatentDim int    `json:"latent_dim,omitempty"`
	Scales    string `json:"scales,omitempty"`
	LoRA      string `json:"lora,omitempty"`
	Scheme    string `json:"key_scheme,omitempty"`
	HashSeed  string `json:"hash_seed,omitempty"`
	ExtraRoom int    `json:"extra_key_bytes,omitempty"`
}

func (g goldenNamespace) namespace(t *testing.T) Namespace {
	d, err := ParseDType(g.DType)
	if err != nil || uint8(d) != g.DTypeID {
		t.Fatalf("golden dtype %q/%d: %v", g.DType, g.DTypeID, err)
	}
	ns := Namespace{Model: g.Model, DType: d, BlockTokens: g.BlockTokens, Layers: g.Layers,
		KVHeads: g.KVHeads, HeadDim: g.HeadDim, TenantSalt: g.TenantSalt,
		LatentDim: g.LatentDim, LoRA: g.LoRA, HashSeed: g.HashSeed, ExtraKeyBytes: g.ExtraRoom}
	var errs [3]error
	if g.Layout != "" {
		ns.Layout, errs[0] = ParseKVLayout(g.Layout)
	}
	if g.Scales != "" {
		ns.Scales, errs[1] = ParseScales(g.Scales)
	}
	if g.Scheme != "" {
		ns.Scheme, errs[2] = ParseKeyScheme(g.Scheme)
	}
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	return ns
}

func optName[T interface {
	comparable
	String() string
}](v T) string {
	var zero T
	if v == zero {
		return ""
	}
	return v.String()
}

func goldenNS(ns Namespace) goldenNamespace {
	return goldenNamespace{Model: ns.Model, DType: ns.DType.String(), DTypeID: uint8(ns.DType), BlockTokens: ns.BlockTokens,
		Layers: ns.Layers, KVHeads: ns.KVHeads, HeadDim: ns.HeadDim, TenantSalt: ns.TenantSalt,
		Layout: optName(ns.Layout), LatentDim: ns.LatentDim, Scales: optName(ns.Scales), LoRA: ns.LoRA,
		Scheme: optName(ns.Scheme), HashSeed: ns.HashSeed, ExtraRoom: ns.ExtraKeyBytes}
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
	llama := Namespace{Model: "meta-llama/Llama-3.1-8B", DType: BFloat16, BlockTokens: 16, Layers: 32,
		KVHeads: 8, HeadDim: 128}
	salted := llama
	salted.TenantSalt = "tenant-a"
	qwen := Namespace{Model: "Qwen/Qwen2.5-0.5B-Instruct", DType: Float32, BlockTokens: 1, Layers: 24,
		KVHeads: 2, HeadDim: 64, TenantSalt: "t"}
	mistral := Namespace{Model: "mistralai/Mistral-7B-v0.3", DType: Float8E4M3, BlockTokens: 3, Layers: 8,
		KVHeads: 8, HeadDim: 128, TenantSalt: "tenant/ü-ß-☃"}
	deepseek := Namespace{Model: "deepseek-ai/DeepSeek-V3", DType: Int8, BlockTokens: 256, Layers: 61,
		KVHeads: 1, HeadDim: 576}
	fp16 := Namespace{Model: "kvmesh/test", DType: Float16, BlockTokens: 16, Layers: 1,
		KVHeads: 4, HeadDim: 64}
	e5m2 := Namespace{Model: "kvmesh/tes", DType: Float8E5M2, BlockTokens: 16, Layers: 2,
		KVHeads: 4, HeadDim: 64, TenantSalt: "t"}
	v := func(name string, ns Namespace, tokens []uint32) goldenVector {
		return goldenVector{Name: name, Namespace: goldenNS(ns), Tokens: tokens}
	}
	kimi := Namespace{Model: "moonshotai/Kimi-K2.5", DType: BFloat16, BlockTokens: 16, Layers: 61,
		Layout: LatentKV, LatentDim: 576}
	kimiFP8 := kimi
	kimiFP8.DType, kimiFP8.Scales, kimiFP8.LoRA = Float8E4M3, ScalesPerBlock, "kimi-sql-lora"
	llamaInt8 := llama
	llamaInt8.DType, llamaInt8.Scales, llamaInt8.LoRA = Int8, ScalesPerHead, "adapter/ü"
	vllmNS := llama
	vllmNS.Scheme, vllmNS.HashSeed = SchemeVLLM, "0"
	vllmLoRA := vllmNS
	vllmLoRA.LoRA, vllmLoRA.TenantSalt, vllmLoRA.ExtraKeyBytes = "sql-adapter", "tenant-a", 128
	llamaXK := llama
	llamaXK.ExtraKeyBytes = 64
	withExtra := func(g goldenVector, extra ...[]string) goldenVector {
		g.ExtraKeys = extra
		return g
	}
	mm := func(id string, off int) string { return hex.EncodeToString(VLLMMultimodalKey(id, off)) }
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
		v("kimi-bf16-b16-latent576", kimi, goldenTokens(40, 7)),
		v("kimi-fp8-b16-latent576-scales-block-lora", kimiFP8, goldenTokens(40, 7)),
		v("llama-int8-b16-scales-head-lora", llamaInt8, goldenTokens(33, 8)),
		withExtra(v("llama-bf16-b16-extra-keys", llamaXK, goldenTokens(64, 9)),
			nil, []string{"696d6167652d61", "0500000000000000"}, []string{}, []string{""}),
		v("vllm-bf16-b16-seed0", vllmNS, goldenTokens(40, 10)),
		withExtra(v("vllm-bf16-b16-lora-salt-mm", vllmLoRA, goldenTokens(48, 11)),
			[]string{mm("img-1", 5)}, []string{mm("img-1", -11), hex.EncodeToString(VLLMBytes([]byte{1, 2, 3}))}),
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
	extra := make([]ExtraKeys, len(g.ExtraKeys))
	for i, ks := range g.ExtraKeys {
		for _, k := range ks {
			b, err := hex.DecodeString(k)
			if err != nil {
				t.Fatalf("%s: extra key %q: %v", g.Name, k, err)
			}
			extra[i] = append(extra[i], b)
		}
	}
	keys, err := KeysExtra(ns, g.Tokens, extra)
	if err != nil {
		t.Fatalf("%s: %v", g.Name, err)
	}
	g.Keys = []string{}
	for _, k := range keys {
		g.Keys = append(g.Keys, k.String())
	}
}

func goldenHeader() goldenFile {
	return goldenFile{
		Comment: "kvmesh block-key golden vectors, generated by `go test ./prefixhash -run TestGolden -update`. " +
			"Every implementation of kvmesh keys must reproduce encoding, root, digest and keys from each vector's namespace and tokens.",
		KeyVersion: KeyVersion,
		Encoding: "string(magic \"kvmesh/ns/v3\") ‖ string(model) ‖ u8 dtype_id ‖ u32 block_tokens ‖ u32 layers ‖ " +
			"u32 kv_heads ‖ u32 head_dim ‖ string(tenant_salt), then only when set, in this order: " +
			"u8 1 ‖ u8 kv_layout (split 0, latent 1) ‖ u32 latent_dim; u8 2 ‖ string(lora); u8 3 ‖ u8 scales (none 0, block 1, head 2); " +
			"u8 4 ‖ u8 key_scheme (kvmesh 0, vllm 1) ‖ string(hash_seed); u8 5 ‖ u32 extra_key_bytes; " +
			"integers little-endian, string(s) = u32 little-endian byte length ‖ UTF-8 bytes",
		Root: "key_scheme kvmesh: k_0 = first 16 bytes of SHA-256(encoding); key_scheme vllm: first 16 bytes of " +
			"h_root = SHA-256(CBOR text string(hash_seed)); 32 lowercase hex digits",
		Digest: "uint64 read little-endian from the first 8 bytes of SHA-256(encoding), as 16 lowercase hex digits of that integer",
		BlockKey: "key_scheme kvmesh: k_i = first 16 bytes of SHA-256(k_{i-1} ‖ tokens of block i as little-endian uint32), " +
			"followed, when block i has extra keys, by u32 count ‖ (u32 length ‖ bytes) per extra key; " +
			"key_scheme vllm: h_i = SHA-256(canonical CBOR [bytes h_{i-1} (32), [uint tokens], null or [extra items]]), " +
			"k_i its first 16 bytes, extra items = CBOR text(lora) if set, then the block's extra keys that are not byte strings, " +
			"then CBOR text(tenant_salt) for block 0 if set, then the block's byte-string extra keys; " +
			"only full blocks of block_tokens tokens are keyed",
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
		writeJSON(t, path, f)
	}
	var f goldenFile
	readJSON(t, path, &f)
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
		if w.Name != inputs[i].Name || w.Namespace != inputs[i].Namespace || !reflect.DeepEqual(w.Tokens, inputs[i].Tokens) ||
			!reflect.DeepEqual(w.ExtraKeys, inputs[i].ExtraKeys) {
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

// writeJSON writes v to path as indented JSON: a golden file regenerated
// with -update.
func writeJSON(t *testing.T, path string, v any) {
	t.Helper()
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	enc.SetIndent("", "  ")
	if err := enc.Encode(v); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
}

// readJSON reads the golden file at path into v.
func readJSON(t *testing.T, path string, v any) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, v); err != nil {
		t.Fatal(err)
	}
}
