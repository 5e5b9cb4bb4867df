package store

import (
	"context"
	"slices"
	"sync"
	"time"

	"github.com/kvmesh/kvmesh/prefixhash"
)

// SpillStats says how far a Spill got.
type SpillStats struct {
	// Planned is the bytes the spill set out to write: the blocks only
	// memory held, within its budget.
	Planned int64
	// Blocks and Bytes were written to the persistent tier.
	Blocks int
	Bytes  int64
	// Left is the blocks only memory still holds: over the budget, past
	// the deadline, busy, over their namespace's persistent quota, or
	// refused by the tier.
	Left int
	// Took is how long the spill ran.
	Took time.Duration
}

// spillBatchBytes is what one round of a spill marks and writes: large
// writes for the persistent tier, and progress reported often.
const spillBatchBytes = 64 << 20

// spillInFlight is how many batches a spill has written at once.
const spillInFlight = 2

// Spill writes the blocks only the memory tier holds to the persistent tier,
// hottest first, at most maxBytes of them, so that the node serves them
// again after a restart: it is what a node stopping cleanly does last. The
// blocks in later (those another node has taken) go after every other.
// Blocks in HBM, and copies of blocks other nodes own, are not written.
//
// Each block moves as a demotion does (its memory is freed once it is on
// disk); one read or touched meanwhile stays in memory, and one the tier
// refuses (full, with nothing to reclaim) is dropped, as under memory
// pressure. Spill stops when ctx ends, and calls progress, when not nil,
// after each batch of up to 64 MiB (one call at a time).
func (l *Local) Spill(ctx context.Context, maxBytes int64, later []prefixhash.Key, progress func(SpillStats)) SpillStats {
	start := time.Now()
	var st SpillStats
	l.mu.Lock()
	if l.disk == nil || maxBytes <= 0 || !l.enterLocked() {
		st.Left = l.memOnlyLocked(nil)
		l.mu.Unlock()
		return st
	}
	late := make(map[prefixhash.Key]bool, len(later))
	for _, k := range later {
		late[k] = true
	}
	var first, last []uint32
	l.memOnlyLocked(func(i uint32) {
		if late[l.mu.x.at(i).key] {
			last = append(last, i)
		} else {
			first = append(first, i)
		}
	})
	var keys []prefixhash.Key
	for _, i := range append(first, last...) {
		e := l.mu.x.at(i)
		if size := int64(l.mu.ns.get(e.ns).size); st.Planned+size <= maxBytes {
			st.Planned += size
			keys = append(keys, e.key)
		}
	}
	l.mu.Unlock()
	defer l.exit()

	// Two batches in flight: the tier writes one while the other syncs.
	sem := make(chan struct{}, spillInFlight)
	var wg sync.WaitGroup
	var smu sync.Mutex // guards st from here on
	for len(keys) > 0 && ctx.Err() == nil {
		sem <- struct{}{}
		var vs []moved
		size := 0
		var fr []freeLoc
		l.mu.Lock()
		for len(keys) > 0 && size < spillBatchBytes {
			i := l.mu.x.find(keys[0])
			keys = keys[1:]
			if i == 0 {
				continue // gone since the walk
			}
			if e := l.mu.x.at(i); e.persistent() || e.busy() || e.copy() || e.has(flagDropped) || isHBM(e.getLoc()) {
				continue
			}
			vs = append(vs, l.markVictimLocked(i))
			size += vs[len(vs)-1].size
		}
		l.reserveDemotionsLocked(vs, &fr)
		// A block its namespace's quota has no room for stays where it
		// is: a spill drops nothing by choice.
		vs = slices.DeleteFunc(vs, func(m moved) bool {
			if m.skipDisk {
				l.doneMovingLocked(m.i)
			}
			return m.skipDisk
		})
		l.mu.Unlock()
		l.freeAll(fr)
		wg.Go(func() {
			defer func() { <-sem }()
			l.demote(vs)
			blocks, bytes := 0, int64(0)
			l.mu.Lock()
			for _, m := range vs {
				if i := l.mu.x.find(m.key); i != 0 && l.mu.x.at(i).persistent() {
					blocks++
					bytes += int64(m.size)
				}
			}
			l.mu.Unlock()
			smu.Lock()
			defer smu.Unlock()
			st.Blocks += blocks
			st.Bytes += bytes
			if progress != nil {
				st.Took = time.Since(start)
				progress(st)
			}
		})
	}
	wg.Wait()
	l.mu.Lock()
	st.Left = l.memOnlyLocked(nil)
	l.mu.Unlock()
	st.Took = time.Since(start)
	return st
}

// memOnlyLocked calls f, when not nil, for each block only the memory tier
// holds (DRAM, not HBM; no copy of another owner's block), hottest first
// within each size class, and returns how many there are.
func (l *Local) memOnlyLocked(f func(i uint32)) int {
	x := &l.mu.x
	n := 0
	for _, list := range l.mu.memLists {
		if list == 0 {
			continue
		}
		for j := x.at(list).next; j != list; j = x.at(j).next {
			e := x.at(j)
			if e.persistent() || e.copy() || e.has(flagDropped) || isHBM(e.getLoc()) {
				continue
			}
			n++
			if f != nil {
				f(j)
			}
		}
	}
	return n
}
