package prefill

import (
	"context"
	"sync"

	"gonum.org/v1/gonum/blas"
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

// hostPasses are the CPU backend's: gonum's Sgemm on the host, cut for
// cancellation (linearCancel), and the LM head's product spread over
// threads goroutines.
type hostPasses struct{ threads int }

func (h hostPasses) get() (pass, error) { return hostPass(h), nil }
func (hostPasses) put(pass)             {}
func (hostPasses) close() error         { return nil }

type hostPass struct{ threads int }

func (hostPass) linear(ctx context.Context, w *matrix, m int, a []float32, lda int, beta float32, c []float32, ldc int) error {
	return linearCancel(ctx, m, w.rows, w.cols, a, lda, w.data, w.cols, beta, c, ldc)
}

// head splits the rows of the LM head (the largest matrix of a small
// model, read whole for every decoded token) over the threads: gonum's
// Sgemv runs on one.
func (p hostPass) head(_ context.Context, w *matrix, h, logits []float32) error {
	t := max(1, min(p.threads, w.rows/1024))
	var wg sync.WaitGroup
	for i := range t {
		lo, hi := w.rows*i/t, w.rows*(i+1)/t
		wg.Go(func() {
			impl.Sgemv(blas.NoTrans, hi-lo, w.cols, 1, w.data[lo*w.cols:], w.cols, h, 1, 0, logits[lo:hi], 1)
		})
	}
	wg.Wait()
	return nil
}
