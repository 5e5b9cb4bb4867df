package store

import (
	"errors"
	"fmt"
	"time"

	"github.com/kvmesh/kvmesh/block"
	"github.com/kvmesh/kvmesh/tiers"
)

// Options configure a Local. Zero fields take the documented defaults.
type Options struct {
	// DRAM is the memory tier every write lands in. Required. When it
	// implements tiers.Viewer, Get serves blocks in place without a copy;
	// when it implements tiers.Classed, pressure frees room class by class.
	DRAM tiers.Tier
	// NVMe is the persistent tier DRAM pressure demotes blocks to.
	// Optional: nil keeps the node memory-only, and pressure drops blocks.
	// tiers.Segmented (reclaim by whole segments), tiers.Recoverable (the
	// index is rebuilt on Open) and tiers.Batcher (one write per demotion
	// batch) are used when it implements them.
	NVMe tiers.Tier
	// HBM is the GPU-memory tier above DRAM (tiers.HBM): writes and
	// promotions land there first, HBM pressure demotes into DRAM, and a
	// DRAM hit promotes back (local_hbm.go). Optional: nil, DRAM is the top.
	HBM tiers.Tier
	// MaxBlockBytes is the largest block payload Put accepts, in bytes;
	// larger blocks get ErrTooLarge. Default 64 MiB, at most 1 GiB.
	MaxBlockBytes int
	// MaxBlocks bounds the number of blocks cached in all tiers together,
	// and with it the index's RAM (about 60 bytes per block). Default:
	// the tiers' capacities over 4 KiB, within [65536, 1<<27].
	MaxBlocks int
	// DemoteBatchBytes is the least that one round of DRAM pressure from
	// a write demotes, in bytes, so that NVMe sees large writes (a
	// promotion demotes only the room it needs), within a sixteenth of
	// the DRAM tier's capacity: a larger batch would empty a small tier
	// at each round. Default 4 MiB.
	DemoteBatchBytes int
	// VerifyMemoryHits makes a Get served from DRAM verify the whole
	// block (header and payload checksums) instead of only its key.
	// Default false: DRAM bytes were verified when they were put, and
	// bytes read from NVMe are always verified. With it, an NVMe hit's
	// payload is hashed by Local too, not only by a tiers.Checked tier
	// (whose sum was taken over the DRAM bytes it was demoted from).
	VerifyMemoryHits bool
	// SkipRecoveryScan leaves blocks recovered from NVMe unresolved until
	// they are first read, instead of reading each once in the background
	// after Open to learn its namespace and parent. Default false.
	SkipRecoveryScan bool
	// Quotas bound what each namespace may cache on this node, by namespace
	// digest (prefixhash.Namespace.Digest): encoded block bytes per tier,
	// zero for unlimited (see Quota and the package doc). Namespaces not
	// listed take DefaultQuota. Open copies the map; SetQuota and ClearQuota
	// change it at run time. Default: none.
	Quotas map[uint64]Quota
	// DefaultQuota is the quota of every namespace not in Quotas. Default:
	// zero, unlimited in both tiers. SetDefaultQuota changes it at run time.
	DefaultQuota Quota
	// Eviction is the eviction policy (evict.go): EvictLRU, the reference;
	// EvictDedup, which evicts copies (PutCopy) first; or EvictReuse, which
	// also gives blocks asked for again a second chance. Default
	// DefaultEviction.
	Eviction Eviction
	// NVMeReusedOnly is NVMe admission under EvictReuse: DRAM pressure
	// writes to NVMe only the blocks asked for again (found by a lookup,
	// read, or put again) since they were written to memory, and drops
	// the others, counted as the persistent tier's
	// TierEvictions.Unadmitted: a block nobody came back to while it was
	// in DRAM is not worth an NVMe write. Default false: every victim is demoted. It
	// needs EvictReuse (the other policies keep no reuse mark).
	NVMeReusedOnly bool
	// PartialTTL is how long an incomplete block (parts of a block put,
	// not all of them yet) is kept before it expires and its memory is
	// freed. Default 30 s.
	PartialTTL time.Duration
	// ClaimTTL is how long a claim (Claim answering ClaimWrite) stands
	// unless a part put covering it releases it first. Default 10 s.
	ClaimTTL time.Duration
	// MaxRetentionTTL is the longest TTL a lease or pin may have
	// (retain.go). Default 24 h, at most block.MaxObjectTTL.
	MaxRetentionTTL time.Duration
	// MaxPinnedFraction bounds the bytes under hard pins and leases, all
	// namespaces together, as a fraction of the node's tiers' capacity
	// (DRAM and NVMe together). Default 0.5, within (0, 1].
	MaxPinnedFraction float64
	// Events, when set, is told of blocks entering and leaving tiers (KV
	// events; events.go). Default nil: none.
	Events Events
	// Now is the clock of PartialTTL, ClaimTTL and retention (tests inject one).
	// Default time.Now.
	Now func() time.Time
}

// Option defaults and limits.
const (
	DefaultMaxBlockBytes    = 64 << 20
	MaxMaxBlockBytes        = 1 << 30
	DefaultDemoteBatchBytes = 4 << 20
	DefaultPartialTTL       = 30 * time.Second
	DefaultClaimTTL         = 10 * time.Second
	DefaultMaxRetentionTTL  = 24 * time.Hour
	DefaultPinnedFraction   = 0.5
	// MaxPartialTTL and MaxClaimTTL bound the TTLs: an incomplete block
	// holds memory, a claim holds back other writers.
	MaxPartialTTL       = time.Hour
	MaxClaimTTL         = 10 * time.Minute
	minDefaultMaxBlocks = 1 << 16
	maxDefaultMaxBlocks = 1 << 27
)

// EnsureDefaults fills zero fields with their defaults.
func (o *Options) EnsureDefaults() {
	if o.MaxBlockBytes == 0 {
		o.MaxBlockBytes = DefaultMaxBlockBytes
	}
	if o.DemoteBatchBytes == 0 {
		o.DemoteBatchBytes = DefaultDemoteBatchBytes
	}
	if o.PartialTTL == 0 {
		o.PartialTTL = DefaultPartialTTL
	}
	if o.ClaimTTL == 0 {
		o.ClaimTTL = DefaultClaimTTL
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.MaxRetentionTTL == 0 {
		o.MaxRetentionTTL = DefaultMaxRetentionTTL
	}
	if o.MaxPinnedFraction == 0 {
		o.MaxPinnedFraction = DefaultPinnedFraction
	}
	if o.Eviction == "" {
		o.Eviction = DefaultEviction
	}
	if o.MaxBlocks == 0 && o.DRAM != nil {
		c := o.DRAM.Stats().Capacity
		if o.NVMe != nil {
			c += o.NVMe.Stats().Capacity
		}
		if o.HBM != nil {
			c += o.HBM.Stats().Capacity
		}
		o.MaxBlocks = int(min(max(c/4096, minDefaultMaxBlocks), maxDefaultMaxBlocks))
	}
}

// Validate reports the first field that makes o unusable.
func (o *Options) Validate() error {
	switch {
	case o.DRAM == nil:
		return errors.New("store: options: DRAM: a memory tier is required")
	case o.MaxBlockBytes < 1 || o.MaxBlockBytes > MaxMaxBlockBytes:
		return fmt.Errorf("store: options: MaxBlockBytes: %d is outside 1..%d", o.MaxBlockBytes, MaxMaxBlockBytes)
	case o.MaxBlocks < 1 || o.MaxBlocks > maxEntry-(1<<16):
		return fmt.Errorf("store: options: MaxBlocks: %d is outside 1..%d", o.MaxBlocks, maxEntry-(1<<16))
	case o.DemoteBatchBytes < 1:
		return fmt.Errorf("store: options: DemoteBatchBytes: %d must be positive", o.DemoteBatchBytes)
	case o.PartialTTL < time.Millisecond || o.PartialTTL > MaxPartialTTL:
		return fmt.Errorf("store: options: PartialTTL: %v is outside 1ms..%v", o.PartialTTL, MaxPartialTTL)
	case o.ClaimTTL < time.Millisecond || o.ClaimTTL > MaxClaimTTL:
		return fmt.Errorf("store: options: ClaimTTL: %v is outside 1ms..%v", o.ClaimTTL, MaxClaimTTL)
	case o.Now == nil:
		return errors.New("store: options: Now: a clock is required")
	case o.MaxRetentionTTL < time.Millisecond || o.MaxRetentionTTL > block.MaxObjectTTL:
		return fmt.Errorf("store: options: MaxRetentionTTL: %v is outside 1ms..%v", o.MaxRetentionTTL, block.MaxObjectTTL)
	case !(o.MaxPinnedFraction > 0 && o.MaxPinnedFraction <= 1):
		return fmt.Errorf("store: options: MaxPinnedFraction: %v is outside (0, 1]", o.MaxPinnedFraction)
	}
	if _, err := ParseEviction(string(o.Eviction)); err != nil {
		return fmt.Errorf("store: options: Eviction: %w", err)
	}
	if o.NVMeReusedOnly && o.Eviction != EvictReuse {
		return fmt.Errorf("store: options: NVMeReusedOnly needs Eviction %s, not %s", EvictReuse, o.Eviction)
	}
	if err := o.DefaultQuota.validate("options: DefaultQuota"); err != nil {
		return err
	}
	for d, q := range o.Quotas {
		if err := q.validate(fmt.Sprintf("options: Quotas[%016x]", d)); err != nil {
			return err
		}
	}
	return nil
}
