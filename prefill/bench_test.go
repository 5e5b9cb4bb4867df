package prefill

import (
	"context"
	"fmt"
	"testing"
	"time"

	"gonum.org/v1/gonum/blas"
)

// sgemmPeak returns the best GFLOP/s of gonum's Sgemm on 2048×2048×2048
// (C = A·Bᵀ, the form the linear layers use) over a few runs: the ceiling
// the engine's GFLOP/s is read against.
func sgemmPeak(runs int) float64 {
	const n = 2048
	a, bm, c := make([]float32, n*n), make([]float32, n*n), make([]float32, n*n)
	for i := range a {
		a[i], bm[i] = float32(i%7)*0.1, float32(i%5)*0.1
	}
	best := 0.0
	for range runs {
		start := time.Now()
		impl.Sgemm(blas.NoTrans, blas.Trans, n, n, n, 1, a, n, bm, n, 0, c, n)
		best = max(best, 2*n*n*n/time.Since(start).Seconds()/1e9)
	}
	return best
}

// BenchmarkSgemm2048 reports gonum's Sgemm peak on its own.
func BenchmarkSgemm2048(b *testing.B) {
	var g float64
	for range b.N {
		g = sgemmPeak(1)
	}
	b.ReportMetric(g, "GFLOP/s")
}

// BenchmarkPrefill measures the time to first token of one prompt with the
// default model: cold, and with 50% and 90% of it cached (the cache, in
// memory, was filled by an earlier prefill of the prefix and is frozen, so
// every iteration sees the same hit). It reports the TTFTs, the warm/cold
// ratios (target: 90% cached ≤ 0.15× cold), the engine's GFLOP/s on the
// cold prefill and gonum's Sgemm peak measured in the same run.
//
//	go test -run '^$' -bench 'Prefill/n=8192' -benchtime 1x -count 3 ./prefill/
func BenchmarkPrefill(b *testing.B) {
	cfg := DefaultConfig()
	w := SeededWeights(cfg, 0)
	for _, n := range []int{2048, 8192} {
		b.Run(fmt.Sprintf("n=%d", n), func(b *testing.B) {
			tokens := make([]uint32, n)
			for i := range tokens {
				tokens[i] = uint32(i*7919+i/3) % uint32(cfg.Vocab)
			}
			newEngine := func(cache Cache) *Engine {
				e, err := New(cache, Options{Config: cfg, Weights: w})
				if err != nil {
					b.Fatal(err)
				}
				b.Cleanup(func() { e.Close() })
				return e
			}
			cold := newEngine(nil)
			warm := func(frac float64) *Engine {
				cache := newMemCache()
				e := newEngine(cache)
				run(b, e, tokens[:int(frac*float64(n))])
				flush(b, e)
				cache.frozen = true
				return e
			}
			e50, e90 := warm(0.5), warm(0.9)
			peak := sgemmPeak(3)
			b.ResetTimer()
			var tc, t50, t90 time.Duration
			var flops, compute float64
			var cached50, cached90 int
			for range b.N {
				rc := run(b, cold, tokens)
				r50 := run(b, e50, tokens)
				r90 := run(b, e90, tokens)
				tc, t50, t90 = tc+rc.TTFT, t50+r50.TTFT, t90+r90.TTFT
				flops += rc.FLOPs
				compute += rc.Timing.Compute.Seconds()
				cached50, cached90 = r50.Usage.CachedTokens, r90.Usage.CachedTokens
			}
			b.StopTimer()
			per := func(d time.Duration) float64 { return d.Seconds() / float64(b.N) }
			b.ReportMetric(per(tc), "cold-s")
			b.ReportMetric(per(t50), "c50-s")
			b.ReportMetric(per(t90), "c90-s")
			b.ReportMetric(float64(t50)/float64(tc), "c50/cold")
			b.ReportMetric(float64(t90)/float64(tc), "c90/cold")
			b.ReportMetric(flops/compute/1e9, "engine-GFLOP/s")
			b.ReportMetric(peak, "sgemm-GFLOP/s")
			b.ReportMetric(float64(cached50)/float64(n), "c50-cached-frac")
			b.ReportMetric(float64(cached90)/float64(n), "c90-cached-frac")
		})
	}
}

// BenchmarkForwardTiny is a fast smoke benchmark of the forward pass on the
// test model (for profiling changes to the CPU backend).
func BenchmarkForwardTiny(b *testing.B) {
	c, _, m := loadTiny(b, 0)
	tokens := randTokens(newRand(1), 512, c.Vocab)
	kv := NewKV(c, len(tokens))
	logits := make([]float32, c.Vocab)
	b.ResetTimer()
	for range b.N {
		if err := m.Forward(context.Background(), kv, 0, tokens, logits); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(c.ForwardFLOPs(0, len(tokens))*float64(b.N)/b.Elapsed().Seconds()/1e9, "GFLOP/s")
}
