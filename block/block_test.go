package block_test

import (
	"bytes"
	"encoding/binary"
	"errors"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/cespare/xxhash/v2"

	"github.com/kvmesh/kvmesh/block"
	"github.com/kvmesh/kvmesh/block/blocktest"
	"github.com/kvmesh/kvmesh/prefixhash"
)

func TestBlockRoundTrip(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 1))
	ns := blocktest.NS()
	b, key, tokens, payload := blocktest.Random(t, rng, ns, ns.Root())
	if len(b) != block.EncodedLen(len(tokens), len(payload)) || block.HeaderLen(len(tokens))%64 != 0 {
		t.Fatalf("encoded %d bytes, EncodedLen %d", len(b), block.EncodedLen(len(tokens), len(payload)))
	}
	blk, err := block.Decode(b, 0)
	if err != nil {
		t.Fatal(err)
	}
	if blk.Key != key || blk.Parent != ns.Root() || blk.Namespace != ns.Digest() || !bytes.Equal(blk.Payload, payload) {
		t.Fatalf("decoded header %+v differs", blk.Header)
	}
	for i := range tokens {
		if blk.Tokens[i] != tokens[i] {
			t.Fatalf("token %d differs", i)
		}
	}
	if key != prefixhash.Keys(ns, tokens)[0] {
		t.Fatal("block key is not the chain key of its tokens")
	}
	if err := blk.CheckNamespace(ns); err != nil {
		t.Fatal(err)
	}
	other := ns
	other.TenantSalt = "someone else"
	if err := blk.CheckNamespace(other); !errors.Is(err, block.ErrCorrupt) {
		t.Fatalf("CheckNamespace(other tenant) = %v", err)
	}
	if _, err := block.Decode(b, len(payload)-1); !errors.Is(err, block.ErrTooLarge) {
		t.Fatalf("payload over the limit: %v", err)
	}
}

// TestBlockEveryByteMatters flips each byte of an encoded block in turn; no
// flipped block may decode (padding and reserved bytes excepted, which no
// reader interprets).
func TestBlockEveryByteMatters(t *testing.T) {
	rng := rand.New(rand.NewPCG(2, 2))
	ns := blocktest.NS()
	b, _, _, _ := blocktest.Random(t, rng, ns, ns.Root())
	// Reserved bytes are under the header checksum, and the padding that
	// aligns the header must be zeros: no byte goes unchecked, so a block
	// has one encoding (a reused slot's stale bytes in the padding once
	// passed for the block: FuzzReserveCommit).
	for i := range b {
		c := bytes.Clone(b)
		c[i] ^= 0x5a
		if _, err := block.Decode(c, 0); !errors.Is(err, block.ErrCorrupt) {
			t.Fatalf("byte %d flipped: Decode = %v, want ErrCorrupt", i, err)
		}
	}
	for _, n := range []int{0, 1, len(b) - 1} {
		if _, err := block.Decode(b[:n], 0); !errors.Is(err, block.ErrCorrupt) {
			t.Fatalf("truncated to %d: %v", n, err)
		}
	}
	if _, err := block.Decode(append(bytes.Clone(b), 0), 0); !errors.Is(err, block.ErrCorrupt) {
		t.Fatalf("trailing byte accepted: %v", err)
	}
}

// TestBlockForgedKey re-checksums a header whose tokens were changed: the
// checksums then pass, and only the key check can catch it.
func TestBlockForgedKey(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 3))
	ns := blocktest.NS()
	b, _, _, _ := blocktest.Random(t, rng, ns, ns.Root())
	b[block.FixedHeaderLen]++
	blocktest.Reseal(b)
	if _, err := block.Decode(b, 0); !errors.Is(err, block.ErrCorrupt) {
		t.Fatalf("forged tokens accepted: %v", err)
	}
}

// TestBlockHeaderLayout pins the format 4 header offsets that other readers (the
// Python library, inspect tools) rely on.
func TestBlockHeaderLayout(t *testing.T) {
	rng := rand.New(rand.NewPCG(6, 6))
	ns := blocktest.NS()
	tokens := []uint32{1, 0xffffffff, 3, 4}
	payload := make([]byte, ns.BlockBytes())
	for i := range payload {
		payload[i] = byte(rng.Uint32())
	}
	parent := ns.Root()
	b, key, err := block.EncodeTenant(nil, 0x1122334455667788, ns, parent, tokens, payload)
	if err != nil {
		t.Fatal(err)
	}
	le32 := func(off int) uint32 { return binary.LittleEndian.Uint32(b[off:]) }
	le64 := func(off int) uint64 { return binary.LittleEndian.Uint64(b[off:]) }
	switch {
	case string(b[0:4]) != "KVMB", binary.LittleEndian.Uint16(b[4:]) != 4, b[6] != prefixhash.KeyVersion, b[7] != 0:
		t.Fatalf("magic/versions: % x", b[:8])
	case le32(8) != 192 || block.HeaderLen(4) != 192 || block.HeaderLen(0) != 192 || block.HeaderLen(14) != 192 || block.HeaderLen(15) != 256:
		t.Fatalf("header length %d (HeaderLen(4) = %d)", le32(8), block.HeaderLen(4))
	case le32(12) != 4, le64(16) != ns.Digest():
		t.Fatal("token count or namespace digest")
	case !bytes.Equal(b[24:40], key[:]), !bytes.Equal(b[40:56], parent[:]):
		t.Fatal("key or parent")
	case b[56] != byte(ns.DType), b[57] != 0, b[58] != 0, b[59] != 0, le32(60) != 2, le32(64) != 2, le32(68) != 8, le32(72) != 0, le32(76) != 0:
		t.Fatal("layout")
	case le64(80) != uint64(len(payload)), le64(88) != xxhash.Sum64(payload), le64(96) != 0x1122334455667788:
		t.Fatal("payload length, checksum or tenant")
	case le32(104) != 0 || le32(108) != 2 || le32(112) != 0 || le32(116) != 2:
		t.Fatal("part range of a whole block")
	case le32(128) != 1 || le32(132) != 0xffffffff || le32(140) != 4:
		t.Fatal("tokens")
	case le32(144) != 4 || le32(148) != 0:
		t.Fatal("extension: length 4, no extra keys")
	}
	blk, err := block.Decode(b, 0)
	if err != nil || blk.Tenant != 0x1122334455667788 {
		t.Fatalf("Decode: tenant %x, %v", blk.Tenant, err)
	}
	if b, _, _ = block.Encode(nil, ns, parent, tokens, payload); le64(96) != 0 {
		t.Fatal("Encode wrote a tenant tag")
	}
}

// TestBlockOtherFormats: a block written by an older kvmesh (format 1, its
// 104-byte header and xxhash64 keys; formats 2 and 3, key format 2) or
// under another key format fails to decode, and says why.
func TestBlockOtherFormats(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 7))
	ns := blocktest.NS()
	b, _, _, _ := blocktest.Random(t, rng, ns, ns.Root())

	// A version-1 block, as main wrote it: the v2 fields moved, checksum at 96.
	v1 := make([]byte, 0, len(b))
	v1 = append(v1, b[:96]...)
	binary.LittleEndian.PutUint16(v1[4:], 1)
	v1[6] = 0
	v1 = binary.LittleEndian.AppendUint64(v1, 0)
	v1 = append(v1, b[block.FixedHeaderLen:]...)
	for _, c := range []struct {
		name string
		b    []byte
	}{
		{"format 1", v1},
		{"format 1, header only", v1[:104]},
		{"key format 1", func() []byte { c := bytes.Clone(b); c[6] = 1; blocktest.Reseal(c); return c }()},
		{"key format 2", func() []byte { c := bytes.Clone(b); c[6] = 2; blocktest.Reseal(c); return c }()},
		{"format 3, key format 2", func() []byte {
			c := bytes.Clone(b)
			binary.LittleEndian.PutUint16(c[4:], 3)
			c[6] = 2
			blocktest.Reseal(c)
			return c
		}()},
		{"key format 4", func() []byte { c := bytes.Clone(b); c[6] = 4; blocktest.Reseal(c); return c }()},
	} {
		_, err := block.Decode(c.b, 0)
		if !errors.Is(err, block.ErrCorrupt) || !errors.Is(err, block.ErrOtherFormat) {
			t.Fatalf("%s: Decode = %v, want ErrOtherFormat wrapping ErrCorrupt", c.name, err)
		}
		if !strings.Contains(err.Error(), "kvmesh under a different key format") {
			t.Errorf("%s: error %q does not say the block is of another key format", c.name, err)
		}
	}
	if _, err := block.Decode(b, 0); err != nil {
		t.Fatal(err)
	}
}

func TestCheckTokens(t *testing.T) {
	rng := rand.New(rand.NewPCG(8, 8))
	ns := blocktest.NS()
	b, _, tokens, _ := blocktest.Random(t, rng, ns, ns.Root())
	blk, err := block.Decode(b, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := blk.CheckTokens(ns.Root(), tokens); err != nil {
		t.Fatalf("CheckTokens(its own tokens) = %v", err)
	}
	other := append([]uint32(nil), tokens...)
	other[3]++
	for name, err := range map[string]error{
		"a token":  blk.CheckTokens(ns.Root(), other),
		"short":    blk.CheckTokens(ns.Root(), tokens[:3]),
		"a parent": blk.CheckTokens(prefixhash.Key{1}, tokens),
	} {
		if !errors.Is(err, block.ErrTokens) || !errors.Is(err, block.ErrCorrupt) {
			t.Errorf("%s differs: CheckTokens = %v, want ErrTokens", name, err)
		}
	}
}

func TestEncodeRejects(t *testing.T) {
	ns := blocktest.NS()
	tokens := make([]uint32, ns.BlockTokens)
	payload := make([]byte, ns.BlockBytes())
	if _, _, err := block.Encode(nil, ns, ns.Root(), tokens[:1], payload); err == nil {
		t.Error("short token list accepted")
	}
	if _, _, err := block.Encode(nil, ns, ns.Root(), tokens, payload[1:]); err == nil {
		t.Error("short payload accepted")
	}
	bad := ns
	bad.KVHeads = 0
	if _, _, err := block.Encode(nil, bad, ns.Root(), tokens, payload); !errors.Is(err, prefixhash.ErrInvalidNamespace) {
		t.Errorf("invalid namespace: %v", err)
	}
}

// FuzzDecode feeds arbitrary bytes to the decoder. It must never panic, and
// whatever it accepts must be a block that re-encodes to the same bytes: its
// key is H(parent ‖ tokens) and its payload matches its checksum.
func FuzzDecode(f *testing.F) {
	rng := rand.New(rand.NewPCG(4, 4))
	ns := blocktest.NS()
	b, _, _, _ := blocktest.Random(f, rng, ns, ns.Root())
	f.Add(b)
	f.Add(b[:block.FixedHeaderLen])
	f.Add([]byte("KVMB"))
	b, _, _ = block.EncodeTenant(nil, 42, ns, ns.Root(), []uint32{0, 0xffffffff, 7, 8}, make([]byte, ns.BlockBytes()))
	f.Add(b)
	v1 := bytes.Clone(b)
	binary.LittleEndian.PutUint16(v1[4:], 1)
	f.Add(v1)
	for _, vns := range v3Namespaces() {
		v3, _, _ := block.AppendHeaderExt(nil, 0, vns, vns.RootLink(), []uint32{1, 2, 3, 4}[:vns.BlockTokens],
			prefixhash.ExtraKeys{prefixhash.VLLMText("k")}, make([]byte, vns.BlockBytes()))
		f.Add(append(v3, make([]byte, vns.BlockBytes())...))
	}
	obj, _, _ := block.EncodeObject(nil, 7, ns, block.Object{Name: "o", Pieces: 2, Piece: 1, Size: 9, Generation: 3,
		Retention: block.Retention{Pin: block.PinSoft, TTL: time.Second}}, []byte("piece"))
	f.Add(obj)
	f.Fuzz(func(t *testing.T, data []byte) {
		blk, err := block.Decode(data, 1<<20)
		if err != nil {
			return
		}
		if blk.Kind == block.KindObject {
			checkObjectReencodes(t, blk, data)
			return
		}
		if prefixhash.BlockLink(blk.Scheme, blk.ParentLink, blk.Tokens, blk.Extra).Key() != blk.Key || blk.ParentLink.Key() != blk.Parent {
			t.Fatal("accepted a block whose key does not match its parent, tokens and extra keys")
		}
		if len(data) != blk.Len+blk.PayloadLen || blk.PayloadLen != blk.Layout.PartLen(len(blk.Tokens), blk.Part) {
			t.Fatal("accepted a record of the wrong length")
		}
		if blk.Len != block.HeaderLen(len(blk.Tokens)) || blk.Scheme != prefixhash.SchemeKVMesh || len(blk.Extra) != 0 {
			return // a namespace with extra key room: the checks above are what hold
		}
		rns := prefixhash.Namespace{Model: "x", DType: blk.Layout.DType, BlockTokens: len(blk.Tokens), Layers: blk.Layout.Layers,
			KVHeads: blk.Layout.KVHeads, HeadDim: blk.Layout.HeadDim, Layout: blk.Layout.KV, LatentDim: blk.Layout.LatentDim, Scales: blk.Layout.Scales}
		re, link, err := block.AppendPartHeaderExt(nil, blk.Tenant, rns, blk.ParentLink, blk.Tokens, nil, blk.Part, blk.Payload)
		if err != nil {
			t.Fatalf("accepted block does not re-encode: %v", err)
		}
		re = append(re, blk.Payload...)
		if link.Key() != blk.Key || !bytes.Equal(re[blk.Len:], data[blk.Len:]) || !bytes.Equal(re[104:120], data[104:120]) {
			t.Fatal("accepted block re-encodes differently")
		}
	})
}

func BenchmarkDecode(b *testing.B) {
	ns := blocktest.NS()
	ns.DType, ns.BlockTokens, ns.KVHeads, ns.HeadDim = prefixhash.Float32, 512, 4, 64 // 1 MiB payload
	rng := rand.New(rand.NewPCG(5, 5))
	enc, _, _, _ := blocktest.Random(b, rng, ns, ns.Root())
	b.SetBytes(int64(len(enc)))
	for b.Loop() {
		if _, err := block.Decode(enc, 0); err != nil {
			b.Fatal(err)
		}
	}
}

func TestLayoutPayloadLenNeverWraps(t *testing.T) {
	l := block.Layout{DType: prefixhash.Float32, Layers: prefixhash.MaxLayers, KVHeads: 1 << 20, HeadDim: 1 << 20}
	if n := l.PayloadLen(1 << 16); n != -1 {
		t.Fatalf("absurd layout gave payload length %d", n)
	}
	l = block.Layout{DType: prefixhash.Float32, Layers: 2, KVHeads: 2, HeadDim: 8}
	if n := l.PayloadLen(4); n != 2*2*4*2*8*4 {
		t.Fatalf("PayloadLen = %d", n)
	}
}

// TestDecodeFramed checks that DecodeFramed verifies what Decode does but
// the payload checksum: for bytes a checksum of their own already covered.
func TestDecodeFramed(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 5))
	ns := blocktest.NS()
	b, key, _, payload := blocktest.Random(t, rng, ns, ns.Root())
	blk, err := block.DecodeFramed(b, 0)
	if err != nil || blk.Key != key || !bytes.Equal(blk.Payload, payload) {
		t.Fatalf("DecodeFramed of a good block: %v", err)
	}
	c := bytes.Clone(b)
	c[len(c)-1] ^= 1
	if _, err := block.DecodeFramed(c, 0); err != nil {
		t.Fatalf("DecodeFramed hashed the payload: %v", err)
	}
	if _, err := block.Decode(c, 0); !errors.Is(err, block.ErrCorrupt) {
		t.Fatalf("Decode of a damaged payload: %v", err)
	}
	for _, bad := range [][]byte{b[:len(b)-1], append(bytes.Clone(b), 0)} {
		if _, err := block.DecodeFramed(bad, 0); !errors.Is(err, block.ErrCorrupt) {
			t.Fatalf("DecodeFramed of %d bytes (the block is %d): %v", len(bad), len(b), err)
		}
	}
	c = bytes.Clone(b)
	c[30] ^= 1 // the key
	if _, err := block.DecodeFramed(c, 0); !errors.Is(err, block.ErrCorrupt) {
		t.Fatalf("DecodeFramed of a damaged header: %v", err)
	}
}
