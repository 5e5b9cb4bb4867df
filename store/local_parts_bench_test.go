package store

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"

	"github.com/kvmesh/kvmesh/block"
)

// BenchmarkPutParts stores 1 MiB blocks (16 layers × 8 KV heads) put as
// the parts of N tensor-parallel ranks, one goroutine each, against the
// same blocks put whole by one goroutine (ranks=1): bytes/s are the whole
// blocks'. A part is verified (its checksum) and copied into the
// incomplete block outside its lock; the last one seals it, which
// checksums the whole block once more.
func BenchmarkPutParts(b *testing.B) {
	ctx := context.Background()
	ns := benchNS(1 << 20)
	const n = 8
	rng := rand.New(rand.NewPCG(2, 2))
	var bs []*partBlock
	for range n {
		bs = append(bs, newPartBlock(b, rng, ns))
	}
	for _, ranks := range []int{1, 2, 4, 8} {
		recs := make([][][]byte, ranks) // rank → block → record
		for r := range ranks {
			p, err := block.RankPart(ns, r, ranks, 0, 1)
			if err != nil {
				b.Fatal(err)
			}
			for _, pb := range bs {
				recs[r] = append(recs[r], pb.record(b, p, nil))
			}
		}
		b.Run(fmt.Sprintf("ranks=%d", ranks), func(b *testing.B) {
			l := openLocal(b, Options{DRAM: realDRAM(b, 64<<20, 4<<20)})
			b.SetBytes(int64(len(bs[0].payload)))
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				k := i % n
				if k == 0 && i > 0 {
					b.StopTimer()
					if _, err := l.DropNamespace(ns.Digest()); err != nil {
						b.Fatal(err)
					}
					b.StartTimer()
				}
				if ranks == 1 {
					if err := l.Put(ctx, recs[0][k]); err != nil {
						b.Fatal(err)
					}
					continue
				}
				var wg sync.WaitGroup
				for r := range ranks {
					wg.Add(1)
					go func() {
						defer wg.Done()
						if err := l.Put(ctx, recs[r][k]); err != nil {
							b.Error(err)
						}
					}()
				}
				wg.Wait()
			}
		})
	}
}
