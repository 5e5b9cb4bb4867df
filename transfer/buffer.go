package transfer

import (
	"context"
	"math/bits"
	"sync"
	"unsafe"
)

// A buffer is a pooled receive buffer. b is 64-byte aligned; its capacity is
// its size class.
type buffer struct{ b []byte }

// Receive buffers come in power-of-two size classes from 64 KiB up; larger
// requests than the biggest class are allocated and dropped, not pooled. The
// pool is shared by every client and server of the process: buffers are
// plain Go memory without pointers, so the GC never scans them, and an idle
// pool empties itself over two GC cycles (sync.Pool).
const (
	minClassShift = 16
	maxClassShift = 31
)

var bufPools [maxClassShift - minClassShift + 1]sync.Pool

func classOf(n int) int {
	if n <= 1<<minClassShift {
		return 0
	}
	return bits.Len(uint(n-1)) - minClassShift
}

// getBuffer returns a buffer of n bytes (n > 0), 64-byte aligned, with
// unspecified contents. Give it back with putBuffer.
func getBuffer(n int) *buffer {
	c := classOf(n)
	if c < len(bufPools) {
		if b, ok := bufPools[c].Get().(*buffer); ok {
			b.b = b.b[:n]
			return b
		}
	}
	size := n
	if c < len(bufPools) {
		size = 1 << (c + minClassShift)
	}
	return &buffer{b: alignedBytes(size)[:n]}
}

// putBuffer returns b to its pool. b must not be used after.
func putBuffer(b *buffer) {
	c := classOf(cap(b.b))
	if c < len(bufPools) && cap(b.b) == 1<<(c+minClassShift) {
		bufPools[c].Put(b)
	}
}

// alignedBytes returns n bytes starting at a 64-byte-aligned address. Large
// Go allocations are page aligned; the slack covers the case they are not.
func alignedBytes(n int) []byte {
	b := make([]byte, n)
	if uintptr(unsafe.Pointer(unsafe.SliceData(b)))%valueAlign == 0 {
		return b
	}
	b = make([]byte, n+valueAlign)
	off := int(-uintptr(unsafe.Pointer(unsafe.SliceData(b))) % valueAlign)
	return b[off : off+n : off+n]
}

// zeros is the padding written after values whose length is not a multiple
// of 64.
var zeros [valueAlign]byte

// byteSem is a weighted semaphore of bytes, first come first served: the
// in-flight bound of clients and servers. Waiters give up with their
// context.
type byteSem struct {
	mu struct {
		sync.Mutex
		used    int64
		waiters []*semWaiter
	}
	size int64
}

type semWaiter struct {
	n     int64
	ready chan struct{}
}

func newByteSem(size int64) *byteSem { return &byteSem{size: size} }

// acquire takes n bytes (at most the semaphore's size: callers clamp),
// waiting until they are free or ctx is done.
func (s *byteSem) acquire(ctx context.Context, n int64) error {
	if n > s.size {
		panic("transfer: semaphore acquire over its size")
	}
	s.mu.Lock()
	if len(s.mu.waiters) == 0 && s.mu.used+n <= s.size {
		s.mu.used += n
		s.mu.Unlock()
		return nil
	}
	w := &semWaiter{n: n, ready: make(chan struct{})}
	s.mu.waiters = append(s.mu.waiters, w)
	s.mu.Unlock()
	select {
	case <-w.ready:
		return nil
	case <-ctx.Done():
	}
	s.mu.Lock()
	select {
	case <-w.ready:
		// Granted while we were giving up: keep the grant, give it back.
		s.mu.Unlock()
		s.release(n)
	default:
		for i, x := range s.mu.waiters {
			if x == w {
				s.mu.waiters = append(s.mu.waiters[:i], s.mu.waiters[i+1:]...)
				break
			}
		}
		// Our leaving may unblock those behind us.
		s.wakeLocked()
		s.mu.Unlock()
	}
	return ctx.Err()
}

// force takes n bytes without waiting, even past the semaphore's size.
func (s *byteSem) force(n int64) {
	s.mu.Lock()
	s.mu.used += n
	s.mu.Unlock()
}

// release gives back n bytes taken by acquire or force.
func (s *byteSem) release(n int64) {
	s.mu.Lock()
	s.mu.used -= n
	if s.mu.used < 0 {
		panic("transfer: semaphore released more than acquired")
	}
	s.wakeLocked()
	s.mu.Unlock()
}

func (s *byteSem) wakeLocked() {
	for len(s.mu.waiters) > 0 {
		w := s.mu.waiters[0]
		if s.mu.used+w.n > s.size {
			return
		}
		s.mu.used += w.n
		s.mu.waiters[0] = nil
		s.mu.waiters = s.mu.waiters[1:]
		close(w.ready)
	}
}
