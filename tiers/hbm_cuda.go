//go:build cuda

package tiers

import (
	"encoding/binary"
	"fmt"
	"runtime"
	"unsafe"

	"gorgonia.org/cu"

	"github.com/kvmesh/kvmesh/prefixhash"
)

// HBM is the GPU-memory tier: one device allocation of the capacity, cut into
// slabs by the same allocator as DRAM (whose tests cover its logic). Put
// copies host to device, Read device to host; device memory is not
// addressable by the process, so HBM is not a Viewer. The copies are
// synchronous (pageable host memory) and run outside the allocator lock.
//
// CUDA contexts are bound to OS threads: every call locks its goroutine to
// its thread and makes the device's primary context current there.
type HBM struct {
	slabTier
	dev  cu.Device
	ctx  cu.CUContext
	base cu.DevicePtr // guarded by closeMu; 0 after Close
}

var (
	_ Tier    = (*HBM)(nil)
	_ Classed = (*HBM)(nil)
)

// NewHBM allocates an HBM tier's memory on opts.Device.
func NewHBM(opts HBMOptions) (*HBM, error) {
	opts.EnsureDefaults()
	nslabs, err := opts.slabs()
	if err != nil {
		return nil, err
	}
	dev, err := cu.GetDevice(opts.Device)
	if err != nil {
		return nil, fmt.Errorf("tiers: hbm: device %d: %w", opts.Device, err)
	}
	ctx, err := dev.RetainPrimaryCtx()
	if err != nil {
		return nil, fmt.Errorf("tiers: hbm: device %d context: %w", opts.Device, err)
	}
	h := &HBM{dev: dev, ctx: ctx}
	h.capacity, h.alloc = opts.Capacity, newSlabAlloc(opts.SlabSize, nslabs)
	size := int64(nslabs) * opts.SlabSize
	if err := h.do(func() (err error) { h.base, err = cu.MemAlloc(size); return err }); err != nil {
		_ = dev.ReleasePrimaryCtx()
		return nil, fmt.Errorf("tiers: hbm: allocate %d bytes on device %d: %w", size, opts.Device, err)
	}
	return h, nil
}

// do runs fn with the tier's context current on the calling thread.
func (h *HBM) do(fn func() error) error {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if err := cu.SetCurrentContext(h.ctx); err != nil {
		return err
	}
	return fn()
}

// Name returns "hbm".
func (h *HBM) Name() string { return "hbm" }

// Put copies the slot header and val to the device.
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
	dst := h.base + cu.DevicePtr(off)
	err = h.do(func() error {
		if err := cu.MemcpyHtoD(dst, unsafe.Pointer(&hdr[0]), slotHeaderLen); err != nil || len(val) == 0 {
			return err
		}
		return cu.MemcpyHtoD(dst+slotHeaderLen, unsafe.Pointer(&val[0]), int64(len(val)))
	})
	if err != nil {
		h.release(loc, nil)
		return 0, fmt.Errorf("tiers: hbm: copy to device: %w", err)
	}
	return loc, nil
}

// Read copies the value at loc from the device into dst, which must be
// exactly its length.
func (h *HBM) Read(loc Loc, dst []byte) error {
	h.closeMu.RLock()
	defer h.closeMu.RUnlock()
	if h.closed {
		return ErrClosed
	}
	h.mu.Lock()
	n := h.alloc.valueLen(loc)
	h.mu.Unlock()
	if n != len(dst) {
		return fmt.Errorf("tiers: hbm: read of a %d-byte value into %d bytes", n, len(dst))
	}
	if n == 0 {
		return nil
	}
	slab, class, slot := h.alloc.split(loc)
	src := h.base + cu.DevicePtr(h.alloc.offset(slab, class, slot)+slotHeaderLen)
	if err := h.do(func() error { return cu.MemcpyDtoH(unsafe.Pointer(&dst[0]), src, int64(n)) }); err != nil {
		return fmt.Errorf("tiers: hbm: copy from device: %w", err)
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
// maps to the same Loc.
func (h *HBM) Evacuate(avoid int) []Record {
	h.closeMu.RLock()
	defer h.closeMu.RUnlock()
	if h.closed {
		return nil
	}
	h.mu.Lock()
	recs, offs := h.evacuateLocked(avoid)
	h.mu.Unlock()
	err := h.do(func() error {
		for i, off := range offs {
			if err := cu.MemcpyDtoH(unsafe.Pointer(&recs[i].Key[0]), h.base+cu.DevicePtr(off), 16); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return nil
	}
	return recs
}

// Close frees the device memory and releases the device's primary context.
func (h *HBM) Close() error {
	h.closeMu.Lock()
	defer h.closeMu.Unlock()
	if h.closed {
		return ErrClosed
	}
	h.closed = true
	err := h.do(func() error { return cu.MemFree(h.base) })
	h.base = 0
	if rerr := h.dev.ReleasePrimaryCtx(); err == nil {
		err = rerr
	}
	if err != nil {
		return fmt.Errorf("tiers: hbm: close: %w", err)
	}
	return nil
}
