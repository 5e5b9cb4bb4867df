package store

import (
	"encoding/binary"
	"fmt"

	"github.com/kvmesh/kvmesh/internal/invariants"
	"github.com/kvmesh/kvmesh/prefixhash"
	"github.com/kvmesh/kvmesh/tiers"
)

// The index is the only in-RAM record of what a node caches: one 52-byte
// entry per block in pages of a slab addressed by uint32, and an
// open-addressing table of uint32 slots keyed by the key's own bits (a key is
// already a hash). No pointers, so the GC scans none of it, and a million
// cached blocks cost about 60 bytes each (BenchmarkIndexBytesPerBlock).
//
// An entry belongs to at most one recency list (a circular doubly linked list
// through prev/next with a sentinel entry as its head), and to at most one
// sibling list under its parent. The sibling list is doubly linked without a
// parent field: up is the previous sibling, or the parent itself for the
// first child (flagFirst), so unlinking is O(1) and the parent costs no word.
//
// The index is not safe for concurrent use: Local guards it with its mutex.

// entry is one cached block. Keep it at 52 bytes: TestEntrySize pins it.
type entry struct {
	key        prefixhash.Key
	loc        [2]uint32 // tiers.Loc, split so the struct needs 4-byte alignment only
	prev, next uint32    // recency list (next is also the free-list link)
	child      uint32    // first child, 0 if none
	sib        uint32    // next sibling
	up         uint32    // parent if flagFirst, else previous sibling; 0 when unlinked
	ns         uint32    // namespace id (see namespaces)
	hits       uint16    // Gets served, saturating at maxHits; the top bits are hitsCopy, hitsReused, hitsRetired, hitsRetained and hitsLapsed
	pins       uint8     // live Refs reading it in place, saturating at maxPins
	flags      uint8
}

// Entry flags.
const (
	flagPersistent uint8 = 1 << iota // lives in the persistent tier, else in memory
	flagFirst                        // up is the parent (first child)
	flagMoving                       // a mover copies it: demotion, promotion, rewrite, resolution
	flagDropped                      // out of the table and lists; freed when pins and mover are gone
	flagHit                          // touched since it was written to its tier
	flagLocGone                      // its loc was in a dropped segment: never Free it
	flagSentinel                     // head of a recency list, not a block
	flagCursor                       // a namespace's cold cursor is on it (quota.go)
)

const maxPins = 1<<8 - 1

// hitsCopy, the top bit of entry.hits, marks a copy: a block this node keeps
// beside the owner that placement gave it (Local.PutCopy under EvictDedup or
// EvictReuse). hitsReused, the next bit, marks a block reused (found by a
// lookup, or read) since it was stored or last passed over by EvictReuse.
// hitsRetired, the next, marks a group's record that its chain has moved
// past (local_groups.go); hitsRetained, the next, a value under retention
// (retain.go); hitsLapsed, the next, a value whose retention's TTL lapsed
// and that nobody read since (an eviction of it is counted as TTL expiry).
// The eight flag bits are taken, and 2047 hits saturate as well as 65535.
const (
	hitsCopy     uint16 = 1 << 15
	hitsReused   uint16 = 1 << 14
	hitsRetired  uint16 = 1 << 13
	hitsRetained uint16 = 1 << 12
	hitsLapsed   uint16 = 1 << 11
	hitsMarks           = hitsCopy | hitsReused | hitsRetired | hitsRetained | hitsLapsed
	maxHits             = hitsLapsed - 1
)

func (e *entry) getLoc() tiers.Loc  { return tiers.Loc(uint64(e.loc[1])<<32 | uint64(e.loc[0])) }
func (e *entry) setLoc(l tiers.Loc) { e.loc = [2]uint32{uint32(l), uint32(uint64(l) >> 32)} }
func (e *entry) has(f uint8) bool   { return e.flags&f != 0 }
func (e *entry) set(f uint8)        { e.flags |= f }
func (e *entry) clear(f uint8)      { e.flags &^= f }
func (e *entry) persistent() bool   { return e.flags&flagPersistent != 0 }
func (e *entry) busy() bool         { return e.pins > 0 || e.flags&flagMoving != 0 }
func (e *entry) copy() bool         { return e.hits&hitsCopy != 0 }
func (e *entry) retained() bool     { return e.hits&hitsRetained != 0 }
func (e *entry) retired() bool      { return e.hits&hitsRetired != 0 }
func (e *entry) hitCount() int      { return int(e.hits &^ hitsMarks) }
func (e *entry) setHitsSaturating() { e.hits = e.hits&hitsMarks | min(e.hits&^hitsMarks+1, maxHits) }
func (e *entry) reused() bool       { return e.hits&hitsReused != 0 }
func (e *entry) lapsed() bool       { return e.hits&hitsLapsed != 0 }

const (
	pageBits = 12
	pageLen  = 1 << pageBits

	// A table slot holds an entry index in its low idxBits and 4 bits of
	// the key (a tag) above them, so a probe rarely touches an entry whose
	// key differs. Slot 0 is empty; entry 0 is never used.
	idxBits  = 28
	idxMask  = 1<<idxBits - 1
	maxEntry = idxMask

	minTable = 1 << 10
)

type index struct {
	pages [][]entry
	next  uint32 // first never-used entry
	free  uint32 // free list through entry.next
	used  int    // entries allocated, sentinels and dropped ones included

	table []uint32
	mask  uint64
	keys  int // slots in use

	// branching counts the entries with two or more linked children: the
	// points where cached chains fork (a shared system prompt, a tool
	// list). Kept in O(1) by link, unlink and orphan.
	branching int64
}

// forks reports whether entry e has two or more linked children.
func (x *index) forks(e *entry) bool { return e.child != 0 && x.at(e.child).sib != 0 }

func (x *index) at(i uint32) *entry { return &x.pages[i>>pageBits][i&(pageLen-1)] }

// alloc returns a fresh zeroed entry for key, or 0 when the slab is at its
// hard limit.
func (x *index) alloc(key prefixhash.Key) uint32 {
	i := x.free
	if i != 0 {
		x.free = x.at(i).next
	} else {
		if x.next == 0 {
			x.next = 1
		}
		if x.next > maxEntry {
			return 0
		}
		i = x.next
		x.next++
		if int(i>>pageBits) == len(x.pages) {
			x.pages = append(x.pages, make([]entry, pageLen))
		}
	}
	*x.at(i) = entry{key: key}
	x.used++
	return i
}

// release returns entry i to the free list. It must be out of the table,
// every list and every tree: the invariants build checks it, since a child
// still linked to a released entry would name a parent that is gone (and,
// once the slot is reused, another block).
func (x *index) release(i uint32) {
	e := x.at(i)
	if invariants.Enabled {
		x.checkReleasable(i)
	}
	*e = entry{next: x.free}
	x.free = i
	x.used--
}

func slotHash(k *prefixhash.Key) (pos uint64, tag uint32) {
	return binary.LittleEndian.Uint64(k[0:8]), uint32(k[8]>>4) << idxBits
}

// find returns the entry of key, or 0.
func (x *index) find(key prefixhash.Key) uint32 {
	if x.keys == 0 {
		return 0
	}
	h, tag := slotHash(&key)
	for p := h & x.mask; ; p = (p + 1) & x.mask {
		s := x.table[p]
		if s == 0 {
			return 0
		}
		if s&^idxMask == tag {
			if i := s & idxMask; x.at(i).key == key {
				return i
			}
		}
	}
}

// insert adds entry i under its key, which must not be in the table.
func (x *index) insert(i uint32) {
	if (x.keys+1)*4 > len(x.table)*3 {
		x.grow()
	}
	x.place(i)
	x.keys++
}

func (x *index) place(i uint32) {
	h, tag := slotHash(&x.at(i).key)
	p := h & x.mask
	for x.table[p] != 0 {
		p = (p + 1) & x.mask
	}
	x.table[p] = tag | i
}

func (x *index) grow() {
	old := x.table
	n := max(minTable, 2*len(old))
	x.table = make([]uint32, n)
	x.mask = uint64(n - 1)
	for _, s := range old {
		if s != 0 {
			x.place(s & idxMask)
		}
	}
}

// remove deletes key's slot (backward-shift deletion: no tombstones, so
// probe lengths never degrade). It reports whether key was there.
func (x *index) remove(key prefixhash.Key) bool {
	if x.keys == 0 {
		return false
	}
	h, tag := slotHash(&key)
	p := h & x.mask
	for {
		s := x.table[p]
		if s == 0 {
			return false
		}
		if s&^idxMask == tag && x.at(s&idxMask).key == key {
			break
		}
		p = (p + 1) & x.mask
	}
	// Shift back every following slot whose home is at or before the hole.
	hole := p
	for q := (p + 1) & x.mask; ; q = (q + 1) & x.mask {
		s := x.table[q]
		if s == 0 {
			break
		}
		home, _ := slotHash(&x.at(s & idxMask).key)
		home &= x.mask
		// The entry at q may move to hole unless its home lies cyclically
		// in (hole, q].
		if (q-home)&x.mask >= (q-hole)&x.mask {
			x.table[hole] = s
			hole = q
		}
	}
	x.table[hole] = 0
	x.keys--
	return true
}

// The prefix tree.

// link makes child the first child of parent. child must be unlinked, and
// parent a block in the table (the invariants build checks it).
func (x *index) link(child, parent uint32) {
	c, p := x.at(child), x.at(parent)
	if c.up != 0 {
		panic(fmt.Sprintf("store: linking entry %d, already linked", child))
	}
	if invariants.Enabled && !x.inTable(parent) {
		panic(fmt.Sprintf("store: linking entry %d (%s) to parent entry %d, which is no block in the table (flags %#x)", child, c.key, parent, p.flags))
	}
	if old := p.child; old != 0 {
		o := x.at(old)
		if o.sib == 0 {
			x.branching++ // a second child
		}
		o.up = child
		o.clear(flagFirst)
		c.sib = old
	}
	c.up = parent
	c.set(flagFirst)
	p.child = child
}

// unlink removes i from its parent's children, if it has a parent.
func (x *index) unlink(i uint32) {
	e := x.at(i)
	if e.up == 0 {
		return
	}
	// Two children before, one after: the first is i or its previous
	// sibling, and the second is the other.
	if e.has(flagFirst) && e.sib != 0 && x.at(e.sib).sib == 0 || !e.has(flagFirst) && x.at(e.up).has(flagFirst) && e.sib == 0 {
		x.branching--
	}
	if e.has(flagFirst) {
		x.at(e.up).child = e.sib
		if e.sib != 0 {
			s := x.at(e.sib)
			s.up = e.up
			s.set(flagFirst)
		}
	} else {
		x.at(e.up).sib = e.sib
		if e.sib != 0 {
			x.at(e.sib).up = e.up
		}
	}
	e.up, e.sib = 0, 0
	e.clear(flagFirst)
}

// parent returns i's parent, or 0. It walks the sibling list: O(siblings).
func (x *index) parent(i uint32) uint32 {
	e := x.at(i)
	for e.up != 0 && !e.has(flagFirst) {
		e = x.at(e.up)
	}
	return e.up
}

// inTable reports whether entry i is a block in the table: not free, not a
// sentinel, not dropped.
func (x *index) inTable(i uint32) bool {
	e := x.at(i)
	return i != 0 && e.flags&(flagSentinel|flagDropped) == 0 && x.find(e.key) == i
}

// checkReleasable panics unless entry i is out of the table, its list and
// the prefix tree, and holds no pin: what release requires.
func (x *index) checkReleasable(i uint32) {
	e := x.at(i)
	switch {
	case e.flags&flagSentinel == 0 && x.find(e.key) == i:
		panic(fmt.Sprintf("store: releasing entry %d (%s), which is still in the table", i, e.key))
	case e.prev != 0 || e.next != 0:
		panic(fmt.Sprintf("store: releasing entry %d (%s), which is still in a recency list", i, e.key))
	case e.child != 0:
		panic(fmt.Sprintf("store: releasing entry %d (%s), which still has children (entry %d): they would name a parent that is gone", i, e.key, e.child))
	case e.up != 0:
		panic(fmt.Sprintf("store: releasing entry %d (%s), which is still linked to its parent", i, e.key))
	case e.pins != 0:
		panic(fmt.Sprintf("store: releasing entry %d (%s) with %d pins", i, e.key, e.pins))
	}
}
