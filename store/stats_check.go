package store

import "fmt"

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
//   - the namespaces' blocks add up to the tiers'.
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
	s := l.statsLocked()
	s.Tiers[0].Stats = l.mem.Stats()
	if l.disk != nil {
		s.Tiers[1].Stats = l.disk.Stats()
	}
	if l.hbm != nil {
		s.Tiers[len(s.Tiers)-1].Stats = l.hbm.Stats()
	}
	if err := s.Check(); err != nil {
		panic(fmt.Sprintf("%v, at Close: %+v", err, s))
	}
}
