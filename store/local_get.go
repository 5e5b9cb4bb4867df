package store

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/kvmesh/kvmesh/auth"
	"github.com/kvmesh/kvmesh/block"
	"github.com/kvmesh/kvmesh/internal/invariants"
	"github.com/kvmesh/kvmesh/prefixhash"
)

// Ref is a pinned, verified block returned by Get. Its bytes stay valid and
// unchanged until Release; the block cannot be freed or moved under it.
type Ref struct {
	leak invariants.Leak // a pinned Ref collected unreleased panics in the invariants build
	l    *Local
	i    uint32 // pinned entry, 0 when b is a private copy
	b    []byte
	buf  *[]byte // the pooled buffer a private copy lives in, back to the pool at Release
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
	l, i, buf := r.l, r.i, r.buf
	r.l, r.b, r.buf = nil, nil, nil
	r.leak.Stop()
	if i == 0 {
		l.putReadBuf(buf)
		return
	}
	var fr []freeLoc
	l.mu.Lock()
	l.unpinLocked(i, &fr)
	l.unrefLocked()
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

// unrefLocked counts a live Ref gone (released, or spent on a failed
// check). The count going below zero means a Ref was released twice, and
// the pin it held was taken from another reader: the invariants build
// panics.
func (l *Local) unrefLocked() {
	l.mu.refs--
	if invariants.Enabled && l.mu.refs < 0 {
		panic(fmt.Sprintf("store: %d live Refs: a Ref was released more often than it was handed out", l.mu.refs))
	}
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
	if a := auth.AccessFrom(ctx); !a.Allows(block.Tenant(r.b)) {
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
			if l.hbm != nil && !isHBM(e.getLoc()) && !e.busy() {
				return l.promoteHBMLocked(ctx, i)
			}
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
	if l.viewable(loc) && e.pins < maxPins {
		e.pins++
		l.mu.refs++
		l.mu.Unlock()
		b := l.view.View(loc, size)
		if err := l.checkHit(key, b); err != nil {
			l.corruptPinned(i)
			return nil, ErrNotFound
		}
		r := &Ref{l: l, i: i, b: b}
		invariants.Track(r, &r.leak, "store.Ref")
		return r, nil
	}
	if l.viewable(loc) { // pins saturated: hand out a copy
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
	err := l.memRead(loc, b)
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
		return fmt.Errorf("%w: bytes at the location of %s are not its block", block.ErrCorrupt, key)
	}
	return nil
}

// verify decodes a block read from a tier and checks it is key's.
func (l *Local) verify(key prefixhash.Key, b []byte) (block.Block, error) {
	return l.verifyWith(block.Decode, key, b)
}

// verifyRead is verify for a block read from the persistent tier. When that
// tier checked every byte against the sum taken when it was written
// (tiers.Checked), which was over bytes Put verified, the header, the
// length and the key are checked and the payload is not hashed a second
// time (block.DecodeFramed).
func (l *Local) verifyRead(key prefixhash.Key, b []byte) (block.Block, error) {
	if l.diskChecked {
		return l.verifyWith(block.DecodeFramed, key, b)
	}
	return l.verify(key, b)
}

func (l *Local) verifyWith(decode func([]byte, int) (block.Block, error), key prefixhash.Key, b []byte) (block.Block, error) {
	blk, err := decode(b, l.opts.MaxBlockBytes)
	if err != nil {
		return blk, err
	}
	if blk.Key != key {
		return blk, fmt.Errorf("%w: the location of %s holds %s", block.ErrCorrupt, key, blk.Key)
	}
	return blk, nil
}

// readBuf returns a buffer of n bytes for a block read from the persistent
// tier, pooled by size: a fresh one would be cleared by the runtime only for
// the read to overwrite it. Its contents are unspecified.
func (l *Local) readBuf(n int) *[]byte {
	p, ok := l.readBufs.Load(n)
	if !ok {
		p, _ = l.readBufs.LoadOrStore(n, &sync.Pool{New: func() any {
			b := make([]byte, n)
			return &b
		}})
	}
	return p.(*sync.Pool).Get().(*[]byte)
}

// putReadBuf returns a buffer of readBuf to its pool; nil does nothing.
func (l *Local) putReadBuf(b *[]byte) {
	if b == nil {
		return
	}
	if p, ok := l.readBufs.Load(len(*b)); ok {
		p.(*sync.Pool).Put(b)
	}
}

// corruptPinned drops a block whose in-place bytes failed checkHit.
func (l *Local) corruptPinned(i uint32) {
	var fr []freeLoc
	l.mu.Lock()
	l.unrefLocked()
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
// a chain's ancestors end up warmest); the rest (on NVMe) go through Get,
// slowReadDepth of them at once. The error is
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
		if e.persistent() || l.view == nil || e.pins == maxPins || l.hbm != nil {
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
		invariants.Track(refs[k], &refs[k].leak, "store.Ref")
	}
	l.mu.Unlock()
	for k, r := range refs {
		if r != nil && l.checkHit(keys[k], r.b) != nil {
			l.corruptPinned(r.i) // unpins: the Ref is spent
			r.leak.Stop()
			refs[k] = nil
		}
	}
	if err := l.getSlow(ctx, keys, slow, refs); err != nil {
		for _, r := range refs {
			if r != nil {
				r.Release()
			}
		}
		return nil, err
	}
	return refs, nil
}

// slowReadDepth is how many of a GetMany's blocks outside memory (on NVMe)
// are read at once: a prompt's blocks reach the disk as a queue, not one
// read after another, and at depth 8 an NVMe device is near its random
// read bandwidth.
const slowReadDepth = 8

// getSlow gets keys[k] for each k of slow through Get into refs[k] (nil on
// a miss), up to slowReadDepth at once. The error is the first that is
// not a miss; the refs already got stay in refs for the caller to release.
func (l *Local) getSlow(ctx context.Context, keys []prefixhash.Key, slow []int, refs []*Ref) error {
	if len(slow) == 0 {
		return nil // before the closures, which the workers make escape
	}
	get := func(k int) error {
		r, err := l.Get(ctx, keys[k])
		switch {
		case err == nil:
			refs[k] = r
		case !errors.Is(err, ErrNotFound):
			return err
		}
		return nil
	}
	if len(slow) == 1 {
		return get(slow[0])
	}
	var (
		next atomic.Int64
		mu   sync.Mutex
		werr error
		wg   sync.WaitGroup
	)
	for range min(len(slow), slowReadDepth) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				j := int(next.Add(1)) - 1
				if j >= len(slow) {
					return
				}
				if err := get(slow[j]); err != nil {
					mu.Lock()
					werr = cmp.Or(werr, err)
					mu.Unlock()
					next.Store(int64(len(slow))) // the others stop at their next block
					return
				}
			}
		}()
	}
	wg.Wait()
	return werr
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
// request with access a may see: one index probe per key, under one lock
// hold. Under EvictLRU and EvictDedup it writes no LRU state: a lookup is
// not a use, the blocks are touched when they are read (GetMany touches a
// chain deepest-first, so its ancestors end up warmest), so a lookup that
// is not followed by a read, or a peer's lookup for a node that then reads
// elsewhere, does not keep blocks warm. Under EvictReuse a lookup that
// finds blocks is what tells their owner that a prompt holding them came
// back (the engine may read them from another node): it touches them,
// deepest-first, and marks them reused (see EvictReuse).
func (l *Local) LongestPrefix(a auth.Access, keys []prefixhash.Key) int {
	n, _ := l.prefix(a, keys, nil)
	return n
}

// LongestPrefixTiers is LongestPrefix that also appends to tiers the name of
// the tier each block of the prefix is in, from the same probe.
func (l *Local) LongestPrefixTiers(a auth.Access, keys []prefixhash.Key, tiers []string) (int, []string) {
	if tiers == nil {
		tiers = make([]string, 0, len(keys))
	}
	return l.prefix(a, keys, tiers)
}

// prefix is LongestPrefix, appending tier names when tiers is not nil.
func (l *Local) prefix(a auth.Access, keys []prefixhash.Key, tiers []string) (int, []string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.mu.closed {
		return 0, tiers
	}
	x, ns := &l.mu.x, &l.mu.ns
	if l.opts.Eviction == EvictReuse {
		defer l.lookedUpLocked()
		l.mu.stack = l.mu.stack[:0]
	}
	for n, k := range keys {
		i := x.find(k)
		if i == 0 || !ns.allows(a, x.at(i).ns) {
			return n, tiers
		}
		if l.opts.Eviction == EvictReuse {
			l.mu.stack = append(l.mu.stack, i)
		}
		if tiers != nil {
			if x.at(i).persistent() {
				tiers = append(tiers, l.disk.Name())
			} else {
				tiers = append(tiers, l.mem.Name())
			}
		}
	}
	return len(keys), tiers
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
