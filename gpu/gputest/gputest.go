// Package gputest is a GPU in host memory for tests: a gpumem.BLAS whose
// device memory is Go byte slices and whose products are gonum's. It checks
// what a real device would punish but not always visibly: its streams run
// their copies and products only at Wait, so code that reads a result before
// waiting for it, or reuses a staging buffer a copy has not drained, sees
// wrong bytes; asynchronous copies of host memory that HostAlloc did not
// return fail, as unpinned memory must not be used for them; addresses
// outside an allocation fail; and Close fails while anything allocated on
// the device is still live.
package gputest

import (
	"errors"
	"fmt"
	"sync"
	"unsafe"

	"gonum.org/v1/gonum/blas"
	"gonum.org/v1/gonum/blas/gonum"

	"github.com/kvmesh/kvmesh/gpu/gpumem"
)

// Device is a fake GPU. All methods are safe for concurrent use.
type Device struct {
	mu     sync.Mutex
	mem    map[gpumem.Ptr][]byte // allocation base → bytes
	next   gpumem.Ptr
	pinned map[*byte]int // HostAlloc'd buffers → length
	live   int           // streams not closed
	closed bool
	fail   error // returned by every Wait while set
	// limit, when positive, is the most device bytes allocated at once.
	limit, used int64
	products    int // Sgemm calls run
}

var _ gpumem.BLAS = (*Device)(nil)

// New returns an empty device.
func New() *Device {
	return &Device{mem: map[gpumem.Ptr][]byte{}, next: 1 << 40, pinned: map[*byte]int{}}
}

// String names the device.
func (d *Device) String() string { return "gputest fake device" }

// SetFail makes every later Wait fail with err (nil: succeed again), as a
// device that met an error would.
func (d *Device) SetFail(err error) {
	d.mu.Lock()
	d.fail = err
	d.mu.Unlock()
}

// SetLimit makes Alloc fail once more than n bytes would be allocated at
// once (0: no limit).
func (d *Device) SetLimit(n int64) {
	d.mu.Lock()
	d.limit = n
	d.mu.Unlock()
}

// Closed reports whether Close succeeded.
func (d *Device) Closed() bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.closed
}

// Products returns the number of products (Sgemm) run so far.
func (d *Device) Products() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.products
}

// Live returns the device allocations, pinned buffers and streams not yet
// released.
func (d *Device) Live() (allocs, pinned, streams int) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return len(d.mem), len(d.pinned), d.live
}

// Alloc allocates n bytes of device memory.
func (d *Device) Alloc(n int64) (gpumem.Ptr, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.limit > 0 && d.used+n > d.limit {
		return 0, fmt.Errorf("gputest: out of memory: %d bytes allocated, %d more asked, limit %d", d.used, n, d.limit)
	}
	p := d.next
	d.mem[p] = make([]byte, n)
	d.used += n
	d.next += gpumem.Ptr(n) + 1<<20
	return p, nil
}

// Free releases memory from Alloc.
func (d *Device) Free(p gpumem.Ptr) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	b, ok := d.mem[p]
	if !ok {
		return fmt.Errorf("gputest: free of %#x, not allocated", p)
	}
	d.used -= int64(len(b))
	delete(d.mem, p)
	return nil
}

// Bytes returns the device bytes [p, p+n), aliased: what a copy from the
// device would read once every stream has been waited for.
func (d *Device) Bytes(p gpumem.Ptr, n int64) ([]byte, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	for base, b := range d.mem {
		if p >= base && p+gpumem.Ptr(n) <= base+gpumem.Ptr(len(b)) {
			return b[p-base : p-base+gpumem.Ptr(n)], nil
		}
	}
	return nil, fmt.Errorf("gputest: %d bytes at %#x are not device memory", n, p)
}

// floats returns the n float32s at p, aliased.
func (d *Device) floats(p gpumem.Ptr, n int) ([]float32, error) {
	if n == 0 {
		return nil, nil
	}
	if p%4 != 0 {
		return nil, fmt.Errorf("gputest: float32 matrix at %#x is not aligned", p)
	}
	b, err := d.Bytes(p, 4*int64(n))
	if err != nil {
		return nil, err
	}
	return unsafe.Slice((*float32)(unsafe.Pointer(&b[0])), n), nil
}

// HostAlloc allocates n bytes of "pinned" host memory.
func (d *Device) HostAlloc(n int) ([]byte, error) {
	b := make([]byte, max(n, 1))[:n]
	d.mu.Lock()
	d.pinned[unsafe.SliceData(b)] = n
	d.mu.Unlock()
	return b, nil
}

// HostFree releases memory from HostAlloc.
func (d *Device) HostFree(b []byte) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if _, ok := d.pinned[unsafe.SliceData(b)]; !ok {
		return errors.New("gputest: HostFree of memory HostAlloc did not return")
	}
	delete(d.pinned, unsafe.SliceData(b))
	return nil
}

// isPinned reports whether b lies within a HostAlloc'd buffer.
func (d *Device) isPinned(b []byte) bool {
	if len(b) == 0 {
		return true
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	p := uintptr(unsafe.Pointer(&b[0]))
	for base, n := range d.pinned {
		q := uintptr(unsafe.Pointer(base))
		if p >= q && p+uintptr(len(b)) <= q+uintptr(n) {
			return true
		}
	}
	return false
}

// NewStream creates a stream.
func (d *Device) NewStream() (gpumem.Stream, error) {
	d.mu.Lock()
	d.live++
	d.mu.Unlock()
	return &stream{d: d}, nil
}

// Close fails if anything allocated on the device is still live.
func (d *Device) Close() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if len(d.mem) != 0 || len(d.pinned) != 0 || d.live != 0 {
		return fmt.Errorf("gputest: closed with %d allocations, %d pinned buffers, %d streams", len(d.mem), len(d.pinned), d.live)
	}
	d.closed = true
	return nil
}

// Sgemm enqueues the product on s (see gpumem.BLAS); it runs, with gonum's
// Sgemm, at s.Wait.
func (d *Device) Sgemm(s gpumem.Stream, transA, transB bool, m, n, k int, alpha float32, a gpumem.Ptr, lda int, b gpumem.Ptr, ldb int, beta float32, c gpumem.Ptr, ldc int) error {
	st, ok := s.(*stream)
	if !ok || st.d != d {
		return fmt.Errorf("gputest: Sgemm on a stream of another device (%T)", s)
	}
	ta, tb := blas.NoTrans, blas.NoTrans
	ar, ac := m, k
	if transA {
		ta, ar, ac = blas.Trans, k, m
	}
	br, bc := k, n
	if transB {
		tb, br, bc = blas.Trans, n, k
	}
	if m < 0 || n < 0 || k < 0 || lda < max(1, ac) || ldb < max(1, bc) || ldc < max(1, n) {
		return fmt.Errorf("gputest: Sgemm m=%d n=%d k=%d lda=%d ldb=%d ldc=%d: bad shape", m, n, k, lda, ldb, ldc)
	}
	size := func(rows, cols, ld int) int {
		if rows == 0 || cols == 0 {
			return 0
		}
		return (rows-1)*ld + cols
	}
	return st.enqueue(nil, func() error {
		am, err := d.floats(a, size(ar, ac, lda))
		if err != nil {
			return err
		}
		bm, err := d.floats(b, size(br, bc, ldb))
		if err != nil {
			return err
		}
		cm, err := d.floats(c, size(m, n, ldc))
		if err != nil {
			return err
		}
		d.mu.Lock()
		d.products++
		d.mu.Unlock()
		if m == 0 || n == 0 {
			return nil
		}
		if k == 0 {
			// gonum wants a non-empty A and B; C = beta·C.
			for i := range m {
				for j := range n {
					cm[i*ldc+j] *= beta
				}
			}
			return nil
		}
		gonum.Implementation{}.Sgemm(ta, tb, m, n, k, alpha, am, lda, bm, ldb, beta, cm, ldc)
		return nil
	})
}

// stream queues its work until Wait.
type stream struct {
	d     *Device
	queue []func() error
	busy  sync.Mutex // a Stream is used by one goroutine at a time
}

func (s *stream) enqueue(host []byte, op func() error) error {
	if !s.busy.TryLock() {
		panic("gputest: stream used by two goroutines at once")
	}
	defer s.busy.Unlock()
	if !s.d.isPinned(host) {
		return errors.New("gputest: asynchronous copy of unpinned host memory")
	}
	s.queue = append(s.queue, op)
	return nil
}

func (s *stream) HtoD(dst gpumem.Ptr, src []byte) error {
	return s.enqueue(src, func() error {
		b, err := s.d.Bytes(dst, int64(len(src)))
		copy(b, src)
		return err
	})
}

func (s *stream) DtoH(dst []byte, src gpumem.Ptr) error {
	return s.enqueue(dst, func() error {
		b, err := s.d.Bytes(src, int64(len(dst)))
		copy(dst, b)
		return err
	})
}

func (s *stream) DtoD(dst, src gpumem.Ptr, n int64) error {
	return s.enqueue(nil, func() error {
		a, err := s.d.Bytes(src, n)
		if err != nil {
			return err
		}
		b, err := s.d.Bytes(dst, n)
		copy(b, a)
		return err
	})
}

func (s *stream) Wait() error {
	q := s.queue
	s.queue = nil
	var first error
	for _, op := range q {
		if err := op(); first == nil {
			first = err
		}
	}
	s.d.mu.Lock()
	fail := s.d.fail
	s.d.mu.Unlock()
	if fail != nil {
		return fail
	}
	return first
}

func (s *stream) Close() error {
	s.d.mu.Lock()
	s.d.live--
	s.d.mu.Unlock()
	return nil
}
