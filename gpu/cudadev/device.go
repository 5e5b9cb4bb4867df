//go:build cuda

// Package cudadev is gpumem.BLAS on a CUDA GPU, through gorgonia.org/cu (the
// driver API) and gorgonia.org/cu/blas (cuBLAS). It is thin on purpose: every
// call maps to one driver or cuBLAS call, and the logic above it (staging,
// chunking, completion, which products to run) is tiers.HBM's and
// prefill.Device's, tested in the default build against a fake device
// (gpu/gputest).
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
	"sync"
	"unsafe"

	"gonum.org/v1/gonum/blas"
	"gorgonia.org/cu"
	cublas "gorgonia.org/cu/blas"

	"github.com/kvmesh/kvmesh/gpu/gpumem"
)

// Device is one CUDA device and its primary context.
type Device struct {
	dev  cu.Device
	ctx  cu.CUContext
	name string
	// blas is the cuBLAS handle, made at the first product. Its calls are
	// serialized: a handle is not safe for concurrent use.
	blas struct {
		sync.Mutex
		h *cublas.Standard
	}
}

var _ gpumem.BLAS = (*Device)(nil)

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
	err := d.do(func() (err error) {
		if s.s, err = cu.MakeStream(cu.NonBlocking); err != nil {
			return err
		}
		if s.before, err = cu.MakeEvent(cu.DisableTiming); err != nil {
			return err
		}
		s.after, err = cu.MakeEvent(cu.DisableTiming)
		return err
	})
	if err != nil {
		_ = d.do(s.destroy)
		return nil, fmt.Errorf("cudadev: create stream: %w", err)
	}
	return s, nil
}

// Sgemm enqueues a row-major product on s (see gpumem.BLAS). cuBLAS is
// column-major, and a row-major matrix is its transpose in column-major
// order, so C = op(A)·op(B) is computed as Cᵀ = op(B)ᵀ·op(A)ᵀ: the operands
// swapped, nothing copied. The handle of gorgonia.org/cu/blas runs on the
// legacy default stream, which a non-blocking stream does not synchronize
// with; two events order the product after s's queued work and s's later
// work after the product, without the host waiting.
func (d *Device) Sgemm(s gpumem.Stream, transA, transB bool, m, n, k int, alpha float32, a gpumem.Ptr, lda int, b gpumem.Ptr, ldb int, beta float32, c gpumem.Ptr, ldc int) error {
	st, ok := s.(*stream)
	if !ok || st.d != d {
		return fmt.Errorf("cudadev: Sgemm on a stream of another device (%T)", s)
	}
	if m == 0 || n == 0 {
		return nil
	}
	op := func(t bool) blas.Transpose {
		if t {
			return blas.Trans
		}
		return blas.NoTrans
	}
	d.blas.Lock()
	defer d.blas.Unlock()
	err := d.do(func() error {
		if d.blas.h == nil {
			// cublasCreate binds the handle to the current context, d.ctx.
			h := &cublas.Standard{}
			if err := h.Init(); err != nil {
				return err
			}
			d.blas.h = h
		}
		var legacy cu.Stream // the NULL stream
		if err := st.before.Record(st.s); err != nil {
			return err
		}
		if err := legacy.Wait(st.before, 0); err != nil {
			return err
		}
		h := d.blas.h
		h.Sgemm(op(transB), op(transA), n, m, k, alpha, devFloats(b), ldb, devFloats(a), lda, beta, devFloats(c), ldc)
		if err := h.Err(); err != nil {
			// The handle's error is sticky: make a new one for the next product.
			d.blas.h = nil
			return fmt.Errorf("cublasSgemm: %w", err)
		}
		if err := st.after.Record(legacy); err != nil {
			return err
		}
		return st.s.Wait(st.after, 0)
	})
	if err != nil {
		return fmt.Errorf("cudadev: Sgemm %d×%d×%d: %w", m, n, k, err)
	}
	return nil
}

// devFloats is the form gorgonia.org/cu/blas takes a device address in: a
// slice whose first element's address is the device pointer. It is never
// dereferenced on the host; device memory is not in the Go heap, so the
// garbage collector ignores the pointer.
func devFloats(p gpumem.Ptr) []float32 {
	return unsafe.Slice((*float32)(*(*unsafe.Pointer)(unsafe.Pointer(&p))), 1)
}

// Close destroys the cuBLAS handle and releases the primary context.
func (d *Device) Close() error {
	d.blas.Lock()
	h := d.blas.h
	d.blas.h = nil
	d.blas.Unlock()
	if h != nil {
		if err := d.do(h.Close); err != nil {
			return fmt.Errorf("cudadev: destroy the cuBLAS handle: %w", err)
		}
	}
	if err := d.dev.ReleasePrimaryCtx(); err != nil {
		return fmt.Errorf("cudadev: release context: %w", err)
	}
	return nil
}

// stream is a CUDA stream and the events that order products on the
// cuBLAS handle's stream with it; see gpumem.Stream.
type stream struct {
	d             *Device
	s             cu.Stream
	before, after cu.Event
}

// destroy releases what NewStream made, ignoring what it did not.
func (s *stream) destroy() error {
	var first error
	keep := func(err error) {
		if first == nil {
			first = err
		}
	}
	var zeroS cu.Stream
	var zeroE cu.Event
	if s.after != zeroE {
		keep(cu.DestroyEvent(&s.after))
	}
	if s.before != zeroE {
		keep(cu.DestroyEvent(&s.before))
	}
	if s.s != zeroS {
		keep(s.s.Destroy())
	}
	return first
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
	return s.d.do(s.destroy)
}
