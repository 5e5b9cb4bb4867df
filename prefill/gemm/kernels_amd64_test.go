//go:build !purego

package gemm

import (
	"os"
	"strings"
	"testing"

	"golang.org/x/sys/cpu"

	"github.com/kvmesh/kvmesh/internal/testkit"
)

// TestKernelsFollowCPU: the products run the widest kernels the CPU has,
// as golang.org/x/sys/cpu reports it: without AVX-512F the AVX2 ones,
// without AVX2 or FMA the portable ones, and the products are still right.
// GODEBUG=cpu.avx512f=off (cpu.avx2=off, cpu.fma=off) makes this machine
// such a CPU for a child process.
func TestKernelsFollowCPU(t *testing.T) {
	const wantEnv = "GEMM_TEST_WANT_KERNELS"
	if testkit.InChild(t) {
		if want := os.Getenv(wantEnv); Kernels() != want {
			t.Fatalf("the products run the %q kernels, want %q", Kernels(), want)
		}
		check(t, active, shape{m: 7, n: 13, k: 33, padA: 1, alpha: 1, beta: 1, threads: 2}, true, 1)
		return
	}
	avx2 := cpu.X86.HasAVX2 && cpu.X86.HasFMA
	want := "portable"
	switch {
	case avx2 && cpu.X86.HasAVX512F:
		want = "avx512"
	case avx2:
		want = "avx2"
	}
	if Kernels() != want {
		t.Errorf("the products run the %q kernels, want %q", Kernels(), want)
	}
	for _, c := range []struct{ godebug, want string }{
		{"cpu.avx512f=off", map[bool]string{true: "avx2", false: "portable"}[avx2]},
		{"cpu.avx2=off", "portable"},
		{"cpu.fma=off", "portable"},
	} {
		cmd := testkit.Child(t)
		cmd.Args = append(cmd.Args, "-test.v")
		cmd.Env = append(cmd.Env, "GODEBUG="+c.godebug, wantEnv+"="+c.want)
		out, err := cmd.CombinedOutput()
		if err != nil || !strings.Contains(string(out), "--- PASS: "+t.Name()) {
			t.Errorf("GODEBUG=%s: %v\n%s", c.godebug, err, out)
		}
	}
}
