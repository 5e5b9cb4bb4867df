package prefixhash

import (
	"encoding/json"
	"errors"
	"flag"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"

	"github.com/cespare/xxhash/v2"
)

var update = flag.Bool("update", false, "rewrite testdata/golden.json (only when the key format changes on purpose)")

func testNS() Namespace {
	return Namespace{Model: "kvmesh/test", DType: Float32, BlockTokens: 16, LayerStart: 0, LayerEnd: 2,
		KVHeads: 4, HeadDim: 64, TPSize: 1}
}

// seqTokens returns n deterministic tokens that do not depend on any RNG
// implementation, so the golden file stays valid across Go versions.
func seqTokens(n int, mul uint32) []uint32 {
	t := make([]uint32, n)
	for i := range t {
		t[i] = (uint32(i)*mul + 17) % 128256
	}
	return t
}

type goldenCase struct {
	Name      string    `json:"name"`
	NS        Namespace `json:"namespace"`
	NumTokens int       `json:"num_tokens"`
	Mul       uint32    `json:"mul"`
	Digest    uint64    `json:"digest"`
	Root      string    `json:"root"`
	Keys      []string  `json:"keys"`
}

func goldenCases() []goldenCase {
	base := testNS()
	salted := base
	salted.TenantSalt = "tenant-a"
	tp := base
	tp.TPRank, tp.TPSize = 1, 2
	bf := base
	bf.DType, bf.BlockTokens = BFloat16, 512
	return []goldenCase{
		{Name: "base", NS: base, NumTokens: 64, Mul: 7919},
		{Name: "base-partial-tail", NS: base, NumTokens: 70, Mul: 7919},
		{Name: "salted", NS: salted, NumTokens: 64, Mul: 7919},
		{Name: "tp-rank-1", NS: tp, NumTokens: 64, Mul: 7919},
		{Name: "bf16-b512", NS: bf, NumTokens: 1536, Mul: 104729},
		{Name: "empty", NS: base, NumTokens: 0, Mul: 1},
	}
}

func (c *goldenCase) compute() {
	c.Digest = c.NS.Digest()
	c.Root = c.NS.Root().String()
	c.Keys = nil
	for _, k := range Keys(c.NS, seqTokens(c.NumTokens, c.Mul)) {
		c.Keys = append(c.Keys, k.String())
	}
}

// TestGolden pins keys: they must be identical across processes, machines,
// Go versions and restarts, or every cached block silently misses.
func TestGolden(t *testing.T) {
	path := filepath.Join("testdata", "golden.json")
	cases := goldenCases()
	for i := range cases {
		cases[i].compute()
	}
	if *update {
		b, err := json.MarshalIndent(cases, "", "  ")
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, append(b, '\n'), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var want []goldenCase
	if err := json.Unmarshal(b, &want); err != nil {
		t.Fatal(err)
	}
	if len(want) != len(cases) {
		t.Fatalf("golden file has %d cases, test has %d", len(want), len(cases))
	}
	for i, w := range want {
		got := cases[i]
		if got.Digest != w.Digest || got.Root != w.Root {
			t.Errorf("%s: digest/root = %x/%s, golden %x/%s: the namespace encoding changed", w.Name, got.Digest, got.Root, w.Digest, w.Root)
		}
		if len(got.Keys) != len(w.Keys) {
			t.Errorf("%s: %d keys, golden %d", w.Name, len(got.Keys), len(w.Keys))
			continue
		}
		for j := range w.Keys {
			if got.Keys[j] != w.Keys[j] {
				t.Errorf("%s: key %d = %s, golden %s: the key format changed", w.Name, j, got.Keys[j], w.Keys[j])
			}
		}
	}
}

func TestNamespacesNeverShareKeys(t *testing.T) {
	base := testNS()
	variants := map[string]func(*Namespace){
		"model":  func(n *Namespace) { n.Model = "kvmesh/other" },
		"dtype":  func(n *Namespace) { n.DType = Float16 },
		"block":  func(n *Namespace) { n.BlockTokens = 32 },
		"layers": func(n *Namespace) { n.LayerStart, n.LayerEnd = 1, 2 },
		"heads":  func(n *Namespace) { n.KVHeads = 8 },
		"dim":    func(n *Namespace) { n.HeadDim = 128 },
		"rank":   func(n *Namespace) { n.TPRank, n.TPSize = 1, 2 },
		"size":   func(n *Namespace) { n.TPSize = 2 },
		"salt":   func(n *Namespace) { n.TenantSalt = "x" },
		// Length prefixes keep a model/salt boundary from being ambiguous.
		"boundary": func(n *Namespace) { n.Model, n.TenantSalt = "kvmesh/tes", "t" },
	}
	toks := seqTokens(64, 31)
	baseKeys := Keys(base, toks)
	for name, mut := range variants {
		ns := base
		mut(&ns)
		if err := ns.Validate(); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if ns.Digest() == base.Digest() || ns.Root() == base.Root() {
			t.Errorf("%s: same digest or root as the base namespace", name)
		}
		keys := Keys(ns, toks)
		for i := range min(len(keys), len(baseKeys)) {
			if keys[i] == baseKeys[i] {
				t.Errorf("%s: block %d shares a key with the base namespace", name, i)
			}
		}
	}
	// TPSize 0 means 1.
	one := base
	one.TPSize = 0
	if one.Root() != base.Root() {
		t.Error("TPSize 0 and 1 give different roots")
	}
}

func TestValidate(t *testing.T) {
	tests := []struct {
		name  string
		mut   func(*Namespace)
		field string
	}{
		{"ok", func(*Namespace) {}, ""},
		{"no model", func(n *Namespace) { n.Model = "" }, "model"},
		{"long model", func(n *Namespace) { n.Model = string(make([]byte, MaxModelLen+1)) }, "model"},
		{"no dtype", func(n *Namespace) { n.DType = 0 }, "dtype"},
		{"bad dtype", func(n *Namespace) { n.DType = 200 }, "dtype"},
		{"zero block", func(n *Namespace) { n.BlockTokens = 0 }, "block_tokens"},
		{"huge block", func(n *Namespace) { n.BlockTokens = MaxBlockTokens + 1 }, "block_tokens"},
		{"empty layers", func(n *Namespace) { n.LayerStart, n.LayerEnd = 3, 3 }, "layers"},
		{"kv heads", func(n *Namespace) { n.KVHeads = 0 }, "kv_heads"},
		{"head dim", func(n *Namespace) { n.HeadDim = -1 }, "head_dim"},
		{"tp rank", func(n *Namespace) { n.TPRank, n.TPSize = 2, 2 }, "tp"},
		{"long salt", func(n *Namespace) { n.TenantSalt = string(make([]byte, MaxSaltLen+1)) }, "tenant_salt"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ns := testNS()
			tt.mut(&ns)
			err := ns.Validate()
			if tt.field == "" {
				if err != nil {
					t.Fatalf("unexpected error: %v", err)
				}
				return
			}
			if !errors.Is(err, ErrInvalidNamespace) {
				t.Fatalf("err = %v, want ErrInvalidNamespace", err)
			}
			if got := err.Error(); !contains(got, tt.field) {
				t.Fatalf("error %q does not name field %q", got, tt.field)
			}
		})
	}
}

func contains(s, sub string) bool {
	for i := 0; i+len(sub) <= len(s); i++ {
		if s[i:i+len(sub)] == sub {
			return true
		}
	}
	return false
}

// TestChainMatchesKeys checks that extending a chain in arbitrary pieces
// yields the same keys as hashing the whole prompt at once.
func TestChainMatchesKeys(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	ns := testNS()
	for iter := range 200 {
		toks := seqTokens(rng.IntN(400), uint32(iter+3))
		want := Keys(ns, toks)
		c := NewChain(ns)
		added := 0
		for rest := toks; len(rest) > 0; {
			n := min(len(rest), rng.IntN(40))
			added += c.Extend(rest[:n])
			rest = rest[n:]
		}
		if added != len(want) || c.Len() != len(want) || c.Tokens() != len(toks) {
			t.Fatalf("iter %d: added %d, len %d, tokens %d; want %d blocks of %d tokens", iter, added, c.Len(), c.Tokens(), len(want), len(toks))
		}
		for i, k := range c.Keys() {
			if k != want[i] {
				t.Fatalf("iter %d: block %d key differs", iter, i)
			}
			if c.Parent(i+1) != k {
				t.Fatalf("iter %d: Parent(%d) is not key %d", iter, i+1, i)
			}
			if BlockKey(c.Parent(i), toks[i*ns.BlockTokens:(i+1)*ns.BlockTokens]) != k {
				t.Fatalf("iter %d: block %d is not H(parent ‖ tokens)", iter, i)
			}
		}
	}
}

func TestPrefixSensitivity(t *testing.T) {
	ns := testNS()
	a := seqTokens(64, 7)
	b := append([]uint32(nil), a...)
	b[20]++ // block 1
	ka, kb := Keys(ns, a), Keys(ns, b)
	if ka[0] != kb[0] {
		t.Error("block 0 should not depend on later tokens")
	}
	for i := 1; i < len(ka); i++ {
		if ka[i] == kb[i] {
			t.Errorf("block %d: a changed token in block 1 must change every later key", i)
		}
	}
}

func TestParseKey(t *testing.T) {
	k := Keys(testNS(), seqTokens(16, 3))[0]
	got, err := ParseKey(k.String())
	if err != nil || got != k {
		t.Fatalf("ParseKey(String()) = %v, %v", got, err)
	}
	for _, bad := range []string{"", "abc", k.String()[:31] + "g", k.String() + "00"} {
		if _, err := ParseKey(bad); err == nil {
			t.Errorf("ParseKey(%q) accepted", bad)
		}
	}
	if makeKey(k.Hi(), k.Lo()) != k {
		t.Error("Hi/Lo do not round-trip")
	}
}

func TestDType(t *testing.T) {
	for d := Float32; d <= Int8; d++ {
		got, err := ParseDType(d.String())
		if err != nil || got != d || d.Size() == 0 {
			t.Errorf("dtype %d: parse %v %v size %d", d, got, err, d.Size())
		}
	}
	if _, err := ParseDType("float64"); err == nil {
		t.Error("ParseDType accepted float64")
	}
	ns := testNS()
	if got, want := ns.BlockBytes(), 2*2*16*4*64*4; got != want {
		t.Errorf("BlockBytes = %d, want %d", got, want)
	}
}

func TestChunks(t *testing.T) {
	keys := Keys(testNS(), seqTokens(16*10, 5))
	c := ChunkBlocks(16, 64) // 4 blocks per chunk
	if c != 4 {
		t.Fatalf("ChunkBlocks = %d", c)
	}
	if ChunkBlocks(512, 0) != 1 || ChunkBlocks(1024, 512) != 1 || ChunkBlocks(16, 0) != 32 {
		t.Error("ChunkBlocks defaults")
	}
	chunks := Chunks(keys, c)
	if len(chunks) != 3 || chunks[2].Start != 8 || chunks[2].End != 10 {
		t.Fatalf("chunks = %+v", chunks)
	}
	for _, ch := range chunks {
		for i := ch.Start; i < ch.End; i++ {
			if ChunkKey(keys, i, c) != ch.Key || ch.Key != keys[ch.Start] {
				t.Fatalf("block %d not placed by its chunk's first key", i)
			}
		}
	}
}

func BenchmarkHash(b *testing.B) {
	for _, bt := range []int{16, 256, 512} {
		b.Run("block_tokens="+itoa(bt), func(b *testing.B) {
			ns := testNS()
			ns.BlockTokens = bt
			toks := seqTokens(128*1024, 7919) // a 128k-token prompt
			root := ns.Root()
			dst := make([]Key, 0, len(toks)/bt)
			b.SetBytes(int64(4 * len(toks)))
			b.ReportAllocs()
			for b.Loop() {
				dst = AppendKeys(dst[:0], root, bt, toks)
			}
		})
	}
}

func itoa(n int) string {
	b, _ := json.Marshal(n)
	return string(b)
}

func TestSum2MatchesXXHash(t *testing.T) {
	var pre Key
	for i := range pre {
		pre[i] = byte(3*i + 1)
	}
	for n := 16; n < 700; n++ {
		b := make([]byte, n)
		for i := range b {
			b[i] = byte(i*131 + n)
		}
		hi, lo := sum2(&pre, b)
		dh, dl := xxhash.NewWithSeed(seedHi), xxhash.NewWithSeed(seedLo)
		dh.Write(pre[:])
		dh.Write(b)
		dl.Write(pre[:])
		dl.Write(b)
		if hi != dh.Sum64() || lo != dl.Sum64() {
			t.Fatalf("len %d: fused digests differ from xxhash", n)
		}
	}
}

// BenchmarkXXHashSinglePass is the reference for BenchmarkHash: one xxhash64
// pass over the same bytes, measured in the same run. Two digests cannot be
// cheaper than one pass; the fused hash aims at about 0.6x of it.
func BenchmarkXXHashSinglePass(b *testing.B) {
	buf := tokenBytes(seqTokens(128*1024, 7919))
	b.SetBytes(int64(len(buf)))
	var sink uint64
	for b.Loop() {
		sink += xxhash.Sum64(buf)
	}
	_ = sink
}

// TestAppendKeysMatchesBlockKey: AppendKeys' chained fast paths (the
// parent in registers, the unrolled 16-token block) give the keys of the
// plain BlockKey chain at every block size around them.
func TestAppendKeysMatchesBlockKey(t *testing.T) {
	toks := seqTokens(40*33, 104729)
	root := testNS().Root()
	for _, bt := range []int{1, 3, 4, 5, 15, 16, 17, 32, 33} {
		got := AppendKeys(nil, root, bt, toks)
		parent := root
		for i := range len(toks) / bt {
			parent = BlockKey(parent, toks[i*bt:(i+1)*bt])
			if got[i] != parent {
				t.Fatalf("block_tokens %d: key %d = %s, BlockKey chain %s", bt, i, got[i], parent)
			}
		}
		if len(got) != len(toks)/bt {
			t.Fatalf("block_tokens %d: %d keys, want %d", bt, len(got), len(toks)/bt)
		}
	}
}
