package transfer

import (
	"context"
	"errors"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/internal/testkit"
)

// The arena against a model: a byte map of which 64-byte units are taken.
// Random allocations and frees must never overlap, must stay inside the
// region, and must succeed whenever the model has a large enough hole
// (first fit finds any hole that fits).
func TestArenaModel(t *testing.T) {
	const size = 64 << 10
	const units = size / valueAlign
	r := rand.New(rand.NewPCG(1, 2))
	a := newArena(size)
	var taken [units]bool
	type alloc struct{ off, n int64 }
	var live []alloc
	largestHole := func() int64 {
		best, run := 0, 0
		for _, tk := range taken {
			if tk {
				run = 0
				continue
			}
			run++
			best = max(best, run)
		}
		return int64(best) * valueAlign
	}
	for step := range 20000 {
		if len(live) > 0 && r.IntN(2) == 0 {
			i := r.IntN(len(live))
			x := live[i]
			live = append(live[:i], live[i+1:]...)
			a.release(x.off, x.n)
			for u := x.off / valueAlign; u < (x.off+alignExtent(x.n))/valueAlign; u++ {
				taken[u] = false
			}
			continue
		}
		n := int64(r.IntN(8 << 10))
		off, ok := a.alloc(n)
		if !ok {
			if h := largestHole(); h >= alignExtent(n) {
				t.Fatalf("step %d: alloc of %d failed with a %d-byte hole", step, n, h)
			}
			continue
		}
		if n == 0 {
			continue
		}
		if off%valueAlign != 0 || off < 0 || off+n > size {
			t.Fatalf("step %d: alloc of %d at %d", step, n, off)
		}
		for u := off / valueAlign; u < (off+alignExtent(n))/valueAlign; u++ {
			if taken[u] {
				t.Fatalf("step %d: alloc of %d at %d overlaps a live one", step, n, off)
			}
			taken[u] = true
		}
		live = append(live, alloc{off, n})
	}
	for _, x := range live {
		a.release(x.off, x.n)
	}
	if a.used != 0 || len(a.free) != 1 || a.free[0] != (extent{0, size}) {
		t.Fatalf("after freeing everything: used %d, free list %v", a.used, a.free)
	}
}

func TestArenaDoubleFreePanics(t *testing.T) {
	a := newArena(4096)
	off, _ := a.alloc(100)
	a.release(off, 100)
	defer func() {
		if recover() == nil {
			t.Fatal("double free did not panic")
		}
	}()
	a.release(off, 100)
}

func TestByteSem(t *testing.T) {
	s := newByteSem(100)
	ctx := context.Background()
	if err := s.acquire(ctx, 60); err != nil {
		t.Fatal(err)
	}
	// 50 does not fit: it waits, and gives up with its context.
	short, cancel := context.WithTimeout(ctx, 10*time.Millisecond)
	defer cancel()
	if err := s.acquire(short, 50); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("acquire over the size: %v", err)
	}
	// First come, first served: 10 would fit, but queues behind 50.
	got := make(chan int, 2)
	go func() { s.acquire(ctx, 50); got <- 50 }()
	testkit.WaitFor(t, "the first waiter to queue", func() bool { s.mu.Lock(); defer s.mu.Unlock(); return len(s.mu.waiters) == 1 })
	go func() { s.acquire(ctx, 10); got <- 10 }()
	testkit.WaitFor(t, "the second waiter to queue", func() bool { s.mu.Lock(); defer s.mu.Unlock(); return len(s.mu.waiters) == 2 })
	s.release(60)
	if a, b := <-got, <-got; a+b != 60 {
		t.Fatalf("waiters granted %d and %d", a, b)
	}
	s.release(60)
	if s.mu.used != 0 {
		t.Fatalf("%d bytes still held", s.mu.used)
	}
}

func TestBuffersAligned(t *testing.T) {
	for _, n := range []int{1, 100, 64 << 10, 64<<10 + 1, 3 << 20} {
		b := getBuffer(n)
		if len(b.b) != n || uintptrOf(b.b)%valueAlign != 0 {
			t.Fatalf("getBuffer(%d): %d bytes at %#x", n, len(b.b), uintptrOf(b.b))
		}
		putBuffer(b)
	}
}
