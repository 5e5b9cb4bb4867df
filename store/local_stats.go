package store

import (
	"sort"

	"github.com/kvmesh/kvmesh/auth"
	"github.com/kvmesh/kvmesh/block"
	"github.com/kvmesh/kvmesh/prefixhash"
	"github.com/kvmesh/kvmesh/tiers"
)

// Stats is a snapshot of a Local's usage and counters. Every block that ever
// entered the index (Puts + Recovered) is either still cached (the tiers'
// Blocks) or was removed exactly once, as an eviction, a corrupt drop or a
// namespace drop; a descendant dropped with its ancestor counts under the
// ancestor's reason (as an eviction when the ancestor was corrupt) and also
// in Cascaded.
type Stats struct {
	// Tiers are the memory tier (DRAM), then the persistent tier if any,
	// then HBM if any.
	Tiers []TierStats

	Hits   int64 // Gets served
	Misses int64 // Gets not served, failed verifications included

	Puts       int64 // blocks stored
	Duplicates int64 // Puts of a block already cached (touched, not stored)
	Refused    int64 // Puts refused for lack of room (ErrFull, ErrTooLarge, ErrQuota)
	Recovered  int64 // blocks indexed from the persistent tier on Open
	// QuotaRefused counts the Puts of Refused that their namespace's
	// quota refused (ErrQuota).
	QuotaRefused int64

	Demotions  int64 // memory → persistent moves
	Promotions int64 // persistent → memory moves on a hit
	// PromotionsDeferred counts second hits on the persistent tier served
	// from their copy, and left there, because another promotion was
	// making room in memory (one at a time); a later hit may promote them.
	PromotionsDeferred int64
	Rewrites           int64 // blocks re-inserted when their segment was reclaimed
	// HBMDemotions and HBMPromotions count the moves between HBM and
	// DRAM: HBM pressure, and hits in DRAM.
	HBMDemotions, HBMPromotions int64

	Evictions      int64 // blocks dropped from the node for room
	CorruptDrops   int64 // blocks dropped because a read or verification failed
	NamespaceDrops int64 // blocks dropped by DropNamespace
	Removed        int64 // values (objects' pieces, blocks) dropped by Remove
	Cascaded       int64 // of all drops, descendants dropped with an ancestor
	// Retired counts the records of hybrid namespaces' sliding and state
	// groups that a chain moved past (a window's old block, a state
	// before the chain's end), listed cold and dropped first for room.
	Retired int64
	// SecondChances counts the blocks EvictReuse passed over at the cold
	// end of a list, because they were asked for again, and moved to the
	// hot end.
	SecondChances int64
	// ReusedBlocks are the cached blocks EvictReuse holds marked: asked for
	// again since they were stored or last passed over. Their share of the
	// blocks is the policy's own signal: near 0, the workload comes back
	// to little of what it stored and the policy is LRU; near 1, eviction
	// walks past many blocks before it finds a victim.
	ReusedBlocks int64
	// BranchingBlocks are the cached blocks with two or more cached
	// children linked to them: where cached chains fork (a system prompt
	// or tool list many prompts share). Their share of the blocks says
	// how much of the cache is a tree rather than separate chains. (In
	// a namespace with groups a block's windows and states hang from
	// it too, so every block with them counts.)
	BranchingBlocks int64

	// Retained values are under a pin or a lease (retain.go); PinnedBytes
	// is what those under a hard pin or a lease hold.
	Retained    int
	PinnedBytes int64

	Pinned int // live Refs pinning a block in place

	// Reservations are the open Reservations (memory slots taken, not
	// yet committed or aborted); ReservationsExpired counts those whose
	// context ended first, and CorruptCommits the commits refused because
	// the bytes written were not the reserved block.
	Reservations        int
	ReservationsExpired int64
	CorruptCommits      int64

	// Parts (issue 23). PartialsOpen incomplete blocks hold PartialBytes
	// of the memory tier (slots of their whole encoded size, not in the
	// index); PartsStored counts the parts copied into one,
	// PartsCompleted the blocks completed from parts, PartConflicts the
	// parts refused with ErrPartConflict, PartialsExpired the incomplete
	// blocks dropped after PartialTTL and PartialsDropped those dropped
	// for memory room. Claims counts Claim's answers by block.ClaimStatus.
	PartialsOpen    int
	PartialBytes    int64
	PartsStored     int64
	PartsCompleted  int64
	PartConflicts   int64
	PartialsExpired int64
	PartialsDropped int64
	Claims          [block.ClaimStatuses]int64
	// PartialSlots is how many of PartialsOpen hold a memory-tier slot
	// (the others are in process memory: the tier takes no reservations).
	PartialSlots     int
	PartialSlotBytes int64

	// Namespaces are sorted by digest. Digest 0 gathers blocks recovered
	// from the persistent tier whose header has not been read yet.
	Namespaces []NamespaceStats
}

// TierStats is one tier as the index sees it (Blocks, Bytes) and as the tier
// reports itself (Capacity, Reserved, Stored, Values). The two agree when no
// operation is in flight.
type TierStats struct {
	Name   string
	Blocks int64
	Bytes  int64
	// Evicted counts the blocks that left the tier, by reason.
	Evicted TierEvictions
	// WrittenBytes counts the bytes written to the tier: the persistent
	// tier's demotions, direct writes and segment rewrites (0 for the
	// others), what NVMe admission saves (Options.NVMeAdmission).
	WrittenBytes int64
	tiers.Stats
}

// TierEvictions are the blocks that left a tier, by reason.
type TierEvictions struct {
	// Capacity: dropped from the node for room (in this tier), with the
	// descendants dropped with them.
	Capacity int64
	// Demoted: moved one tier down for room (DRAM to NVMe, HBM to DRAM).
	Demoted int64
	// Refused: writes refused for lack of room (ErrFull, ErrQuota),
	// counted on the tier writes land in (DRAM).
	Refused int64
	// Unadmitted: writes accepted but not kept. In DRAM, since the block
	// was colder than everything the tier holds (its parent was the
	// coldest): evicted at once. In NVMe, DRAM victims NVMe admission
	// refused (Options.NVMeReusedOnly): dropped instead of written.
	// Counted in Stats.Evictions too.
	Unadmitted int64
	// Expired: dropped from the node for room after the TTL of their
	// lease or pin lapsed, not read since (retain.go), with the
	// descendants dropped with them that were too; counted in
	// Stats.Evictions, not in Capacity.
	Expired int64
}

// NamespaceStats is what one namespace has cached on this node, and its
// quota.
type NamespaceStats struct {
	Digest uint64
	Tenant uint64 // the tag of the tenant whose blocks these are (0: none, or not read yet)
	Blocks int64  // blocks, or with groups records of every group
	Bytes  int64  // encoded block bytes, DRAMBytes + NVMeBytes
	// Tokens are the cached tokens: Blocks × tokens per block; with
	// groups, those of group 0's records (list the full group first).
	Tokens int64
	// Objects is how many of Blocks are objects' pieces (object records).
	Objects int64
	// PinnedBytes is what the namespace holds under hard pins and leases
	// (retain.go), which its quota bounds too.
	PinnedBytes int64

	// DRAMBytes and NVMeBytes are the bytes the namespace holds in the
	// memory and the persistent tier: what Quota bounds.
	DRAMBytes, NVMeBytes int64
	// Quota is the quota in force: the namespace's own, else the default
	// (zero fields: unlimited; none for digest 0).
	Quota Quota
}

// Stats returns a snapshot of usage and counters.
func (l *Local) Stats() Stats {
	l.mu.Lock()
	l.expireRetentionsLocked(l.now())
	s := l.statsLocked()
	open := l.enterLocked()
	l.mu.Unlock()
	sort.Slice(s.Namespaces, func(a, b int) bool { return s.Namespaces[a].Digest < s.Namespaces[b].Digest })
	if open {
		s.Tiers[0].Stats = l.mem.Stats()
		if l.disk != nil {
			s.Tiers[1].Stats = l.disk.Stats()
		}
		if l.hbm != nil {
			s.Tiers[len(s.Tiers)-1].Stats = l.hbm.Stats()
		}
		l.exit()
	}
	return s
}

// statsLocked is Stats' index half: counters, the index's view of the
// tiers and the namespaces (unsorted), without the tiers' own figures.
func (l *Local) statsLocked() Stats {
	c := l.mu.c
	s := Stats{
		Hits: c.hits, Misses: c.misses, Puts: c.puts, Duplicates: c.duplicates, Refused: c.refused,
		Recovered: c.recovered, Demotions: c.demotions, Promotions: c.promotions, Rewrites: c.rewrites,
		PromotionsDeferred: c.promotionsDeferred,
		Evictions:          c.evictions, CorruptDrops: c.corruptDrops, NamespaceDrops: c.namespaceDrops, Removed: c.removed,
		Retained: len(l.mu.retain.by), PinnedBytes: l.mu.retain.pinned,
		Cascaded: c.cascade, Retired: c.retired, SecondChances: c.secondChances, ReusedBlocks: l.mu.reused, BranchingBlocks: l.mu.x.branching, Pinned: l.mu.refs, QuotaRefused: c.quotaRefused,
		Reservations: l.mu.reservations, ReservationsExpired: c.reservationsExpired, CorruptCommits: c.corruptCommits,
		HBMDemotions: l.mu.hbm.demote, HBMPromotions: l.mu.hbm.promot,
		PartialsOpen: len(l.mu.parts.open), PartialBytes: l.mu.parts.bytes,
		PartsStored: l.mu.pc.stored, PartsCompleted: l.mu.pc.completed, PartConflicts: l.mu.pc.conflicts,
		PartialsExpired: l.mu.pc.expired, PartialsDropped: l.mu.pc.dropped, Claims: l.mu.pc.claims,
	}
	for _, p := range l.mu.parts.open {
		if !p.heap {
			s.PartialSlots++
			s.PartialSlotBytes += int64(p.size)
		}
	}
	hbmBlocks, hbmBytes := int64(len(l.mu.hbm.at)), l.mu.hbm.bytes
	s.Tiers = append(s.Tiers, TierStats{Name: l.mem.Name(), Blocks: l.mu.blocks[tierMem] - hbmBlocks, Bytes: l.mu.bytes[tierMem] - hbmBytes,
		Evicted: TierEvictions{Capacity: c.evicted[tierMem], Demoted: c.demotions, Refused: c.refused, Unadmitted: c.unadmitted, Expired: c.expired[tierMem]}})
	if l.disk != nil {
		s.Tiers = append(s.Tiers, TierStats{Name: l.disk.Name(), Blocks: l.mu.blocks[tierDisk], Bytes: l.mu.bytes[tierDisk],
			Evicted:      TierEvictions{Capacity: c.evicted[tierDisk], Expired: c.expired[tierDisk], Unadmitted: c.nvmeUnadmitted},
			WrittenBytes: l.diskWritten.Load()})
	}
	if l.hbm != nil {
		s.Tiers = append(s.Tiers, TierStats{Name: l.hbm.Name(), Blocks: hbmBlocks, Bytes: hbmBytes,
			Evicted: TierEvictions{Capacity: c.evicted[tierHBM], Demoted: l.mu.hbm.demote, Expired: c.expired[tierHBM]}})
	}
	byDigest := map[uint64]int{}
	for _, n := range l.mu.ns.list {
		if n.blocks == 0 {
			continue
		}
		k, ok := byDigest[n.digest]
		if !ok {
			k = len(s.Namespaces)
			byDigest[n.digest] = k
			s.Namespaces = append(s.Namespaces, NamespaceStats{Digest: n.digest, Tenant: n.tenant})
		}
		ns := &s.Namespaces[k]
		if n.object {
			ns.Objects += n.blocks
		}
		if n.acct != nil {
			ns.PinnedBytes = n.acct.pinned
		}
		ns.Blocks += n.blocks
		ns.Bytes += n.blocks * int64(n.size)
		if n.group <= 1 { // no groups, or group 0: tokens are counted once
			ns.Tokens += n.blocks * int64(n.tokens)
		}
		ns.DRAMBytes += n.inTier[tierMem] * int64(n.size)
		ns.NVMeBytes += n.inTier[tierDisk] * int64(n.size)
		ns.Quota = Quota{DRAM: n.quota[tierMem], NVMe: n.quota[tierDisk]}
	}
	return s
}

// BlockInfo describes one cached block, for people (the admin BlockInfo RPC).
type BlockInfo struct {
	Key       prefixhash.Key
	Tier      string // the tier's Name: "hbm", "dram", "nvme"
	Size      int    // encoded block bytes
	Namespace uint64 // namespace digest; 0 while a recovered block is unread
	Tokens    int    // tokens in the block; 0 while unread
	Hits      int    // Gets served from it (saturating at 2047)
	Pins      int    // live Refs reading it in place
	Parent    bool   // linked to a cached parent
	Children  int    // cached children linked to it
	Copy      bool   // a copy of a block another node owns (PutCopy under EvictDedup)
	Object    bool   // an object's piece (block.KindObject), not a block
	// Retention is the value's pin and the TTL left of its lease or pin
	// (retain.go).
	Retention block.Retention
}

// Info describes the block of key, if a request with access a may see it,
// without touching it.
func (l *Local) Info(a auth.Access, key prefixhash.Key) (BlockInfo, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	x := &l.mu.x
	i := x.find(key)
	if i == 0 || l.mu.closed || !l.mu.ns.allows(a, x.at(i).ns) {
		return BlockInfo{}, false
	}
	e := x.at(i)
	n := l.mu.ns.get(e.ns)
	info := BlockInfo{Key: key, Tier: l.mem.Name(), Size: n.size, Namespace: n.digest, Tokens: n.tokens,
		Hits: e.hitCount(), Pins: int(e.pins), Parent: e.up != 0, Copy: e.copy(), Object: n.object, Retention: l.retentionOf(i)}
	if e.persistent() {
		info.Tier = l.disk.Name()
	} else if isHBM(e.getLoc()) {
		info.Tier = l.hbm.Name()
	}
	for c := e.child; c != 0; c = x.at(c).sib {
		info.Children++
	}
	return info, true
}
