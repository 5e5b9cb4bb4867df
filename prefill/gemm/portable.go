package gemm

// portable is the kernels in Go, for CPUs without the assembly ones: each
// element a plain sum over k in order, 4 of them at a time.
var portable = kernels{name: "portable", rows3: portable3, one: portable1}

func portable3(k int, a []float32, lda int, b []float32, ldb, nr int, c []float32, ldc int, alpha, beta float32) {
	for i := range tileRows {
		portable1(k, a[i*lda:], lda, b, ldb, nr, c[i*ldc:], ldc, alpha, beta)
	}
}

func portable1(k int, a []float32, _ int, b []float32, ldb, nr int, c []float32, _ int, alpha, beta float32) {
	ar := a[:k]
	var s [tileCols]float32
	if nr == tileCols {
		b0, b1, b2, b3 := b[:k], b[ldb:ldb+k], b[2*ldb:2*ldb+k], b[3*ldb:3*ldb+k]
		var s0, s1, s2, s3 float32
		for p, x := range ar {
			s0 += x * b0[p]
			s1 += x * b1[p]
			s2 += x * b2[p]
			s3 += x * b3[p]
		}
		s = [tileCols]float32{s0, s1, s2, s3}
	} else {
		for j := range nr {
			br := b[j*ldb : j*ldb+k]
			var sj float32
			for p, x := range ar {
				sj += x * br[p]
			}
			s[j] = sj
		}
	}
	for j := range nr {
		if beta == 0 {
			c[j] = alpha * s[j]
		} else {
			c[j] = alpha*s[j] + beta*c[j]
		}
	}
}
