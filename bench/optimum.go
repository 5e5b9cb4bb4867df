package bench

import (
	"container/heap"
	"slices"
	"sync"

	"github.com/kvmesh/kvmesh/prefixhash"
)

// uses returns, for every full-block key of the workload, the indices of the
// requests whose chains hold it, in order.
func (w *Workload) uses() map[prefixhash.Key][]int32 {
	m := make(map[prefixhash.Key][]int32, len(w.keys)/2)
	for i := range len(w.start) - 1 {
		for _, k := range w.Keys(i) {
			u := m[k]
			if n := len(u); n == 0 || u[n-1] != int32(i) {
				m[k] = append(u, int32(i))
			}
		}
	}
	return m
}

// never is the next use of a key no later request holds.
const never = int32(1<<31 - 1)

// optimum is the offline optimum of a cache bounded in blocks (Belady's
// MIN with bypass): it evicts the block whose next use is farthest, and
// does not admit a block whose next use is farther than every block it
// holds. It knows the future from the workload, so it is a reference for
// online policies, never one a node can run. It is per block: it does not
// know that a block is useless once an ancestor is gone, which an online
// prefix policy may exploit, so it is a bound on what a per-block policy
// could do, not on every policy.
type optimum struct {
	capacity int
	uses     map[prefixhash.Key][]int32
	mu       struct {
		sync.Mutex
		next    map[prefixhash.Key]int32 // cached key → its next use
		heap    farthest                 // lazily updated: stale items are skipped
		evicted int
	}
}

func newOptimum(capacity int, uses map[prefixhash.Key][]int32) *optimum {
	o := &optimum{capacity: capacity, uses: uses}
	o.mu.next = make(map[prefixhash.Key]int32, min(capacity, 1<<20))
	return o
}

// nextUse returns the first request after now that holds k.
func (o *optimum) nextUse(k prefixhash.Key, now int) int32 {
	u := o.uses[k]
	i, _ := slices.BinarySearch(u, int32(now)+1)
	if i == len(u) {
		return never
	}
	return u[i]
}

func (o *optimum) contains(k prefixhash.Key) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	_, ok := o.mu.next[k]
	return ok
}

func (o *optimum) touch(k prefixhash.Key, now int) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if _, ok := o.mu.next[k]; ok {
		o.setLocked(k, o.nextUse(k, now))
	}
}

func (o *optimum) setLocked(k prefixhash.Key, nu int32) {
	o.mu.next[k] = nu
	heap.Push(&o.mu.heap, farItem{k, nu})
	if len(o.mu.heap) > 4*o.capacity+64 { // drop the stale items
		live := o.mu.heap[:0]
		for _, it := range o.mu.heap {
			if cur, ok := o.mu.next[it.key]; ok && cur == it.next {
				live = append(live, it)
			}
		}
		o.mu.heap = live
		heap.Init(&o.mu.heap)
	}
}

func (o *optimum) insert(k prefixhash.Key, now int) {
	o.mu.Lock()
	defer o.mu.Unlock()
	nu := o.nextUse(k, now)
	if _, ok := o.mu.next[k]; ok {
		o.setLocked(k, nu)
		return
	}
	if len(o.mu.next) >= o.capacity {
		for {
			it := heap.Pop(&o.mu.heap).(farItem)
			if cur, ok := o.mu.next[it.key]; !ok || cur != it.next {
				continue // stale
			}
			if it.next <= nu { // everything held is used before k: bypass
				heap.Push(&o.mu.heap, it)
				o.mu.evicted++
				return
			}
			delete(o.mu.next, it.key)
			o.mu.evicted++
			break
		}
	}
	o.setLocked(k, nu)
}

func (o *optimum) len() int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return len(o.mu.next)
}

func (o *optimum) evictions() int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.mu.evicted
}

type farItem struct {
	key  prefixhash.Key
	next int32
}

// farthest is a max-heap of next uses.
type farthest []farItem

func (h farthest) Len() int           { return len(h) }
func (h farthest) Less(i, j int) bool { return h[i].next > h[j].next }
func (h farthest) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *farthest) Push(x any)        { *h = append(*h, x.(farItem)) }
func (h *farthest) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}
