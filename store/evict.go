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

	// DefaultEviction is the best policy measured on the trace replays.
	DefaultEviction = EvictDedup
)

// EvictionPolicies lists the policies, the reference first.
func EvictionPolicies() []Eviction { return []Eviction{EvictLRU, EvictDedup} }

// ParseEviction returns the policy named s.
func ParseEviction(s string) (Eviction, error) {
	for _, e := range EvictionPolicies() {
		if string(e) == s {
			return e, nil
		}
	}
	return "", fmt.Errorf("store: eviction %q: want %s or %s", s, EvictLRU, EvictDedup)
}

// PutCopy is Put for a block this node keeps although placement gives it
// to another node: the producer's copy of a block it pushes to its owner
// (Cluster.Put), or a block fetched from its owner (ClusterOptions.KeepRemote).
// Under EvictLRU it is Put. Under EvictDedup the block is stored as a copy
// (see EvictDedup): a node holding copies evicts them before any block it
// owns. Putting a block already cached as an ordinary block touches it and
// leaves it ordinary; a Put of a cached copy (its owner's push, after a
// membership change) makes it ordinary.
func (l *Local) PutCopy(ctx context.Context, block []byte) error {
	return l.put(ctx, block, l.opts.Eviction == EvictDedup, nil)
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
