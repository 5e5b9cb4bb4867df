package tiers

import (
	"encoding/binary"
	"fmt"

	"golang.org/x/sys/unix"

	"github.com/kvmesh/kvmesh/internal/invariants"
	"github.com/kvmesh/kvmesh/internal/prefault"
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
	// WarmSlabs is how many emptied slabs keep their memory for the next
	// slabs that size classes need, instead of returning it to the kernel.
	// A value written into memory the kernel took back faults once per
	// page, and the fault allocates and zeroes the page: that was most of
	// the time of a put of a few MiB (BENCHMARKS.md, "Warm slabs"). Resident
	// memory is then at most what the tier holds plus WarmSlabs slabs.
	// Default DefaultWarmSlabs(slabs); -1 keeps none.
	WarmSlabs int
	// Populate backs the whole arena with memory when the tier opens and
	// keeps it: no put ever waits for the kernel to allocate a page, and
	// resident memory is Capacity from the start (the way an RDMA-registered
	// buffer is pinned whole). For hosts that give the cache its memory;
	// opening takes about a second per 4 GiB.
	Populate bool
}

// DefaultWarmSlabs is WarmSlabs' default for an arena of slabs slabs: one
// in eight, at least one (for the default 1 GiB tier, 7 slabs of 16 MiB).
func DefaultWarmSlabs(slabs int) int { return max(1, slabs/8) }

// EnsureDefaults fills zero fields with their defaults.
func (o *DRAMOptions) EnsureDefaults() {
	if o.Capacity == 0 {
		o.Capacity = DefaultDRAMCapacity
	}
	if o.SlabSize == 0 {
		o.SlabSize = defaultSlabSize(o.Capacity)
	}
	if o.WarmSlabs == 0 && o.SlabSize > 0 {
		o.WarmSlabs = DefaultWarmSlabs(int(o.Capacity / o.SlabSize))
	}
}

// Validate reports the first field that is out of range.
func (o *DRAMOptions) Validate() error {
	if o.WarmSlabs < -1 {
		return fmt.Errorf("tiers: DRAMOptions.WarmSlabs %d is less than -1", o.WarmSlabs)
	}
	_, err := arenaSlabs("DRAMOptions", o.Capacity, o.SlabSize, unix.Getpagesize())
	return err
}

// DRAM is the host-memory tier: an off-heap arena mapped once (a memfd of the
// capacity's size, MAP_SHARED|MAP_NORESERVE) and cut into slabs of size
// classes by the slab allocator. Memory is touched only as slabs are used,
// and an emptied slab is returned to the kernel (MADV_REMOVE punches it out
// of the memfd) once WarmSlabs emptied slabs already keep theirs for reuse,
// so the process's resident memory follows what the tier holds, plus at
// most WarmSlabs slabs (or is the whole arena, with Populate). The arena
// asks for transparent huge pages (MADV_HUGEPAGE), which the kernel grants
// a memfd only where shmem_enabled allows. The arena is a
// memfd so that a process on the same host can map it (Arena): the
// shared-memory data plane hands it to trusted clients, which read blocks
// in place and write reserved slots (Reserve) without a copy on the node.
// The Go heap holds
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
	fd    int    // the arena's memfd; -1 after Close
	// populated: every page of the arena is in memory and mapped here
	// (Populate), so a Put has no fault to save.
	populated bool
}

var (
	_ Tier     = (*DRAM)(nil)
	_ Viewer   = (*DRAM)(nil)
	_ Classed  = (*DRAM)(nil)
	_ Reserver = (*DRAM)(nil)
)

// NewDRAM maps a DRAM tier's arena.
func NewDRAM(opts DRAMOptions) (*DRAM, error) {
	opts.EnsureDefaults()
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	nslabs, _ := arenaSlabs("DRAMOptions", opts.Capacity, opts.SlabSize, unix.Getpagesize())
	size := int64(nslabs) * opts.SlabSize
	fd, err := unix.MemfdCreate("kvmesh-dram", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		return nil, fmt.Errorf("tiers: dram: memfd_create: %w", err)
	}
	if err := unix.Ftruncate(fd, size); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("tiers: dram: size the arena to %d bytes: %w", size, err)
	}
	// Sealed at its size: no process that maps it can shrink it under the
	// node (a SIGBUS on the next access).
	if _, err := unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, unix.F_SEAL_SHRINK|unix.F_SEAL_GROW|unix.F_SEAL_SEAL); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("tiers: dram: seal the arena: %w", err)
	}
	arena, err := unix.Mmap(fd, 0, int(size), unix.PROT_READ|unix.PROT_WRITE,
		unix.MAP_SHARED|unix.MAP_NORESERVE)
	if err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("tiers: dram: map %d bytes: %w", size, err)
	}
	// Transparent huge pages: a block written to memory never touched
	// before (every put after the tier's slabs were emptied) faults once per
	// 2 MiB instead of once per 4 KiB, which was most of the cost of
	// storing a 1 MiB block. An error (THP off in this kernel) leaves small
	// pages: speed, never correctness. An emptied slab is still returned to
	// the kernel (MADV_DONTNEED splits a huge page it covers in part).
	_ = unix.Madvise(arena, unix.MADV_HUGEPAGE)
	if opts.Populate {
		if err := prefault.All(arena); err != nil {
			unix.Munmap(arena)
			unix.Close(fd)
			return nil, fmt.Errorf("tiers: dram: populate %d bytes: %w", size, err)
		}
	}
	d := &DRAM{arena: arena, fd: fd, populated: opts.Populate}
	d.capacity, d.alloc = opts.Capacity, newSlabAlloc(opts.SlabSize, nslabs)
	d.alloc.keepWarm(max(opts.WarmSlabs, 0), opts.Populate)
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
	loc, buf, err := d.reserve(key, len(val))
	if err != nil {
		return 0, err
	}
	if !d.populated {
		prefault.Write(buf)
	}
	copy(buf, val)
	return loc, nil
}

// Reserve takes a slot for an n-byte value of key without writing the
// value: buf is the slot's value bytes, in the arena, for the caller (or a
// process that maps the arena) to fill. The slot is the caller's until it
// frees loc (the way to abandon a reservation) or hands loc to an index;
// buf must not be used after Free or Close. Errors as Put's.
func (d *DRAM) Reserve(key prefixhash.Key, n int) (loc Loc, buf []byte, err error) {
	d.closeMu.RLock()
	defer d.closeMu.RUnlock()
	return d.reserve(key, n)
}

// reserve is Reserve with closeMu held for reading.
func (d *DRAM) reserve(key prefixhash.Key, n int) (Loc, []byte, error) {
	loc, off, err := d.take(n, func(off int64) {
		h := d.arena[off : off+slotHeaderLen]
		copy(h, key[:])
		binary.LittleEndian.PutUint64(h[16:], uint64(n))
		clear(h[24:])
	})
	if err != nil {
		return 0, nil, err
	}
	start, end := off+slotHeaderLen, off+slotHeaderLen+int64(n)
	return loc, d.arena[start:end:end], nil
}

// Arena returns the arena's mapping and its memfd, which another process
// may map (MAP_SHARED) to see the same bytes: byte i of mem is byte i of
// the file. Both are valid until Close; the
// descriptor is the tier's (dup it to keep it). Nil and -1 after Close.
func (d *DRAM) Arena() (mem []byte, fd int) {
	d.closeMu.RLock()
	defer d.closeMu.RUnlock()
	return d.arena, d.fd
}

// value returns the arena offset of the value at loc and its length. It reads
// only the immutable class table and the slot's header, so it takes no lock;
// closeMu must be held for reading. A freed slot's header still holds its
// last value's length (and the value its bytes, until the slot is taken
// again), so a read through an index that names a freed slot would succeed
// with stale bytes: the invariants build asks the allocator, under its
// lock, whether the slot is live.
func (d *DRAM) value(loc Loc) (off int64, n int) {
	if invariants.Enabled {
		d.mustHold("dram", loc)
	}
	slab, class, slot := d.alloc.split(loc)
	off = d.alloc.offset(slab, class, slot)
	n64 := binary.LittleEndian.Uint64(d.arena[off+16:])
	if n64 > uint64(d.alloc.classes[class]-slotHeaderLen) {
		panic(fmt.Sprintf("tiers: dram: location %#x: slot header claims %d bytes", uint64(loc), n64))
	}
	return off + slotHeaderLen, int(n64)
}

// Holds reports whether loc holds a value of key: a live slot whose header
// names key. An index that names a freed slot, or one freed and taken by
// another value since, gets false. It is for checks (the store's, in its
// tests and its invariants build): it takes the allocator's lock.
func (d *DRAM) Holds(loc Loc, key prefixhash.Key) bool {
	d.closeMu.RLock()
	defer d.closeMu.RUnlock()
	if d.closed || !d.holds(loc) {
		return false
	}
	slab, class, slot := d.alloc.split(loc)
	off := d.alloc.offset(slab, class, slot)
	return prefixhash.Key(d.arena[off:off+16]) == key
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
		// MADV_REMOVE frees a shared mapping's pages (MADV_DONTNEED
		// would only unmap them). An error leaves the pages resident:
		// memory, never correctness.
		_ = unix.Madvise(d.arena[off:off+size], unix.MADV_REMOVE)
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
	if cerr := unix.Close(d.fd); err == nil {
		err = cerr
	}
	d.arena, d.fd = nil, -1
	if err != nil {
		return fmt.Errorf("tiers: dram: unmap: %w", err)
	}
	return nil
}
