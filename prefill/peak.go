package prefill

import (
	"time"

	"gonum.org/v1/gonum/blas"
)

// SgemmPeak returns the best GFLOP/s of gonum's Sgemm on 2048×2048×2048
// (C = A·Bᵀ, the form the linear layers use) over runs runs: the ceiling
// the engine's GFLOP/s is read against. Benchmarks of the engine, bare or
// behind a node, report it beside their figures, measured in the same run.
// It allocates 48 MiB and takes about a second per run on two cores.
func SgemmPeak(runs int) float64 {
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
