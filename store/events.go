package store

import "github.com/kvmesh/kvmesh/prefixhash"

// Events is told when blocks enter and leave tiers: what a KV events
// publisher (package kvevents, issue 33) needs. The store declares it and
// calls it; the node hands one in Options.Events. Media are "GPU" (HBM),
// "CPU" (DRAM) and "DISK" (NVMe). A move between tiers is a removal from
// one medium and a store into the other. Objects' pieces, incomplete blocks
// and recovered blocks whose header is not read yet are not reported;
// DropNamespace reports AllBlocksCleared, not each block.
//
// The store calls it with its index lock held: an implementation must not
// block (queue, or drop and count) nor call back into the store. record is
// the block's encoded bytes (header first), valid only during the call: keep
// a copy of what is needed.
type Events interface {
	BlockStored(medium string, record []byte)
	BlockRemoved(medium string, key prefixhash.Key, digest uint64)
	AllBlocksCleared(digest uint64)
}

// Media, as Events names them.
const (
	MediumGPU  = "GPU"
	MediumCPU  = "CPU"
	MediumDisk = "DISK"
)

// mediumLocked returns the medium entry i lives in.
func (l *Local) mediumLocked(i uint32) string {
	e := l.mu.x.at(i)
	switch {
	case e.persistent():
		return MediumDisk
	case isHBM(e.getLoc()):
		return MediumGPU
	}
	return MediumCPU
}

// reportedLocked reports whether entry i's moves are Events' business: a
// resolved namespace's block, not an object's piece.
func (l *Local) reportedLocked(i uint32) bool {
	n := l.mu.ns.get(l.mu.x.at(i).ns)
	return l.opts.Events != nil && n.resolved && !n.object
}

// evStoredLocked reports entry i, whose encoded bytes are record, as now in
// its medium.
func (l *Local) evStoredLocked(i uint32, record []byte) {
	if l.reportedLocked(i) {
		l.opts.Events.BlockStored(l.mediumLocked(i), record)
	}
}

// evRemovedLocked reports entry i as gone from its medium.
func (l *Local) evRemovedLocked(i uint32) {
	if l.reportedLocked(i) {
		l.opts.Events.BlockRemoved(l.mediumLocked(i), l.mu.x.at(i).key, l.mu.ns.get(l.mu.x.at(i).ns).digest)
	}
}
