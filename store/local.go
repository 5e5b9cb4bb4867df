package store

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"sync"
	"sync/atomic"

	"github.com/kvmesh/kvmesh/internal/invariants"
	"github.com/kvmesh/kvmesh/prefixhash"
	"github.com/kvmesh/kvmesh/tiers"
)

// Errors of Local.
var (
	// ErrNotFound is a miss: the block is not cached here, or it was and
	// failed verification when read (then it is dropped and counted).
	ErrNotFound = errors.New("store: block not found")
	// ErrClosed is returned by every method after Close.
	ErrClosed = errors.New("store: closed")
	// ErrFull refuses a write: no tier has room for it even after
	// eviction, for example because everything evictable is pinned. (A
	// namespace's quota refuses with ErrQuota.)
	ErrFull = errors.New("store: no room for block")
	// ErrLayout refuses a block whose token count, layout or size differs
	// from the cached blocks of the namespace its header names.
	ErrLayout = errors.New("store: block layout differs from its namespace")
	// ErrTenant: a block's tenant tag differs from that of the blocks of
	// its namespace or key already held (Header.Tenant).
	ErrTenant = errors.New("store: block belongs to another tenant")
	// ErrPinned is returned by Close while Refs are still live.
	ErrPinned = errors.New("store: blocks still pinned by live Refs")
)

// Local is one node's cache over its tiers. See the package doc for the
// policy and the concurrency rules. All methods are safe for concurrent use.
type Local struct {
	opts    Options
	mem     tiers.Tier
	view    tiers.Viewer  // nil: copy out of mem
	classed tiers.Classed // nil: one class
	disk    tiers.Tier    // nil: memory only
	hbm     tiers.Tier    // nil: DRAM is the top tier
	seg     tiers.Segmented
	// demoteBatch is the least a write's round of DRAM pressure demotes:
	// Options.DemoteBatchBytes, within a sixteenth of the DRAM tier.
	demoteBatch int
	batcher     tiers.Batcher
	// diskChecked: the persistent tier's Read checks every byte against a
	// sum taken when it was written (tiers.Checked), so a promotion checks
	// the block's header and key and does not hash the payload again;
	// VerifyMemoryHits turns it off (that sum was taken over DRAM bytes).
	diskChecked bool
	// readBufs pools the buffers NVMe hits are read into, by size
	// (int → *sync.Pool of *[]byte).
	readBufs sync.Map
	// roomPromoting is held by the one promotion that may make room in
	// memory (demote) at a time; see promote.
	roomPromoting atomic.Bool
	// diskWritten counts the bytes written to the persistent tier
	// (putDisk: demotions, direct writes, rewrites), for
	// TierStats.WrittenBytes.
	diskWritten atomic.Int64

	// diskMu orders persistent-tier writes against segment drops: a writer
	// holds it shared from its write until the index knows the new
	// location, so no segment is dropped under a value the index cannot
	// see yet; reclaim holds it exclusively. Order: diskMu, then mu.
	diskMu sync.RWMutex

	stopResolve context.CancelFunc
	resolveDone chan struct{}
	// partialsOpen mirrors len(mu.parts.open), so that a whole block's
	// Put looks for parts it supersedes only when there are any.
	partialsOpen atomic.Int64
	stopSweep    chan struct{} // closed by Close: ends sweepLoop
	sweepDone    chan struct{}

	mu struct {
		sync.Mutex
		idle        sync.Cond // broadcast when active drops to 0 after closed
		closed      bool
		tiersClosed bool
		active      int // operations that may still touch the tiers
		refs        int // live Refs holding a pin
		// reservations are the open Reservations: memory-tier slots
		// taken and not yet committed or aborted.
		reservations int

		x        index
		ns       namespaces
		memLists []uint32 // recency list sentinel per memory size class
		diskList uint32
		waiters  map[uint32]chan struct{} // closed when the entry's mover is done

		blocks, bytes [2]int64 // per tier (tierMem, tierDisk), as the index sees them
		unresolved    int
		// droppedUnresolved holds namespaces dropped while recovered
		// blocks were unresolved: those blocks are dropped when resolved.
		droppedUnresolved map[uint64]struct{}

		// orphans holds the persistent-tier locations of dropped entries
		// that are not freed yet (local_drop.go). reclaim marks those of
		// the segment it drops true: freeAll must never Free them.
		orphans map[tiers.Loc]bool

		// evicted remembers the last blocks evicted as soon as they were
		// put, so that their children, put next, are evicted too instead
		// of displacing the cached prefix they hang from.
		evicted     [32]prefixhash.Key
		evictedNext int

		cursors map[uint32][]cursorRef // entry → the namespace cursors on it (quota.go)
		hbm     hbmResidents           // entries in HBM (local_hbm.go)

		retain retainState // values under a pin or a lease (retain.go)
		// clearing is set while DropNamespace drops blocks it reported
		// as AllBlocksCleared (events.go).
		clearing bool
		// retiredHint counts records retired in memory since the last
		// dropRetiredForRoom that found none: 0 spares it the walk.
		retiredHint int

		c      counters
		reused int64 // blocks marked reused (EvictReuse): the policy's own signal
		pc     partCounters
		parts  partsState // incomplete blocks and claims (local_parts.go)
		stack  []uint32   // scratch
	}
}

const (
	tierMem  = 0
	tierDisk = 1
)

func tierOf(e *entry) int {
	if e.persistent() {
		return tierDisk
	}
	return tierMem
}

type counters struct {
	hits, misses, puts, duplicates, refused          int64
	quotaRefused                                     int64
	demotions, promotions, rewrites, recovered       int64
	evictions, corruptDrops, namespaceDrops, cascade int64
	removed                                          int64
	reservationsExpired, corruptCommits              int64
	promotionsDeferred                               int64
	retired                                          int64 // group records retired (local_groups.go)
	secondChances                                    int64 // EvictReuse passing over a reused block
	// evicted counts the blocks dropped for room by the tier they were in
	// (tierMem, tierDisk, tierHBM); expired, those of them whose
	// retention's TTL had lapsed, not read since (hitsLapsed), which
	// evicted does not count.
	evicted, expired [3]int64
	// unadmitted counts the blocks accepted but evicted at once, colder
	// than everything cached (errColdest); nvmeUnadmitted, the DRAM
	// victims NVMe admission dropped (reasonUnadmitted). Both are also
	// evictions.
	unadmitted, nvmeUnadmitted int64
}

// tierHBM indexes the HBM tier in counters.evicted: for the index an HBM
// block is a memory block (tierMem), for an operator it left HBM.
const tierHBM = 2

// evictTierLocked is the tier i's block is in, for counters.evicted.
func evictTierLocked(e *entry) int {
	if !e.persistent() && isHBM(e.getLoc()) {
		return tierHBM
	}
	return tierOf(e)
}

type reason uint8

const (
	reasonEvict reason = iota
	// reasonUnadmitted is reasonEvict for a DRAM victim NVMe admission
	// refused (Options.NVMeReusedOnly): counted as the persistent tier's
	// unadmitted, its descendants as evictions from their tiers.
	reasonUnadmitted
	reasonCorrupt
	reasonNamespace
	reasonRemove
)

// freeLoc is a tier location to free once the index lock is released.
type freeLoc struct {
	disk bool
	loc  tiers.Loc
}

// Open returns a Local over opts' tiers. It takes ownership of them: Close
// closes them. (If Open fails, the caller still owns them.) When the NVMe
// tier is tiers.Recoverable, Open rebuilds the index from it; the blocks'
// headers are read in the background (see Options.SkipRecoveryScan).
func Open(opts Options) (*Local, error) {
	opts.EnsureDefaults()
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	l := &Local{opts: opts, mem: opts.DRAM, disk: opts.NVMe, hbm: opts.HBM}
	l.view, _ = opts.DRAM.(tiers.Viewer)
	l.classed, _ = opts.DRAM.(tiers.Classed)
	l.demoteBatch = demoteBatch(opts.DemoteBatchBytes, opts.DRAM.Stats().Capacity)
	l.mu.idle.L = &l.mu.Mutex
	l.mu.ns.quotas = maps.Clone(opts.Quotas)
	l.mu.ns.defQuota = opts.DefaultQuota
	if l.disk != nil {
		l.seg, _ = l.disk.(tiers.Segmented)
		l.batcher, _ = l.disk.(tiers.Batcher)
		if c, ok := l.disk.(tiers.Checked); ok && !opts.VerifyMemoryHits {
			l.diskChecked = c.ChecksReads()
		}
		l.mu.diskList = l.mu.x.newList()
		if err := l.recover(); err != nil {
			return nil, err
		}
	}
	l.resolveDone = make(chan struct{})
	if l.mu.unresolved > 0 && !opts.SkipRecoveryScan {
		ctx, cancel := context.WithCancel(context.Background())
		l.stopResolve = cancel
		go l.resolveLoop(ctx)
	} else {
		close(l.resolveDone)
	}
	l.stopSweep, l.sweepDone = make(chan struct{}), make(chan struct{})
	go l.sweepLoop(l.stopSweep, l.sweepDone)
	return l, nil
}

// Close stops background work, waits for operations in flight and closes
// the tiers. While Refs are live it closes nothing and returns ErrPinned
// (new operations already fail with ErrClosed): release them and call Close
// again.
func (l *Local) Close() error {
	l.mu.Lock()
	if l.mu.tiersClosed {
		l.mu.Unlock()
		return ErrClosed
	}
	first := !l.mu.closed
	l.mu.closed = true
	l.mu.Unlock()
	if l.stopResolve != nil {
		l.stopResolve()
	}
	<-l.resolveDone
	if first {
		close(l.stopSweep)
	}
	<-l.sweepDone

	l.mu.Lock()
	for l.mu.active > 0 {
		l.mu.idle.Wait()
	}
	if l.mu.tiersClosed { // a concurrent Close won
		l.mu.Unlock()
		return ErrClosed
	}
	if n := l.mu.refs; n > 0 {
		l.mu.Unlock()
		return fmt.Errorf("%w: %d Refs not released", ErrPinned, n)
	}
	if ps := l.closePartialsLocked(); len(ps) > 0 {
		l.mu.Unlock()
		l.freePartials(ps)
		l.mu.Lock()
	}
	if invariants.Enabled {
		l.checkQuiescentLocked()
	}
	l.mu.tiersClosed = true
	l.mu.Unlock()
	var errs []error
	if l.hbm != nil {
		if err := l.hbm.Close(); err != nil {
			errs = append(errs, fmt.Errorf("store: close %s: %w", l.hbm.Name(), err))
		}
	}
	if err := l.mem.Close(); err != nil {
		errs = append(errs, fmt.Errorf("store: close %s: %w", l.mem.Name(), err))
	}
	if l.disk != nil {
		if err := l.disk.Close(); err != nil {
			errs = append(errs, fmt.Errorf("store: close %s: %w", l.disk.Name(), err))
		}
	}
	return errors.Join(errs...)
}

// enterLocked registers an operation that will touch the tiers after the
// lock is released; exit ends it.
func (l *Local) enterLocked() bool {
	if l.mu.closed {
		return false
	}
	l.mu.active++
	return true
}

func (l *Local) exit() {
	l.mu.Lock()
	l.mu.active--
	if invariants.Enabled && l.mu.active < 0 {
		panic(fmt.Sprintf("store: %d operations in flight: one ended twice, and Close may close the tiers under another", l.mu.active))
	}
	if l.mu.active == 0 && l.mu.closed {
		l.mu.idle.Broadcast()
	}
	l.mu.Unlock()
}
