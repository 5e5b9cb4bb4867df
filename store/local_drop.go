package store

import (
	"fmt"
	"slices"

	"github.com/kvmesh/kvmesh/tiers"
)

// DropNamespace drops every cached block of the namespace with the given
// digest and returns how many it dropped. Blocks recovered from NVMe whose
// header was not read yet are dropped when it is. Blocks pinned by Refs stay
// readable through those Refs and are freed at their release.
func (l *Local) DropNamespace(digest uint64) (int, error) {
	l.mu.Lock()
	if !l.enterLocked() {
		l.mu.Unlock()
		return 0, ErrClosed
	}
	if l.mu.unresolved > 0 {
		if l.mu.droppedUnresolved == nil {
			l.mu.droppedUnresolved = make(map[uint64]struct{})
		}
		l.mu.droppedUnresolved[digest] = struct{}{}
	}
	held := len(l.mu.ns.idsOf(digest)) > 0 // its blocks (one entry, or one per group) and objects
	pages := len(l.mu.x.pages)
	if held && l.opts.Events != nil {
		l.opts.Events.AllBlocksCleared(digest)
	}
	l.mu.Unlock()
	defer l.exit()
	dropped := 0
	// A page at a time, so that a large drop does not stall every reader.
	// Objects put meanwhile in a new object group of the digest are
	// dropped too: entries are matched by digest, not by id.
	for p := 0; p < pages && held; p++ {
		var fr []freeLoc
		l.mu.Lock()
		if len(l.mu.ns.idsOf(digest)) == 0 {
			l.mu.Unlock()
			break // all gone
		}
		for k := range pageLen {
			i := uint32(p*pageLen + k)
			e := l.mu.x.at(i)
			if e.flags&(flagSentinel|flagDropped) != 0 || e.ns == 0 {
				continue
			}
			if n := l.mu.ns.get(e.ns); n.resolved && n.digest == digest {
				l.mu.clearing = true // one AllBlocksCleared, not an event per block
				dropped += l.dropLocked(i, reasonNamespace, &fr)
				l.mu.clearing = false
			}
		}
		l.mu.Unlock()
		l.freeAll(fr)
	}
	return dropped, nil
}

// dropLocked removes entry i and every cached descendant of it from the
// index, counts them under why, and returns how many it removed.
func (l *Local) dropLocked(i uint32, why reason, fr *[]freeLoc) int {
	x := &l.mu.x
	x.unlink(i)
	stack := append(l.mu.stack[:0], i)
	n := 0
	for len(stack) > 0 {
		j := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		e := x.at(j)
		if x.forks(e) {
			x.branching--
		}
		for c := e.child; c != 0; {
			ce := x.at(c)
			next := ce.sib
			ce.up, ce.sib = 0, 0
			ce.clear(flagFirst)
			stack = append(stack, c)
			c = next
		}
		e.child = 0
		switch {
		case why == reasonUnadmitted && j == i:
			l.mu.c.nvmeUnadmitted++
		case why == reasonEvict || why == reasonUnadmitted || (why == reasonCorrupt && j != i):
			if e.lapsed() {
				l.mu.c.expired[evictTierLocked(e)]++
			} else {
				l.mu.c.evicted[evictTierLocked(e)]++
			}
		}
		l.removeLocked(j, fr)
		n++
	}
	l.mu.stack = stack[:0]
	switch why {
	case reasonEvict, reasonUnadmitted:
		l.mu.c.evictions += int64(n)
	case reasonCorrupt:
		l.mu.c.corruptDrops++
		l.mu.c.evictions += int64(n - 1)
	case reasonNamespace:
		l.mu.c.namespaceDrops += int64(n)
	case reasonRemove:
		l.mu.c.removed += int64(n)
	}
	l.mu.c.cascade += int64(n - 1)
	return n
}

// removeLocked takes i out of the table, its list and its namespace. Its
// slot and tier location go when no pin or mover holds them.
func (l *Local) removeLocked(i uint32, fr *[]freeLoc) {
	x := &l.mu.x
	e := x.at(i)
	if !x.remove(e.key) {
		panic(fmt.Sprintf("store: removing %s, which is not in the table", e.key))
	}
	l.unlistLocked(i)
	l.hbmForgetLocked(i)
	l.clearRetentionLocked(i)
	if !l.mu.clearing {
		l.evRemovedLocked(i)
	}
	if e.reused() {
		l.mu.reused--
	}
	n := l.mu.ns.get(e.ns)
	t := tierOf(e)
	l.mu.blocks[t]--
	l.mu.bytes[t] -= int64(n.size)
	if !n.resolved {
		l.mu.unresolved--
	}
	l.releaseNSLocked(e.ns, t)
	e.ns = 0
	e.set(flagDropped)
	if e.persistent() && !e.has(flagLocGone) {
		l.orphanLocked(e.getLoc())
	}
	l.finalizeIfIdleLocked(i, fr)
}

// finalizeIfIdleLocked frees a dropped entry once nothing holds it.
func (l *Local) finalizeIfIdleLocked(i uint32, fr *[]freeLoc) {
	e := l.mu.x.at(i)
	if !e.has(flagDropped) || e.busy() {
		return
	}
	if !e.has(flagLocGone) {
		*fr = append(*fr, freeLoc{e.persistent(), e.getLoc()})
	}
	l.mu.x.release(i)
}

// orphanLocked records that loc, a persistent-tier location the index no
// longer names, is to be freed. Between the unlock that hands it to freeAll
// (or, for a busy entry, to its pins or mover) and the Free, reclaim may drop
// its segment: reclaim cannot find it in the table, so it marks it here, and
// freeAll leaves it to the dropped segment.
func (l *Local) orphanLocked(loc tiers.Loc) {
	if l.seg == nil {
		return // segments are never dropped
	}
	if l.mu.orphans == nil {
		l.mu.orphans = make(map[tiers.Loc]bool)
	}
	l.mu.orphans[loc] = false
}

// freeAll frees tier locations; it is called without the lock and without
// diskMu.
func (l *Local) freeAll(fr []freeLoc) {
	if l.seg != nil && slices.ContainsFunc(fr, freeLoc.onDisk) {
		// Shared, so that no segment is dropped between the check of
		// orphans and the Free.
		l.diskMu.RLock()
		defer l.diskMu.RUnlock()
	}
	l.freeHeld(fr)
}

// freeHeld is freeAll for a caller that holds diskMu, either way.
func (l *Local) freeHeld(fr []freeLoc) {
	gone := l.takeOrphans(fr)
	for k, f := range fr {
		switch {
		case !f.disk:
			l.memFree(f.loc)
		case gone == nil || !gone[k]:
			l.disk.Free(f.loc)
		}
	}
}

// takeOrphans forgets the orphans among fr's persistent-tier locations and
// reports which of them went with a dropped segment (nil: none).
func (l *Local) takeOrphans(fr []freeLoc) []bool {
	if l.seg == nil || !slices.ContainsFunc(fr, freeLoc.onDisk) {
		return nil
	}
	var gone []bool
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.mu.orphans) == 0 {
		return nil
	}
	for k, f := range fr {
		if !f.disk {
			continue
		}
		if g, ok := l.mu.orphans[f.loc]; ok {
			delete(l.mu.orphans, f.loc)
			if g {
				if gone == nil {
					gone = make([]bool, len(fr))
				}
				gone[k] = true
			}
		}
	}
	return gone
}

func (f freeLoc) onDisk() bool { return f.disk }
