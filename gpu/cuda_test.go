//go:build cuda

package gpu

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"

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

// TestDevice runs HBM round trips on CUDA device 0 through the real plugin
// ($KVMESH_CUDA_PLUGIN, or built from ../cmd/kvmesh-cuda). It skips, saying
// why, on a host without a device: it has never run in CI.
func TestDevice(t *testing.T) {
	if _, err := Probe(); err != nil {
		if !errors.Is(err, ErrNoDevice) {
			t.Fatal(err)
		}
		t.Skipf("not run: no CUDA device on this host (%v); the HBM round trips on a GPU run only where one is", err)
	}
	plug := os.Getenv("KVMESH_CUDA_PLUGIN")
	if plug == "" {
		plug = buildPlugin(t, "../cmd/kvmesh-cuda")
	}
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
