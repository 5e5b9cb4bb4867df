package store

import (
	"bytes"
	"context"
	"errors"
	"fmt"

	"github.com/cespare/xxhash/v2"

	"github.com/kvmesh/kvmesh/auth"
	"github.com/kvmesh/kvmesh/block"
	"github.com/kvmesh/kvmesh/prefixhash"
	"github.com/kvmesh/kvmesh/tiers"
)

// Put stores an encoded block: header and payload, as block.Encode builds it. It
// verifies the whole block first (block.ErrCorrupt, block.ErrTooLarge beyond
// MaxBlockBytes, ErrLayout) and copies it; b is not retained. Putting a
// block already cached is a cheap no-op that touches it. ErrFull means no
// tier has room even after eviction; ErrQuota, that the block's namespace
// has no room within its quotas (see Quota).
func (l *Local) Put(ctx context.Context, b []byte) error {
	return l.put(ctx, b, false, nil)
}

// put is Put, or PutCopy storing a copy (asCopy: under EvictDedup). With
// rv, b is rv's slot in the memory tier, whose location the index takes
// over instead of a copy; on every path that does not, the slot is freed
// before put returns.
func (l *Local) put(ctx context.Context, b []byte, asCopy bool, rv *Reservation) (err error) {
	if rv != nil {
		defer func() {
			if rv != nil {
				l.freeAll([]freeLoc{{false, rv.loc}})
			}
		}()
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	h, err := block.DecodeHeader(b, l.opts.MaxBlockBytes)
	if err != nil {
		return err
	}
	if n := h.Len + h.PayloadLen; len(b) != n {
		return fmt.Errorf("%w: %d bytes, header says %d", block.ErrCorrupt, len(b), n)
	}
	if a := auth.AccessFrom(ctx); !a.Allows(h.Tenant) {
		return fmt.Errorf("%w: block %s is tagged for tenant %016x, the writer is tenant %016x", ErrTenant, h.Key, h.Tenant, a.Tag)
	}
	if !h.Whole() {
		if rv != nil {
			// Assembled from a heap copy, the part's slot freed first: the
			// slot would hold memory that its whole block's needs (a small
			// tier may have a single slab of that class).
			b = bytes.Clone(b)
			l.freeAll([]freeLoc{{false, rv.loc}})
			rv = nil
			if h, err = block.DecodeHeader(b, l.opts.MaxBlockBytes); err != nil {
				return err
			}
		}
		return l.putPart(ctx, b, &h, asCopy)
	}
	if l.partialsOpen.Load() > 0 {
		defer l.dropSuperseded(h.Key)
	}
	size := len(b)
	class := l.classOf(size)
	// A copy goes to the cold end, not behind its parent: making room for
	// it never stops at the parent.
	parent := h.Parent
	if asCopy {
		parent = prefixhash.Key{}
	}
	reclaimed := false
again:
	l.mu.Lock()
	if !l.enterLocked() {
		l.mu.Unlock()
		return ErrClosed
	}
	if i := l.mu.x.find(h.Key); i != 0 {
		if n := l.mu.ns.get(l.mu.x.at(i).ns); n.resolved && n.tenant != h.Tenant {
			l.mu.active--
			l.mu.Unlock()
			if h.Tenant == 0 && !reclaimed {
				l.reclaimForNodeWide(&h)
				reclaimed = true
				goto again
			}
			return fmt.Errorf("%w: key %s is held for tenant %016x, the block is tagged %016x", ErrTenant, h.Key, n.tenant, h.Tenant)
		}
		if e := l.mu.x.at(i); e.copy() && !asCopy {
			l.ownCopyLocked(i, &h)
		}
		l.touchPutLocked(i, h.Parent)
		l.mu.active--
		l.mu.Unlock()
		return nil
	}
	if _, err := l.mu.ns.check(&h, size); err != nil {
		l.mu.active--
		l.mu.Unlock()
		if errors.Is(err, ErrTenant) && h.Tenant == 0 && !reclaimed {
			l.reclaimForNodeWide(&h)
			reclaimed = true
			goto again
		}
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

	if rv == nil || !rv.sealed {
		err = verifyPayload(b, &h)
	}
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
			id, err = l.room(ctx, &h, h.Namespace, size, class, tierMem, parent)
		} else {
			err = nil
		}
		if err == nil {
			var loc tiers.Loc
			if rv != nil {
				loc, rv = rv.loc, nil // the index takes the slot (or frees it)
			} else {
				loc, err = l.putMem(ctx, h.Key, parent, b, class, true)
			}
			if err == nil {
				var fr []freeLoc
				l.mu.Lock()
				err = l.insertLocked(&h, size, class, loc, false, asCopy, id, &fr)
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
		id, derr := l.room(ctx, &h, h.Namespace, size, class, tierDisk, parent)
		if derr == nil {
			var ierr error
			ms := []moved{{key: h.Key, val: b}}
			l.toDisk(ms, func(m *moved, fr *[]freeLoc) {
				if m.done {
					ierr = l.insertLocked(&h, size, class, m.newLoc, true, asCopy, id, fr)
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
		l.mu.c.unadmitted++
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

// reclaimForNodeWide makes way for node-wide block h (tag 0) where tenants' blocks
// hold its key or its namespace's digest: they are dropped (counted as
// namespace drops). A tenant may write under any key or digest it can
// compute, and node-wide ones are not salted, so without this a tenant
// that wrote first under a node-wide prompt's keys would keep node-wide
// data out of the cache for good. Node-wide readers never see a tenant's
// blocks (auth.Principal.Access), and a tenant's write under a digest that
// node-wide blocks hold is refused (ErrTenant), so squatting gains nothing.
func (l *Local) reclaimForNodeWide(h *block.Header) {
	l.mu.Lock()
	if !l.enterLocked() {
		l.mu.Unlock()
		return
	}
	var fr []freeLoc
	if i := l.mu.x.find(h.Key); i != 0 {
		if n := l.mu.ns.get(l.mu.x.at(i).ns); n.resolved && n.tenant != 0 {
			l.dropLocked(i, reasonNamespace, &fr)
		}
	}
	id := l.mu.ns.byDigest[h.Namespace]
	squatted := id != 0 && l.mu.ns.get(id).tenant != 0
	l.mu.Unlock()
	l.freeAll(fr)
	l.exit()
	if squatted {
		l.DropNamespace(h.Namespace)
	}
}

// verifyPayload finishes what DecodeHeader and a length check started: the
// payload checksum.
func verifyPayload(b []byte, h *block.Header) error {
	if sum := xxhash.Sum64(b[h.Len:]); sum != h.Checksum {
		return fmt.Errorf("%w: payload checksum %016x, computed %016x", block.ErrCorrupt, h.Checksum, sum)
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
		return fmt.Errorf("%w: a block of %d bytes fits no tier: %w", block.ErrTooLarge, n, err)
	case errors.Is(err, tiers.ErrFull):
		return fmt.Errorf("%w: %w", ErrFull, err)
	}
	return fmt.Errorf("store: put: %w", err)
}

// insertLocked indexes a block just stored at loc (a copy under EvictDedup
// if asCopy), taking over the reservation room made for it in namespace rid;
// on failure (or when a concurrent Put won) it frees loc.
func (l *Local) insertLocked(h *block.Header, size, class int, loc tiers.Loc, disk, asCopy bool, rid uint32, fr *[]freeLoc) error {
	x := &l.mu.x
	t := tierMem
	if disk {
		t = tierDisk
	}
	if i := x.find(h.Key); i != 0 { // a concurrent Put won
		if x.at(i).copy() && !asCopy {
			l.ownCopyLocked(i, h)
		}
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
	} else {
		l.hbmAddLocked(i, loc, size)
	}
	x.insert(i)
	l.mu.blocks[t]++
	l.mu.bytes[t] += int64(size)
	l.mu.c.puts++
	if asCopy {
		e.hits |= hitsCopy
	}
	l.linkParentLocked(i, h)
	l.placeLocked(i, h.Parent)
	return nil
}

// touchPutLocked touches a block put again.
func (l *Local) touchPutLocked(i uint32, parent prefixhash.Key) {
	l.mu.x.at(i).set(flagHit)
	l.placeLocked(i, parent)
	l.mu.c.duplicates++
}

// classOf returns the memory tier's size class for blocks of n bytes, -1 if
// the tier can never hold them.
func (l *Local) classOf(n int) int {
	if l.classed == nil {
		return 0
	}
	return l.classed.SizeClass(n)
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
