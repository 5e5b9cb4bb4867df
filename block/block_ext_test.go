package block_test

import (
	"bytes"
	"encoding/binary"
	"errors"
	"math/rand/v2"
	"testing"

	"github.com/kvmesh/kvmesh/block"
	"github.com/kvmesh/kvmesh/block/blocktest"
	"github.com/kvmesh/kvmesh/prefixhash"
)

// v3Namespaces are namespaces that use the fields format 3 added (the
// latent layout, scales, the vLLM key scheme).
func v3Namespaces() map[string]prefixhash.Namespace {
	latent := prefixhash.Namespace{Model: "kvmesh/mla", DType: prefixhash.BFloat16, BlockTokens: 4, Layers: 3,
		Layout: prefixhash.LatentKV, LatentDim: 40}
	latentFP8 := latent
	latentFP8.DType, latentFP8.Scales = prefixhash.Float8E4M3, prefixhash.ScalesPerBlock
	int8Head := blocktest.NS()
	int8Head.DType, int8Head.Scales = prefixhash.Int8, prefixhash.ScalesPerHead
	vllm := blocktest.NS()
	vllm.Scheme, vllm.HashSeed, vllm.LoRA, vllm.TenantSalt, vllm.ExtraKeyBytes = prefixhash.SchemeVLLM, "0", "lora-a", "salt", 64
	return map[string]prefixhash.Namespace{"latent": latent, "latent-fp8-scales": latentFP8, "int8-per-head-scales": int8Head, "vllm": vllm}
}

func randBytes(rng *rand.Rand, n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(rng.Uint32())
	}
	return b
}

// TestBlockV3RoundTrip: blocks of every new layout, scheme and with extra
// keys encode and decode, their keys are the chain's (KeysExtra), a
// two-block chain verifies, and the payload (scales included) is covered
// by the checksum.
func TestBlockV3RoundTrip(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 7))
	nss := v3Namespaces()
	xk := blocktest.NS()
	xk.ExtraKeyBytes = 32
	nss["extra-keys"] = xk
	for name, ns := range nss {
		tokens := make([]uint32, 2*ns.BlockTokens)
		for i := range tokens {
			tokens[i] = rng.Uint32()
		}
		extra := []prefixhash.ExtraKeys{{prefixhash.VLLMMultimodalKey("img", 1)}, nil}
		if name != "extra-keys" && name != "vllm" {
			extra = nil
		}
		keys, err := prefixhash.KeysExtra(ns, tokens, extra)
		if err != nil {
			t.Fatal(err)
		}
		link := ns.RootLink()
		for i := range 2 {
			var e prefixhash.ExtraKeys
			if i < len(extra) {
				e = extra[i]
			}
			payload := randBytes(rng, ns.BlockBytes())
			hdr, next, err := block.AppendHeaderExt(nil, 9, ns, link, tokens[i*ns.BlockTokens:(i+1)*ns.BlockTokens], e, payload)
			if err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			want := uint16(4)
			if len(hdr)%64 != 0 || len(hdr) != block.NamespaceHeaderLen(ns) || binary.LittleEndian.Uint16(hdr[4:]) != want {
				t.Fatalf("%s: header of %d bytes, format %d", name, len(hdr), binary.LittleEndian.Uint16(hdr[4:]))
			}
			b := append(hdr, payload...)
			blk, err := block.Decode(b, 0)
			if err != nil {
				t.Fatalf("%s block %d: %v", name, i, err)
			}
			if blk.Key != keys[i] || next.Key() != keys[i] || blk.ParentLink != link || blk.Tenant != 9 || !bytes.Equal(blk.Payload, payload) {
				t.Fatalf("%s block %d: key %s (chain %s), parent link %s want %s", name, i, blk.Key, keys[i], blk.ParentLink, link)
			}
			if err := blk.CheckNamespace(ns); err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			if err := blk.CheckTokens(link.Key(), tokens[i*ns.BlockTokens:(i+1)*ns.BlockTokens]); err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			// The last payload byte is a scale's when the layout has scales:
			// it is covered like the rest.
			bad := bytes.Clone(b)
			bad[len(bad)-1] ^= 1
			if _, err := block.Decode(bad, 0); !errors.Is(err, block.ErrCorrupt) {
				t.Fatalf("%s: a flipped last payload byte decodes: %v", name, err)
			}
			other := blocktest.NS()
			other.Model = "kvmesh/other"
			if err := blk.CheckNamespace(other); err == nil {
				t.Fatalf("%s: block passes another namespace's check", name)
			}
			link = next
		}
	}
}

// TestBlockV3Corruption: every byte of a v3 header's extension and new
// fields is covered: a flip is refused (by the header checksum, or, with
// the checksum recomputed, by the key or the layout).
func TestBlockV3Corruption(t *testing.T) {
	rng := rand.New(rand.NewPCG(8, 8))
	ns := v3Namespaces()["vllm"]
	tokens := []uint32{1, 2, 3, 4}
	payload := randBytes(rng, ns.BlockBytes())
	hdr, _, err := block.AppendHeaderExt(nil, 0, ns, ns.RootLink(), tokens, prefixhash.ExtraKeys{prefixhash.VLLMText("x")}, payload)
	if err != nil {
		t.Fatal(err)
	}
	b := append(hdr, payload...)
	ext := block.FixedHeaderLen + 4*len(tokens)
	x := int(binary.LittleEndian.Uint32(b[ext:]))
	for _, i := range []int{7, 57, 58, 72, ext, ext + 4, ext + 4 + 31, ext + 4 + 32, ext + 4 + x - 1} {
		for _, resum := range []bool{false, true} {
			c := bytes.Clone(b)
			c[i] ^= 0x41
			if resum {
				blocktest.Reseal(c)
			}
			if _, err := block.Decode(c, 0); !errors.Is(err, block.ErrCorrupt) {
				t.Errorf("byte %d flipped (checksum recomputed %v): %v", i, resum, err)
			}
		}
	}
}

// TestBlockReservedZero: a block of the plainest namespace has its
// reserved bytes zero, and a header with one of them set is refused.
func TestBlockReservedZero(t *testing.T) {
	ns := blocktest.NS()
	payload := make([]byte, ns.BlockBytes())
	b, _, err := block.Encode(nil, ns, ns.Root(), []uint32{1, 2, 3, 4}, payload)
	if err != nil {
		t.Fatal(err)
	}
	if v := binary.LittleEndian.Uint16(b[4:]); v != 4 || len(b) != block.HeaderLen(4)+len(payload) {
		t.Fatalf("format %d, %d bytes", v, len(b))
	}
	for _, i := range []int{7, 57, 58, 59, 72, 76, 77, 78, 79} {
		if b[i] != 0 {
			t.Errorf("byte %d is %d, want zero", i, b[i])
		}
	}
	for _, i := range []int{59, 76} {
		c := bytes.Clone(b)
		c[i] = 1
		blocktest.Reseal(c)
		if _, err := block.Decode(c, 0); !errors.Is(err, block.ErrCorrupt) {
			t.Errorf("reserved byte %d set: %v", i, err)
		}
	}
}

func TestBlockV3Refusals(t *testing.T) {
	ns := blocktest.NS()
	payload := make([]byte, ns.BlockBytes())
	tokens := []uint32{1, 2, 3, 4}
	vns := v3Namespaces()["vllm"]
	cases := map[string]func() error{
		"too many extra keys": func() error {
			_, _, err := block.AppendHeaderExt(nil, 0, ns, ns.RootLink(), tokens, make(prefixhash.ExtraKeys, 65), payload)
			return err
		},
		"extra keys in a namespace without room": func() error {
			_, _, err := block.AppendHeaderExt(nil, 0, ns, ns.RootLink(), tokens, prefixhash.ExtraKeys{{1}}, payload)
			return err
		},
		"extra keys over the namespace's room": func() error {
			_, _, err := block.AppendHeaderExt(nil, 0, vns, vns.RootLink(), tokens, prefixhash.ExtraKeys{prefixhash.VLLMBytes(make([]byte, 100))}, make([]byte, vns.BlockBytes()))
			return err
		},
		"vllm extra key not CBOR": func() error {
			_, _, err := block.AppendHeaderExt(nil, 0, vns, vns.RootLink(), tokens, prefixhash.ExtraKeys{[]byte("raw")}, make([]byte, vns.BlockBytes()))
			return err
		},
		"kvmesh parent that is not a key": func() error {
			var l prefixhash.Link
			l[20] = 1
			_, _, err := block.AppendHeaderExt(nil, 0, ns, l, tokens, nil, payload)
			return err
		},
		"vllm parent key below the root": func() error {
			_, _, err := block.AppendHeaderTenant(nil, 0, vns, prefixhash.Key{1}, tokens, make([]byte, vns.BlockBytes()))
			return err
		},
	}
	for name, f := range cases {
		if f() == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

// TestBlockV3LargestHeader: a block of the namespace with the largest
// extension (vllm parent link, longest LoRA id and salt, all the room for
// extra keys, filled) encodes and decodes.
func TestBlockV3LargestHeader(t *testing.T) {
	ns := blocktest.NS()
	ns.Scheme, ns.HashSeed, ns.ExtraKeyBytes = prefixhash.SchemeVLLM, "0", prefixhash.MaxExtraRoom
	ns.LoRA, ns.TenantSalt = string(bytes.Repeat([]byte("l"), prefixhash.MaxLoRALen)), string(bytes.Repeat([]byte("s"), prefixhash.MaxSaltLen))
	extra := prefixhash.ExtraKeys{prefixhash.VLLMBytes(make([]byte, prefixhash.MaxExtraBytes-3))}
	tokens := []uint32{1, 2, 3, 4}
	payload := make([]byte, ns.BlockBytes())
	hdr, link, err := block.AppendHeaderExt(nil, 0, ns, ns.RootLink(), tokens, extra, payload)
	if err != nil {
		t.Fatal(err)
	}
	if len(hdr) != block.MaxHeaderLen(len(tokens)) {
		t.Errorf("header %d bytes, MaxHeaderLen %d", len(hdr), block.MaxHeaderLen(len(tokens)))
	}
	blk, err := block.Decode(append(hdr, payload...), 0)
	if err != nil || blk.Key != link.Key() || len(blk.Extra) != 3 {
		t.Fatalf("decode: %v, %d extra keys", err, len(blk.Extra))
	}
}
