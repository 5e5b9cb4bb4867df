//go:build !purego

package gemm

import "golang.org/x/sys/cpu"

// avx2 and avx512 are the assembly kernels (kernels_amd64.s): AVX2 and
// FMA on 8 lanes, and AVX-512 on 16.
var avx2 = kernels{
	name: "avx2",
	rows3: func(k int, a []float32, lda int, b []float32, ldb, nr int, c []float32, ldc int, alpha, beta float32) {
		dot3x4(k, &a[0], lda, &b[0], ldb, nr, &c[0], ldc, alpha, beta)
	},
	one: func(k int, a []float32, lda int, b []float32, ldb, nr int, c []float32, ldc int, alpha, beta float32) {
		dot1x4(k, &a[0], lda, &b[0], ldb, nr, &c[0], ldc, alpha, beta)
	},
}

var avx512 = kernels{
	name: "avx512",
	rows3: func(k int, a []float32, lda int, b []float32, ldb, nr int, c []float32, ldc int, alpha, beta float32) {
		dot3x4z(k, &a[0], lda, &b[0], ldb, nr, &c[0], ldc, alpha, beta)
	},
	one: func(k int, a []float32, lda int, b []float32, ldb, nr int, c []float32, ldc int, alpha, beta float32) {
		dot1x4z(k, &a[0], lda, &b[0], ldb, nr, &c[0], ldc, alpha, beta)
	},
}

// init adds the kernels this CPU runs, as golang.org/x/sys/cpu reports
// it (which includes the OS's saving of the vector registers), and makes
// the widest active.
func init() {
	if !cpu.X86.HasAVX2 || !cpu.X86.HasFMA {
		return
	}
	runnable = append(runnable, avx2)
	if cpu.X86.HasAVX512F {
		runnable = append(runnable, avx512)
	}
	active = runnable[len(runnable)-1]
}

// dot3x4 sets c[i·ldc+j] = alpha·Σ_p a[i·lda+p]·b[j·ldb+p] + beta·c[i·ldc+j]
// for i < 3, j < nr ≤ 4, p < k; with beta 0, c is not read. It reads
// rows nr… of B as row nr−1 (rows that may not exist are not read).
//
//go:noescape
func dot3x4(k int, a *float32, lda int, b *float32, ldb int, nr int, c *float32, ldc int, alpha float32, beta float32)

// dot1x4 is dot3x4 of one row of A.
//
//go:noescape
func dot1x4(k int, a *float32, lda int, b *float32, ldb int, nr int, c *float32, ldc int, alpha float32, beta float32)

// dot3x4z and dot1x4z are dot3x4 and dot1x4 with AVX-512: 16 lanes.
//
//go:noescape
func dot3x4z(k int, a *float32, lda int, b *float32, ldb int, nr int, c *float32, ldc int, alpha float32, beta float32)

//go:noescape
func dot1x4z(k int, a *float32, lda int, b *float32, ldb int, nr int, c *float32, ldc int, alpha float32, beta float32)

// fmaPeak runs n rounds of 12 independent 8-lane FMAs (192 flops) on
// registers, reading no memory: the core's arithmetic peak at its present
// clock, the physical limit BenchmarkPeak measures the kernels against.
// fmaPeak512 is the same on 16 lanes (384 flops a round).
//
//go:noescape
func fmaPeak(n int)

//go:noescape
func fmaPeak512(n int)
