package store

import (
	"context"
	"errors"
	"fmt"

	"github.com/kvmesh/kvmesh/block"
	"github.com/kvmesh/kvmesh/prefixhash"
	"github.com/kvmesh/kvmesh/tiers"
)

// errNamespaceDropped resolves a recovered block of a namespace that was
// dropped while it was unresolved.
var errNamespaceDropped = errors.New("store: namespace dropped")

// errLocGone resolves a recovered block whose segment was reclaimed while it
// was being read: it is evicted.
var errLocGone = errors.New("store: segment reclaimed during resolution")

// resolveBatch is how many recovered blocks the background scan reads at a
// time (and so holds in memory at once).
const resolveBatch = 16

// recover indexes what the persistent tier kept across the last shutdown.
// Entries start unresolved: the tier records key, location and length, not
// the header, so namespace and parent are learnt when the block is read.
func (l *Local) recover() error {
	r, ok := l.disk.(tiers.Recoverable)
	if !ok {
		return nil
	}
	maxLen := block.EncodedLen(prefixhash.MaxBlockTokens, l.opts.MaxBlockBytes)
	l.mu.Lock()
	defer l.mu.Unlock()
	x := &l.mu.x
	err := r.Range(func(rec tiers.Record) bool {
		// Duplicates and impossible lengths are not indexed: they die
		// with their segment.
		if rec.Len < block.FixedHeaderLen || rec.Len > maxLen || x.find(rec.Key) != 0 {
			return true
		}
		if l.mu.blocks[tierDisk] >= int64(l.opts.MaxBlocks) {
			return false
		}
		i := x.alloc(rec.Key)
		if i == 0 {
			return false
		}
		e := x.at(i)
		e.ns = l.mu.ns.acquireUnresolved(rec.Len)
		e.setLoc(rec.Loc)
		e.set(flagPersistent)
		x.insert(i)
		x.insertAfter(l.mu.diskList, i)
		l.mu.blocks[tierDisk]++
		l.mu.bytes[tierDisk] += int64(rec.Len)
		l.mu.unresolved++
		l.mu.c.recovered++
		return true
	})
	if err != nil {
		return fmt.Errorf("store: recover %s: %w", l.disk.Name(), err)
	}
	return nil
}

// resolveLocked gives recovered entry i the namespace and parent its header
// names. A block its namespace's persistent quota has no room for is not
// resolved (errOverQuota): the caller evicts it.
func (l *Local) resolveLocked(i uint32, h *block.Header) error {
	x := &l.mu.x
	e := x.at(i)
	old := e.ns
	if _, ok := l.mu.droppedUnresolved[h.Namespace]; ok {
		return errNamespaceDropped
	}
	size := l.mu.ns.get(old).size
	if !l.mu.ns.fits(h.Namespace, h.Tenant, tierDisk, size) {
		return errOverQuota
	}
	id, err := l.mu.ns.acquire(h, size, l.classOf(size), tierDisk)
	if err != nil {
		return err
	}
	l.releaseNSLocked(old, tierDisk)
	e.ns = id
	// The block may lie colder than the namespace's cursor.
	l.setCursorLocked(id, tierDisk, 0)
	if l.mu.unresolved--; l.mu.unresolved == 0 {
		l.mu.droppedUnresolved = nil
	}
	if p := x.find(h.Parent); p != 0 && p != i {
		if pns := x.at(p).ns; pns == id || !l.mu.ns.get(pns).resolved {
			x.link(i, p)
		}
	}
	// Blocks put while it was unresolved may have been linked to it; keep
	// only those of its namespace (see insertLocked).
	for c := e.child; c != 0; {
		next := x.at(c).sib
		if x.at(c).ns != id {
			x.unlink(c)
		}
		c = next
	}
	return nil
}

// resolveLoop reads every unresolved recovered block once, oldest first, to
// learn its namespace and parent (and drop it if it fails verification). It
// is owned by Local: Close cancels ctx and waits for it.
func (l *Local) resolveLoop(ctx context.Context) {
	defer close(l.resolveDone)
	next := uint32(1)
	var ms []moved
	var buf []byte
	for ctx.Err() == nil {
		ms = ms[:0]
		l.mu.Lock()
		x := &l.mu.x
		for ; next < x.next && len(ms) < resolveBatch; next++ {
			e := x.at(next)
			if e.ns == 0 || e.flags&(flagSentinel|flagDropped|flagMoving) != 0 || l.mu.ns.get(e.ns).resolved {
				continue
			}
			e.set(flagMoving)
			ms = append(ms, l.movedLocked(next))
		}
		l.mu.Unlock()
		if len(ms) == 0 {
			return
		}
		for k := range ms {
			m := &ms[k]
			if cap(buf) < m.size {
				buf = make([]byte, m.size)
			}
			if m.err = l.disk.Read(m.loc, buf[:m.size]); m.err == nil {
				var blk block.Block
				if blk, m.err = l.verifyRead(m.key, buf[:m.size]); m.err == nil {
					m.err = l.resolveOne(m.i, &blk.Header)
				}
			}
			if m.err != nil {
				l.finishResolve(m)
			}
		}
	}
}

// resolveOne commits one successful resolution.
func (l *Local) resolveOne(i uint32, h *block.Header) error {
	var fr []freeLoc
	l.mu.Lock()
	defer func() { l.mu.Unlock(); l.freeAll(fr) }()
	e := l.mu.x.at(i)
	if e.has(flagDropped) {
		l.doneMovingLocked(i)
		l.finalizeIfIdleLocked(i, &fr)
		return nil
	}
	if e.has(flagLocGone) {
		return errLocGone // its segment was reclaimed while it was read: finishResolve evicts it
	}
	if err := l.resolveLocked(i, h); err != nil {
		return err
	}
	l.doneMovingLocked(i)
	return nil
}

// finishResolve drops a recovered block that could not be resolved.
func (l *Local) finishResolve(m *moved) {
	var fr []freeLoc
	l.mu.Lock()
	l.doneMovingLocked(m.i)
	e := l.mu.x.at(m.i)
	switch {
	case e.has(flagDropped):
		l.finalizeIfIdleLocked(m.i, &fr)
	case errors.Is(m.err, errNamespaceDropped):
		l.dropLocked(m.i, reasonNamespace, &fr)
	case e.has(flagLocGone) || errors.Is(m.err, errOverQuota):
		l.dropLocked(m.i, reasonEvict, &fr)
	default:
		l.dropLocked(m.i, reasonCorrupt, &fr)
	}
	l.mu.Unlock()
	l.freeAll(fr)
}
