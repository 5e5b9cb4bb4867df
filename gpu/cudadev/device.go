//go:build cuda

// Package cudadev is gpumem.Device on a CUDA GPU, through gorgonia.org/cu and
// the driver API. It is thin on purpose: every call maps to one driver call,
// and the logic above it (staging, chunking, completion) is tiers.HBM's,
// tested in the default build against a fake device.
//
// Importing this package runs cu's init, which exits the process when the
// driver finds no device. Only cmd/kvmesh-cuda (a plugin that package gpu
// loads after probing for a device) imports it; see package gpu. It has been
// compiled and vetted against CUDA 11.8, and has not yet run on a GPU.
//
// CUDA contexts are bound to OS threads: every call locks its goroutine to
// its thread and makes the device's primary context current there.
package cudadev

/*
#cgo LDFLAGS: -lcuda
#cgo linux CFLAGS: -I/usr/local/cuda/include
#cgo linux LDFLAGS: -L/usr/local/cuda/lib64
#include <cuda.h>

// cu v0.9.6 wraps cuMemFreeHost but not cuMemHostAlloc. PORTABLE: the
// buffer is pinned for every context, not only the current one.
static CUresult hostAlloc(void **p, size_t n) {
	return cuMemHostAlloc(p, n, CU_MEMHOSTALLOC_PORTABLE);
}
*/
import "C"

import (
	"fmt"
	"runtime"
	"unsafe"

	"gorgonia.org/cu"

	"github.com/kvmesh/kvmesh/tiers/gpumem"
)

// Device is one CUDA device and its primary context.
type Device struct {
	dev  cu.Device
	ctx  cu.CUContext
	name string
}

var _ gpumem.Device = (*Device)(nil)

// Open retains the primary context of device ordinal.
func Open(ordinal int) (*Device, error) {
	dev, err := cu.GetDevice(ordinal)
	if err != nil {
		return nil, fmt.Errorf("cudadev: device %d: %w", ordinal, err)
	}
	name, err := dev.Name()
	if err != nil {
		return nil, fmt.Errorf("cudadev: device %d name: %w", ordinal, err)
	}
	ctx, err := dev.RetainPrimaryCtx()
	if err != nil {
		return nil, fmt.Errorf("cudadev: device %d context: %w", ordinal, err)
	}
	return &Device{dev: dev, ctx: ctx, name: fmt.Sprintf("%s (CUDA device %d)", name, ordinal)}, nil
}

// String names the device.
func (d *Device) String() string { return d.name }

// do runs fn with the device's context current on the calling thread.
func (d *Device) do(fn func() error) error {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if err := cu.SetCurrentContext(d.ctx); err != nil {
		return fmt.Errorf("cudadev: set context: %w", err)
	}
	return fn()
}

// Alloc allocates n bytes of device memory (cuMemAlloc).
func (d *Device) Alloc(n int64) (p gpumem.Ptr, err error) {
	err = d.do(func() error {
		dp, err := cu.MemAlloc(n)
		p = gpumem.Ptr(dp)
		return err
	})
	return p, err
}

// Free releases memory from Alloc (cuMemFree).
func (d *Device) Free(p gpumem.Ptr) error {
	return d.do(func() error { return cu.MemFree(cu.DevicePtr(p)) })
}

// HostAlloc allocates n bytes of pinned host memory (cuMemHostAlloc). The
// slice is outside the Go heap: it must be released with HostFree.
func (d *Device) HostAlloc(n int) (b []byte, err error) {
	err = d.do(func() error {
		var p unsafe.Pointer
		if r := C.hostAlloc(&p, C.size_t(n)); r != C.CUDA_SUCCESS {
			return fmt.Errorf("cudadev: cuMemHostAlloc of %d bytes: CUresult %d", n, int(r))
		}
		b = unsafe.Slice((*byte)(p), n)
		return nil
	})
	return b, err
}

// HostFree releases memory from HostAlloc (cuMemFreeHost).
func (d *Device) HostFree(b []byte) error {
	return d.do(func() error { return cu.MemFreeHost(unsafe.Pointer(unsafe.SliceData(b))) })
}

// NewStream creates a non-blocking stream: its copies do not wait for work
// on the legacy default stream.
func (d *Device) NewStream() (gpumem.Stream, error) {
	s := &stream{d: d}
	err := d.do(func() (err error) { s.s, err = cu.MakeStream(cu.NonBlocking); return err })
	if err != nil {
		return nil, fmt.Errorf("cudadev: create stream: %w", err)
	}
	return s, nil
}

// Close releases the primary context.
func (d *Device) Close() error {
	if err := d.dev.ReleasePrimaryCtx(); err != nil {
		return fmt.Errorf("cudadev: release context: %w", err)
	}
	return nil
}

// stream is a CUDA stream; see gpumem.Stream.
type stream struct {
	d *Device
	s cu.Stream
}

func (s *stream) HtoD(dst gpumem.Ptr, src []byte) error {
	if len(src) == 0 {
		return nil
	}
	return s.d.do(func() error {
		return cu.MemcpyHtoDAsync(cu.DevicePtr(dst), unsafe.Pointer(&src[0]), int64(len(src)), s.s)
	})
}

func (s *stream) DtoH(dst []byte, src gpumem.Ptr) error {
	if len(dst) == 0 {
		return nil
	}
	return s.d.do(func() error {
		return cu.MemcpyDtoHAsync(unsafe.Pointer(&dst[0]), cu.DevicePtr(src), int64(len(dst)), s.s)
	})
}

func (s *stream) DtoD(dst, src gpumem.Ptr, n int64) error {
	return s.d.do(func() error { return cu.MemcpyDtoDAsync(cu.DevicePtr(dst), cu.DevicePtr(src), n, s.s) })
}

// Wait blocks until the stream's copies are done (cuStreamSynchronize).
func (s *stream) Wait() error {
	return s.d.do(func() error { return s.s.Synchronize() })
}

func (s *stream) Close() error {
	return s.d.do(func() error { return s.s.Destroy() })
}
