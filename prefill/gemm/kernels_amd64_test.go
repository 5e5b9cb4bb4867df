//go:build !purego

package gemm

import (
	"strings"
	"testing"

	"golang.org/x/sys/cpu"

	"github.com/kvmesh/kvmesh/internal/testkit"
)

// TestFallsBackWithoutAVX2: a CPU without AVX2 or without FMA, as
// golang.org/x/sys/cpu reports it, runs the portable kernels, and its
// products are still right. GODEBUG=cpu.avx2=off (or cpu.fma=off) makes
// this machine such a CPU for a child process.
func TestFallsBackWithoutAVX2(t *testing.T) {
	if testkit.InChild(t) {
		if Kernels() != "portable" {
			t.Fatalf("without AVX2 or FMA the products run the %q kernels", Kernels())
		}
		check(t, active, shape{m: 7, n: 13, k: 33, padA: 1, alpha: 1, beta: 1, threads: 2}, true, 1)
		return
	}
	if cpu.X86.HasAVX2 && cpu.X86.HasFMA && Kernels() != "avx2" {
		t.Errorf("with AVX2 and FMA the products run the %q kernels", Kernels())
	}
	for _, off := range []string{"cpu.avx2=off", "cpu.fma=off"} {
		cmd := testkit.Child(t)
		cmd.Args = append(cmd.Args, "-test.v")
		cmd.Env = append(cmd.Env, "GODEBUG="+off)
		out, err := cmd.CombinedOutput()
		if err != nil || !strings.Contains(string(out), "--- PASS: "+t.Name()) {
			t.Errorf("GODEBUG=%s: %v\n%s", off, err, out)
		}
	}
}
