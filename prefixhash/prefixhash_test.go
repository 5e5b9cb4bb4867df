package prefixhash

import (
	"crypto/sha256"
	"encoding/json"
	"errors"
	"math/rand/v2"
	"testing"
)

func testNS() Namespace {
	return Namespace{Model: "kvmesh/test", DType: Float32, BlockTokens: 16, Layers: 2,
		KVHeads: 4, HeadDim: 64}
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

func TestNamespacesNeverShareKeys(t *testing.T) {
	base := testNS()
	variants := map[string]func(*Namespace){
		"model":  func(n *Namespace) { n.Model = "kvmesh/other" },
		"dtype":  func(n *Namespace) { n.DType = Float16 },
		"block":  func(n *Namespace) { n.BlockTokens = 32 },
		"layers": func(n *Namespace) { n.Layers = 3 },
		"heads":  func(n *Namespace) { n.KVHeads = 8 },
		"dim":    func(n *Namespace) { n.HeadDim = 128 },
		"salt":   func(n *Namespace) { n.TenantSalt = "x" },
		"latent": func(n *Namespace) { n.Layout, n.LatentDim, n.KVHeads, n.HeadDim = LatentKV, 256, 0, 0 },
		"lora":   func(n *Namespace) { n.LoRA = "adapter" },
		"scales": func(n *Namespace) { n.DType, n.Scales = Int8, ScalesPerBlock },
		"vllm":   func(n *Namespace) { n.Scheme, n.HashSeed = SchemeVLLM, "0" },
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
		{"no layers", func(n *Namespace) { n.Layers = 0 }, "layers"},
		{"too many layers", func(n *Namespace) { n.Layers = MaxLayers + 1 }, "layers"},
		{"kv heads", func(n *Namespace) { n.KVHeads = 0 }, "kv_heads"},
		{"head dim", func(n *Namespace) { n.HeadDim = -1 }, "head_dim"},
		{"long salt", func(n *Namespace) { n.TenantSalt = string(make([]byte, MaxSaltLen+1)) }, "tenant_salt"},
	}
	latent := func(n *Namespace) { n.Layout, n.LatentDim, n.KVHeads, n.HeadDim = LatentKV, 576, 0, 0 }
	tests = append(tests, []struct {
		name  string
		mut   func(*Namespace)
		field string
	}{
		{"latent ok", latent, ""},
		{"unknown layout", func(n *Namespace) { n.Layout = 2 }, "kv_layout"},
		{"latent without dim", func(n *Namespace) { latent(n); n.LatentDim = 0 }, "latent_dim"},
		{"latent with heads", func(n *Namespace) { latent(n); n.KVHeads = 1 }, "kv_heads"},
		{"split with latent dim", func(n *Namespace) { n.LatentDim = 8 }, "latent_dim"},
		{"scales ok", func(n *Namespace) { n.DType, n.Scales = Float8E5M2, ScalesPerHead }, ""},
		{"unknown scales", func(n *Namespace) { n.DType, n.Scales = Int8, 3 }, "scales"},
		{"scales on float32", func(n *Namespace) { n.Scales = ScalesPerBlock }, "scales"},
		{"per-head scales latent", func(n *Namespace) { latent(n); n.DType, n.Scales = Int8, ScalesPerHead }, "scales"},
		{"long lora", func(n *Namespace) { n.LoRA = string(make([]byte, MaxLoRALen+1)) }, "lora"},
		{"unknown scheme", func(n *Namespace) { n.Scheme = 2 }, "key_scheme"},
		{"vllm without seed", func(n *Namespace) { n.Scheme = SchemeVLLM }, "hash_seed"},
		{"seed without vllm", func(n *Namespace) { n.HashSeed = "0" }, "hash_seed"},
		{"long seed", func(n *Namespace) { n.Scheme, n.HashSeed = SchemeVLLM, string(make([]byte, MaxSeedLen+1)) }, "hash_seed"},
	}...)
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

// TestPayloadRule: the payload sizes of both layouts, with and without
// scales.
func TestPayloadRule(t *testing.T) {
	kimi := Namespace{Model: "k", DType: BFloat16, BlockTokens: 16, Layers: 61, Layout: LatentKV, LatentDim: 576}
	if got, want := kimi.BlockBytes(), 61*16*576*2; got != want {
		t.Errorf("latent block %d bytes, want %d", got, want)
	}
	kimi.DType, kimi.Scales = Float8E4M3, ScalesPerBlock
	if got, want := kimi.BlockBytes(), 61*16*576+4*61; got != want || kimi.KVBytes() != 61*16*576 {
		t.Errorf("latent fp8 block %d bytes (kv %d), want %d", got, kimi.KVBytes(), want)
	}
	ns := testNS() // 2 layers, 4 heads of 64
	ns.DType, ns.Scales = Int8, ScalesPerHead
	if got, want := ns.BlockBytes(), 2*2*16*4*64+4*2*2*4; got != want || ns.ScaleCount() != 16 {
		t.Errorf("split int8 per-head block %d bytes, want %d", got, want)
	}
	ns.Scales = ScalesPerBlock
	if ns.ScaleCount() != 4 {
		t.Errorf("per-block scales %d, want 4", ns.ScaleCount())
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
	var hl Key
	for i := range 8 {
		hl[i], hl[8+i] = byte(k.Hi()>>(56-8*i)), byte(k.Lo()>>(56-8*i))
	}
	if hl != k {
		t.Error("Hi/Lo are not the key's halves, big-endian")
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

// BenchmarkSHA256SinglePass is the reference for BenchmarkHash: one SHA-256
// pass over the same token bytes, in the same run. Chained keys cannot beat
// it: each 16-token block is an 80-byte message, two SHA-256 compressions
// where the single pass spends one per 64 bytes, so at 16 tokens per block
// the floor is about 0.5x of this pass, approached as B grows.
func BenchmarkSHA256SinglePass(b *testing.B) {
	toks := seqTokens(128*1024, 7919)
	buf := make([]byte, 4*len(toks))
	putTokens(buf, toks)
	b.SetBytes(int64(len(buf)))
	var sink byte
	for b.Loop() {
		s := sha256.Sum256(buf)
		sink += s[0]
	}
	_ = sink
}

// TestAppendKeysMatchesBlockKey: AppendKeys (one pooled hasher for the
// chain) gives the keys of the plain BlockKey chain, and BlockKey is
// trunc128(SHA-256(parent ‖ tokens, little-endian)) at every block size
// around the hasher's buffer.
func TestAppendKeysMatchesBlockKey(t *testing.T) {
	if !prePadOK {
		t.Error("pre-padded hashing is off: the serialised SHA-256 state changed form; hashing works, slower")
	}
	defer func(ok bool) { prePadOK = ok }(prePadOK)
	for _, pre := range []bool{true, false} {
		prePadOK = pre
		appendKeysMatchBlockKey(t)
	}
}

func appendKeysMatchBlockKey(t *testing.T) {
	toks := seqTokens(40*33, 104729)
	root := testNS().Root()
	for _, bt := range []int{1, 2, 3, 4, 5, 10, 11, 12, 13, 14, 15, 16, 17, 20, 21, 27, 28, 29, 32, 33, 256} {
		got := AppendKeys(nil, root, bt, toks)
		parent := root
		for i := range len(toks) / bt {
			block := toks[i*bt : (i+1)*bt]
			msg := append([]byte(nil), parent[:]...)
			for _, t := range block {
				msg = append(msg, byte(t), byte(t>>8), byte(t>>16), byte(t>>24))
			}
			sum := sha256.Sum256(msg)
			if want := Key(sum[:16]); BlockKey(parent, block) != want {
				t.Fatalf("block_tokens %d: BlockKey of block %d is not trunc128(SHA-256(parent ‖ tokens))", bt, i)
			}
			parent = BlockKey(parent, block)
			if got[i] != parent {
				t.Fatalf("block_tokens %d: key %d = %s, BlockKey chain %s", bt, i, got[i], parent)
			}
		}
		if len(got) != len(toks)/bt {
			t.Fatalf("block_tokens %d: %d keys, want %d", bt, len(got), len(toks)/bt)
		}
	}
}

// TestNoAllocsPerBlock: hashing a prompt allocates nothing but the keys.
func TestNoAllocsPerBlock(t *testing.T) {
	if raceEnabled {
		t.Skip("sync.Pool drops items under -race")
	}
	toks := seqTokens(16*1024, 7919)
	root := testNS().Root()
	dst := make([]Key, 0, 1024)
	if n := testing.AllocsPerRun(20, func() { dst = AppendKeys(dst[:0], root, 16, toks) }); n != 0 {
		t.Errorf("AppendKeys of 1024 blocks: %v allocations", n)
	}
	if n := testing.AllocsPerRun(20, func() { _ = BlockKey(root, toks[:16]) }); n != 0 {
		t.Errorf("BlockKey: %v allocations", n)
	}
}
