package store

import (
	"github.com/kvmesh/kvmesh/auth"
	"github.com/kvmesh/kvmesh/block"
	"github.com/kvmesh/kvmesh/prefixhash"
)

// Records of hybrid namespaces (prefixhash.Groups): each block of a prompt
// is one record per group, group g's under GroupKey(k_i, g). The index
// needs nothing new for them: a record is a block whose size is its
// group's (namespaces keeps one entry per group), whose LinkParent is the
// same group's record of the parent block (full and indexer groups) or the
// anchor's record of its own block (sliding and state groups), so that
// dropping a full block drops the windows and states that hang from it.
//
// Bytes kept follow the hit rule. A writer may store every group's record
// at every block, but a reader resuming at P needs only the window before P
// and the state at P: when a chain grows past them, the older ones are
// retired (retireBehindLocked). A retired record is listed at the cold end
// of its tier, marked (hitsRetired), and is the first thing dropped when
// memory is needed, in any size class, before any live block is demoted
// (dropRetiredForRoom); it is dropped, not demoted, and a read makes it an
// ordinary record again.

// Resume applies the hit rule (prefixhash.Resume) to chain, the keys of a
// prompt's blocks from block 0 in a namespace with groups, over the records
// held here that a request with access a may see. It touches nothing.
func (l *Local) Resume(a auth.Access, groups []prefixhash.Group, blockTokens int, chain []prefixhash.Key) prefixhash.Hit {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.mu.closed {
		hit, _ := prefixhash.Resume(groups, blockTokens, 0, nil)
		return hit
	}
	hit, _ := prefixhash.Resume(groups, blockTokens, len(chain), func(g, i int) prefixhash.Presence {
		if l.containsLocked(a, prefixhash.GroupKey(chain[i], g)) {
			return prefixhash.Held
		}
		return prefixhash.Missing
	})
	return hit
}

// ContainsMany sets held[k] when keys[k] is cached here as a block a
// request with access a may see (Contains, under one lock hold).
func (l *Local) ContainsMany(a auth.Access, keys []prefixhash.Key, held []bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.mu.closed {
		return
	}
	for k, key := range keys {
		held[k] = l.containsLocked(a, key)
	}
}

func (l *Local) containsLocked(a auth.Access, key prefixhash.Key) bool {
	i := l.mu.x.find(key)
	return i != 0 && l.mu.ns.allows(a, l.mu.x.at(i).ns)
}

// retireBehindLocked retires what group record i (header h), just put,
// makes useless to a reader who resumes at the end of its chain: for a
// state, the same group's state at the parent block; for a sliding
// window's block, the same group's block that fell out of the window
// (⌈W/B⌉ blocks back, found by walking the anchor's chain), unless a
// branch of the chain starts within the window, whose reader may still
// need it.
func (l *Local) retireBehindLocked(i uint32, h *block.Header) {
	x := &l.mu.x
	switch h.Group.Kind {
	case prefixhash.GroupState:
		l.retireLocked(i, prefixhash.GroupKey(h.Parent, h.Group.Index))
	case prefixhash.GroupSliding:
		if h.Group.Anchor < 0 {
			return // nothing to walk back along
		}
		// The anchor's record of the parent block, then w-1 blocks up.
		p := x.find(prefixhash.GroupKey(h.Parent, h.Group.Anchor))
		for step := 1; ; step++ {
			if p == 0 {
				return
			}
			if l.branchesLocked(p) {
				return // a branch within the window
			}
			if step == h.Group.WindowBlocks {
				break
			}
			p = x.parent(p)
		}
		chain := prefixhash.GroupKey(x.at(p).key, h.Group.Anchor)
		l.retireLocked(i, prefixhash.GroupKey(chain, h.Group.Index))
	}
}

// branchesLocked reports whether two or more records of p's own group
// hang from p: the chain branches after p's block. (The windows and
// states of p's block hang from it too, but are of other groups.)
func (l *Local) branchesLocked(p uint32) bool {
	x := &l.mu.x
	n := 0
	for c := x.at(p).child; c != 0; c = x.at(c).sib {
		if x.at(c).ns == x.at(p).ns {
			if n++; n > 1 {
				return true
			}
		}
	}
	return false
}

// retireLocked retires the record under key, if it is cached as a record
// of the same namespace as entry by, idle and in no HBM slot.
func (l *Local) retireLocked(by uint32, key prefixhash.Key) {
	x := &l.mu.x
	j := x.find(key)
	if j == 0 || j == by {
		return
	}
	e := x.at(j)
	if e.retired() || e.retained() || e.copy() || e.busy() || isHBM(e.getLoc()) || !l.mu.ns.same(e.ns, x.at(by).ns) {
		return
	}
	e.hits |= hitsRetired
	if e.reused() { // no second chance for it under EvictReuse
		e.hits &^= hitsReused
		l.mu.reused--
	}
	l.placeCopyLocked(j) // the cold end of its tier's list, as a copy goes
	if !e.persistent() {
		l.mu.retiredHint++
	}
	l.mu.c.retired++
}

// dropRetiredForRoom drops the retired records at the cold end of every
// memory size class, reporting whether it dropped any: under Classed
// room for one class is made from others' slabs only as they empty, and
// retired records (windows and states a chain has moved past) go before
// any live block of any class.
func (l *Local) dropRetiredForRoom() bool {
	l.mu.Lock()
	if l.mu.retiredHint == 0 {
		l.mu.Unlock()
		return false
	}
	x := &l.mu.x
	var fr []freeLoc
	dropped := 0
	for _, list := range l.mu.memLists {
		if list == 0 {
			continue
		}
		for j, walked := x.at(list).prev, 0; j != list && walked < maxVictimWalk; walked++ {
			e := x.at(j)
			prev := e.prev
			if !e.copy() && !e.retired() {
				break // copies and retired records share the cold end
			}
			if e.retired() && !e.busy() && !isHBM(e.getLoc()) && !l.keepTreeLocked(j, false) {
				dropped += l.dropLocked(j, reasonEvict, &fr)
			}
			j = prev
		}
	}
	if dropped == 0 {
		l.mu.retiredHint = 0
	}
	l.mu.Unlock()
	l.freeAll(fr)
	return dropped > 0
}
