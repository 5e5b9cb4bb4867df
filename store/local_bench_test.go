package store

import (
	"context"
	"math/rand/v2"
	"testing"

	"github.com/cespare/xxhash/v2"

	"github.com/kvmesh/kvmesh/auth"
	"github.com/kvmesh/kvmesh/block"
	"github.com/kvmesh/kvmesh/prefixhash"
)

// benchNS returns a namespace whose blocks carry payload bytes: 16 tokens of
// 8 heads × 128 dims in float16 per layer and K|V is 64 KiB a layer.
func benchNS(payload int) prefixhash.Namespace {
	return prefixhash.Namespace{Model: "kvmesh/bench", DType: prefixhash.Float16, BlockTokens: 16,
		Layers: payload / (64 << 10), KVHeads: 8, HeadDim: 128}
}

var benchSizes = []struct {
	name    string
	payload int
}{{"64KiB", 64 << 10}, {"1MiB", 1 << 20}, {"4MiB", 4 << 20}}

// benchBlocks returns n distinct encoded root blocks of ns.
func benchBlocks(b *testing.B, ns prefixhash.Namespace, n int) ([][]byte, []prefixhash.Key) {
	rng := rand.New(rand.NewPCG(1, 1))
	payload := make([]byte, ns.BlockBytes())
	for i := range payload {
		payload[i] = byte(rng.Uint32())
	}
	var blocks [][]byte
	var keys []prefixhash.Key
	for range n {
		tokens := make([]uint32, ns.BlockTokens)
		for i := range tokens {
			tokens[i] = rng.Uint32()
		}
		enc, key, err := block.Encode(nil, ns, ns.Root(), tokens, payload)
		if err != nil {
			b.Fatal(err)
		}
		blocks = append(blocks, enc)
		keys = append(keys, key)
	}
	return blocks, keys
}

// BenchmarkLocalPut puts distinct blocks into a memory tier that holds half
// of them: every Put verifies the block (payload checksum), evicts the
// coldest block and copies. memcpy and xxhash of the same bytes, run beside
// it, are the limits: a Put does one of each.
func BenchmarkLocalPut(b *testing.B) {
	ctx := context.Background()
	for _, sz := range benchSizes {
		ns := benchNS(sz.payload)
		const n = 16
		blocks, _ := benchBlocks(b, ns, n)
		size := len(blocks[0])
		b.Run(sz.name, func(b *testing.B) {
			mem := newFakeMem(size, n/2, size)
			mem.fast = true
			l := openLocal(b, Options{DRAM: mem})
			b.SetBytes(int64(size))
			k := 0
			for b.Loop() {
				if err := l.Put(ctx, blocks[k%n]); err != nil {
					b.Fatal(err)
				}
				k++
			}
			if s := l.Stats(); s.Duplicates != 0 {
				b.Fatalf("%d Puts were duplicates", s.Duplicates)
			}
		})
		b.Run(sz.name+"/memcpy", func(b *testing.B) {
			dst := make([]byte, size)
			b.SetBytes(int64(size))
			k := 0
			for b.Loop() {
				copy(dst, blocks[k%n])
				k++
			}
		})
		b.Run(sz.name+"/xxhash", func(b *testing.B) {
			b.SetBytes(int64(size))
			k := 0
			for b.Loop() {
				xxhash.Sum64(blocks[k%n])
				k++
			}
		})
	}
}

// BenchmarkLocalGet gets cached blocks: "view" is Get and Release (the block
// is served in place, no byte copied: the figure is the API's overhead
// expressed per byte served); "copy" also copies the bytes out, as a server
// writing them to a socket or a shared buffer would, next to memcpy alone.
func BenchmarkLocalGet(b *testing.B) {
	ctx := context.Background()
	for _, sz := range benchSizes {
		ns := benchNS(sz.payload)
		const n = 16
		blocks, keys := benchBlocks(b, ns, n)
		size := len(blocks[0])
		l := openLocal(b, Options{DRAM: newFakeMem(size, n, size)})
		for _, blk := range blocks {
			if err := l.Put(ctx, blk); err != nil {
				b.Fatal(err)
			}
		}
		dst := make([]byte, size)
		for _, mode := range []string{"view", "copy"} {
			b.Run(sz.name+"/"+mode, func(b *testing.B) {
				b.SetBytes(int64(size))
				k := 0
				for b.Loop() {
					r, err := l.Get(ctx, keys[k%n])
					if err != nil {
						b.Fatal(err)
					}
					if mode == "copy" {
						copy(dst, r.Bytes())
					}
					r.Release()
					k++
				}
			})
		}
		b.Run(sz.name+"/memcpy", func(b *testing.B) {
			b.SetBytes(int64(size))
			k := 0
			for b.Loop() {
				copy(dst, blocks[k%n])
				k++
			}
		})
	}
}

// BenchmarkLongestPrefix looks up a fully cached 128k-token prompt: 256
// blocks of 512 tokens, touching all of them deepest-first; and a GetMany of
// the same chain.
func BenchmarkLongestPrefix(b *testing.B) {
	ctx := context.Background()
	ns := prefixhash.Namespace{Model: "kvmesh/bench", DType: prefixhash.Float16, BlockTokens: 512,
		Layers: 1, KVHeads: 1, HeadDim: 1}
	const blocks = 256
	rng := rand.New(rand.NewPCG(2, 2))
	tokens := make([]uint32, blocks*ns.BlockTokens)
	for i := range tokens {
		tokens[i] = rng.Uint32()
	}
	keys := prefixhash.Keys(ns, tokens)
	size := block.EncodedLen(ns.BlockTokens, ns.BlockBytes())
	l := openLocal(b, Options{DRAM: newFakeMem(64*size, 8, size)})
	payload := make([]byte, ns.BlockBytes())
	parent := ns.Root()
	for i := range blocks {
		enc, key, err := block.Encode(nil, ns, parent, tokens[i*ns.BlockTokens:(i+1)*ns.BlockTokens], payload)
		if err != nil {
			b.Fatal(err)
		}
		if err := l.Put(ctx, enc); err != nil {
			b.Fatal(err)
		}
		parent = key
	}
	b.Run("LongestPrefix", func(b *testing.B) {
		for b.Loop() {
			if n := l.LongestPrefix(auth.Access{}, keys); n != blocks {
				b.Fatalf("cached prefix %d, want %d", n, blocks)
			}
		}
	})
	b.Run("GetMany", func(b *testing.B) {
		for b.Loop() {
			refs, err := l.GetMany(ctx, keys)
			if err != nil {
				b.Fatal(err)
			}
			for _, r := range refs {
				r.Release()
			}
		}
	})
	b.Run("Hash", func(b *testing.B) {
		b.SetBytes(int64(4 * len(tokens)))
		for b.Loop() {
			prefixhash.Keys(ns, tokens)
		}
	})
}

// BenchmarkGetManyNVMe gets a prompt of 64 blocks of 256 KiB that live on
// the NVMe tier (a real one, in a temporary directory; the page cache is
// not dropped, so this measures the hit path's own cost more than the
// disk's) through a DRAM tier that holds 8 of them: each GetMany reads the
// blocks outside memory in parallel (slowReadDepth).
func BenchmarkGetManyNVMe(b *testing.B) {
	ctx := context.Background()
	ns := benchNS(256 << 10)
	const n = 64
	blocks, keys := benchBlocks(b, ns, n)
	size := int64(len(blocks[0]))
	slab := (size + 4095) &^ 4095
	l := openLocal(b, Options{DRAM: realDRAM(b, 8*slab, slab), NVMe: realNVMe(b, b.TempDir(), 4*n*slab, 16*slab),
		DemoteBatchBytes: int(size)})
	for _, blk := range blocks {
		if err := l.Put(ctx, blk); err != nil {
			b.Fatal(err)
		}
	}
	b.SetBytes(n * size)
	before := l.Stats()
	for b.Loop() {
		refs, err := l.GetMany(ctx, keys)
		if err != nil {
			b.Fatal(err)
		}
		for k, r := range refs {
			if r == nil {
				b.Fatalf("block %d missing", k)
			}
			r.Release()
		}
	}
	after := l.Stats()
	b.ReportMetric(float64(after.Promotions-before.Promotions)/float64(b.N)/n, "promotions/block")
	b.ReportMetric(float64(after.Demotions-before.Demotions)/float64(b.N)/n, "demotions/block")
}

// BenchmarkGetManyNVMeRandom gets random prompts of 16 blocks of 256 KiB,
// from a data set four times the DRAM tier (16 prompts, DRAM holding 4),
// the rest on a real NVMe tier in a temporary directory: the working set
// of bench nvme's end-to-end row, where half the NVMe hits are second hits
// and promotion pushes blocks out (demotions/block).
func BenchmarkGetManyNVMeRandom(b *testing.B) {
	ctx := context.Background()
	ns := benchNS(256 << 10)
	const prompts, per = 16, 16
	blocks, keys := distinctBlocks(b, ns, prompts*per)
	size := int64(len(blocks[0]))
	slab := (size + 4095) &^ 4095
	l := openLocal(b, Options{DRAM: realDRAM(b, prompts*per/4*slab, slab), NVMe: realNVMe(b, b.TempDir(), 8*prompts*per*slab, 64*slab)})
	for _, blk := range blocks {
		if err := l.Put(ctx, blk); err != nil {
			b.Fatal(err)
		}
	}
	rng := rand.New(rand.NewPCG(3, 3))
	b.SetBytes(per * size)
	before := l.Stats()
	for b.Loop() {
		p := rng.IntN(prompts)
		refs, err := l.GetMany(ctx, keys[p*per:(p+1)*per])
		if err != nil {
			b.Fatal(err)
		}
		for k, r := range refs {
			if r == nil {
				b.Fatalf("prompt %d block %d missing", p, k)
			}
			r.Release()
		}
	}
	after := l.Stats()
	b.ReportMetric(float64(after.Promotions-before.Promotions)/float64(b.N)/per, "promotions/block")
	b.ReportMetric(float64(after.Demotions-before.Demotions)/float64(b.N)/per, "demotions/block")
}
