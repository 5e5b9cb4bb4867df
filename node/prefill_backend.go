package node

import (
	"fmt"

	"github.com/kvmesh/kvmesh/gpu"
	"github.com/kvmesh/kvmesh/prefill"
)

// Backends of the prefill engine (PrefillOptions.Backend).
const (
	BackendCPU  = "cpu"
	BackendCUDA = "cuda"
)

// checkBackend refuses a cuda backend before anything is opened when the
// build has no CUDA or the host no such device (gpu.Probe asks the driver;
// nothing is loaded). A missing or mismatched plugin is found later, when
// the engine opens the device.
func checkBackend(opts Options) error {
	if opts.Prefill.Disabled || opts.Prefill.Backend != BackendCUDA {
		return nil
	}
	info, err := probeGPU()
	if err == nil && opts.GPU >= info.Devices {
		err = fmt.Errorf("%w %d: this host has %d", gpu.ErrNoDevice, opts.GPU, info.Devices)
	}
	if err != nil {
		return cudaRefused(err)
	}
	return nil
}

func cudaRefused(err error) error {
	return &OptionError{Field: "Prefill.Backend", Msg: fmt.Sprintf("the cuda backend needs a CUDA device: %v", err)}
}

// prefillBackend returns the engine's backend and what releases it after
// the engine is closed: nil (the engine's default, the CPU) for cpu; for
// cuda, the device backend on CUDA device ordinal, or an OptionError that
// says why there is none (a build without CUDA, no device, no plugin).
func prefillBackend(name string, ordinal int) (prefill.Backend, func() error, error) {
	none := func() error { return nil }
	if name != BackendCUDA {
		return nil, none, nil
	}
	dev, err := openBLAS(ordinal, gpu.Options{})
	if err != nil {
		return nil, none, cudaRefused(err)
	}
	b, err := prefill.NewDevice(dev, prefill.DeviceOptions{})
	if err != nil {
		_ = dev.Close()
		return nil, none, fmt.Errorf("node: prefill backend: %w", err)
	}
	return b, b.Close, nil
}
