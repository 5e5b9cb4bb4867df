// Package tiers holds the places where kvmesh keeps bytes: host DRAM in
// off-heap mmap arenas, NVMe in append-only segment files indexed by pebble,
// and GPU memory (HBM) through gorgonia.org/cu behind the cuda build tag.
//
// Every tier implements Tier: it stores opaque values under keys and returns
// a Loc. Tiers know keys and bytes, never what a block means; the policy
// (what is hot, what moves down, what is dropped) belongs to the owner,
// store.Local, which keeps the only in-RAM index.
//
// DRAM and HBM allocate in size-class slabs (slab.go): a value is a slot of a
// slab of its class, a 64-byte header (key, length) in the tier's memory and
// then the value, 64-byte aligned. The Go heap holds only per-slab
// bookkeeping, never an object per value. Copies run outside the allocator
// lock; DRAM's Read and View take no allocator lock at all.
//
// HBM is built only with -tags cuda, over gorgonia.org/cu, which needs the
// CUDA headers to compile and a driver to start (its init exits the process
// without one). No machine kvmesh is developed on has CUDA: hbm_cuda.go has
// been type-checked against cu's API but never compiled or run against CUDA.
// Without the tag NewHBM returns ErrNoCUDA, so callers name it in every
// build; the allocator it shares with DRAM is tested in the default build.
package tiers
