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
// lock; DRAM's Read and View take no allocator lock at all. An emptied DRAM
// slab returns its pages to the kernel unless it is one of the WarmSlabs kept
// for reuse (taken first when a class needs a slab); DRAMOptions.Populate
// makes the whole arena resident up front.
//
// HBM is built in every build over the small Device and Stream interfaces
// (declared in the leaf gpu/gpumem, aliased here): pinned staging buffers,
// streams, chunked copies whose host half overlaps the DMA of the previous
// chunk, and waiting on completion are all logic of this package, tested
// against an in-memory fake device (gpu/gputest) whose copies happen only
// when waited for. store.Local places blocks in it above DRAM
// (store.Options.HBM). The CUDA implementation of Device lives
// in gpu/cudadev (-tags cuda, gorgonia.org/cu) and is loaded at run time by
// package gpu only when a device exists; see gpu's package doc for why. It has
// been compiled and vetted against CUDA 11.8 but never run on a GPU.
//
// # Capabilities
//
// Tier is what every tier does; the optional interfaces say what else a
// tier offers its owner, who discovers them by type assertion:
//
//	interface    what it gives the owner                      DRAM  HBM  NVMe
//	Tier         Put, Read, Free, Stats, Close                 x     x    x
//	Viewer       View: a value in place, without a copy        x
//	Classed      size classes; Evacuate names a slab to empty  x     x
//	Segmented    reclaim by whole segments, oldest first                  x
//	Recoverable  Range: what survived a restart or a crash                x
//	Batcher      PutBatch: many values, one write and one sync            x
//	Checked      Read verifies every byte against a put-time sum          x
//
// Each implementation asserts its set at compile time (var _ Viewer =
// (*DRAM)(nil)); a change there belongs in this table too.
//
// # Concurrency
//
// Every method of every tier is safe for concurrent use. A tier holds no
// lock across I/O or a device copy: DRAM and HBM copy outside their
// allocator lock (DRAM's Read and View take none), and NVMe's Puts are
// group-committed by one writer goroutine while readers use pread on
// reference-counted segment files. Goroutines a tier starts (NVMe's writer
// and syncer) are its own and stop in Close, which waits for the calls in
// flight; every method returns ErrClosed afterwards. The owner, not the
// tier, guarantees that a Loc is not freed while a reader still uses it,
// and that Free is called once per Loc.
package tiers
