package store

import (
	"container/list"
	"context"
	"errors"

	"github.com/kvmesh/kvmesh/prefixhash"
	"github.com/kvmesh/kvmesh/tiers"
)

// The HBM tier (Options.HBM) is the top of the memory tier. For the index,
// quotas, recency lists and DRAM pressure, a block in HBM is a block in
// memory like any other; where its bytes live is told by its location, whose
// top bit (hbmTag) no DRAM location has. Policy:
//
//   - A write, or a promotion from NVMe, goes to HBM first. When HBM is
//     full, its least recently used idle blocks are demoted into DRAM
//     (making room there as a write would, which may push DRAM's coldest to
//     NVMe); when that frees nothing, the block goes to DRAM.
//   - A hit in DRAM promotes the block to HBM (served from the copy read
//     for it); a hit in HBM is served from a copy (device memory cannot be
//     viewed in place).
//   - DRAM pressure never picks blocks in HBM: they leave HBM only through
//     DRAM. A namespace's memory quota counts HBM and DRAM together.
//
// The recency of blocks within HBM is its own LRU (hbmResidents), beside the
// memory lists, which keep ordering HBM and DRAM blocks together.
const hbmTag tiers.Loc = 1 << 63

func isHBM(loc tiers.Loc) bool { return loc&hbmTag != 0 }

// hbmResidents are the entries whose bytes are in HBM, most recently used
// first, and their bytes. Guarded by Local.mu.
type hbmResidents struct {
	lru    list.List // of uint32 entry index
	at     map[uint32]*list.Element
	bytes  int64
	sizes  map[uint32]int // encoded size of each resident
	demote int64          // HBM → DRAM moves committed
	promot int64          // DRAM → HBM moves committed
}

// hbmAddLocked records entry i as living in HBM at loc, when loc is there.
func (l *Local) hbmAddLocked(i uint32, loc tiers.Loc, size int) {
	if !isHBM(loc) {
		return
	}
	r := &l.mu.hbm
	if r.at == nil {
		r.at, r.sizes = map[uint32]*list.Element{}, map[uint32]int{}
	}
	r.at[i] = r.lru.PushFront(i)
	r.sizes[i] = size
	r.bytes += int64(size)
}

// hbmForgetLocked records that entry i no longer lives in HBM.
func (l *Local) hbmForgetLocked(i uint32) {
	r := &l.mu.hbm
	if el, ok := r.at[i]; ok {
		r.lru.Remove(el)
		r.bytes -= int64(r.sizes[i])
		delete(r.at, i)
		delete(r.sizes, i)
	}
}

// hbmTouchLocked makes entry i, if in HBM, its most recently used.
func (l *Local) hbmTouchLocked(i uint32) {
	if el, ok := l.mu.hbm.at[i]; ok {
		l.mu.hbm.lru.MoveToFront(el)
	}
}

// memRead, memFree and memView reach a memory location in HBM or DRAM.
func (l *Local) memRead(loc tiers.Loc, dst []byte) error {
	if isHBM(loc) {
		return l.hbm.Read(loc&^hbmTag, dst)
	}
	return l.mem.Read(loc, dst)
}

func (l *Local) memFree(loc tiers.Loc) {
	if isHBM(loc) {
		l.hbm.Free(loc &^ hbmTag)
		return
	}
	l.mem.Free(loc)
}

// viewable reports whether the memory location loc can be read in place.
func (l *Local) viewable(loc tiers.Loc) bool { return l.view != nil && !isHBM(loc) }

// putHBM copies val into HBM, demoting HBM's least recently used blocks
// into DRAM when it is full. ok is false when HBM cannot take it: the
// caller puts it in DRAM.
func (l *Local) putHBM(ctx context.Context, key prefixhash.Key, val []byte) (tiers.Loc, bool) {
	for round := 0; ; round++ {
		loc, err := l.hbm.Put(key, val)
		if err == nil {
			return loc | hbmTag, true
		}
		if !errors.Is(err, tiers.ErrFull) || round == maxRoomRounds || ctx.Err() != nil {
			return 0, false
		}
		if !l.demoteHBM(ctx, len(val)) {
			return 0, false
		}
	}
}

// demoteHBM moves HBM's least recently used idle blocks, at least need
// bytes of them, into DRAM, and reports whether any left HBM.
func (l *Local) demoteHBM(ctx context.Context, need int) bool {
	type victim struct {
		m     moved
		class int
	}
	var vs []victim
	l.mu.Lock()
	got := 0
	for el, walked := l.mu.hbm.lru.Back(), 0; el != nil && got < need && walked < maxVictimWalk; el, walked = el.Prev(), walked+1 {
		i := el.Value.(uint32)
		e := l.mu.x.at(i)
		if e.busy() || e.has(flagDropped) {
			continue
		}
		class := l.mu.ns.get(e.ns).class
		vs = append(vs, victim{l.markVictimLocked(i), class})
		got += vs[len(vs)-1].m.size
	}
	l.mu.Unlock()
	freed := false
	for k := range vs {
		m := &vs[k].m
		l.memBytes(m)
		if m.err == nil {
			if loc, err := l.putDRAM(ctx, m.key, prefixhash.Key{}, m.val, vs[k].class, true); err == nil {
				m.newLoc, m.done = loc, true
			}
		}
		var fr []freeLoc
		l.mu.Lock()
		e := l.mu.x.at(m.i)
		l.doneMovingLocked(m.i)
		switch {
		case e.has(flagDropped):
			if m.done {
				fr = append(fr, freeLoc{false, m.newLoc})
			}
			l.finalizeIfIdleLocked(m.i, &fr)
		case m.err != nil:
			l.dropLocked(m.i, reasonCorrupt, &fr)
			freed = true
		case e.pins > 0 || e.has(flagHit) || !m.done:
			// Read or touched while it was copied, or DRAM had no room:
			// it stays in HBM.
			if m.done {
				fr = append(fr, freeLoc{false, m.newLoc})
			}
		default:
			fr = append(fr, freeLoc{false, m.loc})
			l.evRemovedLocked(m.i)
			l.hbmForgetLocked(m.i)
			e.setLoc(m.newLoc)
			l.evStoredLocked(m.i, m.val)
			l.mu.hbm.demote++
			freed = true
		}
		l.mu.Unlock()
		l.freeAll(fr)
	}
	return freed
}

// promoteHBMLocked serves a hit of entry i, in DRAM, by copying it out and
// into HBM. It is called with the lock held and the entry idle, and returns
// with the lock released.
func (l *Local) promoteHBMLocked(ctx context.Context, i uint32) (*Ref, error) {
	e := l.mu.x.at(i)
	l.touchLocked(i)
	e.setHitsSaturating()
	l.mu.c.hits++
	if !l.enterLocked() {
		l.mu.Unlock()
		return nil, ErrClosed
	}
	e.set(flagMoving)
	m := l.movedLocked(i)
	l.mu.Unlock()
	defer l.exit()

	m.val = make([]byte, m.size)
	err := l.memRead(m.loc, m.val)
	if err == nil {
		err = l.checkHit(m.key, m.val)
	}
	var newLoc tiers.Loc
	ok := false
	if err == nil {
		newLoc, ok = l.putHBM(ctx, m.key, m.val)
	}
	var fr []freeLoc
	l.mu.Lock()
	l.doneMovingLocked(i)
	switch {
	case e.has(flagDropped):
		if ok {
			fr = append(fr, freeLoc{false, newLoc})
		}
		l.finalizeIfIdleLocked(i, &fr)
	case err != nil:
		l.mu.c.hits--
		l.failedReadLocked(i, &fr)
	case !ok || e.pins > 0:
		// No room in HBM, or read in place meanwhile: it stays in DRAM.
		if ok {
			fr = append(fr, freeLoc{false, newLoc})
		}
	default:
		fr = append(fr, freeLoc{false, m.loc})
		l.evRemovedLocked(i)
		e.setLoc(newLoc)
		l.hbmAddLocked(i, newLoc, m.size)
		l.evStoredLocked(i, m.val)
		l.mu.hbm.promot++
	}
	l.mu.Unlock()
	l.freeAll(fr)
	if err != nil {
		return nil, ErrNotFound
	}
	return &Ref{l: l, b: m.val}, nil
}

// putFree copies val into free room of the memory tier, HBM's first when
// there is one, and makes none: the promotion of a block's first NVMe hit.
func (l *Local) putFree(key prefixhash.Key, val []byte) (tiers.Loc, error) {
	if l.hbm != nil {
		if loc, err := l.hbm.Put(key, val); err == nil {
			return loc | hbmTag, nil
		}
	}
	return l.mem.Put(key, val)
}

// putMem copies val into the memory tier: HBM when there is one and it
// takes it, else DRAM (putDRAM, with batch).
func (l *Local) putMem(ctx context.Context, key, parent prefixhash.Key, val []byte, class int, batch bool) (tiers.Loc, error) {
	if l.hbm != nil {
		if loc, ok := l.putHBM(ctx, key, val); ok {
			return loc, nil
		}
	}
	return l.putDRAM(ctx, key, parent, val, class, batch)
}
