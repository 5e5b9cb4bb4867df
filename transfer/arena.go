package transfer

import (
	"fmt"
	"sort"
)

// arena hands out 64-byte-aligned extents of a region of fixed size: first
// fit over a sorted list of free extents, which free merges with its
// neighbours. The list is as long as the number of holes, at most one more
// than the number of extents allocated. It is not safe for concurrent use.
type arena struct {
	size int64
	used int64
	free []extent // sorted by off; no two overlap or touch
}

type extent struct{ off, n int64 }

func newArena(size int64) *arena {
	if size <= 0 || size%valueAlign != 0 {
		panic(fmt.Sprintf("transfer: arena of %d bytes", size))
	}
	return &arena{size: size, free: []extent{{0, size}}}
}

func alignExtent(n int64) int64 { return (n + valueAlign - 1) &^ (valueAlign - 1) }

// alloc returns the offset of n free bytes (rounded up to 64), or ok=false
// if no hole is large enough. A zero-byte allocation takes nothing and
// returns offset 0.
func (a *arena) alloc(n int64) (off int64, ok bool) {
	n = alignExtent(n)
	if n == 0 {
		return 0, true
	}
	for i, e := range a.free {
		if e.n < n {
			continue
		}
		if e.n == n {
			a.free = append(a.free[:i], a.free[i+1:]...)
		} else {
			a.free[i] = extent{e.off + n, e.n - n}
		}
		a.used += n
		return e.off, true
	}
	return 0, false
}

// release frees the n bytes at off that alloc returned. Freeing what is not
// allocated is a bug and panics.
func (a *arena) release(off, n int64) {
	n = alignExtent(n)
	if n == 0 {
		return
	}
	i := sort.Search(len(a.free), func(i int) bool { return a.free[i].off > off })
	if off < 0 || off+n > a.size ||
		(i > 0 && a.free[i-1].off+a.free[i-1].n > off) ||
		(i < len(a.free) && off+n > a.free[i].off) {
		panic(fmt.Sprintf("transfer: arena release of [%d, +%d) that is not allocated", off, n))
	}
	a.used -= n
	mergePrev := i > 0 && a.free[i-1].off+a.free[i-1].n == off
	mergeNext := i < len(a.free) && off+n == a.free[i].off
	switch {
	case mergePrev && mergeNext:
		a.free[i-1].n += n + a.free[i].n
		a.free = append(a.free[:i], a.free[i+1:]...)
	case mergePrev:
		a.free[i-1].n += n
	case mergeNext:
		a.free[i] = extent{off, n + a.free[i].n}
	default:
		a.free = append(a.free, extent{})
		copy(a.free[i+1:], a.free[i:])
		a.free[i] = extent{off, n}
	}
}
