package store

import (
	"fmt"

	"github.com/kvmesh/kvmesh/prefixhash"
	"github.com/kvmesh/kvmesh/tiers"
)

// Check reports the first way s breaks the store's accounting, or nil. It
// holds for a snapshot taken while no operation is in flight (a Put, Get,
// move or drop between its reservation and its index update is counted on
// one side only):
//
//   - each tier holds what the index says it holds: as many values and
//     bytes as the index counts in it (the memory tier, also the slots of
//     the incomplete blocks: PartialSlots, PartialSlotBytes), and reserves
//     no more than its capacity;
//   - every block that came in (Puts, Recovered) is either cached or was
//     dropped (Evictions, CorruptDrops, NamespaceDrops, Removed);
//   - the namespaces' blocks add up to the tiers';
//   - the tiers' evictions (capacity, unadmitted, expired) add up to
//     Evictions, and no more blocks are marked reused, or fork, than are
//     cached.
//
// Tests call it after a workload; the invariants build (go test -race, or
// -tags invariants) calls it when a Local closes.
func (s Stats) Check() error {
	total := int64(0)
	for k, ts := range s.Tiers {
		if ts.Reserved > ts.Capacity {
			return fmt.Errorf("store: tier %s reserves %d bytes, capacity %d", ts.Name, ts.Reserved, ts.Capacity)
		}
		if k == 0 { // incomplete blocks hold memory-tier slots the index does not list
			ts.Values -= int64(s.PartialSlots)
			ts.Stored -= s.PartialSlotBytes
		}
		if ts.Blocks != ts.Values || ts.Bytes != ts.Stored {
			return fmt.Errorf("store: tier %s: the index counts %d blocks, %d bytes; the tier holds %d values, %d bytes",
				ts.Name, ts.Blocks, ts.Bytes, ts.Values, ts.Stored)
		}
		total += ts.Blocks
	}
	if in, out := s.Puts+s.Recovered, total+s.Evictions+s.CorruptDrops+s.NamespaceDrops+s.Removed; in != out {
		return fmt.Errorf("store: %d blocks came in (puts %d, recovered %d), %d are cached or were dropped (cached %d, evicted %d, corrupt %d, namespace drops %d, removed %d)",
			in, s.Puts, s.Recovered, out, total, s.Evictions, s.CorruptDrops, s.NamespaceDrops, s.Removed)
	}
	evicted := int64(0)
	for _, ts := range s.Tiers {
		evicted += ts.Evicted.Capacity + ts.Evicted.Unadmitted + ts.Evicted.Expired
	}
	if evicted != s.Evictions {
		return fmt.Errorf("store: the tiers count %d blocks evicted for room, the node %d", evicted, s.Evictions)
	}
	if s.ReusedBlocks < 0 || s.ReusedBlocks > total {
		return fmt.Errorf("store: %d blocks marked reused, %d cached", s.ReusedBlocks, total)
	}
	if s.BranchingBlocks < 0 || s.BranchingBlocks > total {
		return fmt.Errorf("store: %d blocks fork, %d cached", s.BranchingBlocks, total)
	}
	nsBlocks := int64(0)
	for _, n := range s.Namespaces {
		nsBlocks += n.Blocks
	}
	if nsBlocks != total {
		return fmt.Errorf("store: namespaces hold %d blocks, tiers %d", nsBlocks, total)
	}
	return nil
}

// checkQuiescentLocked panics when the accounting is broken at a point
// where nothing is in flight: Close, once every operation has ended and no
// Ref is live. The invariants build calls it; the tiers' Stats take only
// their own locks.
func (l *Local) checkQuiescentLocked() {
	if _, err := l.quiescentErrLocked(); err != nil {
		panic(fmt.Sprintf("%v, at Close", err))
	}
}

// checkQuiescent is checkQuiescentLocked as an error, with the snapshot it
// checked, for tests that check the store after each operation (the model
// tests).
func (l *Local) checkQuiescent() (Stats, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.quiescentErrLocked()
}

func (l *Local) quiescentErrLocked() (Stats, error) {
	s := l.statsLocked()
	s.Tiers[0].Stats = l.mem.Stats()
	if l.disk != nil {
		s.Tiers[1].Stats = l.disk.Stats()
	}
	if l.hbm != nil {
		s.Tiers[len(s.Tiers)-1].Stats = l.hbm.Stats()
	}
	if err := s.Check(); err != nil {
		return s, fmt.Errorf("%w: %+v", err, s)
	}
	return s, l.checkIndexLocked()
}

// holder is a tier that can say whether a location holds a value of a key
// (tiers.DRAM can).
type holder interface {
	Holds(loc tiers.Loc, key prefixhash.Key) bool
}

// checkIndexLocked reports the first way the index disagrees with the tiers
// or with itself, or nil. With no operation in flight:
//
//   - every block in the table names a location where its tier holds its
//     value, where the tier can say (holder), and no two blocks name one
//     location: a slot that is free, or that holds another block, is never
//     indexed;
//   - every block linked into the prefix tree hangs from a block in the
//     table: no child names a parent that is gone; and the blocks with two
//     or more children are as many as the index counts (BranchingBlocks).
func (l *Local) checkIndexLocked() error {
	x := &l.mu.x
	type where struct {
		tier int
		loc  tiers.Loc
	}
	// Only tiers that cannot say what a location holds need the map: where
	// one can, a location that holds block i's key is not block j's.
	var seen map[where]uint32
	forks := int64(0)
	for _, slot := range x.table {
		if slot == 0 {
			continue
		}
		i := slot & idxMask
		e := x.at(i)
		loc, tier, t := e.getLoc(), tierOf(e), tiers.Tier(l.mem)
		switch {
		case e.persistent():
			t = l.disk
		case isHBM(loc):
			tier, t, loc = 2, l.hbm, loc&^hbmTag
		}
		if e.persistent() && e.has(flagLocGone) {
			return fmt.Errorf("store: entry %d (%s) is in the table with its location gone", i, e.key)
		}
		if h, ok := t.(holder); ok {
			if !h.Holds(loc, e.key) {
				return fmt.Errorf("store: entry %d (%s) names location %#x, where tier %s holds no value of it: an index entry whose location is dead (freed, or taken by another value)", i, e.key, uint64(loc), t.Name())
			}
		} else {
			w := where{tier, loc}
			if j, dup := seen[w]; dup {
				return fmt.Errorf("store: entries %d and %d (%s, %s) both name location %#x of tier %s", j, i, x.at(j).key, e.key, uint64(loc), t.Name())
			}
			if seen == nil {
				seen = make(map[where]uint32)
			}
			seen[w] = i
		}
		if x.forks(e) {
			forks++
		}
		// A first child's up is its parent (the others' is a sibling):
		// checking first children checks every child's parent.
		if e.up != 0 && e.has(flagFirst) && !x.inTable(e.up) {
			return fmt.Errorf("store: entry %d (%s) hangs from entry %d, which is no block in the table", i, e.key, e.up)
		}
	}
	if forks != x.branching {
		return fmt.Errorf("store: %d blocks have two or more children, the index counts %d", forks, x.branching)
	}
	return nil
}
