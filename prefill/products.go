package prefill

import (
	"context"

	"github.com/kvmesh/kvmesh/prefill/gemm"
)

// matrix is a weight matrix [rows][cols], row-major, as the model multiplies
// it: a linear layer computes x·matrixᵀ. id numbers the model's matrices
// (cpuModel.mats), so that a backend can keep its own copy of each (a
// device buffer).
type matrix struct {
	id         int
	rows, cols int
	data       []float32 // host copy, len rows·cols
}

// pass runs the products with weight matrices of one forward pass. Every
// backend shares the rest of the forward pass (cpuModel.Forward); this is
// where they differ. A pass is used by one goroutine at a time.
type pass interface {
	// linear computes c = a·wᵀ + beta·c for a [m][w.cols] (row stride lda)
	// and c [m][w.rows] (row stride ldc). It returns ctx's error, leaving c
	// partly written, when ctx is done before it finished.
	linear(ctx context.Context, w *matrix, m int, a []float32, lda int, beta float32, c []float32, ldc int) error
	// head computes logits = w·h: the LM head of the last position.
	head(ctx context.Context, w *matrix, h, logits []float32) error
}

// passes hands out passes to concurrent forward passes.
type passes interface {
	get() (pass, error)
	put(pass)
	// close releases every pass and the weights behind them; none is in use.
	close() error
}

// hostPasses are the CPU backend's: package gemm's products on the host,
// on threads goroutines.
type hostPasses struct{ threads int }

func (h hostPasses) get() (pass, error) { return hostPass(h), nil }
func (hostPasses) put(pass)             {}
func (hostPasses) close() error         { return nil }

type hostPass struct{ threads int }

func (p hostPass) linear(ctx context.Context, w *matrix, m int, a []float32, lda int, beta float32, c []float32, ldc int) error {
	return gemm.MulT(ctx, p.threads, m, w.rows, w.cols, 1, a, lda, w.data, w.cols, beta, c, ldc)
}

func (p hostPass) head(ctx context.Context, w *matrix, h, logits []float32) error {
	return gemm.MulT(ctx, p.threads, 1, w.rows, w.cols, 1, h, w.cols, w.data, w.cols, 0, logits, w.rows)
}
