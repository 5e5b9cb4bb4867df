package tiers

import (
	"encoding/binary"
	"fmt"

	"golang.org/x/sys/unix"

	"github.com/kvmesh/kvmesh/prefixhash"
)

// DefaultDRAMCapacity is the DRAM tier's default Capacity, 1 GiB.
const DefaultDRAMCapacity = 1 << 30

// DRAMOptions configure a DRAM tier.
type DRAMOptions struct {
	// Capacity is the hard limit on the memory the tier holds, in bytes,
	// rounded down to a whole number of slabs. It is reserved as address
	// space at once and backed by memory only as slabs are used.
	// Default DefaultDRAMCapacity (1 GiB).
	Capacity int64
	// SlabSize is the unit in which memory is given to a size class and
	// returned, in bytes, a multiple of the page size of at most
	// MaxSlabSize (1 GiB). No value may exceed a slab (less 64 bytes of
	// slot header). Default DefaultSlabSize (16 MiB + 64 KiB), or Capacity
	// rounded down to the page size if that is smaller.
	SlabSize int64
}

// EnsureDefaults fills zero fields with their defaults.
func (o *DRAMOptions) EnsureDefaults() {
	if o.Capacity == 0 {
		o.Capacity = DefaultDRAMCapacity
	}
	if o.SlabSize == 0 {
		o.SlabSize = defaultSlabSize(o.Capacity)
	}
}

// Validate reports the first field that is out of range.
func (o *DRAMOptions) Validate() error {
	_, err := arenaSlabs("DRAMOptions", o.Capacity, o.SlabSize, unix.Getpagesize())
	return err
}

// DRAM is the host-memory tier: an off-heap arena mapped once (anonymous,
// private, MAP_NORESERVE) at the size of the capacity and cut into slabs of
// size classes by the slab allocator. Memory is touched only as slabs are
// used, and an emptied slab is returned to the kernel (MADV_DONTNEED), so the
// process's resident memory follows what the tier holds. The arena asks for
// transparent huge pages (MADV_HUGEPAGE), so first touches fault 2 MiB at a
// time. The Go heap holds
// only per-slab bookkeeping: the garbage collector never scans or moves the
// cached bytes.
//
// One reservation rather than a mapping per slab: a location turns into an
// address with arithmetic and no lookup, so Read and View take no allocator
// lock, and no mmap or munmap runs on the hot path. Address space is cheap
// (128 TiB on amd64). Where the kernel enforces strict overcommit
// (vm.overcommit_memory=2) MAP_NORESERVE is ignored and the whole capacity is
// charged at once.
//
// Put and Read copy outside the allocator lock; the lock covers only the
// choice of a slot and its 64-byte header. Free releases an emptied slab's
// memory outside the lock too. View returns a slice of the arena that is
// valid until its location is freed; using it after Close is a caller bug
// that faults (the memory is unmapped).
type DRAM struct {
	slabTier
	arena []byte // guarded by closeMu; nil after Close
}

var (
	_ Tier    = (*DRAM)(nil)
	_ Viewer  = (*DRAM)(nil)
	_ Classed = (*DRAM)(nil)
)

// NewDRAM maps a DRAM tier's arena.
func NewDRAM(opts DRAMOptions) (*DRAM, error) {
	opts.EnsureDefaults()
	nslabs, err := arenaSlabs("DRAMOptions", opts.Capacity, opts.SlabSize, unix.Getpagesize())
	if err != nil {
		return nil, err
	}
	size := int64(nslabs) * opts.SlabSize
	arena, err := unix.Mmap(-1, 0, int(size), unix.PROT_READ|unix.PROT_WRITE,
		unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_NORESERVE)
	if err != nil {
		return nil, fmt.Errorf("tiers: dram: map %d bytes: %w", size, err)
	}
	// Transparent huge pages: a block written to memory never touched
	// before (every put after the tier's slabs were emptied) faults once per
	// 2 MiB instead of once per 4 KiB, which was most of the cost of
	// storing a 1 MiB block. An error (THP off in this kernel) leaves small
	// pages: speed, never correctness. An emptied slab is still returned to
	// the kernel (MADV_DONTNEED splits a huge page it covers in part).
	_ = unix.Madvise(arena, unix.MADV_HUGEPAGE)
	d := &DRAM{arena: arena}
	d.capacity, d.alloc = opts.Capacity, newSlabAlloc(opts.SlabSize, nslabs)
	return d, nil
}

// Name returns "dram".
func (d *DRAM) Name() string { return "dram" }

// Put copies val into a slot of its size class. ErrTooLarge: no class holds
// len(val) bytes; ErrFull: no slot of the class and no empty slab is free.
// Only the slot's choice and its header are under the allocator lock.
func (d *DRAM) Put(key prefixhash.Key, val []byte) (Loc, error) {
	d.closeMu.RLock()
	defer d.closeMu.RUnlock()
	loc, off, err := d.take(len(val), func(off int64) {
		h := d.arena[off : off+slotHeaderLen]
		copy(h, key[:])
		binary.LittleEndian.PutUint64(h[16:], uint64(len(val)))
		clear(h[24:])
	})
	if err != nil {
		return 0, err
	}
	copy(d.arena[off+slotHeaderLen:], val)
	return loc, nil
}

// value returns the arena offset of the value at loc and its length. It reads
// only the immutable class table and the slot's header, so it takes no lock;
// closeMu must be held for reading.
func (d *DRAM) value(loc Loc) (off int64, n int) {
	slab, class, slot := d.alloc.split(loc)
	off = d.alloc.offset(slab, class, slot)
	n64 := binary.LittleEndian.Uint64(d.arena[off+16:])
	if n64 > uint64(d.alloc.classes[class]-slotHeaderLen) {
		panic(fmt.Sprintf("tiers: dram: location %#x: slot header claims %d bytes", uint64(loc), n64))
	}
	return off + slotHeaderLen, int(n64)
}

// Read copies the value at loc into dst, which must be exactly its length.
func (d *DRAM) Read(loc Loc, dst []byte) error {
	d.closeMu.RLock()
	defer d.closeMu.RUnlock()
	if d.closed {
		return ErrClosed
	}
	off, n := d.value(loc)
	if n != len(dst) {
		return fmt.Errorf("tiers: dram: read of a %d-byte value into %d bytes", n, len(dst))
	}
	copy(dst, d.arena[off:off+int64(n)])
	return nil
}

// View returns the n-byte value at loc without copying. The slice aliases the
// arena: it is valid until loc is freed, and must not be used after Close. It
// is nil after Close; n other than the value's length panics (the caller's
// index is wrong).
func (d *DRAM) View(loc Loc, n int) []byte {
	d.closeMu.RLock()
	defer d.closeMu.RUnlock()
	if d.closed {
		return nil
	}
	off, vn := d.value(loc)
	if vn != n {
		panic(fmt.Sprintf("tiers: dram: view of %d bytes at %#x, which holds %d", n, uint64(loc), vn))
	}
	end := off + int64(n)
	return d.arena[off:end:end]
}

// Free releases the value at loc. When that empties its slab, the slab's
// pages go back to the kernel and the slab to the pool. Freeing a location
// that holds no value panics. Free after Close does nothing.
func (d *DRAM) Free(loc Loc) {
	d.closeMu.RLock()
	defer d.closeMu.RUnlock()
	d.release(loc, func(off, size int64) {
		// An error leaves the pages resident: memory, never correctness.
		_ = unix.Madvise(d.arena[off:off+size], unix.MADV_DONTNEED)
	})
}

// Evacuate names the values of the slab with the fewest live values among
// slabs not of class avoid (-1: any class). The slab takes no new values
// until it empties or the next Evacuate picks another. The owner frees only
// the records its index maps to the same Loc.
func (d *DRAM) Evacuate(avoid int) []Record {
	d.closeMu.RLock()
	defer d.closeMu.RUnlock()
	if d.closed {
		return nil
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	recs, offs := d.evacuateLocked(avoid)
	for i, off := range offs {
		copy(recs[i].Key[:], d.arena[off:off+16])
	}
	return recs
}

// Close unmaps the arena. Every method then returns ErrClosed or nothing; a
// slice returned by View must not be used after Close.
func (d *DRAM) Close() error {
	d.closeMu.Lock()
	defer d.closeMu.Unlock()
	if d.closed {
		return ErrClosed
	}
	d.closed = true
	err := unix.Munmap(d.arena)
	d.arena = nil
	if err != nil {
		return fmt.Errorf("tiers: dram: unmap: %w", err)
	}
	return nil
}
