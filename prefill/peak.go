package prefill

import (
	"context"
	"time"

	"gonum.org/v1/gonum/blas"
)

// SgemmPeak returns the best GFLOP/s of the CPU backend's Sgemm (gonum) on
// n×n×n, C = A·Bᵀ (the form the linear layers use), over runs runs: the
// ceiling the engine's GFLOP/s is read against. This package's benchmarks
// and `kvmesh bench prefill` both report it next to the engine's figure. It
// stops early, with the best so far, when ctx ends.
func SgemmPeak(ctx context.Context, n, runs int) float64 {
	a, bm, c := make([]float32, n*n), make([]float32, n*n), make([]float32, n*n)
	for i := range a {
		a[i], bm[i] = float32(i%7)*0.1, float32(i%5)*0.1
	}
	best := 0.0
	for range runs {
		if ctx.Err() != nil {
			break
		}
		start := time.Now()
		impl.Sgemm(blas.NoTrans, blas.Trans, n, n, n, 1, a, n, bm, n, 0, c, n)
		best = max(best, 2*float64(n)*float64(n)*float64(n)/time.Since(start).Seconds()/1e9)
	}
	return best
}
