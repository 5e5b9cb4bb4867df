package prefixhash

import (
	"encoding/hex"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"testing"
)

// vllmFile is testdata/vllm.json, written by testdata/vllm_vectors.py from
// vLLM's own definition of its block hash (cbor2, as vLLM uses it), not
// from this package.
type vllmFile struct {
	Vectors []struct {
		Name        string   `json:"name"`
		HashSeed    string   `json:"hash_seed"`
		BlockTokens int      `json:"block_tokens"`
		Tokens      []uint32 `json:"tokens"`
		LoRA        string   `json:"lora"`
		CacheSalt   string   `json:"cache_salt"`
		MM          [][]any  `json:"mm"` // [identifier, offset, length]
		Embeds      []string `json:"embeds"`
		NoneHash    string   `json:"none_hash"`
		Hashes      []string `json:"hashes"`
	} `json:"vectors"`
}

// TestVLLMVectors: a SchemeVLLM namespace reproduces vLLM's block hashes
// (keys are their first 16 bytes; Chain.Last their whole 32 bytes) with the
// LoRA name, multimodal keys, cache salt and prompt-embedding hashes in
// vLLM's order.
func TestVLLMVectors(t *testing.T) {
	b, err := os.ReadFile(filepath.Join("testdata", "vllm.json"))
	if err != nil {
		t.Fatal(err)
	}
	var f vllmFile
	if err := json.Unmarshal(b, &f); err != nil {
		t.Fatal(err)
	}
	if len(f.Vectors) < 10 {
		t.Fatalf("%d vectors", len(f.Vectors))
	}
	for _, v := range f.Vectors {
		ns := Namespace{Model: "m", DType: BFloat16, BlockTokens: v.BlockTokens, Layers: 1, KVHeads: 1, HeadDim: 8,
			Scheme: SchemeVLLM, HashSeed: v.HashSeed, LoRA: v.LoRA, TenantSalt: v.CacheSalt, ExtraKeyBytes: 256}
		if err := ns.Validate(); err != nil {
			t.Fatalf("%s: %v", v.Name, err)
		}
		if got := ns.RootLink().String(); got != v.NoneHash {
			t.Errorf("%s: NONE_HASH %s, vLLM %s", v.Name, got, v.NoneHash)
		}
		nb := len(v.Tokens) / v.BlockTokens
		extra := make([]ExtraKeys, nb)
		for i := range nb {
			start, end := i*v.BlockTokens, (i+1)*v.BlockTokens
			for _, m := range v.MM {
				id, off, n := m[0].(string), int(m[1].(float64)), int(m[2].(float64))
				if end > off && start < off+n {
					extra[i] = append(extra[i], VLLMMultimodalKey(id, off-start))
				}
			}
			if i < len(v.Embeds) {
				e, _ := hex.DecodeString(v.Embeds[i])
				extra[i] = append(extra[i], VLLMBytes(e))
			}
		}
		keys, err := KeysExtra(ns, v.Tokens, extra)
		if err != nil {
			t.Fatalf("%s: %v", v.Name, err)
		}
		if len(keys) != len(v.Hashes) {
			t.Fatalf("%s: %d keys, vLLM %d hashes", v.Name, len(keys), len(v.Hashes))
		}
		link := ns.RootLink()
		for i, h := range v.Hashes {
			if got := keys[i].String(); got != h[:2*KeySize] {
				t.Errorf("%s: block %d key %s, vLLM hash %s", v.Name, i, got, h)
			}
			link = BlockLink(SchemeVLLM, link, v.Tokens[i*v.BlockTokens:(i+1)*v.BlockTokens], ns.BlockExtra(i == 0, extra[i]))
			if got := link.String(); got != h {
				t.Errorf("%s: block %d link %s, vLLM %s", v.Name, i, got, h)
			}
		}
		if len(v.MM) == 0 && len(v.Embeds) == 0 {
			// Keys and a Chain fed in pieces agree with vLLM too.
			if got := Keys(ns, v.Tokens); !equalKeys(got, keys) {
				t.Errorf("%s: Keys differs from KeysExtra", v.Name)
			}
			c := NewChain(ns)
			for i := 0; i < len(v.Tokens); i += 5 {
				c.Extend(v.Tokens[i:min(i+5, len(v.Tokens))])
			}
			if !equalKeys(c.Keys(), keys) || (nb > 0 && c.Last().String() != v.Hashes[nb-1]) {
				t.Errorf("%s: a chain fed 5 tokens at a time differs from vLLM", v.Name)
			}
		}
	}
}

func equalKeys(a, b []Key) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func TestExtraKeysSeparateBlocks(t *testing.T) {
	for _, scheme := range []KeyScheme{SchemeKVMesh, SchemeVLLM} {
		ns := testNS()
		ns.ExtraKeyBytes = 256
		if scheme == SchemeVLLM {
			ns.Scheme, ns.HashSeed = SchemeVLLM, "0"
		}
		toks := seqTokens(64, 31) // 4 blocks
		plain := Keys(ns, toks)
		img := func(id string) ExtraKeys { return ExtraKeys{VLLMMultimodalKey(id, 3)} }
		a, err := KeysExtra(ns, toks, []ExtraKeys{nil, img("image-a")})
		if err != nil {
			t.Fatal(err)
		}
		b, _ := KeysExtra(ns, toks, []ExtraKeys{nil, img("image-b")})
		a2, _ := KeysExtra(ns, toks, []ExtraKeys{nil, img("image-a")})
		empty, _ := KeysExtra(ns, toks, []ExtraKeys{{}, {}, nil})
		switch {
		case a[0] != plain[0] || b[0] != plain[0]:
			t.Errorf("%s: extra keys of block 1 changed block 0's key", scheme)
		case !equalKeys(a, a2):
			t.Errorf("%s: equal extra keys give different keys", scheme)
		case !equalKeys(empty, plain):
			t.Errorf("%s: empty extra keys differ from none", scheme)
		}
		for i := 1; i < 4; i++ {
			if a[i] == b[i] || a[i] == plain[i] || b[i] == plain[i] {
				t.Errorf("%s: block %d: equal tokens with different extra keys share a key", scheme, i)
			}
		}
		// The boundary between extra keys is part of the key.
		if scheme == SchemeKVMesh {
			x, _ := KeysExtra(ns, toks, []ExtraKeys{{[]byte("ab"), []byte("c")}})
			y, _ := KeysExtra(ns, toks, []ExtraKeys{{[]byte("a"), []byte("bc")}})
			z, _ := KeysExtra(ns, toks, []ExtraKeys{{[]byte("abc")}})
			if x[0] == y[0] || x[0] == z[0] || y[0] == z[0] {
				t.Error("extra keys with the same concatenation share a key")
			}
		}
	}
}

func TestLoRASeparatesNamespaces(t *testing.T) {
	for _, scheme := range []KeyScheme{SchemeKVMesh, SchemeVLLM} {
		ns := testNS()
		if scheme == SchemeVLLM {
			ns.Scheme, ns.HashSeed = SchemeVLLM, "0"
		}
		l := ns
		l.LoRA = "adapter-1"
		toks := seqTokens(48, 7)
		base, lora := Keys(ns, toks), Keys(l, toks)
		for i := range base {
			if base[i] == lora[i] {
				t.Errorf("%s: block %d: a LoRA adapter shares a key with the base model", scheme, i)
			}
		}
		if ns.Digest() == l.Digest() {
			t.Errorf("%s: LoRA does not change the digest", scheme)
		}
	}
}

func TestExtraKeysRefused(t *testing.T) {
	ns := testNS()
	ns.ExtraKeyBytes = MaxExtraRoom
	toks := seqTokens(32, 3)
	vns := ns
	vns.Scheme, vns.HashSeed = SchemeVLLM, "0"
	small := ns
	small.ExtraKeyBytes = 8
	big := make(ExtraKeys, MaxExtraKeys+1)
	tests := map[string]struct {
		ns    Namespace
		extra []ExtraKeys
	}{
		"more blocks than the prompt": {ns, []ExtraKeys{nil, nil, {[]byte("x")}}},
		"no room in the namespace":    {testNS(), []ExtraKeys{{[]byte("x")}}},
		"over the namespace's room":   {small, []ExtraKeys{{[]byte("12345")}}},
		"too many keys":               {ns, []ExtraKeys{big}},
		"too many bytes":              {ns, []ExtraKeys{{make([]byte, MaxExtraBytes+1)}}},
		"vllm: not cbor":              {vns, []ExtraKeys{{[]byte("raw")}}},
		"vllm: two items":             {vns, []ExtraKeys{{append(VLLMText("a"), VLLMText("b")...)}}},
		"vllm: truncated":             {vns, []ExtraKeys{{VLLMText("abc")[:2]}}},
		"vllm: long head":             {vns, []ExtraKeys{{{0x18, 0x05}}}},
		"vllm: map":                   {vns, []ExtraKeys{{{0xa0}}}},
		"vllm: float":                 {vns, []ExtraKeys{{{0xf9, 0, 0}}}},
		"vllm: indefinite array":      {vns, []ExtraKeys{{{0x9f, 0xff}}}},
		"vllm: bad utf-8":             {vns, []ExtraKeys{{{0x61, 0xff}}}},
	}
	for name, tc := range tests {
		if _, err := KeysExtra(tc.ns, toks, tc.extra); !errors.Is(err, ErrExtraKeys) {
			t.Errorf("%s: err %v, want ErrExtraKeys", name, err)
		}
	}
	for _, ok := range [][]byte{VLLMText(""), VLLMBytes(make([]byte, 300)), VLLMMultimodalKey("i", -70000), {0xf6}, {0x80}} {
		if err := checkCBORItem(ok); err != nil {
			t.Errorf("%x: %v", ok, err)
		}
	}
}

func FuzzCheckCBORItem(f *testing.F) {
	f.Add(VLLMMultimodalKey("img", 5))
	f.Add([]byte{0x9f, 0xff})
	f.Fuzz(func(t *testing.T, b []byte) {
		if checkCBORItem(b) == nil && len(b) == 0 {
			t.Fatal("empty input accepted")
		}
	})
}

// TestExtensionRoomBound: the largest namespace's extension fits the bound
// block decoders accept.
func TestExtensionRoomBound(t *testing.T) {
	ns := testNS()
	ns.Scheme, ns.HashSeed, ns.ExtraKeyBytes = SchemeVLLM, "0", MaxExtraRoom
	ns.LoRA, ns.TenantSalt = string(make([]byte, MaxLoRALen)), string(make([]byte, MaxSaltLen))
	if err := ns.Validate(); err != nil {
		t.Fatal(err)
	}
	if r := ns.ExtensionRoom(); r != MaxExtensionRoom {
		t.Fatalf("largest extension %d, bound %d", r, MaxExtensionRoom)
	}
}
