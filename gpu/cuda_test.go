//go:build cuda

package gpu

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"gonum.org/v1/gonum/blas"
	"gonum.org/v1/gonum/blas/gonum"

	"github.com/kvmesh/kvmesh/prefill"
	"github.com/kvmesh/kvmesh/prefill/prefilltest"
	"github.com/kvmesh/kvmesh/prefixhash"
	"github.com/kvmesh/kvmesh/tiers"
)

// buildPlugin builds the plugin in dir pkg with the go command that runs
// this test, and returns its path.
func buildPlugin(t *testing.T, pkg string) string {
	t.Helper()
	gocmd, err := exec.LookPath("go")
	if err != nil {
		t.Skipf("no go command to build the plugin: %v", err)
	}
	out := filepath.Join(t.TempDir(), filepath.Base(pkg)+".so")
	cmd := exec.Command(gocmd, "build", "-tags", "cuda", "-buildmode=plugin", "-o", out, pkg)
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build the plugin %s: %v\n%s", pkg, err, b)
	}
	return out
}

// TestLoadPlugin: a plugin built from this tree with this toolchain loads
// into a cuda build and its Open, typed with tiers.Device, is called. The
// stand-in plugin does not link gorgonia.org/cu, so this runs on any host;
// the real one is loaded by TestDevice where a GPU is.
func TestLoadPlugin(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a plugin")
	}
	open, err := load(buildPlugin(t, "./testdata/fakeplugin"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := open(3); err == nil || !strings.Contains(err.Error(), "no device 3") {
		t.Fatalf("the plugin's Open(3) = %v", err)
	}
	if _, err := load(filepath.Join(t.TempDir(), "missing.so")); err == nil || !strings.Contains(err.Error(), "-buildmode=plugin") {
		t.Fatalf("load of a missing plugin = %v, want an error that says how to build it", err)
	}
}

// TestDevice runs the real plugin ($KVMESH_CUDA_PLUGIN, or built from
// ../cmd/kvmesh-cuda) on CUDA device 0: HBM round trips, cuBLAS products
// against gonum's, the prefill engine's device backend against its CPU
// backend, and Hugging Face checkpoints on it against PyTorch. It skips, saying why, on a host without a device: it has never
// run in CI.
func TestDevice(t *testing.T) {
	if _, err := Probe(); err != nil {
		if !errors.Is(err, ErrNoDevice) {
			t.Fatal(err)
		}
		t.Skipf("not run: no CUDA device on this host (%v); the HBM round trips, cuBLAS products and prefill on a GPU run only where one is", err)
	}
	plug := os.Getenv("KVMESH_CUDA_PLUGIN")
	if plug == "" {
		plug = buildPlugin(t, "../cmd/kvmesh-cuda")
	}
	t.Run("hbm", func(t *testing.T) { testHBM(t, plug) })
	t.Run("sgemm", func(t *testing.T) { testSgemm(t, plug) })
	t.Run("prefill", func(t *testing.T) { testPrefill(t, plug) })
	t.Run("checkpoints", func(t *testing.T) { testCheckpoints(t, plug) })
}

// testCheckpoints: a small random checkpoint of each architecture, written
// by the independent PyTorch implementation of prefill/prefilltest, loads
// on the device backend and computes PyTorch's logits within 1e-3 of their
// scale, cold and over a prefix computed before.
func testCheckpoints(t *testing.T, plug string) {
	const n = 150
	out := t.TempDir()
	models := prefilltest.Archs(n)
	refs := prefilltest.Suite(t, out, models)
	dev, err := OpenBLAS(0, Options{Plugin: plug})
	if err != nil {
		t.Fatal(err)
	}
	b, err := prefill.NewDevice(dev, prefill.DeviceOptions{})
	if err != nil {
		dev.Close()
		t.Fatal(err)
	}
	defer func() {
		if err := b.Close(); err != nil {
			t.Error(err)
		}
	}()
	ctx := context.Background()
	for i, m := range models {
		dir := filepath.Join(out, m.Name)
		c, info, err := prefill.LoadConfigJSON(filepath.Join(dir, "config.json"))
		if err != nil {
			t.Fatal(err)
		}
		w, err := prefill.LoadCheckpoint(dir, c, info.TieEmbeddings)
		if err != nil {
			t.Fatal(err)
		}
		model, err := b.Load(c, w)
		if err != nil {
			t.Fatal(err)
		}
		cold, warm := make([]float32, c.Vocab), make([]float32, c.Vocab)
		if err := model.Forward(ctx, prefill.NewKV(c, n), 0, m.Prompt, cold); err != nil {
			t.Fatal(err)
		}
		kv := prefill.NewKV(c, n)
		if err := model.Forward(ctx, kv, 0, m.Prompt[:100], make([]float32, c.Vocab)); err != nil {
			t.Fatal(err)
		}
		if err := model.Forward(ctx, kv, 100, m.Prompt[100:], warm); err != nil {
			t.Fatal(err)
		}
		for what, l := range map[string][]float32{"cold": cold, "over a prefix": warm} {
			if e := prefilltest.MaxRelErr(l, refs[i][n-1]); e > 1e-3 {
				t.Errorf("%s, %s: device logits differ from PyTorch's by %.2g of their scale", m.Name, what, e)
			}
		}
		if err := model.Close(); err != nil {
			t.Error(err)
		}
		w.Release()
	}
}

// testHBM: values of many sizes through an HBM tier, device-to-device
// copies, concurrent lanes, evacuation.
func testHBM(t *testing.T, plug string) {
	dev, err := Open(0, Options{Plugin: plug})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("device: %v", dev)
	const slab = 1 << 20
	h, err := tiers.NewHBM(dev, tiers.HBMOptions{Capacity: 8 * slab, SlabSize: slab, StagingBytes: 64 << 10, Lanes: 3})
	if err != nil {
		dev.Close()
		t.Fatal(err)
	}
	defer func() {
		if err := h.Close(); err != nil {
			t.Error(err)
		}
	}()

	// Put and read back values smaller and larger than a staging half.
	locs := map[tiers.Loc][]byte{}
	for i, n := range []int{0, 1, 4096, 32 << 10, 100 << 10, 900 << 10} {
		val := bytes.Repeat([]byte{byte(i + 1), 0x5a, byte(n)}, n/3+1)[:n]
		loc, err := h.Put(prefixhash.Key{byte(i)}, val)
		if err != nil {
			t.Fatalf("Put %d bytes: %v", n, err)
		}
		locs[loc] = val
	}
	for loc, val := range locs {
		got := make([]byte, len(val))
		if err := h.Read(loc, got); err != nil || !bytes.Equal(got, val) {
			t.Fatalf("Read %d bytes: %v, equal %t", len(val), err, bytes.Equal(got, val))
		}
	}

	// Device to device, into a buffer of the device's own (an engine's KV
	// buffer), read back through a stream and pinned memory.
	for loc, val := range locs {
		if len(val) != 100<<10 {
			continue
		}
		scratch, err := dev.Alloc(int64(len(val)))
		if err != nil {
			t.Fatal(err)
		}
		if err := h.CopyTo(loc, scratch, len(val)); err != nil {
			t.Fatal(err)
		}
		pinned, err := dev.HostAlloc(len(val))
		if err != nil {
			t.Fatal(err)
		}
		s, err := dev.NewStream()
		if err != nil {
			t.Fatal(err)
		}
		if err := s.DtoH(pinned, scratch); err != nil {
			t.Fatal(err)
		}
		if err := s.Wait(); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(pinned, val) {
			t.Fatal("CopyTo moved other bytes")
		}
		for _, err := range []error{s.Close(), dev.HostFree(pinned), dev.Free(scratch)} {
			if err != nil {
				t.Fatal(err)
			}
		}
	}

	// More goroutines than lanes: every value comes back whole.
	var wg sync.WaitGroup
	errs := make(chan error, 6)
	for g := range 6 {
		wg.Go(func() {
			for i := range 20 {
				val := bytes.Repeat([]byte{byte(g), byte(i), 0xc3}, 1000+g*7000+i)
				loc, err := h.Put(prefixhash.Key{0x80 | byte(g), byte(i)}, val)
				if err != nil {
					errs <- err
					return
				}
				got := make([]byte, len(val))
				err = h.Read(loc, got)
				h.Free(loc)
				if err != nil || !bytes.Equal(got, val) {
					errs <- fmt.Errorf("goroutine %d value %d: %v, equal %t", g, i, err, bytes.Equal(got, val))
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}

	// Evacuate names keys read back from the device; freeing them empties
	// the slab.
	recs := h.Evacuate(-1)
	if len(recs) == 0 {
		t.Fatal("Evacuate named nothing")
	}
	for _, r := range recs {
		if r.Key[0] > 5 {
			t.Fatalf("Evacuate read key %x from the device", r.Key)
		}
		h.Free(r.Loc)
	}
	if s := h.Stats(); s.Values != int64(len(locs)-len(recs)) {
		t.Fatalf("after evacuation: %+v", s)
	}
}

// testSgemm: cuBLAS's row-major products, every transposition and strides
// wider than the rows, equal gonum's on the host.
func testSgemm(t *testing.T, plug string) {
	dev, err := OpenBLAS(0, Options{Plugin: plug})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := dev.Close(); err != nil {
			t.Error(err)
		}
	}()
	s, err := dev.NewStream()
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	rng := rand.New(rand.NewPCG(1, 2))
	const m, n, k, pad = 37, 53, 71, 3
	for _, tr := range [][2]bool{{false, false}, {false, true}, {true, false}, {true, true}} {
		ar, ac := m, k
		if tr[0] {
			ar, ac = k, m
		}
		br, bc := k, n
		if tr[1] {
			br, bc = n, k
		}
		lda, ldb, ldc := ac+pad, bc+pad, n+pad
		mats := [][]float32{make([]float32, ar*lda), make([]float32, br*ldb), make([]float32, m*ldc)}
		for _, x := range mats {
			for i := range x {
				x[i] = rng.Float32()*2 - 1
			}
		}
		want := slices.Clone(mats[2])
		op := func(t bool) blas.Transpose {
			if t {
				return blas.Trans
			}
			return blas.NoTrans
		}
		gonum.Implementation{}.Sgemm(op(tr[0]), op(tr[1]), m, n, k, 0.5, mats[0], lda, mats[1], ldb, 0.25, want, ldc)

		var ptrs []tiers.DevicePtr
		var pinned [][]byte
		for _, x := range mats {
			p, err := dev.Alloc(int64(4 * len(x)))
			if err != nil {
				t.Fatal(err)
			}
			defer dev.Free(p)
			h, err := dev.HostAlloc(4 * len(x))
			if err != nil {
				t.Fatal(err)
			}
			defer dev.HostFree(h)
			for i, v := range x {
				binary.LittleEndian.PutUint32(h[4*i:], math.Float32bits(v))
			}
			if err := s.HtoD(p, h); err != nil {
				t.Fatal(err)
			}
			ptrs, pinned = append(ptrs, p), append(pinned, h)
		}
		if err := dev.Sgemm(s, tr[0], tr[1], m, n, k, 0.5, ptrs[0], lda, ptrs[1], ldb, 0.25, ptrs[2], ldc); err != nil {
			t.Fatal(err)
		}
		if err := s.DtoH(pinned[2], ptrs[2]); err != nil {
			t.Fatal(err)
		}
		if err := s.Wait(); err != nil {
			t.Fatal(err)
		}
		for i, w := range want {
			got := math.Float32frombits(binary.LittleEndian.Uint32(pinned[2][4*i:]))
			if math.Abs(float64(got-w)) > 1e-4*(1+math.Abs(float64(w))) {
				t.Fatalf("trans %v: C[%d] = %g, gonum says %g", tr, i, got, w)
			}
		}
	}
}

// testPrefill: the device backend's logits are within 1e-3 (relative to
// their scale) of the CPU backend's, on the demo model and on a random
// 4-layer model, cold and over a prefix computed before.
func testPrefill(t *testing.T, plug string) {
	dev, err := OpenBLAS(0, Options{Plugin: plug})
	if err != nil {
		t.Fatal(err)
	}
	gpuB, err := prefill.NewDevice(dev, prefill.DeviceOptions{})
	if err != nil {
		dev.Close()
		t.Fatal(err)
	}
	defer func() {
		if err := gpuB.Close(); err != nil {
			t.Error(err)
		}
	}()
	cpuB, err := prefill.NewCPU(prefill.CPUOptions{})
	if err != nil {
		t.Fatal(err)
	}
	four := prefill.Config{Layers: 4, Dim: 256, Heads: 8, KVHeads: 2, HeadDim: 32, FFNDim: 512, Vocab: 1000,
		MaxContext: 4096, BlockTokens: 16, RopeTheta: 500000}
	four.EnsureDefaults()
	for name, c := range map[string]prefill.Config{"demo": prefill.DefaultConfig(), "4 layers": four} {
		w := prefill.SeededWeights(c, 99)
		ref, err := cpuB.Load(c, w)
		if err != nil {
			t.Fatal(err)
		}
		m, err := gpuB.Load(c, w)
		if err != nil {
			t.Fatal(err)
		}
		rng := rand.New(rand.NewPCG(3, 4))
		for _, n := range []int{1, 100, 1500} {
			tokens := make([]uint32, n)
			for i := range tokens {
				tokens[i] = uint32(rng.IntN(c.Vocab))
			}
			want, got, warm := make([]float32, c.Vocab), make([]float32, c.Vocab), make([]float32, c.Vocab)
			ctx := context.Background()
			if err := ref.Forward(ctx, prefill.NewKV(c, n), 0, tokens, want); err != nil {
				t.Fatal(err)
			}
			if err := m.Forward(ctx, prefill.NewKV(c, n), 0, tokens, got); err != nil {
				t.Fatal(err)
			}
			kv := prefill.NewKV(c, n)
			split := n / 2
			if split > 0 {
				if err := m.Forward(ctx, kv, 0, tokens[:split], make([]float32, c.Vocab)); err != nil {
					t.Fatal(err)
				}
			}
			if err := m.Forward(ctx, kv, split, tokens[split:], warm); err != nil {
				t.Fatal(err)
			}
			for what, l := range map[string][]float32{"cold": got, "over a prefix": warm} {
				if e := relErr(l, want); e > 1e-3 {
					t.Errorf("%s, %d tokens, %s: device logits differ from the CPU's by %.2g (relative)", name, n, what, e)
				}
			}
		}
		for _, x := range []prefill.Model{m, ref} {
			if err := x.Close(); err != nil {
				t.Error(err)
			}
		}
	}
}

// relErr is max|a−b| / max|b|.
func relErr(a, b []float32) float64 {
	var diff, scale float64
	for i := range b {
		diff = max(diff, math.Abs(float64(a[i])-float64(b[i])))
		scale = max(scale, math.Abs(float64(b[i])))
	}
	return diff / scale
}
