package bench

import (
	"container/heap"
	"sync"

	"github.com/kvmesh/kvmesh/prefixhash"
)

// DepthPenalty is EvictDepthLRU's penalty, in requests per block of chain
// depth: a block at depth d is evicted as if it were last used
// DepthPenalty × d requests earlier than it was.
const DepthPenalty = 8

// depthLRU is LRU with a penalty for depth: it evicts the block with the
// least last use − DepthPenalty × depth (ties: the deeper first), and does
// not admit a block that would be the one to evict. Deep
// blocks are those of long chains, which a later turn is less likely to
// continue, and a deep block is worth nothing once a shallower one of its
// chain is gone. A simulation only: kvmesh nodes run the prefix-aware LRU.
type depthLRU struct {
	capacity int
	mu       struct {
		sync.Mutex
		score   map[prefixhash.Key]int64
		heap    leastScore // lazily updated: stale items are skipped
		evicted int
	}
}

func newDepthLRU(capacity int) *depthLRU {
	d := &depthLRU{capacity: capacity}
	d.mu.score = make(map[prefixhash.Key]int64, min(capacity, 1<<20))
	return d
}

func depthScore(now, depth int) int64 {
	const k = 1 << 10
	return int64(now)*k - int64(depth)*(DepthPenalty*k+1)
}

func (d *depthLRU) contains(k prefixhash.Key) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	_, ok := d.mu.score[k]
	return ok
}

func (d *depthLRU) touchAt(k prefixhash.Key, now, depth int) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if _, ok := d.mu.score[k]; ok {
		d.setLocked(k, depthScore(now, depth))
	}
}

func (d *depthLRU) insertAt(k prefixhash.Key, now, depth int) {
	d.mu.Lock()
	defer d.mu.Unlock()
	s := depthScore(now, depth)
	if _, ok := d.mu.score[k]; !ok {
		for len(d.mu.score) >= d.capacity {
			it := heap.Pop(&d.mu.heap).(scoreItem)
			if cur, ok := d.mu.score[it.key]; !ok || cur != it.score {
				continue // stale
			}
			if s < it.score {
				// Colder than everything held (a deep block of a chain
				// put under its own prefix): not admitted, so that it
				// does not evict its own ancestors.
				heap.Push(&d.mu.heap, it)
				d.mu.evicted++
				return
			}
			delete(d.mu.score, it.key)
			d.mu.evicted++
		}
	}
	d.setLocked(k, s)
}

func (d *depthLRU) setLocked(k prefixhash.Key, s int64) {
	d.mu.score[k] = s
	heap.Push(&d.mu.heap, scoreItem{k, s})
	if len(d.mu.heap) > 4*d.capacity+64 {
		live := d.mu.heap[:0]
		for _, it := range d.mu.heap {
			if cur, ok := d.mu.score[it.key]; ok && cur == it.score {
				live = append(live, it)
			}
		}
		d.mu.heap = live
		heap.Init(&d.mu.heap)
	}
}

// touch and insert without a depth treat the block as a chain's first.
func (d *depthLRU) touch(k prefixhash.Key, now int)  { d.touchAt(k, now, 0) }
func (d *depthLRU) insert(k prefixhash.Key, now int) { d.insertAt(k, now, 0) }

func (d *depthLRU) len() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return len(d.mu.score)
}

func (d *depthLRU) evictions() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.mu.evicted
}

type scoreItem struct {
	key   prefixhash.Key
	score int64
}

// leastScore is a min-heap of scores.
type leastScore []scoreItem

func (h leastScore) Len() int           { return len(h) }
func (h leastScore) Less(i, j int) bool { return h[i].score < h[j].score }
func (h leastScore) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *leastScore) Push(x any)        { *h = append(*h, x.(scoreItem)) }
func (h *leastScore) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}
