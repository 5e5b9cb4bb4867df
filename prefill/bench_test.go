package prefill

import (
	"context"
	"fmt"
	"syscall"
	"testing"
	"time"
)

// BenchmarkSgemm2048 reports gonum's Sgemm peak on its own.
func BenchmarkSgemm2048(b *testing.B) {
	var g float64
	for range b.N {
		g = SgemmPeak(context.Background(), 2048, 1)
	}
	b.ReportMetric(g, "GFLOP/s")
}

// cpuTime returns the CPU time (user + system) this process has used.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkPrefill measures the time to first token of one prompt with the
// default model: cold, and with 50% and 90% of it cached (the cache, in
// memory, was filled by an earlier prefill of the prefix and is frozen, so
// every iteration sees the same hit). It reports the TTFTs, the warm/cold
// ratios (target: 90% cached ≤ 0.15× cold), the engine's GFLOP/s on the
// cold prefill and gonum's Sgemm peak measured in the same run. On a shared
// machine wall time swings with the neighbours' load, so it also reports the
// ratios of process CPU time, which measure the work done.
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
			warm := func(frac float64) *Engine {
				cache := newMemCache()
				e := newEngine(cache)
				run(b, e, tokens[:int(frac*float64(n))])
				flush(b, e)
				cache.frozen = true
				return e
			}
			engines := []*Engine{newEngine(nil), warm(0.5), warm(0.9)}
			peak := SgemmPeak(context.Background(), 2048, 3)
			b.ResetTimer()
			var ttft, cpu [3]time.Duration
			var cached [3]int
			var flops, compute float64
			for range b.N {
				for i, e := range engines {
					c0 := cpuTime()
					r := run(b, e, tokens)
					flush(b, e) // the warm engines' publishing is part of their cost
					cpu[i] += cpuTime() - c0
					ttft[i] += r.TTFT
					cached[i] = r.Usage.CachedTokens
					if i == 0 {
						flops += r.FLOPs
						compute += r.Timing.Compute.Seconds()
					}
				}
			}
			b.StopTimer()
			for i, name := range []string{"cold", "c50", "c90"} {
				b.ReportMetric(ttft[i].Seconds()/float64(b.N), name+"-s")
				if i > 0 {
					b.ReportMetric(float64(ttft[i])/float64(ttft[0]), name+"/cold")
					b.ReportMetric(float64(cpu[i])/float64(cpu[0]), name+"/cold-cpu")
					b.ReportMetric(float64(cached[i])/float64(n), name+"-cached-frac")
				}
			}
			b.ReportMetric(flops/compute/1e9, "engine-GFLOP/s")
			b.ReportMetric(peak, "sgemm-GFLOP/s")
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

// BenchmarkVerifyRows: the cost of one speculative step's forward pass
// over 1 (plain decoding), 2, 5 and 9 positions (K = 0, 1, 4, 8) after a
// 256-token prompt, on the model of `kvmesh bench speculate` (174 MiB of
// float32 weights): how much cheaper than decoding them one at a time
// verifying K guesses is.
func BenchmarkVerifyRows(b *testing.B) {
	c := Config{Layers: 4, Dim: 1024, Heads: 8, KVHeads: 2, HeadDim: 128, FFNDim: 2816, Vocab: 256, MaxContext: 512}
	c.EnsureDefaults()
	e, err := New(nil, Options{Config: c, Weights: SeededWeights(c, 1)})
	if err != nil {
		b.Fatal(err)
	}
	defer e.Close()
	tokens := randTokens(newRand(1), 265, c.Vocab)
	kv := NewKV(c, len(tokens))
	if err := e.model.Forward(context.Background(), kv, 0, tokens[:256], make([]float32, c.Vocab)); err != nil {
		b.Fatal(err)
	}
	for _, s := range []int{1, 2, 5, 9} {
		b.Run(fmt.Sprintf("positions=%d", s), func(b *testing.B) {
			rows := make([]float32, s*c.Vocab)
			for b.Loop() {
				if err := e.model.Forward(context.Background(), kv, 256, tokens[256:256+s], rows); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
