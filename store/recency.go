package store

import (
	"fmt"
	"slices"

	"github.com/kvmesh/kvmesh/prefixhash"
)

// Recency lists. Every block in memory is in the list of its size class
// (Local.mu.memLists), every block on NVMe in Local.mu.diskList: doubly
// linked through the index's entries (entry.prev, entry.next) around a
// sentinel entry, whose next is the hottest entry and whose prev the
// coldest. Eviction walks a list from the cold end (coldestLocked); a put
// places a block right behind its parent (placeLocked) and a read makes it
// the hottest (touchLocked), so that leaves go before their ancestors. A
// namespace's quota cursors (quota.go) point into these lists: whatever
// takes an entry out of its list or moves it goes through unlistLocked or
// moveFrontLocked, which keep the cursors true.

// newList makes an empty recency list and returns its sentinel.
func (x *index) newList() uint32 {
	s := x.alloc(prefixhash.Key{})
	if s == 0 {
		panic("store: index full while creating a recency list")
	}
	e := x.at(s)
	e.flags = flagSentinel
	e.prev, e.next = s, s
	return s
}

// insertAfter links i into a list right after at (on its colder side); at may
// be a sentinel, which makes i the hottest.
func (x *index) insertAfter(at, i uint32) {
	a, e := x.at(at), x.at(i)
	e.prev, e.next = at, a.next
	x.at(a.next).prev = i
	a.next = i
}

// unlist removes i from its recency list, if it is in one.
func (x *index) unlist(i uint32) {
	e := x.at(i)
	if e.prev == 0 {
		return
	}
	x.at(e.prev).next = e.next
	x.at(e.next).prev = e.prev
	e.prev, e.next = 0, 0
}

// moveFront makes i the hottest of list.
func (x *index) moveFront(list, i uint32) {
	if x.at(list).next == i {
		return
	}
	x.unlist(i)
	x.insertAfter(list, i)
}

func (l *Local) memListLocked(class int) uint32 {
	if class < 0 {
		panic(fmt.Sprintf("store: memory list of class %d", class))
	}
	for len(l.mu.memLists) <= class {
		l.mu.memLists = append(l.mu.memLists, 0)
	}
	if l.mu.memLists[class] == 0 {
		l.mu.memLists[class] = l.mu.x.newList()
	}
	return l.mu.memLists[class]
}

// placeLocked moves i in its recency list right behind its parent (on the
// colder side) when the parent is in the same list, else to the front. So
// a chain put in order, or put again, keeps its leaves colder than its
// ancestors, and eviction takes leaves first. A copy goes to the cold end.
func (l *Local) placeLocked(i uint32, parent prefixhash.Key) {
	x := &l.mu.x
	e := x.at(i)
	if e.copy() {
		l.placeCopyLocked(i)
		return
	}
	list := l.mu.diskList
	if !e.persistent() {
		list = l.memListLocked(l.mu.ns.get(e.ns).class)
	}
	at := list
	if p := x.find(parent); p != 0 && p != i {
		if pe := x.at(p); pe.persistent() == e.persistent() && l.mu.ns.same(pe.ns, e.ns) && !pe.copy() {
			if l.opts.Eviction == EvictReuse && pe.reused() {
				// A lookup found the parent: its chain is in use, so the
				// parent, and the new block behind it, are the hottest
				// (a lookup marks, it does not move).
				l.moveFrontLocked(list, p)
			}
			at = p
		}
	}
	l.unlistLocked(i)
	x.insertAfter(at, i)
	l.placedBehindLocked(at, i)
}

// touchLocked marks i as just used: the hottest of its list (a copy stays
// where it is, at the cold end).
func (l *Local) touchLocked(i uint32) {
	x := &l.mu.x
	e := x.at(i)
	e.set(flagHit)
	e.hits &^= hitsRetired | hitsLapsed // read again: a resume point after all, wanted after its lease
	l.markReusedLocked(i)
	if e.copy() {
		return
	}
	l.hbmTouchLocked(i)
	if e.persistent() {
		l.moveFrontLocked(l.mu.diskList, i)
	} else {
		l.moveFrontLocked(l.memListLocked(l.mu.ns.get(e.ns).class), i)
	}
}

// placeCopyLocked lists copy i at the cold end of its tier's list. The cold
// cursor of its namespace, if set, moves to it: nothing of the namespace is
// colder.
func (l *Local) placeCopyLocked(i uint32) {
	x := &l.mu.x
	e := x.at(i)
	list := l.mu.diskList
	if !e.persistent() {
		list = l.memListLocked(l.mu.ns.get(e.ns).class)
	}
	l.unlistLocked(i)
	x.insertAfter(x.at(list).prev, i)
	t := tierOf(e)
	if l.mu.ns.get(e.ns).cursor[t] != 0 {
		l.setCursorLocked(e.ns, t, i)
	}
}

// unlistLocked takes i out of its recency list, moving the cursors on it to
// its hotter neighbour.
func (l *Local) unlistLocked(i uint32) {
	if l.mu.x.at(i).has(flagCursor) {
		l.uncursorLocked(i)
	}
	l.mu.x.unlist(i)
}

// moveFrontLocked makes i the hottest of list.
func (l *Local) moveFrontLocked(list, i uint32) {
	x := &l.mu.x
	if x.at(list).next == i {
		return
	}
	if x.at(i).has(flagCursor) {
		l.uncursorLocked(i)
	}
	x.unlist(i)
	x.insertAfter(list, i)
}

// placedBehindLocked keeps i's namespace's cursor true after i was listed
// right behind at.
func (l *Local) placedBehindLocked(at, i uint32) {
	x := &l.mu.x
	if !x.at(at).has(flagCursor) {
		return
	}
	e := x.at(i)
	r := cursorRef{e.ns, tierOf(e)}
	if slices.Contains(l.mu.cursors[at], r) {
		l.setCursorLocked(r.ns, r.t, i)
	}
}

// coldestLocked marks the coldest idle blocks of list as victims until they
// add up to want bytes, walking at most maxVictimWalk entries; it stops at
// stop (reporting that it reached it). The policy may pass over a block
// (secondChanceLocked), which moves it to the hot end. Values under
// retention (retain.go), and blocks with a descendant under retention or
// held by a reader (keepTreeLocked), are passed over too; soft-pinned ones
// are taken only by a second search, when the first found nothing else.
func (l *Local) coldestLocked(list uint32, want int, stop uint32) (vs []moved, reachedStop bool) {
	vs, reachedStop, sawSoft := l.coldestPassLocked(list, want, stop, false)
	if len(vs) == 0 && !reachedStop && sawSoft {
		vs, reachedStop, _ = l.coldestPassLocked(list, want, stop, true)
	}
	return vs, reachedStop
}

func (l *Local) coldestPassLocked(list uint32, want int, stop uint32, takeSoft bool) (vs []moved, reachedStop, sawSoft bool) {
	x := &l.mu.x
	got := 0
	first := uint32(0) // the first value moved out of the way: the walk ends when it comes round
	for j, walked := x.at(list).prev, 0; j != list && j != first && got < want && walked < maxVictimWalk; walked++ {
		if j == stop {
			return vs, true, sawSoft
		}
		e, prev := x.at(j), x.at(j).prev
		switch {
		case e.busy() || isHBM(e.getLoc()): // HBM empties into DRAM, not past it
		case l.keepTreeLocked(j, takeSoft):
			// Taken by the second search if only soft pins keep it.
			sawSoft = sawSoft || !takeSoft && !l.keepTreeLocked(j, true)
			l.moveFrontLocked(list, j) // out of the next search's way
			if first == 0 {
				first = j
			}
		case l.secondChanceLocked(list, j):
		default:
			vs = append(vs, l.markVictimLocked(j))
			got += vs[len(vs)-1].size
		}
		j = prev
	}
	return vs, false, sawSoft
}
