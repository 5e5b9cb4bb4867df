package node

import (
	"context"
	"slices"
	"strings"
	"testing"

	"github.com/kvmesh/kvmesh/client"
	"github.com/kvmesh/kvmesh/gpu"
	"github.com/kvmesh/kvmesh/gpu/gpumem"
	"github.com/kvmesh/kvmesh/gpu/gputest"
	"github.com/kvmesh/kvmesh/internal/testkit"
	"github.com/kvmesh/kvmesh/store"
	"github.com/kvmesh/kvmesh/tiers"
)

// fakeGPUs makes the node see one CUDA device, the fakes it returns, for the
// rest of the test.
func fakeGPUs(t *testing.T) (hbm, blas *gputest.Device) {
	hbm, blas = gputest.New(), gputest.New()
	p, o, b := probeGPU, openGPU, openBLAS
	t.Cleanup(func() { probeGPU, openGPU, openBLAS = p, o, b })
	probeGPU = func() (gpu.Info, error) { return gpu.Info{Devices: 1, Driver: 12020}, nil }
	openGPU = func(int, gpu.Options) (tiers.Device, error) { return hbm, nil }
	openBLAS = func(int, gpu.Options) (gpumem.BLAS, error) { return blas, nil }
	return hbm, blas
}

// TestNodeOnGPU: a node with --hbm and --backend cuda over a fake device:
// the engine's products run on the device, its blocks land in the HBM tier
// on top of DRAM and NVMe, a second prefill hits them, and closing the node
// releases both devices. A device ordinal the host lacks is refused before
// anything opens.
func TestNodeOnGPU(t *testing.T) {
	hbmDev, blasDev := fakeGPUs(t)
	cn := openClusterNode(t, t.TempDir(), "gpu", nil, func(o *Options) {
		o.Tiers.HBMBytes = 32 * MiB
		o.Prefill.Backend = BackendCUDA
	})
	ctx := context.Background()
	eng, err := cn.client.Engine(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(eng.Backend, "gpu/blas") {
		t.Fatalf("engine backend %q, want the device backend", eng.Backend)
	}
	tokens := make([]uint32, 3*eng.BlockTokens+5)
	for i := range tokens {
		tokens[i] = uint32(i*7) % uint32(eng.Vocab)
	}
	first, err := cn.client.Prefill(ctx, client.PrefillRequest{Tokens: tokens})
	if err != nil {
		t.Fatal(err)
	}
	if blasDev.Products() == 0 {
		t.Fatal("no product ran on the device")
	}
	testkit.WaitFor(t, "the prompt's blocks published", func() bool {
		return cn.cluster.local.Stats().Puts >= 3
	})
	var hbm store.TierStats
	for _, ts := range cn.cluster.local.Stats().Tiers {
		if ts.Name == "hbm" {
			hbm = ts
		}
	}
	if hbm.Blocks != 3 || hbm.Values != 3 {
		t.Fatalf("HBM tier %+v: want the prompt's 3 blocks", hbm)
	}
	second, err := cn.client.Prefill(ctx, client.PrefillRequest{Tokens: tokens})
	if err != nil {
		t.Fatal(err)
	}
	if second.Usage.CachedTokens != 3*eng.BlockTokens || second.TopTokens[0] != first.TopTokens[0] {
		t.Fatalf("second prefill: %+v, first %+v", second.Usage, first.Usage)
	}
	// The tiers, HBM included, reach the node's stats (and its metrics).
	var tierNames []string
	for _, ts := range cn.cache.Stats().Tiers {
		tierNames = append(tierNames, ts.Name)
	}
	if !slices.Contains(tierNames, "hbm") {
		t.Fatalf("node stats tiers %v, want hbm among them", tierNames)
	}
	cn.stop(t)
	if !hbmDev.Closed() || !blasDev.Closed() {
		t.Fatalf("devices not released on close: hbm %t, blas %t", hbmDev.Closed(), blasDev.Closed())
	}

	_, err = Open(Options{DataDir: t.TempDir(), Tiers: TierOptions{HBMBytes: 32 * MiB}, GPU: 1})
	if err == nil || !strings.Contains(err.Error(), "this host has 1") {
		t.Fatalf("Open on a device the host lacks = %v", err)
	}
}
