package store

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/kvmesh/kvmesh/block/blocktest"
)

// BenchmarkQuotaPut puts distinct small blocks (640 bytes, so that the
// store's bookkeeping shows, not memcpy) into a full cache over the real
// DRAM tier, memory only, so that every Put evicts one block:
//   - global: no quota; the memory tier is full, the node evicts its
//     coldest block (the peer figure);
//   - quota/idle=N: the tier has room, the namespace is at its quota and
//     evicts its own coldest block, while another namespace holds N idle
//     blocks colder than all of it in the same recency list. The cold
//     cursor walks past them once, not at every Put: the figure must not
//     grow with N.
func BenchmarkQuotaPut(b *testing.B) {
	ctx := context.Background()
	const hot = 256 // blocks the writer keeps
	wa := newWorld(b, 301, tenantNS("a"))
	for range 4 * hot {
		wa.extend(-1)
	}
	b.Run("global", func(b *testing.B) {
		l := openLocal(b, Options{DRAM: realDRAM(b, 4<<16, 1<<16), MaxBlocks: 1 << 20}) // about 300 blocks
		k := 0
		for b.Loop() {
			if err := l.Put(ctx, wa.blocks[k%len(wa.blocks)].enc); err != nil {
				b.Fatal(err)
			}
			k++
		}
		if s := l.Stats(); s.Duplicates != 0 || b.N > len(wa.blocks) && s.Evictions == 0 {
			b.Fatalf("the benchmark did not evict at every Put: %+v", s)
		}
	})
	for _, idle := range []int{0, 1 << 16} {
		b.Run(fmt.Sprintf("quota/idle=%d", idle), func(b *testing.B) {
			l := openLocal(b, Options{DRAM: realDRAM(b, 128<<20, 1<<20), MaxBlocks: 1 << 20,
				Quotas: map[uint64]Quota{wa.ns.Digest(): {DRAM: hot * bb}}})
			other := tenantNS("b")
			rng := rand.New(rand.NewPCG(302, 302))
			for range idle {
				enc, _, _, _ := blocktest.Random(b, rng, other, other.Root())
				if err := l.Put(ctx, enc); err != nil {
					b.Fatal(err)
				}
			}
			k := 0
			for b.Loop() {
				if err := l.Put(ctx, wa.blocks[k%len(wa.blocks)].enc); err != nil {
					b.Fatal(err)
				}
				k++
			}
			s := l.Stats()
			if u := usage(s, other.Digest()); u.Blocks != int64(idle) {
				b.Fatalf("the idle namespace lost blocks: %+v", u)
			}
			if s.Duplicates != 0 || b.N > len(wa.blocks) && s.Evictions == 0 {
				b.Fatalf("the benchmark did not evict at every Put: %+v", s)
			}
		})
	}
}
