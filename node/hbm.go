package node

import (
	"fmt"

	"github.com/kvmesh/kvmesh/gpu"
	"github.com/kvmesh/kvmesh/tiers"
)

// checkHBM decides whether the node can have the HBM tier that HBMBytes
// asks for, before anything else is opened, and returns an OptionError that
// says why not. A build without CUDA and a host without the device are
// refused with gpu's reason. On a host with the device, the GPU plugin is
// loaded and the tier is opened and closed again, so that a GPU host proves
// the device, the plugin and the allocation work; then it is refused all the
// same, because store.Local has two tiers (DRAM, NVMe) and places nothing in
// HBM yet. Serving with HBM needs the store to take a third, faster tier:
// writes into HBM, pressure demoting HBM → DRAM → NVMe, hits promoting.
func checkHBM(opts Options) error {
	if opts.HBMBytes == 0 {
		return nil
	}
	bad := func(format string, args ...any) error {
		return &OptionError{Field: "HBMBytes", Msg: fmt.Sprintf(format, args...)}
	}
	dev, err := gpu.Open(opts.GPU, gpu.Options{})
	if err != nil {
		return bad("an HBM tier needs a CUDA device: %v", err)
	}
	hopts := tiers.HBMOptions{Capacity: opts.HBMBytes}
	if need := int64(opts.MaxBlockBytes) + 64; need > tiers.DefaultSlabSize {
		hopts.SlabSize = roundUp(need, 64*KiB)
	}
	h, err := tiers.NewHBM(dev, hopts)
	if err != nil {
		_ = dev.Close()
		return bad("HBM tier of %d bytes on %v: %v", opts.HBMBytes, dev, err)
	}
	if err := h.Close(); err != nil {
		return bad("HBM tier on %v: %v", dev, err)
	}
	return bad("the HBM tier opened on %v, but the store does not place blocks in HBM yet (HBM → DRAM → NVMe is not implemented); serve without --hbm", dev)
}
