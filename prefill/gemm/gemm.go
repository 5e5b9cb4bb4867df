package gemm

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
)

// Blocking. A task computes a block of at most rowBlock rows of C over at
// most about taskFLOPs; within it, k is cut into blocks of kBlock, so that
// the rows of A a tile reads (rowBlock·kBlock floats, 1 MiB) stay in L2
// and the 4 rows of B it reads (16 KiB) in L1. kBlock also fixes how every
// element's sum is cut (see the package doc), so it is a constant.
const (
	rowBlock  = 255 // a multiple of tileRows
	kBlock    = 1024
	tileRows  = 3
	tileCols  = 4
	taskFLOPs = 32 << 20 // a few ms on one core: how soon a cancelled product stops
)

// MulT computes C = alpha·A·Bᵀ + beta·C for A [m][k] (row stride lda), B
// [n][k] (row stride ldb) and C [m][n] (row stride ldc), all row-major, on
// up to threads goroutines (the caller's and threads−1 more). When beta
// is 0, C is only written. It returns ctx's error, leaving C partly
// written, when ctx is done before the product is.
func MulT(ctx context.Context, threads, m, n, k int, alpha float32, a []float32, lda int, b []float32, ldb int, beta float32, c []float32, ldc int) error {
	checkMatrix("MulT", "A", m, k, a, lda)
	checkMatrix("MulT", "B", n, k, b, ldb)
	if trivial("MulT", m, n, k, alpha, beta, c, ldc) {
		return nil
	}
	p := newPlan(m, n, k, threads)
	return run(ctx, threads, p.tasks(), func(t int) {
		i0, i1, j0, j1 := p.task(t)
		tiles(active, i0, i1, j0, j1, k, alpha, a, lda, b, ldb, beta, c, ldc)
	})
}

// Mul computes C = alpha·A·B + beta·C for A [m][k] (row stride lda), B
// [k][n] (row stride ldb) and C [m][n] (row stride ldc), as MulT does (it
// copies Bᵀ into a pooled scratch matrix and calls MulT).
func Mul(ctx context.Context, threads, m, n, k int, alpha float32, a []float32, lda int, b []float32, ldb int, beta float32, c []float32, ldc int) error {
	checkMatrix("Mul", "A", m, k, a, lda)
	checkMatrix("Mul", "B", k, n, b, ldb)
	if trivial("Mul", m, n, k, alpha, beta, c, ldc) {
		return nil
	}
	bt := getScratch(n * k)
	defer scratch.Put(bt)
	transpose(k, n, b, ldb, *bt, k)
	return MulT(ctx, threads, m, n, k, alpha, a, lda, *bt, k, beta, c, ldc)
}

// checkMatrix panics unless x holds a rows×cols matrix with row stride ld.
func checkMatrix(fn, name string, rows, cols int, x []float32, ld int) {
	switch {
	case rows < 0 || cols < 0:
		panic(fmt.Sprintf("gemm: %s: %s is %d×%d", fn, name, rows, cols))
	case ld < max(1, cols):
		panic(fmt.Sprintf("gemm: %s: %s has row stride %d for %d columns", fn, name, ld, cols))
	case rows > 0 && cols > 0 && len(x) < (rows-1)*ld+cols:
		panic(fmt.Sprintf("gemm: %s: %s of %d×%d (stride %d) in a slice of %d", fn, name, rows, cols, ld, len(x)))
	}
}

// trivial checks C and reports whether the product is done without A
// and B: C is empty, or (k or alpha 0) C = beta·C, which it computes.
func trivial(fn string, m, n, k int, alpha, beta float32, c []float32, ldc int) bool {
	checkMatrix(fn, "C", m, n, c, ldc)
	switch {
	case m == 0 || n == 0:
		return true
	case k == 0 || alpha == 0:
		scale(m, n, beta, c, ldc)
		return true
	}
	return false
}

// scale sets C = beta·C, writing zeros without reading C when beta is 0.
func scale(m, n int, beta float32, c []float32, ldc int) {
	for i := range m {
		row := c[i*ldc : i*ldc+n]
		if beta == 0 {
			clear(row)
			continue
		}
		for j := range row {
			row[j] *= beta
		}
	}
}

// plan cuts C into tasks: rblks blocks of rows × cblks blocks of columns.
type plan struct {
	m, n         int
	rows, cols   int // of a task, but the last ones
	rblks, cblks int
}

// newPlan cuts m×n into blocks of at most rowBlock rows and columns of a
// multiple of tileCols, about taskFLOPs each, and at least one task per
// thread where C has enough columns.
func newPlan(m, n, k, threads int) plan {
	rblks := (m + rowBlock - 1) / rowBlock
	rows := (m + rblks - 1) / rblks
	rows = (rows + tileRows - 1) / tileRows * tileRows
	quads := (n + tileCols - 1) / tileCols
	cblks := max(1, 2*rows*n*k/taskFLOPs)
	// Whole rounds of tasks, so that no thread idles while another does
	// the last one.
	t := max(1, threads)
	cblks = (rblks*cblks + t - 1) / t * t
	cblks = min((cblks+rblks-1)/rblks, quads)
	cols := (quads + cblks - 1) / cblks * tileCols
	return plan{m: m, n: n, rows: rows, cols: cols, rblks: (m + rows - 1) / rows, cblks: (n + cols - 1) / cols}
}

func (p plan) tasks() int { return p.rblks * p.cblks }

// task returns task t's rows [i0, i1) and columns [j0, j1). Consecutive
// tasks share their columns (rows of B).
func (p plan) task(t int) (i0, i1, j0, j1 int) {
	r, c := t%p.rblks, t/p.rblks
	i0, j0 = r*p.rows, c*p.cols
	return i0, min(p.m, i0+p.rows), j0, min(p.n, j0+p.cols)
}

// kernels computes tiles of C = alpha·A·Bᵀ + beta·C over k: rows3 for 3
// rows of A (a, lda), one for 1, each against nr ≤ 4 rows of B (b, ldb),
// writing nr columns of C (c, ldc). Both compute every element the same way.
type kernels struct {
	name       string
	rows3, one func(k int, a []float32, lda int, b []float32, ldb, nr int, c []float32, ldc int, alpha, beta float32)
}

// runnable is the kernels this CPU can run, the portable ones first
// (kernels_amd64.go adds the assembly ones), and active the last of them:
// the widest.
var (
	runnable = []kernels{portable}
	active   = portable
)

// tiles computes rows [i0, i1) × columns [j0, j1) of C = alpha·A·Bᵀ +
// beta·C: for each block of k, for each 4 rows of B (kept in L1), every
// 3 rows of A.
func tiles(kr kernels, i0, i1, j0, j1, k int, alpha float32, a []float32, lda int, b []float32, ldb int, beta float32, c []float32, ldc int) {
	for p0 := 0; p0 < k; p0 += kBlock {
		kb := min(kBlock, k-p0)
		bt := beta
		if p0 > 0 {
			bt = 1
		}
		for j := j0; j < j1; j += tileCols {
			nr := min(tileCols, j1-j)
			bq := b[j*ldb+p0:]
			i := i0
			for ; i+tileRows <= i1; i += tileRows {
				kr.rows3(kb, a[i*lda+p0:], lda, bq, ldb, nr, c[i*ldc+j:], ldc, alpha, bt)
			}
			for ; i < i1; i++ {
				kr.one(kb, a[i*lda+p0:], lda, bq, ldb, nr, c[i*ldc+j:], ldc, alpha, bt)
			}
		}
	}
}

// run calls f(t) for every t in [0, tasks) on up to threads goroutines,
// the caller's among them, checking ctx before each call. It returns
// ctx's error if it stopped before the last task, once every goroutine
// has returned.
func run(ctx context.Context, threads, tasks int, f func(t int)) error {
	if threads <= 1 || tasks == 1 {
		for t := range tasks {
			if err := ctx.Err(); err != nil {
				return err
			}
			f(t)
		}
		return nil
	}
	var next atomic.Int64
	var stopped atomic.Bool
	work := func() {
		for {
			t := int(next.Add(1) - 1)
			if t >= tasks {
				return
			}
			if ctx.Err() != nil {
				stopped.Store(true)
				return
			}
			f(t)
		}
	}
	var wg sync.WaitGroup
	for range min(threads, tasks) - 1 {
		wg.Go(work)
	}
	work()
	wg.Wait()
	if stopped.Load() {
		return ctx.Err()
	}
	return nil
}

// scratch holds Mul's transposed matrices.
var scratch sync.Pool

// getScratch returns a pooled slice of length n; put it back with
// scratch.Put.
func getScratch(n int) *[]float32 {
	s, _ := scratch.Get().(*[]float32)
	if s == nil {
		s = new([]float32)
	}
	if cap(*s) < n {
		*s = make([]float32, n)
	}
	*s = (*s)[:n]
	return s
}

// transpose writes the rows×cols matrix x (row stride ldx) transposed into
// y (row stride ldy), in 8×8 blocks.
func transpose(rows, cols int, x []float32, ldx int, y []float32, ldy int) {
	const blk = 8
	for i0 := 0; i0 < rows; i0 += blk {
		for j0 := 0; j0 < cols; j0 += blk {
			for i := i0; i < min(i0+blk, rows); i++ {
				row := x[i*ldx : i*ldx+cols]
				for j := j0; j < min(j0+blk, cols); j++ {
					y[j*ldy+i] = row[j]
				}
			}
		}
	}
}

// Kernels names the kernels this CPU runs: "avx512" (AVX-512F, AVX2 and
// FMA, in assembly), "avx2" (AVX2 and FMA, in assembly) or "portable" (Go).
func Kernels() string { return active.name }
