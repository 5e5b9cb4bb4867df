package gemm

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"gonum.org/v1/gonum/blas"
	"gonum.org/v1/gonum/blas/gonum"
)

// shape is one product: C [m][n] = alpha·A·op(B) + beta·C with strides
// past each row's end (pad floats), on threads goroutines.
type shape struct {
	m, n, k          int
	padA, padB, padC int
	alpha, beta      float32
	threads          int
}

func (s shape) String() string {
	return fmt.Sprintf("%dx%dx%d pad%d/%d/%d a%g b%g t%d", s.m, s.n, s.k, s.padA, s.padB, s.padC, s.alpha, s.beta, s.threads)
}

// sentinel fills what a product must not touch or must not read: the
// padding past each row of C, and C itself when beta is 0.
var sentinel = float32(math.NaN())

// operands returns random A, B (as MulT takes it, [n][k], or as Mul
// does, [k][n]) and C for s, every padding float set to poison.
func operands(r *rand.Rand, s shape, transB bool, poison float32) (a, b, c []float32, lda, ldb, ldc int) {
	fill := func(rows, cols, pad int) ([]float32, int) {
		ld := max(1, cols+pad)
		x := make([]float32, max(0, rows*ld-(ld-cols)))
		for i := range x {
			if i%ld < cols {
				x[i] = float32(r.NormFloat64())
			} else {
				x[i] = poison
			}
		}
		return x, ld
	}
	a, lda = fill(s.m, s.k, s.padA)
	if transB {
		b, ldb = fill(s.n, s.k, s.padB)
	} else {
		b, ldb = fill(s.k, s.n, s.padB)
	}
	c, ldc = fill(s.m, s.n, s.padC)
	if s.beta == 0 {
		for i := range c {
			c[i] = sentinel
		}
	}
	return a, b, c, lda, ldb, ldc
}

// reference computes the product in float64 and the scale of each
// element's terms (alpha·Σ|a·b| + |beta·c|), against which its error is
// measured.
func reference(s shape, transB bool, a []float32, lda int, b []float32, ldb int, c []float32, ldc int) (want, mag []float64) {
	want, mag = make([]float64, s.m*s.n), make([]float64, s.m*s.n)
	for i := range s.m {
		for j := range s.n {
			var sum, abs float64
			for p := range s.k {
				var bv float32
				if transB {
					bv = b[j*ldb+p]
				} else {
					bv = b[p*ldb+j]
				}
				x := float64(a[i*lda+p]) * float64(bv)
				sum += x
				abs += math.Abs(x)
			}
			w := float64(s.alpha) * sum
			m := math.Abs(float64(s.alpha)) * abs
			if s.beta != 0 {
				w += float64(s.beta) * float64(c[i*ldc+j])
				m += math.Abs(float64(s.beta) * float64(c[i*ldc+j]))
			}
			want[i*s.n+j], mag[i*s.n+j] = w, m
		}
	}
	return want, mag
}

// check runs s through kr (MulT, or Mul when !transB) and compares it
// with the float64 reference; the floats of C outside the m×n matrix
// must be left as they were.
func check(t *testing.T, kr kernels, s shape, transB bool, seed uint64) {
	t.Helper()
	defer func(k kernels) { active = k }(active)
	active = kr
	r := rand.New(rand.NewPCG(seed, 1))
	// Padding holds Inf: a kernel that reads past k or past a row of C
	// turns its result into NaN or Inf.
	a, b, c, lda, ldb, ldc := operands(r, s, transB, float32(math.Inf(1)))
	c0 := slices.Clone(c)
	want, mag := reference(s, transB, a, lda, b, ldb, c0, ldc)
	mul := MulT
	if !transB {
		mul = Mul
	}
	if err := mul(context.Background(), s.threads, s.m, s.n, s.k, s.alpha, a, lda, b, ldb, s.beta, c, ldc); err != nil {
		t.Fatalf("%v: %v", s, err)
	}
	bad := 0
	for i := range s.m {
		for j := range min(ldc, len(c)-i*ldc) {
			got := c[i*ldc+j]
			if j >= s.n {
				if math.Float32bits(got) != math.Float32bits(c0[i*ldc+j]) {
					t.Errorf("%v: C[%d][%d] past n written: %g", s, i, j, got)
				}
				continue
			}
			w, m := want[i*s.n+j], mag[i*s.n+j]
			// float32 sums of k terms: a few ulps of the terms' scale per
			// partial sum, bounded well within 1e-5 for k ≤ a few thousand.
			tol := 1e-6*math.Sqrt(float64(s.k)+1)*m + 1e-30
			if e := math.Abs(float64(got) - w); !(e <= tol) {
				if bad++; bad <= 5 {
					t.Errorf("%v: C[%d][%d] = %g, want %g (error %.2g, tolerance %.2g)", s, i, j, got, w, e, tol)
				}
			}
		}
	}
}

// kernelSets returns the kernels to test: the portable ones, and the
// assembly ones this CPU runs.
func kernelSets() map[string]kernels {
	sets := make(map[string]kernels)
	for _, kr := range runnable {
		sets[kr.name] = kr
	}
	return sets
}

func TestMulTMatchesFloat64(t *testing.T) {
	shapes := []shape{
		{m: 1, n: 1, k: 1, alpha: 1},
		{m: 1, n: 4, k: 8, alpha: 1},
		{m: 1, n: 5, k: 9, alpha: 1, beta: 1},
		{m: 1, n: 37, k: 896, alpha: 1, threads: 2}, // decode: one row
		{m: 2, n: 3, k: 7, alpha: 1, beta: 0.5},     // every tile partial
		{m: 3, n: 4, k: 16, alpha: 1},               // one whole tile
		{m: 4, n: 9, k: 15, alpha: -0.3, beta: 1},   // a row and a column past the tiles
		{m: 7, n: 13, k: 33, padA: 3, padB: 5, padC: 2, alpha: 1, beta: 1},
		{m: 13, n: 64, k: 64, padB: 64, alpha: 0.125},                   // attention's scores: K's stride
		{m: 31, n: 50, k: 1030, padA: 1, alpha: 1, beta: 1, threads: 3}, // k past one block
		{m: 40, n: 96, k: 2049, padC: 7, alpha: 1, threads: 2},          // three blocks of k, a tail
		{m: 300, n: 23, k: 40, alpha: 1, beta: -2, threads: 2},          // two blocks of rows
		{m: 5, n: 0, k: 3, alpha: 1},
		{m: 0, n: 5, k: 3, alpha: 1},
		{m: 3, n: 5, k: 0, alpha: 1, beta: 0.5}, // C = beta·C
		{m: 3, n: 5, k: 4, alpha: 0, beta: 0},   // C = 0, A·B not needed
	}
	for name, kr := range kernelSets() {
		for i, s := range shapes {
			t.Run(fmt.Sprintf("%s/%v", name, s), func(t *testing.T) { check(t, kr, s, true, uint64(i)) })
		}
	}
}

func TestMulMatchesFloat64(t *testing.T) {
	shapes := []shape{
		{m: 1, n: 1, k: 1, alpha: 1},
		{m: 5, n: 64, k: 200, padB: 64, alpha: 1, beta: 1}, // attention's scores·V: V's stride
		{m: 9, n: 7, k: 13, padA: 2, padC: 1, alpha: -1, beta: 0.25, threads: 2},
		{m: 256, n: 64, k: 256, padB: 64, alpha: 1, beta: 1},
	}
	for name, kr := range kernelSets() {
		for i, s := range shapes {
			t.Run(fmt.Sprintf("%s/%v", name, s), func(t *testing.T) { check(t, kr, s, false, uint64(i)) })
		}
	}
}

// TestRandomShapes: random sizes, strides, alpha, beta and threads,
// both forms, both kernels.
func TestRandomShapes(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 7))
	betas := []float32{0, 1, 0.5, -1}
	for i := range 100 {
		s := shape{
			m: 1 + r.IntN(40), n: 1 + r.IntN(40), k: 1 + r.IntN(300),
			padA: r.IntN(3) * r.IntN(9), padB: r.IntN(3) * r.IntN(9), padC: r.IntN(3) * r.IntN(9),
			alpha: []float32{1, 1, -0.5, 2}[r.IntN(4)], beta: betas[r.IntN(len(betas))],
			threads: 1 + r.IntN(3),
		}
		if i%10 == 0 {
			s.m = 1 // decode
		}
		for name, kr := range kernelSets() {
			check(t, kr, s, i%3 != 0, uint64(100+i))
			if t.Failed() {
				t.Fatalf("%s kernels failed on %v", name, s)
			}
		}
	}
}

// TestAgreesWithGonum: the products equal gonum's Sgemm's on the
// engine's shapes, to float32 rounding.
func TestAgreesWithGonum(t *testing.T) {
	var g gonum.Implementation
	r := rand.New(rand.NewPCG(3, 4))
	for _, s := range []shape{
		{m: 16, n: 1152, k: 896},        // Q, K, V
		{m: 16, n: 200, k: 4864},        // down
		{m: 1, n: 4864, k: 896},         // decode
		{m: 48, n: 64, k: 256, padB: 8}, // scores·V (Mul)
	} {
		for _, transB := range []bool{true, false} {
			s.alpha, s.beta, s.threads = 1, 1, 2
			a, b, c, lda, ldb, ldc := operands(r, s, transB, 0)
			want := slices.Clone(c)
			tb, mul := blas.Trans, MulT
			if !transB {
				tb, mul = blas.NoTrans, Mul
			}
			g.Sgemm(blas.NoTrans, tb, s.m, s.n, s.k, 1, a, lda, b, ldb, 1, want, ldc)
			if err := mul(context.Background(), 2, s.m, s.n, s.k, 1, a, lda, b, ldb, 1, c, ldc); err != nil {
				t.Fatal(err)
			}
			var num, den float64
			for i := range c {
				num += math.Abs(float64(c[i] - want[i]))
				den += math.Abs(float64(want[i]))
			}
			if e := num / den; e > 1e-5 {
				t.Errorf("%v (transB %v): mean relative difference from gonum %.2g", s, transB, e)
			}
		}
	}
}

// TestSameElementEverywhere: an element does not depend on where it is
// computed: a row of A alone (decode) gives exactly the bits it gives
// among others (prefill), whatever the threads, and so does a column.
func TestSameElementEverywhere(t *testing.T) {
	for name, kr := range kernelSets() {
		t.Run(name, func(t *testing.T) {
			defer func(k kernels) { active = k }(active)
			active = kr
			r := rand.New(rand.NewPCG(9, 9))
			s := shape{m: 130, n: 70, k: 2100, alpha: 1, beta: 1}
			a, b, c, lda, ldb, ldc := operands(r, s, true, 0)
			c0 := slices.Clone(c)
			ctx := context.Background()
			if err := MulT(ctx, 2, s.m, s.n, s.k, 1, a, lda, b, ldb, 1, c, ldc); err != nil {
				t.Fatal(err)
			}
			for _, i := range []int{0, 1, 2, 64, 128, 129} {
				row := slices.Clone(c0[i*ldc : i*ldc+s.n])
				if err := MulT(ctx, 1, 1, s.n, s.k, 1, a[i*lda:], lda, b, ldb, 1, row, s.n); err != nil {
					t.Fatal(err)
				}
				if !slices.Equal(row, c[i*ldc:i*ldc+s.n]) {
					t.Errorf("row %d alone differs from row %d of the whole product", i, i)
				}
			}
			for _, j0 := range []int{0, 3, 65} {
				sub := make([]float32, s.m*2)
				for i := range s.m {
					copy(sub[i*2:], c0[i*ldc+j0:i*ldc+j0+2])
				}
				if err := MulT(ctx, 3, s.m, 2, s.k, 1, a, lda, b[j0*ldb:], ldb, 1, sub, 2); err != nil {
					t.Fatal(err)
				}
				for i := range s.m {
					if sub[i*2] != c[i*ldc+j0] || sub[i*2+1] != c[i*ldc+j0+1] {
						t.Fatalf("columns %d, %d alone differ from the whole product's at row %d", j0, j0+1, i)
					}
				}
			}
		})
	}
}

// TestNaNPropagates: a NaN or an Inf in A reaches the elements it feeds,
// as in any product; the masked tail does not hide it.
func TestNaNPropagates(t *testing.T) {
	for name, kr := range kernelSets() {
		defer func(k kernels) { active = k }(active)
		active = kr
		s := shape{m: 4, n: 5, k: 11}
		r := rand.New(rand.NewPCG(1, 2))
		a, b, c, lda, ldb, ldc := operands(r, s, true, 0)
		a[2*lda+10] = float32(math.NaN()) // row 2, in k's tail
		if err := MulT(context.Background(), 1, s.m, s.n, s.k, 1, a, lda, b, ldb, 0, c, ldc); err != nil {
			t.Fatal(err)
		}
		for i := range s.m {
			for j := range s.n {
				if nan := math.IsNaN(float64(c[i*ldc+j])); nan != (i == 2) {
					t.Errorf("%s: C[%d][%d] = %g", name, i, j, c[i*ldc+j])
				}
			}
		}
	}
}

// TestCancel: a product on a done context stops before it starts and
// says why; C is left alone.
func TestCancel(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	s := shape{m: 64, n: 512, k: 512, beta: 1}
	a, b, c, lda, ldb, ldc := operands(rand.New(rand.NewPCG(1, 1)), s, true, 0)
	c0 := slices.Clone(c)
	for _, threads := range []int{1, 2} {
		if err := MulT(ctx, threads, s.m, s.n, s.k, 1, a, lda, b, ldb, 1, c, ldc); !errors.Is(err, context.Canceled) {
			t.Errorf("threads %d: %v, want context.Canceled", threads, err)
		}
		if err := Mul(ctx, threads, s.m, s.n, s.k, 1, a, lda, b[:s.k*s.n], s.n, 1, c, ldc); !errors.Is(err, context.Canceled) {
			t.Errorf("Mul, threads %d: %v, want context.Canceled", threads, err)
		}
	}
	if !slices.Equal(c, c0) {
		t.Error("a cancelled product wrote C")
	}
}

// TestPlanCoversC: the tasks cover C once, in whole tiles but at its
// edges, and give every thread work when there are columns enough.
func TestPlanCoversC(t *testing.T) {
	for _, c := range []struct{ m, n, k, threads int }{
		{1, 4864, 896, 2}, {128, 896, 896, 2}, {128, 9728, 896, 2}, {512, 896, 4864, 2},
		{7, 5, 3, 4}, {1, 3, 1, 2}, {1, 151936, 896, 3}, {600, 4864, 896, 3}, {256, 64, 256, 1},
	} {
		p := newPlan(c.m, c.n, c.k, c.threads)
		seen := make([]int, c.m*c.n)
		for task := range p.tasks() {
			i0, i1, j0, j1 := p.task(task)
			if i0 >= i1 || j0 >= j1 || j0%tileCols != 0 {
				t.Fatalf("%+v: task %d is rows [%d,%d) columns [%d,%d)", c, task, i0, i1, j0, j1)
			}
			if 2*(i1-i0)*(j1-j0)*c.k > 2*taskFLOPs && j1-j0 > tileCols {
				t.Errorf("%+v: task %d of %d FLOPs", c, task, 2*(i1-i0)*(j1-j0)*c.k)
			}
			for i := i0; i < i1; i++ {
				for j := j0; j < j1; j++ {
					seen[i*c.n+j]++
				}
			}
		}
		if slices.ContainsFunc(seen, func(v int) bool { return v != 1 }) {
			t.Errorf("%+v: tasks do not cover C exactly once", c)
		}
		if want := min(c.threads, (c.n+tileCols-1)/tileCols); p.tasks() < want {
			t.Errorf("%+v: %d tasks for %d threads", c, p.tasks(), c.threads)
		}
	}
}

func TestMalformedPanics(t *testing.T) {
	x := make([]float32, 16)
	for _, c := range []struct {
		name string
		f    func()
		want string
	}{
		{"short A", func() { _ = MulT(context.Background(), 1, 3, 2, 4, 1, x[:11], 4, x, 4, 0, x, 2) }, "A of 3×4"},
		{"stride below k", func() { _ = MulT(context.Background(), 1, 2, 2, 4, 1, x, 3, x, 4, 0, x, 2) }, "row stride 3"},
		{"short C", func() { _ = Mul(context.Background(), 1, 2, 4, 2, 1, x, 2, x, 4, 0, x[:7], 4) }, "C of 2×4"},
		{"negative", func() { _ = MulT(context.Background(), 1, -1, 2, 2, 1, x, 2, x, 2, 0, x, 2) }, "-1×2"},
	} {
		func() {
			defer func() {
				if r := recover(); r == nil || !strings.Contains(fmt.Sprint(r), c.want) {
					t.Errorf("%s: panic %v, want one naming %q", c.name, r, c.want)
				}
			}()
			c.f()
		}()
	}
}
