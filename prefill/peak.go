package prefill

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"time"

	"github.com/kvmesh/kvmesh/gpu/gpumem"
	"github.com/kvmesh/kvmesh/prefill/gemm"
)

// SgemmPeak returns the best GFLOP/s of the CPU backend's Sgemm (package
// gemm, on GOMAXPROCS threads) on n×n×n, C = A·Bᵀ (the form the linear
// layers use), over runs runs: the ceiling the engine's GFLOP/s is read
// against. This package's benchmarks and `kvmesh bench prefill` both
// report it next to the engine's figure. It stops early, with the best so
// far, when ctx ends.
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
		if gemm.MulT(ctx, runtime.GOMAXPROCS(0), n, n, n, 1, a, n, bm, n, 0, c, n) != nil {
			break
		}
		best = max(best, 2*float64(n)*float64(n)*float64(n)/time.Since(start).Seconds()/1e9)
	}
	return best
}

// DeviceSgemmPeak is SgemmPeak on dev: the best GFLOP/s of its Sgemm
// (cuBLAS on CUDA) on n×n×n, C = A·Bᵀ, timed from enqueueing to the
// stream's completion, over runs runs. It is the device backend's ceiling.
func DeviceSgemmPeak(ctx context.Context, dev gpumem.BLAS, n, runs int) (_ float64, err error) {
	s, err := dev.NewStream()
	if err != nil {
		return 0, fmt.Errorf("prefill: sgemm peak: %w", err)
	}
	defer func() { err = errors.Join(err, s.Close()) }()
	var m [3]gpumem.Ptr
	for i := range m {
		if m[i], err = dev.Alloc(4 * int64(n) * int64(n)); err != nil {
			return 0, fmt.Errorf("prefill: sgemm peak: %w", err)
		}
		defer func() { err = errors.Join(err, dev.Free(m[i])) }()
	}
	best := 0.0
	for range runs {
		if ctx.Err() != nil {
			break
		}
		start := time.Now()
		err := dev.Sgemm(s, false, true, n, n, n, 1, m[0], n, m[1], n, 0, m[2], n)
		if err = errors.Join(err, s.Wait()); err != nil {
			return best, fmt.Errorf("prefill: sgemm peak: %w", err)
		}
		best = max(best, 2*float64(n)*float64(n)*float64(n)/time.Since(start).Seconds()/1e9)
	}
	return best, nil
}
