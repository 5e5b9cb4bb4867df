package store

import (
	"context"
	"fmt"

	"github.com/kvmesh/kvmesh/block"
)

// Eviction names the policy that picks what a Local drops (or demotes) when
// a tier or the index is full. Every policy keeps the prefix-aware recency
// of the package doc (a chain's leaves go before its ancestors); they differ
// in what they do with copies (PutCopy).
type Eviction string

// Eviction policies.
const (
	// EvictLRU is the reference: the prefix-aware LRU. A copy is an
	// ordinary block: PutCopy is Put.
	EvictLRU Eviction = "lru"
	// EvictDedup is EvictLRU that spends no room on copies while it needs
	// room for anything else: a copy is listed at the cold end of its tier
	// and stays there when touched, so it is the first victim; it is never
	// linked into a chain (dropping it drops nothing else, and a block put
	// below it is not its child); and memory pressure drops it instead of
	// demoting it. On a pooled cluster with random routing most blocks a
	// node computes belong to other nodes, and under LRU those copies take
	// about half of every node's room (BENCHMARKS.md, issue 17). The mark
	// lives in memory only: a copy that reached NVMe (put there when DRAM
	// had no room) is an ordinary block after a restart.
	EvictDedup Eviction = "dedup"
	// EvictReuse is EvictDedup that also knows reuse: a block found by a
	// lookup (the node's own or a peer's) or read since it was stored is
	// marked, and when eviction reaches a marked block at the cold end of
	// its list it moves it to the hot end instead, clearing the mark: a
	// second chance per reuse (CLOCK's reference bit over the prefix-aware
	// LRU). Lookups count because that is how a node learns that its
	// blocks are asked for again: an engine reads a prompt's blocks from
	// whichever node the router chose, while every owner answers the
	// lookup. A block that came back once is more likely to come back
	// again (on the conversation trace a turn that continued a
	// conversation is continued in turn 42–77% of the time, a first turn
	// 30%). The mark is one bit of the entry's hit counter: no new index
	// memory. Quota trimming (a namespace's own coldest) stays LRU.
	EvictReuse Eviction = "reuse"

	// DefaultEviction is the best policy measured on the trace replays.
	DefaultEviction = EvictDedup
)

// EvictionPolicies lists the policies, the reference first.
func EvictionPolicies() []Eviction { return []Eviction{EvictLRU, EvictDedup, EvictReuse} }

// keepsCopies reports whether the policy stores PutCopy's blocks as copies.
func (e Eviction) keepsCopies() bool { return e == EvictDedup || e == EvictReuse }

// ParseEviction returns the policy named s.
func ParseEviction(s string) (Eviction, error) {
	for _, e := range EvictionPolicies() {
		if string(e) == s {
			return e, nil
		}
	}
	return "", fmt.Errorf("store: eviction %q: want %s, %s or %s", s, EvictLRU, EvictDedup, EvictReuse)
}

// PutCopy is Put for a block this node keeps although placement gives it
// to another node: the producer's copy of a block it pushes to its owner
// (Cluster.Put), or a block fetched from its owner (ClusterOptions.KeepRemote).
// Under EvictLRU it is Put. Under EvictDedup and EvictReuse the block is
// stored as a copy (see EvictDedup): a node holding copies evicts them before
// any block it owns. Putting a block already cached as an ordinary block touches it and
// leaves it ordinary; a Put of a cached copy (its owner's push, after a
// membership change) makes it ordinary.
func (l *Local) PutCopy(ctx context.Context, block []byte) error {
	return l.put(ctx, block, l.opts.Eviction.keepsCopies(), nil)
}

// ownCopyLocked makes copy i an ordinary block: its owner put it here.
// It links it to its parent as insertLocked would have.
func (l *Local) ownCopyLocked(i uint32, h *block.Header) {
	e := l.mu.x.at(i)
	e.hits &^= hitsCopy
	l.linkParentLocked(i, h)
}

// linkParentLocked links new block i to its cached parent (the record it
// hangs from: block.Header.LinkParent), unless either is
// a copy, or the parent is another namespace's: a block naming one is forged,
// and one tenant's eviction must never cascade into another's. (An
// unresolved parent is checked when it is resolved.)
func (l *Local) linkParentLocked(i uint32, h *block.Header) {
	x := &l.mu.x
	p := x.find(h.LinkParent())
	if p == 0 || p == i || x.at(i).copy() || x.at(i).up != 0 {
		return
	}
	pe := x.at(p)
	if pe.copy() {
		return
	}
	if l.mu.ns.same(pe.ns, x.at(i).ns) || !l.mu.ns.get(pe.ns).resolved {
		x.link(i, p)
	}
}

// lookedUpLocked touches and marks the blocks a lookup found (EvictReuse),
// listed in l.mu.stack in chain order: deepest first, so that the chain's
// ancestors end up warmest, as GetMany leaves them.
func (l *Local) lookedUpLocked() {
	for k := len(l.mu.stack) - 1; k >= 0; k-- {
		i := l.mu.stack[k]
		e := l.mu.x.at(i)
		l.setReusedLocked(e)
		if e.copy() {
			continue // a copy stays at the cold end
		}
		list := l.mu.diskList
		if !e.persistent() {
			list = l.memListLocked(l.mu.ns.get(e.ns).class)
			// Asked for since it was written to memory: NVMe admission
			// (admitLocked) writes it there. (On NVMe flagHit means a
			// read: a lookup does not make a later read a second hit.)
			e.set(flagHit)
		}
		l.moveFrontLocked(list, i)
	}
	l.mu.stack = l.mu.stack[:0]
}

// markReusedLocked records that i was asked for again (EvictReuse).
func (l *Local) markReusedLocked(i uint32) {
	if l.opts.Eviction == EvictReuse {
		l.setReusedLocked(l.mu.x.at(i))
	}
}

func (l *Local) setReusedLocked(e *entry) {
	if !e.reused() {
		e.hits |= hitsReused
		l.mu.reused++
	}
}

// secondChanceLocked reports whether eviction passes over i, found at the
// cold end of list: under EvictReuse a block reused since it was stored or
// last passed over is moved to the hot end, its mark cleared. A copy never
// is: it stays at the cold end.
func (l *Local) secondChanceLocked(list, i uint32) bool {
	e := l.mu.x.at(i)
	if l.opts.Eviction != EvictReuse || !e.reused() || e.copy() {
		return false
	}
	e.hits &^= hitsReused
	l.mu.reused--
	l.moveFrontLocked(list, i)
	l.mu.c.secondChances++
	return true
}
