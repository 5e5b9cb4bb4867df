//go:build !purego

package gemm

import (
	"fmt"
	"runtime"
	"sync"
	"testing"

	"golang.org/x/sys/cpu"
)

// BenchmarkPeak measures the physical limit of the products: FMAs on
// registers alone (fmaPeak, fmaPeak512), 2 FMA units × 8 (16) lanes × 2
// flops per cycle at the clock the cores run at now, on one goroutine and
// on GOMAXPROCS.
func BenchmarkPeak(b *testing.B) {
	if !cpu.X86.HasAVX2 || !cpu.X86.HasFMA {
		b.Skip("no AVX2 and FMA: the products run the portable kernels")
	}
	const rounds = 1 << 20
	for _, k := range []struct {
		name  string
		flops float64
		f     func(int)
	}{{"avx2", 192, fmaPeak}, {"avx512", 384, fmaPeak512}} {
		if k.name == "avx512" && !cpu.X86.HasAVX512F {
			continue
		}
		for _, t := range []int{1, runtime.GOMAXPROCS(0)} {
			b.Run(fmt.Sprintf("%s/threads=%d", k.name, t), func(b *testing.B) {
				measure(b, float64(t)*k.flops*rounds, func() {
					var wg sync.WaitGroup
					for range t - 1 {
						wg.Go(func() { k.f(rounds) })
					}
					k.f(rounds)
					wg.Wait()
				})
			})
		}
	}
}
