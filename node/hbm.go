package node

import (
	"fmt"

	"github.com/kvmesh/kvmesh/gpu"
	"github.com/kvmesh/kvmesh/tiers"
)

// The GPU as the node reaches it; tests substitute a fake device.
var (
	probeGPU = gpu.Probe
	openGPU  = gpu.Open
	openBLAS = gpu.OpenBLAS
)

// checkHBM refuses the HBM tier that HBMBytes asks for before anything is
// opened when the build has no CUDA or the host no such device (the driver
// is asked; nothing is loaded). A missing or mismatched plugin is found by
// openHBM.
func checkHBM(opts Options) error {
	if opts.Tiers.HBMBytes == 0 {
		return nil
	}
	info, err := probeGPU()
	if err == nil && opts.GPU >= info.Devices {
		err = fmt.Errorf("%w %d: this host has %d", gpu.ErrNoDevice, opts.GPU, info.Devices)
	}
	if err != nil {
		return &OptionError{Field: "Tiers.HBMBytes", Msg: fmt.Sprintf("an HBM tier needs a CUDA device: %v", err)}
	}
	return nil
}

// openHBM opens the HBM tier on CUDA device GPU, of HBMBytes: the top of the
// store's tiers (HBM → DRAM → NVMe; see store.Options.HBM). It returns nil
// when HBMBytes is 0. Its slabs hold the largest block, as DRAM's do.
func openHBM(opts Options) (tiers.Tier, error) {
	if opts.Tiers.HBMBytes == 0 {
		return nil, nil
	}
	bad := func(format string, args ...any) error {
		return &OptionError{Field: "Tiers.HBMBytes", Msg: fmt.Sprintf(format, args...)}
	}
	dev, err := openGPU(opts.GPU, gpu.Options{})
	if err != nil {
		return nil, bad("an HBM tier needs a CUDA device: %v", err)
	}
	hopts := tiers.HBMOptions{Capacity: opts.Tiers.HBMBytes}
	if need := int64(opts.Limits.MaxBlockBytes) + 64; need > tiers.DefaultSlabSize {
		hopts.SlabSize = roundUp(need, 64*KiB)
	}
	h, err := tiers.NewHBM(dev, hopts)
	if err != nil {
		_ = dev.Close()
		return nil, bad("HBM tier of %d bytes on %v: %v", opts.Tiers.HBMBytes, dev, err)
	}
	return h, nil
}
