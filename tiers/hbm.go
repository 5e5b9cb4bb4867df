package tiers

import (
	"encoding/binary"
	"errors"
	"fmt"

	"golang.org/x/sys/unix"

	"github.com/kvmesh/kvmesh/gpu/gpumem"
	"github.com/kvmesh/kvmesh/prefixhash"
)

// Device, DevicePtr and Stream are the GPU an HBM tier keeps its values on;
// see package gpumem, a leaf so that the CUDA plugin which implements them
// links nothing else of kvmesh. The tier's logic (allocation, staging,
// chunking, completion) is the same code in every build and is tested
// against an in-memory fake.
type (
	Device    = gpumem.Device
	DevicePtr = gpumem.Ptr
	Stream    = gpumem.Stream
)

// HBMOptions configure an HBM tier.
type HBMOptions struct {
	// Capacity is the device memory the tier allocates at once and never
	// exceeds, in bytes, rounded down to a whole number of slabs. Required:
	// there is no default share of a GPU.
	Capacity int64
	// SlabSize is as in DRAMOptions. Default DefaultSlabSize
	// (16 MiB + 64 KiB), or Capacity rounded down to the page size if that
	// is smaller.
	SlabSize int64
	// Lanes is how many copies may be in flight at once: each lane is a
	// stream and a pinned staging buffer of StagingBytes. A caller waits
	// for a free lane. Default 4.
	Lanes int
	// StagingBytes is the pinned host buffer of each lane, in bytes, used
	// in two halves so that the host copy of one chunk overlaps the DMA of
	// the other. A value larger than half of it moves in several chunks.
	// Default 4 MiB; at least 8 KiB.
	StagingBytes int
}

// EnsureDefaults fills zero fields with their defaults.
func (o *HBMOptions) EnsureDefaults() {
	if o.SlabSize == 0 {
		o.SlabSize = defaultSlabSize(o.Capacity)
	}
	if o.Lanes == 0 {
		o.Lanes = 4
	}
	if o.StagingBytes == 0 {
		o.StagingBytes = 4 << 20
	}
}

// Validate reports the first field that is out of range.
func (o *HBMOptions) Validate() error {
	_, err := o.slabs()
	return err
}

func (o *HBMOptions) slabs() (int, error) {
	switch {
	case o.Capacity <= 0:
		return 0, errors.New("tiers: HBMOptions.Capacity must be set")
	case o.Lanes < 1 || o.Lanes > 64:
		return 0, fmt.Errorf("tiers: HBMOptions.Lanes %d is outside [1, 64]", o.Lanes)
	case o.StagingBytes < 8<<10:
		return 0, fmt.Errorf("tiers: HBMOptions.StagingBytes %d is less than 8 KiB", o.StagingBytes)
	}
	return arenaSlabs("HBMOptions", o.Capacity, o.SlabSize, unix.Getpagesize())
}

// HBM is the GPU-memory tier: one device allocation of the capacity, cut into
// slabs by the same allocator as DRAM. Device memory is not addressable by
// the process, so HBM is not a Viewer: Put and Read copy through pinned
// staging buffers on CUDA streams (a lane each), asynchronously to the host,
// and return once the copy's completion is signalled, so a value is on the
// device when Put returns and in dst when Read does. Copies run outside the
// allocator lock; concurrent calls use different lanes and overlap.
type HBM struct {
	slabTier
	dev   Device
	base  DevicePtr  // guarded by closeMu
	lanes chan *lane // idle lanes; all of them are here when closeMu is held for writing
	all   []*lane
}

// lane is a stream and its pinned staging buffer, in two halves.
type lane struct {
	s    Stream
	buf  []byte
	half [2][]byte
}

var (
	_ Tier    = (*HBM)(nil)
	_ Classed = (*HBM)(nil)
)

// NewHBM allocates an HBM tier's memory and lanes on dev. The tier takes
// ownership of dev: Close closes it (if NewHBM fails, the caller still owns
// it).
func NewHBM(dev Device, opts HBMOptions) (_ *HBM, err error) {
	opts.EnsureDefaults()
	nslabs, err := opts.slabs()
	if err != nil {
		return nil, err
	}
	h := &HBM{dev: dev, lanes: make(chan *lane, opts.Lanes)}
	h.capacity, h.alloc = opts.Capacity, newSlabAlloc(opts.SlabSize, nslabs)
	defer func() {
		if err != nil {
			h.freeLanes()
		}
	}()
	for range opts.Lanes {
		ln := &lane{}
		if ln.buf, err = dev.HostAlloc(opts.StagingBytes); err != nil {
			return nil, fmt.Errorf("tiers: hbm: pinned staging of %d bytes: %w", opts.StagingBytes, err)
		}
		h.all = append(h.all, ln)
		if ln.s, err = dev.NewStream(); err != nil {
			return nil, fmt.Errorf("tiers: hbm: stream: %w", err)
		}
		n := len(ln.buf) / 2 &^ (slotAlign - 1)
		ln.half = [2][]byte{ln.buf[:n:n], ln.buf[n : 2*n : 2*n]}
		h.lanes <- ln
	}
	size := int64(nslabs) * opts.SlabSize
	if h.base, err = dev.Alloc(size); err != nil {
		return nil, fmt.Errorf("tiers: hbm: allocate %d bytes of device memory: %w", size, err)
	}
	return h, nil
}

// freeLanes releases every lane's stream and staging buffer.
func (h *HBM) freeLanes() error {
	var first error
	for _, ln := range h.all {
		if ln.s != nil {
			if err := ln.s.Close(); first == nil {
				first = err
			}
		}
		if err := h.dev.HostFree(ln.buf); first == nil {
			first = err
		}
	}
	h.all = nil
	return first
}

// Name returns "hbm".
func (h *HBM) Name() string { return "hbm" }

// Put copies the slot header and val to the device and waits for the copy to
// complete.
func (h *HBM) Put(key prefixhash.Key, val []byte) (Loc, error) {
	h.closeMu.RLock()
	defer h.closeMu.RUnlock()
	loc, off, err := h.take(len(val), nil)
	if err != nil {
		return 0, err
	}
	var hdr [slotHeaderLen]byte
	copy(hdr[:], key[:])
	binary.LittleEndian.PutUint64(hdr[16:], uint64(len(val)))
	ln := <-h.lanes
	err = ln.toDevice(h.base+DevicePtr(off), hdr[:], val)
	h.lanes <- ln
	if err != nil {
		h.release(loc, nil)
		return 0, fmt.Errorf("tiers: hbm: copy to device: %w", err)
	}
	return loc, nil
}

// toDevice copies a then b to consecutive device memory at dst, a chunk of
// one staging half at a time: the host fills one half while the previous
// chunk, from the other half, is in flight.
func (ln *lane) toDevice(dst DevicePtr, a, b []byte) error {
	total := len(a) + len(b)
	inflight := false
	for pos, h := 0, 0; pos < total; h ^= 1 {
		buf := ln.half[h]
		n := 0
		for n < len(buf) && pos+n < total {
			if p := pos + n; p < len(a) {
				n += copy(buf[n:], a[p:])
			} else {
				n += copy(buf[n:], b[p-len(a):])
			}
		}
		if inflight {
			// buf was last sent two chunks ago and that copy completed at
			// the previous Wait; this one frees the other half, sent last,
			// for the next fill.
			if err := ln.s.Wait(); err != nil {
				return err
			}
		}
		if err := ln.s.HtoD(dst+DevicePtr(pos), buf[:n]); err != nil {
			return err
		}
		inflight = true
		pos += n
	}
	return ln.s.Wait()
}

// fromDevice copies len(dst) bytes at device address src into dst, a chunk
// at a time: the next chunk's DMA into one half overlaps the host copy out
// of the other.
func (ln *lane) fromDevice(dst []byte, src DevicePtr) error {
	chunk := func(pos, h int) []byte {
		return ln.half[h][:min(len(ln.half[h]), len(dst)-pos)]
	}
	if len(dst) == 0 {
		return nil
	}
	if err := ln.s.DtoH(chunk(0, 0), src); err != nil {
		return err
	}
	for pos, h := 0, 0; pos < len(dst); h ^= 1 {
		if err := ln.s.Wait(); err != nil {
			return err
		}
		done := chunk(pos, h)
		if next := pos + len(done); next < len(dst) {
			if err := ln.s.DtoH(chunk(next, h^1), src+DevicePtr(next)); err != nil {
				return err
			}
		}
		pos += copy(dst[pos:], done)
	}
	return nil
}

// value returns the device address of the value at loc and its length.
// closeMu must be held for reading.
func (h *HBM) value(loc Loc) (DevicePtr, int) {
	slab, class, slot := h.alloc.split(loc)
	h.mu.Lock()
	n := h.alloc.valueLen(loc)
	h.mu.Unlock()
	return h.base + DevicePtr(h.alloc.offset(slab, class, slot)+slotHeaderLen), n
}

// Read copies the value at loc from the device into dst, which must be
// exactly its length, and waits for the copy to complete.
func (h *HBM) Read(loc Loc, dst []byte) error {
	h.closeMu.RLock()
	defer h.closeMu.RUnlock()
	if h.closed {
		return ErrClosed
	}
	src, n := h.value(loc)
	if n != len(dst) {
		return fmt.Errorf("tiers: hbm: read of a %d-byte value into %d bytes", n, len(dst))
	}
	ln := <-h.lanes
	err := ln.fromDevice(dst, src)
	h.lanes <- ln
	if err != nil {
		return fmt.Errorf("tiers: hbm: copy from device: %w", err)
	}
	return nil
}

// CopyTo copies the value at loc, which must be n bytes long, to device
// address dst on the same device (an engine's KV buffer), without a trip
// through the host, and waits for the copy to complete.
func (h *HBM) CopyTo(loc Loc, dst DevicePtr, n int) error {
	h.closeMu.RLock()
	defer h.closeMu.RUnlock()
	if h.closed {
		return ErrClosed
	}
	src, vn := h.value(loc)
	if vn != n {
		return fmt.Errorf("tiers: hbm: device copy of %d bytes at %#x, which holds %d", n, uint64(loc), vn)
	}
	ln := <-h.lanes
	err := ln.s.DtoD(dst, src, int64(n))
	if err == nil {
		err = ln.s.Wait()
	}
	h.lanes <- ln
	if err != nil {
		return fmt.Errorf("tiers: hbm: device to device copy: %w", err)
	}
	return nil
}

// Free releases the value at loc; an emptied slab returns to the pool.
func (h *HBM) Free(loc Loc) {
	h.closeMu.RLock()
	defer h.closeMu.RUnlock()
	h.release(loc, nil)
}

// Evacuate names the values of the slab with the fewest live values among
// slabs not of class avoid; see DRAM.Evacuate. Keys are read from the slot
// headers on the device, outside the allocator lock, so a record whose Put is
// in flight may carry a stale key: the owner frees only records its index
// maps to the same Loc. It returns nil if the keys cannot be read.
func (h *HBM) Evacuate(avoid int) []Record {
	h.closeMu.RLock()
	defer h.closeMu.RUnlock()
	if h.closed {
		return nil
	}
	h.mu.Lock()
	recs, offs := h.evacuateLocked(avoid)
	h.mu.Unlock()
	ln := <-h.lanes
	defer func() { h.lanes <- ln }()
	const k = len(prefixhash.Key{})
	per := len(ln.buf) / k
	for i := 0; i < len(offs); i += per {
		batch := offs[i:min(i+per, len(offs))]
		for j, off := range batch {
			if err := ln.s.DtoH(ln.buf[j*k:(j+1)*k], h.base+DevicePtr(off)); err != nil {
				return nil
			}
		}
		if err := ln.s.Wait(); err != nil {
			return nil
		}
		for j := range batch {
			copy(recs[i+j].Key[:], ln.buf[j*k:])
		}
	}
	return recs
}

// Close frees the device memory, the lanes, and closes the device.
func (h *HBM) Close() error {
	h.closeMu.Lock()
	defer h.closeMu.Unlock()
	if h.closed {
		return ErrClosed
	}
	h.closed = true
	err := h.dev.Free(h.base)
	h.base = 0
	if lerr := h.freeLanes(); err == nil {
		err = lerr
	}
	if derr := h.dev.Close(); err == nil {
		err = derr
	}
	if err != nil {
		return fmt.Errorf("tiers: hbm: close: %w", err)
	}
	return nil
}
