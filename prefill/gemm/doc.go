// Package gemm multiplies float32 matrices on the CPU: the products of the
// prefill engine's CPU backend, C = alpha·A·Bᵀ + beta·C (MulT: a linear
// layer, A the activations [m][k], B a weight matrix [n][k], both
// row-major) and C = alpha·A·B + beta·C (Mul: attention's scores times V).
//
// # How
//
// MulT is a dot-product GEMM, as llamafile's tinyBLAS is: the weights are
// stored [n][k], so each output element is the dot product of two
// contiguous rows, and a register-blocked kernel computes a 3×4 tile of C
// (3 rows of A against 4 rows of B: twelve partial sums in vector
// registers, 7 loads for 12 FMAs) over a block of k, then sums each lane
// vector and writes alpha·sum + beta·C. Nothing is packed or transposed:
// a block of 4 rows of B stays in L1 while the rows of A stream past it from
// L2 (kBlock bounds the block of A that has to fit there). The amd64
// kernels are Go assembly, chosen at run time with golang.org/x/sys/cpu:
// AVX-512 (16 lanes) where the CPU has AVX-512F, AVX2 and FMA (8 lanes)
// where it has those; elsewhere, or on an amd64 with neither, a portable
// Go kernel does the same tiles (Kernels names the kernels in use; the
// build tag purego leaves the assembly out). Mul transposes B into a
// pooled scratch matrix and calls MulT: its users multiply by small
// matrices.
//
// # Results
//
// Every element of C is computed the same way wherever it falls: the same
// lane partial sums over the same blocks of k, the same reduction, the
// same rounding of alpha and beta, whatever m, n, the tile it lands in, the
// threads or the cut into tasks. So a row of activations multiplied alone
// (decoding one token) gives exactly what it gives among 511 others (a
// prefill), and the K/V a prefix hit loads equal those a cold prefill
// computes on a machine with the same kernels. The order of the sums
// differs from a plain loop's, and between the kernels (8 or 16 lanes, or
// the portable kernel's one), by the usual float32 rounding.
//
// # Concurrency
//
// MulT and Mul split C into tasks of at most about taskFLOPs (ranges of
// rows and columns) that up to threads goroutines, the caller's included,
// take from a shared counter; they check ctx before each task and return
// its error, leaving C partly written, when it is done before the last.
// They return only when every goroutine they started has stopped. Calls
// are independent: any number may run at once on distinct outputs.
// Malformed shapes (a stride shorter than a row, a slice too short for
// its matrix) are bugs and panic, as gonum's BLAS does.
package gemm
