package gemm

import (
	"context"
	"fmt"
	"math/rand/v2"
	"runtime"
	"syscall"
	"testing"
	"time"

	"gonum.org/v1/gonum/blas"
	"gonum.org/v1/gonum/blas/gonum"
)

// BenchmarkMulT times C = A·Bᵀ on the shapes of Qwen2.5-0.5B's layers (d
// 896, FFN 4864, Q+K+V 1152) for a prefill chunk of 128 rows and for
// decoding (one row), against gonum's Sgemm (the CPU backend's products
// before this package; it uses GOMAXPROCS goroutines as MulT does here)
// and a plain loop (one goroutine) on the same operands. It reports
// GFLOP/s (2·m·n·k per product) of wall time and per CPU-second of the
// process: on a shared machine the second measures the work, to be read
// against one core's peak (BenchmarkPeak).
//
//	go test -run '^$' -bench 'MulT|Peak' -count 3 ./prefill/gemm/
func BenchmarkMulT(b *testing.B) {
	threads := runtime.GOMAXPROCS(0)
	for _, s := range []struct{ m, n, k int }{
		{128, 1152, 896}, // Q, K, V
		{128, 896, 896},  // output projection
		{128, 9728, 896}, // gate and up
		{128, 896, 4864}, // down
		{512, 9728, 896}, // gate and up, a whole chunk (rowChunk)
		{1, 4864, 896},   // decode
		{1, 896, 4864},   // decode: down
		{1, 32768, 896},  // decode: a fifth of the LM head
		{256, 256, 64},   // attention's scores, one tile (one thread)
	} {
		r := rand.New(rand.NewPCG(1, 2))
		a, bm, c := randSlice(r, s.m*s.k), randSlice(r, s.n*s.k), make([]float32, s.m*s.n)
		t := threads
		if s.k == 64 {
			t = 1
		}
		flops := 2 * float64(s.m) * float64(s.n) * float64(s.k)
		name := fmt.Sprintf("%dx%dx%d", s.m, s.n, s.k)
		b.Run(name+"/gemm", func(b *testing.B) {
			measure(b, flops, func() {
				if err := MulT(context.Background(), t, s.m, s.n, s.k, 1, a, s.k, bm, s.k, 0, c, s.n); err != nil {
					b.Fatal(err)
				}
			})
		})
		b.Run(name+"/gonum", func(b *testing.B) {
			var g gonum.Implementation
			measure(b, flops, func() {
				g.Sgemm(blas.NoTrans, blas.Trans, s.m, s.n, s.k, 1, a, s.k, bm, s.k, 0, c, s.n)
			})
		})
		b.Run(name+"/loop", func(b *testing.B) {
			measure(b, flops, func() { naiveMulT(s.m, s.n, s.k, a, bm, c) })
		})
	}
}

// BenchmarkMul times attention's scores·V (C += S·V, V a [keys][64] block
// of rows of stride 128: two KV heads) on one thread, against gonum.
func BenchmarkMul(b *testing.B) {
	const m, n, k, ldb = 256, 64, 256, 128
	r := rand.New(rand.NewPCG(1, 2))
	a, bm, c := randSlice(r, m*k), randSlice(r, k*ldb), make([]float32, m*n)
	flops := 2.0 * m * n * k
	b.Run("gemm", func(b *testing.B) {
		measure(b, flops, func() {
			if err := Mul(context.Background(), 1, m, n, k, 1, a, k, bm, ldb, 1, c, n); err != nil {
				b.Fatal(err)
			}
		})
	})
	b.Run("gonum", func(b *testing.B) {
		var g gonum.Implementation
		measure(b, flops, func() {
			g.Sgemm(blas.NoTrans, blas.NoTrans, m, n, k, 1, a, k, bm, ldb, 1, c, n)
		})
	})
}

// measure runs f in b's loop and reports GFLOP/s, f doing flops, of wall
// time and of the process's CPU time.
func measure(b *testing.B, flops float64, f func()) {
	c0 := cpuTime()
	for b.Loop() {
		f()
	}
	total := flops * float64(b.N) / 1e9
	b.ReportMetric(total/b.Elapsed().Seconds(), "GFLOP/s")
	b.ReportMetric(total/(cpuTime()-c0).Seconds(), "GFLOP/CPU-s")
}

// cpuTime returns the CPU time (user + system) this process has used.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// naiveMulT is C = A·Bᵀ as a plain loop would compute it: the peer a
// hand-written product would be.
func naiveMulT(m, n, k int, a, b, c []float32) {
	for i := range m {
		ar := a[i*k : (i+1)*k]
		for j := range n {
			br := b[j*k : (j+1)*k]
			var s float32
			for p, x := range ar {
				s += x * br[p]
			}
			c[i*n+j] = s
		}
	}
}

func randSlice(r *rand.Rand, n int) []float32 {
	x := make([]float32, n)
	for i := range x {
		x[i] = float32(r.NormFloat64())
	}
	return x
}
