package store

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/kvmesh/kvmesh/block"
	"github.com/kvmesh/kvmesh/prefixhash"
	"github.com/kvmesh/kvmesh/tiers"
)

// Moving blocks between tiers. A mover marks its entries flagMoving under the
// lock, copies without it, and commits under it again. While an entry moves
// it cannot be chosen by another mover, a Get of a persistent entry waits for
// the mover, and a drop leaves the slot and the old location to the mover.

// maxRoomRounds bounds how many times one write makes room and retries.
const maxRoomRounds = 8

// maxVictimWalk bounds how far a victim search walks past busy entries.
const maxVictimWalk = 4096

// moved is an entry a mover holds, with what it snapshot under the lock.
type moved struct {
	i      uint32
	ns     uint32 // namespace id when marked
	key    prefixhash.Key
	loc    tiers.Loc
	size   int
	val    []byte
	err    error // reading or verifying the value failed
	werr   error // writing it to the persistent tier failed (not corruption)
	newLoc tiers.Loc
	done   bool // newLoc holds the value

	hit        bool // flagHit when marked: asked for since it was written to its tier
	reserved   bool // a demotion holds size bytes of ns's persistent quota
	skipDisk   bool // a demotion its namespace's persistent quota has no room for: drop it
	unadmitted bool // a demotion NVMe admission refused (skipDisk too)
}

func (l *Local) movedLocked(i uint32) moved {
	e := l.mu.x.at(i)
	return moved{i: i, ns: e.ns, key: e.key, loc: e.getLoc(), size: l.mu.ns.get(e.ns).size}
}

// moveTierLocked moves entry i's accounting and list membership to the other
// tier, at loc, as the hottest entry there.
func (l *Local) moveTierLocked(i uint32, loc tiers.Loc) {
	x := &l.mu.x
	e := x.at(i)
	n := l.mu.ns.get(e.ns)
	size := int64(n.size)
	from := tierOf(e)
	l.mu.blocks[from]--
	l.mu.bytes[from] -= size
	l.mu.blocks[1-from]++
	l.mu.bytes[1-from] += size
	n.addBlocks(from, -1)
	n.addBlocks(1-from, 1)
	l.unlistLocked(i)
	l.hbmForgetLocked(i)
	e.setLoc(loc)
	e.clear(flagHit | flagLocGone)
	if from == tierMem {
		e.set(flagPersistent)
		x.insertAfter(l.mu.diskList, i)
	} else {
		e.clear(flagPersistent)
		x.insertAfter(l.memListLocked(l.mu.ns.get(e.ns).class), i)
		l.hbmAddLocked(i, loc, int(size))
	}
	if e.copy() {
		l.placeCopyLocked(i)
	}
}

// errColdest says a new block is colder than every block it would evict: it
// would go right behind its parent, and its parent is the coldest evictable
// block of its class. Evicting the parent would orphan the block, so the
// block itself is the victim: it goes to the persistent tier, or is not
// kept.
var errColdest = errors.New("store: the new block is the coldest")

// putDRAM copies val into the DRAM tier, making room when it is full.
// parent is the key of the block's parent for a new block (its position
// in the recency order), zero for a promotion (the hottest position).
// batch makes room by a demotion batch at least (see makeMemRoom).
func (l *Local) putDRAM(ctx context.Context, key, parent prefixhash.Key, val []byte, class int, batch bool) (tiers.Loc, error) {
	if class < 0 {
		return 0, tiers.ErrTooLarge
	}
	for round := 0; ; round++ {
		loc, err := l.mem.Put(key, val)
		if err == nil || !errors.Is(err, tiers.ErrFull) || round == maxRoomRounds {
			return loc, err
		}
		if ctx.Err() != nil {
			return 0, ctx.Err()
		}
		if err := l.makeMemRoom(class, len(val), parent, batch); err != nil {
			return 0, err
		}
	}
}

// makeMemRoom demotes (or, failing that, drops) the coldest idle blocks that
// free room for a value of the given class and size. It returns the tier's
// ErrFull when it could move nothing, errColdest when the new block (child
// of parent) is colder than anything it could move. With batch (writes), it
// demotes DemoteBatchBytes at least (within a sixteenth of the tier:
// demoteBatch), so that NVMe sees large writes; without
// (a promotion), only what the value needs: the rest of a batch's room would
// go to the first hits of blocks not shown hot, each a demotion more.
func (l *Local) makeMemRoom(class, need int, parent prefixhash.Key, batch bool) error {
	if l.dropPartialForRoom(class) {
		return nil // incomplete blocks go first
	}
	if l.dropRetiredForRoom() {
		return nil // then the records of groups that chains moved past
	}
	l.mu.Lock()
	stop := uint32(0)
	if !parent.IsZero() {
		if p := l.mu.x.find(parent); p == 0 {
			if slices.Contains(l.mu.evicted[:], parent) {
				l.mu.Unlock()
				return errColdest // the parent went at once: so does the child
			}
		} else if pe := l.mu.x.at(p); !pe.persistent() && l.mu.ns.get(pe.ns).class == class {
			stop = p
		}
	}
	vs, coldest := l.memVictimsLocked(class, need, stop, batch)
	var fr []freeLoc
	l.admitLocked(vs)
	l.reserveDemotionsLocked(vs, &fr)
	l.mu.Unlock()
	l.freeAll(fr)
	if len(vs) == 0 {
		if coldest {
			return errColdest
		}
		return tiers.ErrFull
	}
	l.demote(vs)
	return nil
}

// demoteBatch is the least one round of DRAM pressure from a write demotes:
// batch bytes, within a sixteenth of the DRAM tier's capacity (as quotas
// clamp theirs). A batch as large as the tier would empty it at each
// round: the blocks written next would push out everything the tier held,
// hot or not, and a small DRAM tier over NVMe would hit less than the same
// bytes all in DRAM.
func demoteBatch(batch int, capacity int64) int {
	return int(max(1, min(int64(batch), capacity/16)))
}

// memVictimsLocked picks and marks the entries to demote. Under Classed, a
// value only frees room for its own class: take the coldest of the class,
// and when the class owns no memory (or none of it is idle), the slab the
// tier names to evacuate. The walk stops at stop, the new block's parent:
// what lies beyond is warmer than the new block; coldest reports that.
func (l *Local) memVictimsLocked(class, need int, stop uint32, batch bool) (vs []moved, coldest bool) {
	want := need
	if l.disk != nil && batch {
		want = max(need, l.demoteBatch) // batch the writes; drops need no batching
	}
	if l.classed == nil {
		return l.coldestLocked(l.memListLocked(0), want, stop)
	}
	if l.classed.ClassHasMemory(class) {
		if vs, coldest := l.coldestLocked(l.memListLocked(class), want, stop); len(vs) > 0 || coldest {
			return vs, coldest
		}
	}
	return l.evacuateLocked(class), false
}

// admitLocked is NVMe admission (Options.NVMeReusedOnly): it marks the
// victims of DRAM pressure that nobody asked for again since they were
// written to memory (no lookup found them, no read or put touched them:
// flagHit, as markVictimLocked saw it) to be dropped rather than written
// to NVMe. A second chance spends the reuse mark, not flagHit.
func (l *Local) admitLocked(vs []moved) {
	if !l.opts.NVMeReusedOnly || l.disk == nil {
		return
	}
	for k := range vs {
		if e := l.mu.x.at(vs[k].i); !vs[k].hit && !e.reused() && e.hitCount() == 0 && !e.retained() {
			vs[k].skipDisk, vs[k].unadmitted = true, true
		}
	}
}

func (l *Local) markVictimLocked(i uint32) moved {
	e := l.mu.x.at(i)
	hit := e.has(flagHit)
	e.set(flagMoving)
	e.clear(flagHit) // a touch while it moves cancels the demotion
	m := l.movedLocked(i)
	m.hit = hit
	return m
}

// evacuateLocked marks the idle blocks of the slab the tier names. Busy ones
// stay; the slab empties when they are released.
func (l *Local) evacuateLocked(avoid int) []moved {
	var vs []moved
	for _, r := range l.classed.Evacuate(avoid) {
		i := l.mu.x.find(r.Key)
		if i == 0 {
			continue // being freed, or a Put not indexed yet
		}
		e := l.mu.x.at(i)
		if e.persistent() || e.getLoc() != r.Loc || e.busy() || l.keepTreeLocked(i, false) {
			continue
		}
		vs = append(vs, l.markVictimLocked(i))
	}
	return vs
}

// memBytes returns the bytes of a memory-tier value for a mover.
func (l *Local) memBytes(m *moved) {
	if l.viewable(m.loc) {
		m.val = l.view.View(m.loc, m.size)
		return
	}
	m.val = make([]byte, m.size)
	if err := l.memRead(m.loc, m.val); err != nil {
		m.err = err
	} else if _, err := l.verify(m.key, m.val); err != nil {
		m.err = err
	}
}

// demote writes the victims to the persistent tier and commits each that
// nobody touched meanwhile; victims it cannot (or must not, skipDisk) write
// are dropped.
func (l *Local) demote(vs []moved) {
	if len(vs) == 0 {
		return
	}
	if l.disk != nil {
		skip := 0
		for k := range vs {
			if vs[k].skipDisk {
				vs[skip], vs[k] = vs[k], vs[skip]
				skip++
			}
		}
		l.commitAll(vs[:skip], l.commitDemotionLocked)
		rest := vs[skip:]
		for k := range rest {
			l.memBytes(&rest[k])
		}
		l.toDisk(rest, l.commitDemotionLocked)
		return
	}
	var fr []freeLoc
	l.mu.Lock()
	for k := range vs {
		l.commitDemotionLocked(&vs[k], &fr)
	}
	l.mu.Unlock()
	l.freeAll(fr)
}

func (l *Local) commitDemotionLocked(m *moved, fr *[]freeLoc) {
	e := l.mu.x.at(m.i)
	l.doneMovingLocked(m.i)
	if m.reserved {
		// Before the move: a block the entry still holds keeps the
		// namespace.
		m.reserved = false
		l.unreserveLocked(m.ns, tierDisk, m.size)
	}
	switch {
	case e.has(flagDropped):
		if m.done {
			*fr = append(*fr, freeLoc{true, m.newLoc})
		}
		l.finalizeIfIdleLocked(m.i, fr)
	case m.err != nil:
		l.dropLocked(m.i, reasonCorrupt, fr)
	case e.pins > 0 || e.has(flagHit):
		// Read or touched while it was copied: it is hot, keep it.
		if m.done {
			*fr = append(*fr, freeLoc{true, m.newLoc})
		}
	case m.done:
		*fr = append(*fr, freeLoc{false, m.loc})
		l.evRemovedLocked(m.i)
		l.moveTierLocked(m.i, m.newLoc)
		l.evStoredLocked(m.i, m.val)
		l.mu.c.demotions++
	case m.unadmitted:
		l.dropLocked(m.i, reasonUnadmitted, fr)
	default:
		l.dropLocked(m.i, reasonEvict, fr)
	}
}

// toDisk writes the values of ms to the persistent tier and hands every
// element of ms, written (done) or not, to commit under the lock. A value is
// committed before any segment can be dropped under it; when the tier is
// full, toDisk commits what was written, reclaims a segment and goes on.
func (l *Local) toDisk(ms []moved, commit func(m *moved, fr *[]freeLoc)) {
	// Values that could not be read are committed first, unwritten.
	rest := ms[partitionFailed(ms):]
	l.commitAll(ms[:len(ms)-len(rest)], commit)
	for round := 0; len(rest) > 0; round++ {
		l.diskMu.RLock()
		n, err := l.putDisk(rest)
		l.freeHeld(l.commitCollect(rest[:n], commit))
		l.diskMu.RUnlock()
		rest = rest[n:]
		if len(rest) == 0 {
			return
		}
		if err == nil {
			panic("store: persistent tier stored part of a batch without an error")
		}
		if !errors.Is(err, tiers.ErrFull) || round == maxRoomRounds || !l.reclaim() {
			rest[0].werr = err
			break
		}
	}
	l.commitAll(rest, commit)
}

// partitionFailed moves the elements of ms with an error to its front and
// returns how many there are.
func partitionFailed(ms []moved) int {
	j := 0
	for k := range ms {
		if ms[k].err != nil {
			ms[j], ms[k] = ms[k], ms[j]
			j++
		}
	}
	return j
}

func (l *Local) commitAll(ms []moved, commit func(m *moved, fr *[]freeLoc)) {
	l.freeAll(l.commitCollect(ms, commit))
}

// commitCollect commits ms under the lock and returns what to free.
func (l *Local) commitCollect(ms []moved, commit func(m *moved, fr *[]freeLoc)) []freeLoc {
	if len(ms) == 0 {
		return nil
	}
	var fr []freeLoc
	l.mu.Lock()
	for k := range ms {
		commit(&ms[k], &fr)
	}
	l.mu.Unlock()
	return fr
}

// putDisk stores the values of ms in the persistent tier, in order, setting
// newLoc and done, and returns how many it stored before the first error.
func (l *Local) putDisk(ms []moved) (int, error) {
	if l.batcher == nil {
		for k := range ms {
			loc, err := l.disk.Put(ms[k].key, ms[k].val)
			if err != nil {
				return k, err
			}
			ms[k].newLoc, ms[k].done = loc, true
			l.diskWritten.Add(int64(len(ms[k].val)))
		}
		return len(ms), nil
	}
	keys := make([]prefixhash.Key, len(ms))
	vals := make([][]byte, len(ms))
	locs := make([]tiers.Loc, len(ms))
	for k := range ms {
		keys[k], vals[k] = ms[k].key, ms[k].val
	}
	n, err := l.batcher.PutBatch(keys, vals, locs)
	for k := range n {
		ms[k].newLoc, ms[k].done = locs[k], true
		l.diskWritten.Add(int64(len(ms[k].val)))
	}
	return n, err
}

// reclaim frees the oldest segment of the persistent tier: blocks hit since
// they were written are read back and rewritten, the rest are dropped (with
// their descendants). It reports whether a segment went.
func (l *Local) reclaim() bool {
	if l.seg == nil {
		return false
	}
	l.diskMu.Lock()
	defer l.diskMu.Unlock()
	seg, recs, ok, err := l.seg.OldestSegment()
	if err != nil || !ok {
		return false
	}
	type live struct {
		i   uint32
		key prefixhash.Key
	}
	var lives []live
	var rw []moved
	var fr []freeLoc
	l.mu.Lock()
	x := &l.mu.x
	for _, r := range recs {
		if _, ok := l.mu.orphans[r.Loc]; ok {
			// Dropped, its Free still to come: it must not.
			l.mu.orphans[r.Loc] = true
		}
		i := x.find(r.Key)
		if i == 0 {
			continue
		}
		if e := x.at(i); e.persistent() && e.getLoc() == r.Loc {
			// Its location dies with the segment: nobody frees it.
			e.set(flagLocGone)
			lives = append(lives, live{i, r.Key})
		}
	}
	for _, lv := range lives {
		e := x.at(lv.i)
		switch {
		case e.key != lv.key || e.has(flagDropped):
			// Dropped with an ancestor earlier in this loop.
		case e.has(flagMoving):
			// A promotion reads it; flagLocGone tells it the rest.
		case e.has(flagHit) || l.keepTreeLocked(lv.i, false):
			e.set(flagMoving)
			rw = append(rw, l.movedLocked(lv.i))
		default:
			l.dropLocked(lv.i, reasonEvict, &fr)
		}
	}
	l.mu.Unlock()
	l.freeHeld(fr)
	fr = fr[:0]

	for k := range rw {
		m := &rw[k]
		m.val = make([]byte, m.size)
		if m.err = l.disk.Read(m.loc, m.val); m.err == nil {
			_, m.err = l.verifyRead(m.key, m.val)
		}
	}
	if err := l.seg.DropSegment(seg); err != nil {
		// The segment stays: so do the locations of the rewrite set. The
		// blocks dropped above, and a promotion's source, are not freed
		// one by one; they go with the segment later.
		l.mu.Lock()
		for _, m := range rw {
			x.at(m.i).clear(flagLocGone)
			l.doneMovingLocked(m.i)
			l.finalizeIfIdleLocked(m.i, &fr)
		}
		l.mu.Unlock()
		l.freeHeld(fr)
		return false
	}
	l.putDisk(rw[partitionFailed(rw):])
	l.mu.Lock()
	for k := range rw {
		m := &rw[k]
		e := x.at(m.i)
		l.doneMovingLocked(m.i)
		switch {
		case e.has(flagDropped):
			if m.done {
				fr = append(fr, freeLoc{true, m.newLoc})
			}
			l.finalizeIfIdleLocked(m.i, &fr)
		case m.err != nil:
			l.dropLocked(m.i, reasonCorrupt, &fr)
		case m.done:
			e.setLoc(m.newLoc)
			e.clear(flagLocGone | flagHit)
			l.moveFrontLocked(l.mu.diskList, m.i)
			l.mu.c.rewrites++
		default:
			l.dropLocked(m.i, reasonEvict, &fr)
		}
	}
	l.mu.Unlock()
	l.freeHeld(fr)
	return true
}

// makeIndexRoom keeps the number of blocks under MaxBlocks: it reclaims a
// segment, or drops the coldest idle memory block.
func (l *Local) makeIndexRoom(ctx context.Context) error {
	refuse := func() error {
		return l.refused(fmt.Errorf("%w: the index holds MaxBlocks (%d) blocks", tiers.ErrFull, l.opts.MaxBlocks), 0)
	}
	for round := 0; ; round++ {
		l.mu.Lock()
		full := l.indexFullLocked()
		onDisk := l.mu.blocks[tierDisk] > 0
		l.mu.Unlock()
		if !full {
			return nil
		}
		if round == maxRoomRounds || ctx.Err() != nil {
			return refuse()
		}
		if onDisk && l.reclaim() {
			continue
		}
		var fr []freeLoc
		l.mu.Lock()
		dropped := false
		// The coldest idle NVMe block, else the coldest idle memory
		// block. Tiers are exclusive and memory demotes its coldest
		// blocks, so NVMe's cold end is the colder: dropping memory
		// first would keep NVMe's oldest blocks for good, and once the
		// index is full memory would never fill again to demote
		// (a DRAM smaller than MaxBlocks froze NVMe).
		for _, list := range append([]uint32{l.mu.diskList}, l.mu.memLists...) {
			if list == 0 {
				continue
			}
			x := &l.mu.x
			for j, walked := x.at(list).prev, 0; j != list && walked < maxVictimWalk; walked++ {
				prev := x.at(j).prev
				if !x.at(j).busy() && !l.keepTreeLocked(j, false) && !l.secondChanceLocked(list, j) {
					l.dropLocked(j, reasonEvict, &fr)
					dropped = true
					break
				}
				j = prev
			}
			if dropped {
				break
			}
		}
		l.mu.Unlock()
		l.freeAll(fr)
		if !dropped {
			return refuse()
		}
	}
}

// indexFullLocked reports whether the index holds MaxBlocks blocks, open
// reservations counted as the blocks they will be: room for a reserved
// block is made when it is reserved, before the memory room that would
// otherwise demote what the index room then drops.
func (l *Local) indexFullLocked() bool {
	return l.mu.blocks[tierMem]+l.mu.blocks[tierDisk]+int64(l.mu.reservations) >= int64(l.opts.MaxBlocks)
}

// promote serves a Get of a block in the persistent tier: it reads and
// verifies it, copies it into memory when there is free room, or when room
// can be made and this is the block's second hit since it was demoted, and
// returns a Ref over the bytes read.
func (l *Local) promote(ctx context.Context, m moved) (*Ref, error) {
	buf := l.readBuf(m.size)
	b := *buf
	err := l.disk.Read(m.loc, b)
	var blk block.Block
	if err == nil {
		blk, err = l.verifyRead(m.key, b)
	}
	var fr []freeLoc
	l.mu.Lock()
	e := l.mu.x.at(m.i)
	if err == nil && !e.has(flagDropped) && !l.mu.ns.get(e.ns).resolved {
		if err = l.resolveLocked(m.i, &blk.Header); err == nil {
			l.evStoredLocked(m.i, b)
		}
	}
	if err != nil {
		l.putReadBuf(buf)
		l.doneMovingLocked(m.i)
		switch {
		case errors.Is(err, errNamespaceDropped):
			l.mu.c.misses++
			l.dropLocked(m.i, reasonNamespace, &fr)
		case errors.Is(err, errOverQuota):
			l.mu.c.misses++
			l.dropLocked(m.i, reasonEvict, &fr)
		default:
			l.failedReadLocked(m.i, &fr)
		}
		l.finalizeIfIdleLocked(m.i, &fr)
		l.mu.Unlock()
		l.freeAll(fr)
		return nil, ErrNotFound
	}
	class, nk := -1, nsKey{}
	if !e.has(flagDropped) {
		n := l.mu.ns.get(e.ns)
		class, nk = n.class, n.key()
	}
	// A block hit on the persistent tier before (flagHit is cleared when
	// it lands there) may push colder blocks out of memory; on its first
	// hit it takes only free room. Otherwise, with a working set larger
	// than memory, every hit would be a read plus a demotion write. One
	// promotion at a time makes room (roomPromoting), and only its own
	// (makeMemRoom without batch): the others take free room only, keep
	// their mark and may push at a later hit, so that the reads of a
	// prompt do not each wait for a demotion batch of their own.
	again := e.has(flagHit)
	l.mu.Unlock()

	// Room in the namespace's memory quota first, as a write makes it.
	var newLoc tiers.Loc
	perr := error(tiers.ErrTooLarge)
	rid := uint32(0)
	deferred := false // a second hit that found another promotion making room
	if class >= 0 {
		if rid, perr = l.room(ctx, nil, nk, m.size, class, tierMem, prefixhash.Key{}); perr == nil {
			if again && l.roomPromoting.CompareAndSwap(false, true) {
				newLoc, perr = l.putMem(ctx, m.key, prefixhash.Key{}, b, class, false)
				l.roomPromoting.Store(false)
			} else {
				newLoc, perr = l.putFree(m.key, b)
				deferred = again && perr != nil
			}
		}
	}
	l.mu.Lock()
	l.doneMovingLocked(m.i)
	if rid != 0 {
		l.unreserveLocked(rid, tierMem, m.size) // the entry keeps the namespace
	}
	if deferred {
		l.mu.c.promotionsDeferred++
	}
	l.mu.c.hits++
	switch {
	case e.has(flagDropped):
		// Dropped while read: the bytes are still the block's.
		if perr == nil {
			fr = append(fr, freeLoc{false, newLoc})
		}
		l.finalizeIfIdleLocked(m.i, &fr)
	case perr == nil:
		if !e.has(flagLocGone) {
			l.orphanLocked(e.getLoc())
			fr = append(fr, freeLoc{true, e.getLoc()})
		}
		e.setHitsSaturating()
		l.evRemovedLocked(m.i)
		l.moveTierLocked(m.i, newLoc)
		l.evStoredLocked(m.i, b)
		l.mu.c.promotions++
	case e.has(flagLocGone):
		e.setHitsSaturating()
		l.dropLocked(m.i, reasonEvict, &fr)
	default:
		e.setHitsSaturating()
		l.touchLocked(m.i)
	}
	l.mu.Unlock()
	l.freeAll(fr)
	return &Ref{l: l, b: b, buf: buf}, nil
}
