// Package tiers holds the places where kvmesh keeps bytes: host DRAM in
// off-heap mmap arenas, NVMe in append-only segment files indexed by pebble,
// and GPU memory (HBM) through gorgonia.org/cu behind the cuda build tag.
//
// Every tier implements Tier: it stores opaque values under keys and returns
// a Loc. Tiers know keys and bytes, never what a block means; the policy
// (what is hot, what moves down, what is dropped) belongs to the owner,
// store.Local, which keeps the only in-RAM index.
package tiers
