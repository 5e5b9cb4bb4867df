package gpu

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/kvmesh/kvmesh/gpu/gpumem"
)

var (
	// ErrNoCUDA is returned by every function of a build without the
	// cuda tag.
	ErrNoCUDA = errors.New("gpu: this kvmesh was built without CUDA (build it with -tags cuda, and kvmesh-cuda.so beside it)")
	// ErrNoDevice means the CUDA driver is missing or found no device.
	ErrNoDevice = errors.New("gpu: no CUDA device")
)

// PluginName is the file Open loads by default, beside the executable.
const PluginName = "kvmesh-cuda.so"

// Options configure Open.
type Options struct {
	// Plugin is the path of the CUDA plugin. Default: $KVMESH_CUDA_PLUGIN
	// if set, else PluginName in the directory of the running executable.
	Plugin string
}

// EnsureDefaults fills zero fields with their defaults.
func (o *Options) EnsureDefaults() {
	if o.Plugin != "" {
		return
	}
	if p := os.Getenv("KVMESH_CUDA_PLUGIN"); p != "" {
		o.Plugin = p
		return
	}
	if exe, err := os.Executable(); err == nil {
		o.Plugin = filepath.Join(filepath.Dir(exe), PluginName)
	} else {
		o.Plugin = PluginName
	}
}

// Info describes the host's CUDA driver and devices.
type Info struct {
	Devices int // number of CUDA devices
	Driver  int // driver API version, 1000·major + 10·minor
}

// Status is one line for `kvmesh version`: whether the GPU features are on,
// and if not, why.
func Status() string {
	info, err := Probe()
	if err != nil {
		return fmt.Sprintf("GPU features off: %v", err)
	}
	return fmt.Sprintf("GPU: %d CUDA device(s), driver API %d.%d; %s is loaded when a GPU feature is asked for",
		info.Devices, info.Driver/1000, info.Driver%1000/10, PluginName)
}

// Open returns CUDA device ordinal for an HBM tier (tiers.NewHBM takes
// ownership of it: tiers.Device is gpumem.Device, so gpu needs nothing of
// tiers). It fails with ErrNoCUDA in a build without the cuda
// tag, with ErrNoDevice where the driver finds none or fewer than
// ordinal+1, and with an error naming the plugin when it cannot be loaded.
func Open(ordinal int, opts Options) (gpumem.Device, error) {
	if ordinal < 0 {
		return nil, fmt.Errorf("gpu: device ordinal %d is negative", ordinal)
	}
	info, err := Probe()
	if err != nil {
		return nil, err
	}
	if ordinal >= info.Devices {
		return nil, fmt.Errorf("%w %d: this host has %d", ErrNoDevice, ordinal, info.Devices)
	}
	opts.EnsureDefaults()
	open, err := load(opts.Plugin)
	if err != nil {
		return nil, err
	}
	dev, err := open(ordinal)
	if err != nil {
		return nil, fmt.Errorf("gpu: device %d: %w", ordinal, err)
	}
	return dev, nil
}

// OpenBLAS returns CUDA device ordinal for the prefill engine's device
// backend (prefill.NewDevice takes ownership of it): its memory, copies and
// cuBLAS products. It fails as Open does.
func OpenBLAS(ordinal int, opts Options) (gpumem.BLAS, error) {
	opts.EnsureDefaults()
	dev, err := Open(ordinal, opts)
	if err != nil {
		return nil, err
	}
	b, ok := dev.(gpumem.BLAS)
	if !ok {
		_ = dev.Close()
		return nil, fmt.Errorf("gpu: device %d of plugin %s has no matrix products (%T): rebuild the plugin from this source", ordinal, opts.Plugin, dev)
	}
	return b, nil
}

// openFunc is the type of the plugin's exported Open.
type openFunc = func(ordinal int) (gpumem.Device, error)
