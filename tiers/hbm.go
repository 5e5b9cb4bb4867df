package tiers

import (
	"errors"

	"golang.org/x/sys/unix"
)

// ErrNoCUDA is returned by NewHBM in a build without the cuda tag.
var ErrNoCUDA = errors.New("tiers: built without cuda")

// HBMOptions configure an HBM tier.
type HBMOptions struct {
	// Device is the CUDA device ordinal. Default 0.
	Device int
	// Capacity is the device memory the tier allocates at once and never
	// exceeds, in bytes, rounded down to a whole number of slabs. Required:
	// there is no default share of a GPU.
	Capacity int64
	// SlabSize is as in DRAMOptions. Default DefaultSlabSize
	// (16 MiB + 64 KiB), or Capacity rounded down to the page size if that
	// is smaller.
	SlabSize int64
}

// EnsureDefaults fills zero fields with their defaults.
func (o *HBMOptions) EnsureDefaults() {
	if o.SlabSize == 0 {
		o.SlabSize = defaultSlabSize(o.Capacity)
	}
}

// Validate reports the first field that is out of range.
func (o *HBMOptions) Validate() error {
	_, err := o.slabs()
	return err
}

func (o *HBMOptions) slabs() (int, error) {
	if o.Device < 0 {
		return 0, errors.New("tiers: HBMOptions.Device must not be negative")
	}
	if o.Capacity <= 0 {
		return 0, errors.New("tiers: HBMOptions.Capacity must be set")
	}
	return arenaSlabs("HBMOptions", o.Capacity, o.SlabSize, unix.Getpagesize())
}
