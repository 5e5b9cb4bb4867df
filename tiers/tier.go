package tiers

import (
	"errors"

	"github.com/kvmesh/kvmesh/prefixhash"
)

// Loc is where a tier put a value. It is chosen by the tier on Put and is
// meaningful only to that tier; its owner stores it in its index and hands it
// back to Read, View and Free.
type Loc uint64

// Errors shared by every tier.
var (
	// ErrFull means there is no room for the value now. The owner frees
	// something (demotes, evicts) and tries again.
	ErrFull = errors.New("tiers: tier full")
	// ErrTooLarge means the value can never fit in this tier.
	ErrTooLarge = errors.New("tiers: value too large for tier")
	// ErrCorrupt means the stored bytes failed their checksum: the value
	// must be treated as missing.
	ErrCorrupt = errors.New("tiers: stored value corrupt")
	// ErrClosed is returned by every method after Close.
	ErrClosed = errors.New("tiers: tier closed")
)

// Tier is one level of the storage hierarchy: device memory (HBM), host DRAM,
// or NVMe. A tier stores opaque values under keys and returns where it put
// them. It keeps no index of its own that its owner must consult on the hot
// path and it makes no policy: the owner (store.Local) keeps key → Loc in RAM,
// decides what is hot, what to demote and what to drop, and a tier only does
// what it is told and says when it is full.
//
// All methods are safe for concurrent use. A Loc may be passed to Read, View
// or Free only until it is freed; Free must be called at most once per Loc.
type Tier interface {
	// Name is "hbm", "dram" or "nvme".
	Name() string
	// Put copies val into the tier under key and returns its location.
	// val is not retained. ErrFull: no room now; ErrTooLarge: never.
	Put(key prefixhash.Key, val []byte) (Loc, error)
	// Read copies the value stored at loc into dst, which must be exactly
	// the value's length. A value that fails its checksum yields
	// ErrCorrupt and must be freed by the owner.
	Read(loc Loc, dst []byte) error
	// Free releases the value at loc. Its space may be reused at once:
	// the owner must not free a location a reader still uses (it pins).
	Free(loc Loc)
	// Stats returns the tier's usage counters.
	Stats() Stats
	// Close releases the tier's resources. Persistent tiers make what was
	// Put durable first.
	Close() error
}

// Viewer is implemented by tiers whose values live in memory the process can
// address (DRAM). View returns the value at loc without copying, n bytes
// long; the slice aliases the tier's memory and is valid until loc is freed.
type Viewer interface {
	View(loc Loc, n int) []byte
}

// Reserver is implemented by tiers that can hand out a slot before its value
// exists (DRAM): Reserve takes room for an n-byte value of key and returns
// the slot's bytes for the caller to fill in place (the data plane receives
// a block straight into them). The caller owns the slot until it frees loc,
// which also abandons the reservation. Errors as Put's.
type Reserver interface {
	Reserve(key prefixhash.Key, n int) (loc Loc, buf []byte, err error)
}

// Stats describe a tier's usage. Capacity is the configured hard limit;
// Reserved is what the tier holds against it (values plus the rounding of its
// allocator, or whole segments); Stored is the sum of the values' lengths.
type Stats struct {
	Capacity int64
	Reserved int64
	// Warm is memory the tier keeps for reuse though it holds no value
	// (the DRAM tier's emptied slabs, DRAMOptions.WarmSlabs): resident,
	// but not counted in Reserved.
	Warm   int64
	Stored int64
	Values int64
}

// Record describes one stored value: the key it was Put under, where it is,
// and its length.
type Record struct {
	Key prefixhash.Key
	Loc Loc
	Len int
}

// The optional interfaces below are how a tier tells its owner what it needs
// to make room, or what it kept across a restart. The owner keeps the policy:
// which of the named values to demote, re-insert or drop.

// Classed is implemented by tiers that allocate in size classes (DRAM). A
// value only ever frees room for values of its own class, unless its whole
// slab empties.
type Classed interface {
	// SizeClass returns the class a value of n bytes is stored in, or -1
	// if no class holds n bytes (ErrTooLarge).
	SizeClass(n int) int
	// ClassHasMemory reports whether class c owns any memory now, that is
	// whether freeing a value of class c can make room for another.
	ClassHasMemory(c int) bool
	// Evacuate names the values of the slab that is cheapest to empty
	// (fewest live values) among slabs not of class avoid. Once the owner
	// has freed them all, the slab returns to the pool and can serve any
	// class. It returns nil when there is no such slab.
	Evacuate(avoid int) []Record
}

// Segmented is implemented by log-structured tiers (NVMe) that reclaim space
// one whole segment at a time, oldest first.
type Segmented interface {
	// OldestSegment returns the oldest sealed segment's id and the values
	// it still holds (live or not; the owner checks each against its
	// index). ok is false when no sealed segment exists.
	OldestSegment() (seg uint64, recs []Record, ok bool, err error)
	// DropSegment deletes a segment and everything in it. Locations in it
	// become invalid; reads already in flight complete.
	DropSegment(seg uint64) error
}

// Recoverable is implemented by persistent tiers. Range calls fn for every
// value that survived the last shutdown or crash, until fn returns false.
// Values whose bytes fail their checksum are not reported (they are
// discarded).
type Recoverable interface {
	Range(fn func(Record) bool) error
}

// Batcher is implemented by tiers for which many values written together cost
// much less than one at a time (NVMe: one aligned write and one sync). It
// stores vals[i] under keys[i], writing locs[i], and returns how many it
// stored before the first error; every stored value is durable on return.
type Batcher interface {
	PutBatch(keys []prefixhash.Key, vals [][]byte, locs []Loc) (int, error)
}

// Checked is implemented by tiers whose Read verifies every byte of the value
// against a checksum taken when it was put, and fails with an error wrapping
// ErrCorrupt otherwise (NVMe: the record's xxhash64). An owner that trusted
// the bytes it put need not hash what it reads back a second time.
type Checked interface {
	ChecksReads() bool
}
