package store

import (
	"context"
	"errors"
	"fmt"
	"github.com/kvmesh/kvmesh/auth"
	"maps"
	"sync"

	"github.com/cespare/xxhash/v2"
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
	// MaxBlockBytes is the largest block payload Put accepts, in bytes;
	// larger blocks get ErrTooLarge. Default 64 MiB, at most 1 GiB.
	MaxBlockBytes int
	// MaxBlocks bounds the number of blocks cached in all tiers together,
	// and with it the index's RAM (about 60 bytes per block). Default:
	// the tiers' capacities over 4 KiB, within [65536, 1<<27].
	MaxBlocks int
	// DemoteBatchBytes is the least that one round of DRAM pressure
	// demotes, in bytes, so that NVMe sees large writes. Default 4 MiB.
	DemoteBatchBytes int
	// VerifyMemoryHits makes a Get served from DRAM verify the whole
	// block (header and payload checksums) instead of only its key.
	// Default false: DRAM bytes were verified when they were put, and
	// bytes read from NVMe are always verified.
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
}

// Option defaults and limits.
const (
	DefaultMaxBlockBytes    = 64 << 20
	MaxMaxBlockBytes        = 1 << 30
	DefaultDemoteBatchBytes = 4 << 20
	minDefaultMaxBlocks     = 1 << 16
	maxDefaultMaxBlocks     = 1 << 27
)

// EnsureDefaults fills zero fields with their defaults.
func (o *Options) EnsureDefaults() {
	if o.MaxBlockBytes == 0 {
		o.MaxBlockBytes = DefaultMaxBlockBytes
	}
	if o.DemoteBatchBytes == 0 {
		o.DemoteBatchBytes = DefaultDemoteBatchBytes
	}
	if o.MaxBlocks == 0 && o.DRAM != nil {
		c := o.DRAM.Stats().Capacity
		if o.NVMe != nil {
			c += o.NVMe.Stats().Capacity
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

// Local is one node's cache over its tiers. See the package doc for the
// policy and the concurrency rules. All methods are safe for concurrent use.
type Local struct {
	opts    Options
	mem     tiers.Tier
	view    tiers.Viewer  // nil: copy out of mem
	classed tiers.Classed // nil: one class
	disk    tiers.Tier    // nil: memory only
	seg     tiers.Segmented
	batcher tiers.Batcher

	// diskMu orders persistent-tier writes against segment drops: a writer
	// holds it shared from its write until the index knows the new
	// location, so no segment is dropped under a value the index cannot
	// see yet; reclaim holds it exclusively. Order: diskMu, then mu.
	diskMu sync.RWMutex

	stopResolve context.CancelFunc
	resolveDone chan struct{}

	mu struct {
		sync.Mutex
		idle        sync.Cond // broadcast when active drops to 0 after closed
		closed      bool
		tiersClosed bool
		active      int // operations that may still touch the tiers
		refs        int // live Refs holding a pin

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

		// evicted remembers the last blocks evicted as soon as they were
		// put, so that their children, put next, are evicted too instead
		// of displacing the cached prefix they hang from.
		evicted     [32]prefixhash.Key
		evictedNext int

		cursors map[uint32][]cursorRef // entry → the namespace cursors on it (quota.go)

		c     counters
		stack []uint32 // scratch
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
}

type reason uint8

const (
	reasonEvict reason = iota
	reasonCorrupt
	reasonNamespace
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
	l := &Local{opts: opts, mem: opts.DRAM, disk: opts.NVMe}
	l.view, _ = opts.DRAM.(tiers.Viewer)
	l.classed, _ = opts.DRAM.(tiers.Classed)
	l.mu.idle.L = &l.mu.Mutex
	l.mu.ns.quotas = maps.Clone(opts.Quotas)
	l.mu.ns.defQuota = opts.DefaultQuota
	if l.disk != nil {
		l.seg, _ = l.disk.(tiers.Segmented)
		l.batcher, _ = l.disk.(tiers.Batcher)
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
	l.mu.closed = true
	l.mu.Unlock()
	if l.stopResolve != nil {
		l.stopResolve()
	}
	<-l.resolveDone

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
	l.mu.tiersClosed = true
	l.mu.Unlock()
	var errs []error
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
	if l.mu.active == 0 && l.mu.closed {
		l.mu.idle.Broadcast()
	}
	l.mu.Unlock()
}

// Put stores an encoded block: header and payload, as Encode builds it. It
// verifies the whole block first (ErrCorrupt, ErrTooLarge beyond
// MaxBlockBytes, ErrLayout) and copies it; block is not retained. Putting a
// block already cached is a cheap no-op that touches it. ErrFull means no
// tier has room even after eviction; ErrQuota, that the block's namespace
// has no room within its quotas (see Quota).
func (l *Local) Put(ctx context.Context, block []byte) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	h, err := DecodeHeader(block, l.opts.MaxBlockBytes)
	if err != nil {
		return err
	}
	if n := h.Len + h.PayloadLen; len(block) != n {
		return fmt.Errorf("%w: %d bytes, header says %d", ErrCorrupt, len(block), n)
	}
	if a := auth.AccessFrom(ctx); !a.Allows(h.Tenant) {
		return fmt.Errorf("%w: block %s is tagged for tenant %016x, the writer is tenant %016x", ErrTenant, h.Key, h.Tenant, a.Tag)
	}
	size := len(block)
	class := l.classOf(size)
	l.mu.Lock()
	if !l.enterLocked() {
		l.mu.Unlock()
		return ErrClosed
	}
	if i := l.mu.x.find(h.Key); i != 0 {
		if n := l.mu.ns.get(l.mu.x.at(i).ns); n.resolved && n.tenant != h.Tenant {
			l.mu.active--
			l.mu.Unlock()
			return fmt.Errorf("%w: key %s is held for tenant %016x, the block is tagged %016x", ErrTenant, h.Key, n.tenant, h.Tenant)
		}
		l.touchPutLocked(i, h.Parent)
		l.mu.active--
		l.mu.Unlock()
		return nil
	}
	if _, err := l.mu.ns.check(&h, size); err != nil {
		l.mu.active--
		l.mu.Unlock()
		return err
	}
	// Most writes fit their namespace's quota: reserve now, under this lock.
	var id uint32
	reserved := false
	if class >= 0 {
		id, reserved = l.tryReserveLocked(&h, size, class, tierMem)
	}
	indexFull := l.indexFullLocked()
	l.mu.Unlock()
	defer l.exit()

	err = verifyPayload(block, &h)
	if err == nil && indexFull {
		err = l.makeIndexRoom(ctx)
	}
	if err != nil {
		if reserved {
			l.mu.Lock()
			l.unreserveLocked(id, tierMem, size)
			l.mu.Unlock()
		}
		return err
	}
	err = tiers.ErrTooLarge
	if class >= 0 {
		if !reserved {
			id, err = l.room(ctx, &h, h.Namespace, size, class, tierMem, h.Parent)
		} else {
			err = nil
		}
		if err == nil {
			var loc tiers.Loc
			if loc, err = l.putMem(ctx, h.Key, h.Parent, block, class); err == nil {
				var fr []freeLoc
				l.mu.Lock()
				err = l.insertLocked(&h, size, class, loc, false, id, &fr)
				l.mu.Unlock()
				l.freeAll(fr)
				return err
			}
			l.mu.Lock()
			l.unreserveLocked(id, tierMem, size)
			l.mu.Unlock()
		}
	}
	if errors.Is(err, ErrLayout) {
		return err
	}
	if ctx.Err() != nil {
		return l.refused(err, size)
	}
	if l.disk != nil {
		// No room in memory (or in the namespace's memory quota), or the
		// block is the coldest there: it goes straight to the persistent
		// tier.
		id, derr := l.room(ctx, &h, h.Namespace, size, class, tierDisk, h.Parent)
		if derr == nil {
			var ierr error
			ms := []moved{{key: h.Key, val: block}}
			l.toDisk(ms, func(m *moved, fr *[]freeLoc) {
				if m.done {
					ierr = l.insertLocked(&h, size, class, m.newLoc, true, id, fr)
				} else {
					l.unreserveLocked(id, tierDisk, size)
				}
			})
			if ms[0].done {
				return ierr
			}
			if errors.Is(err, tiers.ErrTooLarge) && ms[0].werr != nil {
				err = ms[0].werr
			}
		} else if !errors.Is(err, errColdest) || errors.Is(derr, ErrLayout) || ctx.Err() != nil {
			err = derr
		}
	}
	if errors.Is(err, errColdest) {
		// Accepted, and evicted at once; so will its children be.
		l.mu.Lock()
		l.mu.c.puts++
		l.mu.c.evictions++
		l.mu.evicted[l.mu.evictedNext%len(l.mu.evicted)] = h.Key
		l.mu.evictedNext++
		l.mu.Unlock()
		return nil
	}
	if errors.Is(err, ErrLayout) {
		return err
	}
	return l.refused(err, size)
}

// verifyPayload finishes what DecodeHeader and a length check started: the
// payload checksum.
func verifyPayload(b []byte, h *Header) error {
	if sum := xxhash.Sum64(b[h.Len:]); sum != h.Checksum {
		return fmt.Errorf("%w: payload checksum %016x, computed %016x", ErrCorrupt, h.Checksum, sum)
	}
	return nil
}

func (l *Local) refused(err error, n int) error {
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	quota := errors.Is(err, ErrQuota)
	l.mu.Lock()
	l.mu.c.refused++
	if quota {
		l.mu.c.quotaRefused++
	}
	l.mu.Unlock()
	switch {
	case quota:
		return err
	case errors.Is(err, tiers.ErrTooLarge):
		return fmt.Errorf("%w: a block of %d bytes fits no tier: %w", ErrTooLarge, n, err)
	case errors.Is(err, tiers.ErrFull):
		return fmt.Errorf("%w: %w", ErrFull, err)
	}
	return fmt.Errorf("store: put: %w", err)
}

// insertLocked indexes a block just stored at loc, taking over the
// reservation room made for it in namespace rid; on failure (or when a
// concurrent Put won) it frees loc.
func (l *Local) insertLocked(h *Header, size, class int, loc tiers.Loc, disk bool, rid uint32, fr *[]freeLoc) error {
	x := &l.mu.x
	t := tierMem
	if disk {
		t = tierDisk
	}
	if i := x.find(h.Key); i != 0 { // a concurrent Put won
		l.touchPutLocked(i, h.Parent)
		l.unreserveLocked(rid, t, size)
		*fr = append(*fr, freeLoc{disk, loc})
		return nil
	}
	if l.indexFullLocked() { // concurrent Puts passed the check in Put together
		l.unreserveLocked(rid, t, size)
		*fr = append(*fr, freeLoc{disk, loc})
		return fmt.Errorf("%w: the index holds MaxBlocks (%d) blocks", ErrFull, l.opts.MaxBlocks)
	}
	id, err := l.mu.ns.acquire(h, size, class, t)
	l.unreserveLocked(rid, t, size) // after acquire, so that the namespace stays
	if err != nil {
		*fr = append(*fr, freeLoc{disk, loc})
		return err
	}
	i := x.alloc(h.Key)
	if i == 0 {
		l.releaseNSLocked(id, t)
		*fr = append(*fr, freeLoc{disk, loc})
		return fmt.Errorf("%w: the index is full", ErrFull)
	}
	e := x.at(i)
	e.ns = id
	e.setLoc(loc)
	if disk {
		e.set(flagPersistent)
	}
	x.insert(i)
	l.mu.blocks[t]++
	l.mu.bytes[t] += int64(size)
	l.mu.c.puts++
	// A parent of another namespace is not linked: a block naming one is
	// forged, and one tenant's eviction must never cascade into another's.
	// (An unresolved parent is checked when it is resolved.)
	if p := x.find(h.Parent); p != 0 {
		if pns := x.at(p).ns; pns == id || !l.mu.ns.get(pns).resolved {
			x.link(i, p)
		}
	}
	l.placeLocked(i, h.Parent)
	return nil
}

// touchPutLocked touches a block put again.
func (l *Local) touchPutLocked(i uint32, parent prefixhash.Key) {
	l.mu.x.at(i).set(flagHit)
	l.placeLocked(i, parent)
	l.mu.c.duplicates++
}

// placeLocked moves i in its recency list right behind its parent (on the
// colder side) when the parent is in the same list, else to the front. So
// a chain put in order, or put again, keeps its leaves colder than its
// ancestors, and eviction takes leaves first.
func (l *Local) placeLocked(i uint32, parent prefixhash.Key) {
	x := &l.mu.x
	e := x.at(i)
	at := l.mu.diskList
	if !e.persistent() {
		at = l.memListLocked(l.mu.ns.get(e.ns).class)
	}
	if p := x.find(parent); p != 0 && p != i {
		if pe := x.at(p); pe.persistent() == e.persistent() && pe.ns == e.ns {
			at = p
		}
	}
	l.unlistLocked(i)
	x.insertAfter(at, i)
	l.placedBehindLocked(at, i)
}

// classOf returns the memory tier's size class for blocks of n bytes, -1 if
// the tier can never hold them.
func (l *Local) classOf(n int) int {
	if l.classed == nil {
		return 0
	}
	return l.classed.SizeClass(n)
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

// touchLocked marks i as just used: the hottest of its list.
func (l *Local) touchLocked(i uint32) {
	x := &l.mu.x
	e := x.at(i)
	e.set(flagHit)
	if e.persistent() {
		l.moveFrontLocked(l.mu.diskList, i)
	} else {
		l.moveFrontLocked(l.memListLocked(l.mu.ns.get(e.ns).class), i)
	}
}

// Ref is a pinned, verified block returned by Get. Its bytes stay valid and
// unchanged until Release; the block cannot be freed or moved under it.
type Ref struct {
	l *Local
	i uint32 // pinned entry, 0 when b is a private copy
	b []byte
}

// Bytes returns the encoded block. The slice belongs to the store: read it,
// never write it, and not after Release.
func (r *Ref) Bytes() []byte { return r.b }

// Release unpins the block. Call it exactly once per Ref; later calls do
// nothing.
func (r *Ref) Release() {
	if r == nil || r.l == nil {
		return
	}
	l, i := r.l, r.i
	r.l, r.b = nil, nil
	if i == 0 {
		return
	}
	var fr []freeLoc
	l.mu.Lock()
	l.unpinLocked(i, &fr)
	l.mu.refs--
	l.unlockAndFree(fr)
}

// unlockAndFree releases the lock and frees fr, keeping Close from closing
// the tiers under the frees.
func (l *Local) unlockAndFree(fr []freeLoc) {
	if len(fr) == 0 {
		l.mu.Unlock()
		return
	}
	l.mu.active++
	l.mu.Unlock()
	l.freeAll(fr)
	l.exit()
}

func (l *Local) unpinLocked(i uint32, fr *[]freeLoc) {
	e := l.mu.x.at(i)
	if e.pins == 0 {
		panic(fmt.Sprintf("store: unpin of entry %d with no pins", i))
	}
	e.pins--
	l.finalizeIfIdleLocked(i, fr)
}

// Get returns the block of key, pinned until the Ref is released, or
// ErrNotFound. A block read from NVMe is verified, promoted to DRAM when room
// can be made, and a block that fails verification is dropped (with its
// descendants), counted, and reported as a miss.
//
// A request whose context carries a scoped access (auth.WithAccess) gets
// only blocks of its tenant: another tenant's block is ErrNotFound.
func (l *Local) Get(ctx context.Context, key prefixhash.Key) (*Ref, error) {
	r, err := l.get(ctx, key)
	if err != nil {
		return nil, err
	}
	if a := auth.AccessFrom(ctx); !a.Allows(headerTenant(r.b)) {
		r.Release()
		l.mu.Lock()
		l.mu.c.misses++
		l.mu.Unlock()
		return nil, ErrNotFound
	}
	return r, nil
}

func (l *Local) get(ctx context.Context, key prefixhash.Key) (*Ref, error) {
	for {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		l.mu.Lock()
		if l.mu.closed {
			l.mu.Unlock()
			return nil, ErrClosed
		}
		i := l.mu.x.find(key)
		if i == 0 {
			l.mu.c.misses++
			l.mu.Unlock()
			return nil, ErrNotFound
		}
		e := l.mu.x.at(i)
		if !e.persistent() {
			return l.getMemLocked(i)
		}
		if e.has(flagMoving) {
			ch := l.waitLocked(i)
			l.mu.Unlock()
			select {
			case <-ch:
				continue
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		}
		e.set(flagMoving)
		m := l.movedLocked(i)
		l.mu.active++
		l.mu.Unlock()
		r, err := l.promote(ctx, m)
		l.exit()
		return r, err
	}
}

// getMemLocked serves a hit in the memory tier. It is called with the lock
// held and returns with it released.
func (l *Local) getMemLocked(i uint32) (*Ref, error) {
	e := l.mu.x.at(i)
	l.touchLocked(i)
	e.setHitsSaturating()
	l.mu.c.hits++
	key, loc, size := e.key, e.getLoc(), l.mu.ns.get(e.ns).size
	if l.view != nil && e.pins < maxPins {
		e.pins++
		l.mu.refs++
		l.mu.Unlock()
		b := l.view.View(loc, size)
		if err := l.checkHit(key, b); err != nil {
			l.corruptPinned(i)
			return nil, ErrNotFound
		}
		return &Ref{l: l, i: i, b: b}, nil
	}
	if l.view != nil { // pins saturated: hand out a copy
		b := append([]byte(nil), l.view.View(loc, size)...)
		l.mu.Unlock()
		return &Ref{l: l, b: b}, nil
	}
	if !l.enterLocked() {
		l.mu.Unlock()
		return nil, ErrClosed
	}
	e.pins++
	l.mu.Unlock()
	defer l.exit()
	b := make([]byte, size)
	err := l.mem.Read(loc, b)
	if err == nil {
		_, err = l.verify(key, b)
	}
	var fr []freeLoc
	l.mu.Lock()
	l.unpinLocked(i, &fr)
	if err != nil {
		l.failedReadLocked(i, &fr)
	}
	l.mu.Unlock()
	l.freeAll(fr)
	if err != nil {
		return nil, ErrNotFound
	}
	return &Ref{l: l, b: b}, nil
}

// checkHit verifies a block served in place from memory: its key always,
// everything with VerifyMemoryHits.
func (l *Local) checkHit(key prefixhash.Key, b []byte) error {
	if l.opts.VerifyMemoryHits {
		_, err := l.verify(key, b)
		return err
	}
	if len(b) < 40 || prefixhash.Key(b[24:40]) != key {
		return fmt.Errorf("%w: bytes at the location of %s are not its block", ErrCorrupt, key)
	}
	return nil
}

// verify decodes a block read from a tier and checks it is key's.
func (l *Local) verify(key prefixhash.Key, b []byte) (Block, error) {
	blk, err := Decode(b, l.opts.MaxBlockBytes)
	if err != nil {
		return blk, err
	}
	if blk.Key != key {
		return blk, fmt.Errorf("%w: the location of %s holds %s", ErrCorrupt, key, blk.Key)
	}
	return blk, nil
}

// corruptPinned drops a block whose in-place bytes failed checkHit.
func (l *Local) corruptPinned(i uint32) {
	var fr []freeLoc
	l.mu.Lock()
	l.mu.refs--
	l.mu.c.hits--
	l.unpinLocked(i, &fr)
	l.failedReadLocked(i, &fr)
	l.unlockAndFree(fr)
}

// failedReadLocked drops entry i after a failed read or verification and
// counts a miss. A read that failed because the segment went away under it
// is an eviction, not corruption.
func (l *Local) failedReadLocked(i uint32, fr *[]freeLoc) {
	l.mu.c.misses++
	e := l.mu.x.at(i)
	if e.has(flagDropped) {
		return
	}
	why := reasonCorrupt
	if e.has(flagLocGone) {
		why = reasonEvict
	}
	l.dropLocked(i, why, fr)
}

// waitLocked returns a channel closed when i's mover is done.
func (l *Local) waitLocked(i uint32) chan struct{} {
	if l.mu.waiters == nil {
		l.mu.waiters = make(map[uint32]chan struct{})
	}
	ch := l.mu.waiters[i]
	if ch == nil {
		ch = make(chan struct{})
		l.mu.waiters[i] = ch
	}
	return ch
}

func (l *Local) doneMovingLocked(i uint32) {
	l.mu.x.at(i).clear(flagMoving)
	if ch, ok := l.mu.waiters[i]; ok {
		close(ch)
		delete(l.mu.waiters, i)
	}
}

// GetMany gets keys in one pass: refs[i] is the block of keys[i], or nil on
// a miss. Blocks in memory are pinned under one lock, deepest key first (so
// a chain's ancestors end up warmest); the rest go through Get. The error is
// ErrClosed or the context's; then no Ref is returned.
func (l *Local) GetMany(ctx context.Context, keys []prefixhash.Key) ([]*Ref, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	refs := make([]*Ref, len(keys))
	backing := make([]Ref, len(keys))
	var slow []int
	l.mu.Lock()
	if l.mu.closed {
		l.mu.Unlock()
		return nil, ErrClosed
	}
	x := &l.mu.x
	a := auth.AccessFrom(ctx)
	for k := len(keys) - 1; k >= 0; k-- {
		i := x.find(keys[k])
		if i == 0 {
			l.mu.c.misses++
			continue
		}
		e := x.at(i)
		if n := l.mu.ns.get(e.ns); a.Scoped && n.resolved && n.tenant != a.Tag {
			l.mu.c.misses++
			continue
		}
		if e.persistent() || l.view == nil || e.pins == maxPins {
			slow = append(slow, k)
			continue
		}
		l.touchLocked(i)
		e.setHitsSaturating()
		e.pins++
		l.mu.refs++
		l.mu.c.hits++
		backing[k] = Ref{l: l, i: i, b: l.view.View(e.getLoc(), l.mu.ns.get(e.ns).size)}
		refs[k] = &backing[k]
	}
	l.mu.Unlock()
	for k, r := range refs {
		if r != nil && l.checkHit(keys[k], r.b) != nil {
			l.corruptPinned(r.i)
			refs[k] = nil
		}
	}
	for _, k := range slow {
		r, err := l.Get(ctx, keys[k])
		switch {
		case err == nil:
			refs[k] = r
		case errors.Is(err, ErrNotFound):
		default:
			for _, r := range refs {
				r.Release()
			}
			return nil, err
		}
	}
	return refs, nil
}

// PutMany puts every block it can; the error joins those of the blocks
// that failed, each naming the block's position.
func (l *Local) PutMany(ctx context.Context, blocks [][]byte) error {
	var errs []error
	for k, b := range blocks {
		if err := l.Put(ctx, b); err != nil {
			if ctx.Err() != nil {
				return errors.Join(append(errs, err)...)
			}
			errs = append(errs, fmt.Errorf("block %d: %w", k, err))
		}
	}
	return errors.Join(errs...)
}

// Contains reports whether key is cached here, as a block a request with
// access a may see (auth.Access). It does not touch the block.
func (l *Local) Contains(a auth.Access, key prefixhash.Key) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.mu.closed {
		return false
	}
	i := l.mu.x.find(key)
	return i != 0 && l.mu.ns.allows(a, l.mu.x.at(i).ns)
}

// LongestPrefix returns how many leading keys are cached here as blocks a
// request with access a may see. It touches them deepest-first, so that a
// chain's ancestors are always warmer than its descendants.
func (l *Local) LongestPrefix(a auth.Access, keys []prefixhash.Key) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.mu.closed {
		return 0
	}
	s := l.mu.stack[:0]
	for _, k := range keys {
		i := l.mu.x.find(k)
		if i == 0 || !l.mu.ns.allows(a, l.mu.x.at(i).ns) {
			break
		}
		s = append(s, i)
	}
	for k := len(s) - 1; k >= 0; k-- {
		l.touchLocked(s[k])
	}
	l.mu.stack = s[:0]
	return len(s)
}

// NamespaceTenant returns the tenant tag of the blocks of the namespace
// with the given digest, and whether this node holds any.
func (l *Local) NamespaceTenant(digest uint64) (uint64, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	id := l.mu.ns.byDigest[digest]
	if id == 0 {
		return 0, false
	}
	return l.mu.ns.get(id).tenant, true
}

// DropNamespace drops every cached block of the namespace with the given
// digest and returns how many it dropped. Blocks recovered from NVMe whose
// header was not read yet are dropped when it is. Blocks pinned by Refs stay
// readable through those Refs and are freed at their release.
func (l *Local) DropNamespace(digest uint64) (int, error) {
	l.mu.Lock()
	if !l.enterLocked() {
		l.mu.Unlock()
		return 0, ErrClosed
	}
	if l.mu.unresolved > 0 {
		if l.mu.droppedUnresolved == nil {
			l.mu.droppedUnresolved = make(map[uint64]struct{})
		}
		l.mu.droppedUnresolved[digest] = struct{}{}
	}
	id := l.mu.ns.byDigest[digest]
	pages := len(l.mu.x.pages)
	l.mu.Unlock()
	defer l.exit()
	dropped := 0
	// A page at a time, so that a large drop does not stall every reader.
	for p := 0; p < pages && id != 0; p++ {
		var fr []freeLoc
		l.mu.Lock()
		if n := l.mu.ns.get(id); !n.resolved || n.digest != digest {
			l.mu.Unlock()
			break // all gone (and the id possibly reused)
		}
		for k := range pageLen {
			i := uint32(p*pageLen + k)
			e := l.mu.x.at(i)
			if e.ns == id && e.flags&(flagSentinel|flagDropped) == 0 {
				dropped += l.dropLocked(i, reasonNamespace, &fr)
			}
		}
		l.mu.Unlock()
		l.freeAll(fr)
	}
	return dropped, nil
}

// dropLocked removes entry i and every cached descendant of it from the
// index, counts them under why, and returns how many it removed.
func (l *Local) dropLocked(i uint32, why reason, fr *[]freeLoc) int {
	x := &l.mu.x
	x.unlink(i)
	stack := append(l.mu.stack[:0], i)
	n := 0
	for len(stack) > 0 {
		j := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		e := x.at(j)
		for c := e.child; c != 0; {
			ce := x.at(c)
			next := ce.sib
			ce.up, ce.sib = 0, 0
			ce.clear(flagFirst)
			stack = append(stack, c)
			c = next
		}
		e.child = 0
		l.removeLocked(j, fr)
		n++
	}
	l.mu.stack = stack[:0]
	switch why {
	case reasonEvict:
		l.mu.c.evictions += int64(n)
	case reasonCorrupt:
		l.mu.c.corruptDrops++
		l.mu.c.evictions += int64(n - 1)
	case reasonNamespace:
		l.mu.c.namespaceDrops += int64(n)
	}
	l.mu.c.cascade += int64(n - 1)
	return n
}

// removeLocked takes i out of the table, its list and its namespace. Its
// slot and tier location go when no pin or mover holds them.
func (l *Local) removeLocked(i uint32, fr *[]freeLoc) {
	x := &l.mu.x
	e := x.at(i)
	if !x.remove(e.key) {
		panic(fmt.Sprintf("store: removing %s, which is not in the table", e.key))
	}
	l.unlistLocked(i)
	n := l.mu.ns.get(e.ns)
	t := tierOf(e)
	l.mu.blocks[t]--
	l.mu.bytes[t] -= int64(n.size)
	if !n.resolved {
		l.mu.unresolved--
	}
	l.releaseNSLocked(e.ns, t)
	e.ns = 0
	e.set(flagDropped)
	l.finalizeIfIdleLocked(i, fr)
}

// finalizeIfIdleLocked frees a dropped entry once nothing holds it.
func (l *Local) finalizeIfIdleLocked(i uint32, fr *[]freeLoc) {
	e := l.mu.x.at(i)
	if !e.has(flagDropped) || e.busy() {
		return
	}
	if !e.has(flagLocGone) {
		*fr = append(*fr, freeLoc{e.persistent(), e.getLoc()})
	}
	l.mu.x.release(i)
}

// freeAll frees tier locations; it is called without the lock.
func (l *Local) freeAll(fr []freeLoc) {
	for _, f := range fr {
		if f.disk {
			l.disk.Free(f.loc)
		} else {
			l.mem.Free(f.loc)
		}
	}
}
