// Package gpumem declares what the HBM tier (tiers.HBM, its consumer, which
// re-exports these types) needs of a GPU: device memory, pinned host memory,
// and streams of asynchronous copies with a completion to wait on; and what
// the prefill engine's device backend needs besides: matrix products (BLAS).
// It is a leaf, importing nothing, because its implementation on CUDA (gpu/cudadev)
// is built into a plugin that must share every package it imports with the
// kvmesh binary loading it: the fewer, the cheaper the plugin is to build and
// the less there is to mismatch. See package gpu.
package gpumem

// Ptr is an address in a GPU's memory. The process cannot dereference
// it; only copies on a Stream reach the bytes behind it.
type Ptr uint64

// Device is a GPU's memory and copy engines. All methods are safe for
// concurrent use.
type Device interface {
	// Alloc allocates n bytes of device memory.
	Alloc(n int64) (Ptr, error)
	// Free releases memory from Alloc.
	Free(p Ptr) error
	// HostAlloc allocates n bytes of page-locked (pinned) host memory,
	// which asynchronous copies on a Stream may read and write. The slice
	// is valid until HostFree.
	HostAlloc(n int) ([]byte, error)
	// HostFree releases memory from HostAlloc.
	HostFree(b []byte) error
	// NewStream creates a queue of copies that run in order, asynchronously
	// to the caller and to other streams.
	NewStream() (Stream, error)
	// Close releases the device. Everything allocated on it must have been
	// freed first.
	Close() error
}

// Stream is an ordered queue of asynchronous copies on a Device. The
// enqueueing methods return at once; the host memory they name must come
// from Device.HostAlloc and must not be touched until Wait returns. A Stream
// is used by one goroutine at a time.
type Stream interface {
	// HtoD enqueues a copy of src to device address dst.
	HtoD(dst Ptr, src []byte) error
	// DtoH enqueues a copy of len(dst) bytes at device address src to dst.
	DtoH(dst []byte, src Ptr) error
	// DtoD enqueues a copy of n bytes between two device addresses.
	DtoD(dst, src Ptr, n int64) error
	// Wait blocks until every copy enqueued so far has completed, and
	// returns the first error any of them met.
	Wait() error
	// Close destroys the stream.
	Close() error
}

// BLAS is a Device that also multiplies matrices in its memory (cuBLAS on
// CUDA): the prefill engine's device backend (prefill.NewDevice) uploads
// its weights once with the copies of Device and runs its matrix products
// here.
type BLAS interface {
	Device
	// Sgemm enqueues on s, after the work already queued there and before
	// the work queued after it, the row-major float32 product
	//
	//	C = alpha·op(A)·op(B) + beta·C
	//
	// where op(A) is m×k, op(B) is k×n and C is m×n, all in device memory.
	// transA means A is stored k×m (op(A) = Aᵀ), transB that B is stored
	// n×k; lda, ldb and ldc are the row strides, in elements, of A, B and C
	// as stored. Like the copies, it returns at once; s.Wait reports its
	// errors.
	Sgemm(s Stream, transA, transB bool, m, n, k int, alpha float32, a Ptr, lda int, b Ptr, ldb int, beta float32, c Ptr, ldc int) error
}
