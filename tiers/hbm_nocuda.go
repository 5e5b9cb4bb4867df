//go:build !cuda

package tiers

import "github.com/kvmesh/kvmesh/prefixhash"

// HBM is the GPU-memory tier. This build has no CUDA: NewHBM returns
// ErrNoCUDA and no HBM exists. Build with -tags cuda for the real one.
type HBM struct{}

var (
	_ Tier    = (*HBM)(nil)
	_ Classed = (*HBM)(nil)
)

// NewHBM returns ErrNoCUDA: this build has no CUDA.
func NewHBM(opts HBMOptions) (*HBM, error) { return nil, ErrNoCUDA }

// The methods exist so that *HBM is a Tier in every build; none is reachable
// without a value that NewHBM never returns here.

func (*HBM) Name() string                            { return "hbm" }
func (*HBM) Put(prefixhash.Key, []byte) (Loc, error) { return 0, ErrNoCUDA }
func (*HBM) Read(Loc, []byte) error                  { return ErrNoCUDA }
func (*HBM) Free(Loc)                                {}
func (*HBM) Stats() Stats                            { return Stats{} }
func (*HBM) Close() error                            { return ErrNoCUDA }
func (*HBM) SizeClass(int) int                       { return -1 }
func (*HBM) ClassHasMemory(int) bool                 { return false }
func (*HBM) Evacuate(int) []Record                   { return nil }
