package tiers

import (
	"fmt"
	"sort"
	"sync"

	"golang.org/x/sys/unix"
)

// The slab allocator shared by the DRAM and HBM tiers. It hands out offsets
// in an arena of nslabs slabs of slabSize bytes and knows nothing of the
// memory behind them: the tier that owns it maps offsets to host or device
// addresses, copies bytes and releases the memory of empty slabs.
//
// A slab is free (in the pool) or assigned to one size class, and then cut
// into slots of the class's size. A slot is a 64-byte header (key, length;
// written by the tier) followed by the value, so values stay 64-byte
// aligned. A slab returns to the pool as soon as its last value is freed and
// can then serve any class.
//
// Classes are defined by how many slots a slab holds: the class that holds k
// slots has slots of ⌊slabSize/k⌋ bytes rounded down to 64, the largest slot
// with which k fit, so the tail of a slab wastes less than 64 bytes per slot.
// k runs over 1, 2, …, 16 and then grows by 1/16 each step, which spaces
// classes about 1/16 apart (a value wastes at most ~6%, ~3% on average) and
// keeps their number small (152 for the default slab), so a handful of
// partially filled slabs per class costs little. See DefaultSlabSize for why
// the default slab is 16 MiB plus 64 KiB.
//
// Go-heap bookkeeping is per slab: a small struct and, per slot, a uint32
// length (0 when the slot is free) and at most one uint32 on a free list.
// No Go object exists per value.

const (
	// DefaultSlabSize is 16 MiB plus 64 KiB. KV blocks are a payload that
	// is usually a power of two plus a header of a few KiB (2112 bytes at
	// 512 tokens), and a slab of exactly 2^k bytes holds one such block
	// fewer than its size suggests: three 4 MiB blocks in 16 MiB, 75% of it
	// used. The extra 1/256 leaves room in each slot for a header of up to
	// 1/256 of a payload of 1 MiB or more: a slab holds 4 blocks of 4 MiB
	// (99.7% used) or 16 of 1 MiB (99.8%). Blocks of 64 KiB fill 98.4%
	// (245 per slab), which the class spacing decides.
	DefaultSlabSize = 16<<20 + 64<<10

	// slotHeaderLen is the in-arena header of every slot: key (16 bytes),
	// value length (8 bytes), zero padding to 64 so values stay aligned.
	slotHeaderLen = 64
	// slotAlign is the granularity of slot sizes.
	slotAlign = 64
	// minSlot is the smallest slot: a header and 64 bytes of value.
	minSlot = slotHeaderLen + 64
	// classGrowth: past 16 slots per slab, the slot count of the next
	// smaller class is at least 1/classGrowth more.
	classGrowth = 16

	// MaxSlabSize bounds Options' SlabSize so that slots of a slab fit the
	// location's slot field.
	MaxSlabSize = 1 << 30

	// Loc layout: slab+1 in the top 28 bits (so the zero Loc is invalid),
	// class in the next 12, slot in the low 24.
	locSlotBits  = 24
	locClassBits = 12
	locSlabBits  = 64 - locSlotBits - locClassBits
	maxSlabs     = 1<<locSlabBits - 1
)

// slabClasses returns the slot sizes of the classes of a slab of slabSize
// bytes, ascending.
func slabClasses(slabSize int64) []int64 {
	var desc []int64
	for k := int64(1); ; {
		s := slabSize / k / slotAlign * slotAlign
		if s < minSlot {
			break
		}
		if len(desc) == 0 || s != desc[len(desc)-1] {
			desc = append(desc, s)
		}
		k = max(k+1, k+k/classGrowth)
	}
	for i, j := 0, len(desc)-1; i < j; i, j = i+1, j-1 {
		desc[i], desc[j] = desc[j], desc[i]
	}
	return desc
}

// slabMeta is the Go-heap bookkeeping of one slab.
type slabMeta struct {
	class int32 // -1 while the slab is in the pool or being released
	live  uint32
	// bump: slots [bump, slots of the class) were never used since the slab
	// was assigned, so the free list holds only slots that were freed.
	bump uint32
	// links of the class's list of slabs with a free slot; inList says
	// whether the slab is on it.
	prev, next int32
	inList     bool
	lens       []uint32 // per slot: 0 free, else value length + 1
	freeSlots  []uint32 // freed slots, a stack
}

// slabAlloc is not safe for concurrent use: its owner holds a lock.
type slabAlloc struct {
	slabSize int64
	classes  []int64  // slot size per class, ascending
	perSlab  []uint32 // slots per slab per class
	slabs    []slabMeta
	pool     []int32 // free slabs whose memory was released, a stack
	// warm are free slabs whose memory was kept (see warmMax), a stack:
	// a size class that needs a slab takes one of these first, so a put
	// into it writes memory that is already there.
	warm     []int32
	warmMax  int     // most slabs kept in warm; the rest release their memory
	partial  []int32 // per class: first slab with a free slot, -1 if none
	owned    []int32 // per class: slabs assigned to it
	draining int32   // slab being evacuated, -1 if none
	held     int64   // slabs out of the pool (assigned or being released)
	values   int64
	stored   int64
}

// newSlabAlloc returns an allocator of nslabs slabs of slabSize bytes, all in
// the pool.
func newSlabAlloc(slabSize int64, nslabs int) *slabAlloc {
	if nslabs < 1 || nslabs > maxSlabs || slabSize < minSlot || slabSize > MaxSlabSize {
		panic(fmt.Sprintf("tiers: slab allocator of %d slabs of %d bytes", nslabs, slabSize))
	}
	a := &slabAlloc{slabSize: slabSize, classes: slabClasses(slabSize), draining: -1}
	if len(a.classes) >= 1<<locClassBits {
		panic(fmt.Sprintf("tiers: %d size classes overflow a location", len(a.classes)))
	}
	a.perSlab = make([]uint32, len(a.classes))
	for c, s := range a.classes {
		a.perSlab[c] = uint32(slabSize / s)
	}
	a.partial = make([]int32, len(a.classes))
	for c := range a.partial {
		a.partial[c] = -1
	}
	a.owned = make([]int32, len(a.classes))
	a.slabs = make([]slabMeta, nslabs)
	a.pool = make([]int32, nslabs)
	for i := range a.slabs {
		a.slabs[i].class = -1
		a.pool[i] = int32(nslabs - 1 - i) // slab 0 first: low addresses fill first
	}
	return a
}

// sizeClass returns the smallest class whose slots hold an n-byte value and
// its header, or -1.
func (a *slabAlloc) sizeClass(n int) int {
	if n < 0 || int64(n) > a.classes[len(a.classes)-1]-slotHeaderLen {
		return -1
	}
	need := int64(n) + slotHeaderLen
	return sort.Search(len(a.classes), func(c int) bool { return a.classes[c] >= need })
}

// maxValue is the largest value a slot can hold.
func (a *slabAlloc) maxValue() int { return int(a.classes[len(a.classes)-1] - slotHeaderLen) }

// offset returns the arena offset of a slot's header.
func (a *slabAlloc) offset(slab, class, slot int) int64 {
	return int64(slab)*a.slabSize + int64(slot)*a.classes[class]
}

func makeLoc(slab, class, slot int) Loc {
	return Loc(uint64(slab+1)<<(locClassBits+locSlotBits) | uint64(class)<<locSlotBits | uint64(slot))
}

func splitLoc(loc Loc) (slab, class, slot int) {
	return int(loc>>(locClassBits+locSlotBits)) - 1, int(loc >> locSlotBits & (1<<locClassBits - 1)), int(loc & (1<<locSlotBits - 1))
}

// split decodes loc, checking only that it lies in the arena: whether the
// slot is live is for the caller to know (Read, View) or for free to check.
func (a *slabAlloc) split(loc Loc) (slab, class, slot int) {
	slab, class, slot = splitLoc(loc)
	if slab < 0 || slab >= len(a.slabs) || class >= len(a.classes) || slot >= int(a.perSlab[class]) {
		panic(fmt.Sprintf("tiers: location %#x is not in this tier", uint64(loc)))
	}
	return slab, class, slot
}

// alloc takes a slot of class c for an n-byte value. ok is false when no
// slab of the class has a free slot and the pool is empty.
func (a *slabAlloc) alloc(c, n int) (loc Loc, off int64, ok bool) {
	i := a.partial[c]
	if i < 0 {
		if len(a.pool) == 0 && len(a.warm) == 0 {
			return 0, 0, false
		}
		if k := len(a.warm); k > 0 {
			i = a.warm[k-1]
			a.warm = a.warm[:k-1]
		} else {
			i = a.pool[len(a.pool)-1]
			a.pool = a.pool[:len(a.pool)-1]
		}
		a.assign(i, c)
		a.pushPartial(i)
	}
	m := &a.slabs[i]
	var slot uint32
	if k := len(m.freeSlots); k > 0 {
		slot = m.freeSlots[k-1]
		m.freeSlots = m.freeSlots[:k-1]
	} else {
		slot = m.bump
		m.bump++
	}
	if m.lens[slot] != 0 {
		panic(fmt.Sprintf("tiers: slab %d slot %d handed out twice", i, slot))
	}
	m.lens[slot] = uint32(n) + 1
	m.live++
	if m.live == a.perSlab[c] {
		a.unlink(i)
	}
	a.values++
	a.stored += int64(n)
	return makeLoc(int(i), c, int(slot)), a.offset(int(i), c, int(slot)), true
}

// assign gives free slab i to class c.
func (a *slabAlloc) assign(i int32, c int) {
	m := &a.slabs[i]
	n := int(a.perSlab[c])
	if cap(m.lens) < n || cap(m.lens) > 4*n {
		m.lens = make([]uint32, n)
	}
	m.lens = m.lens[:n]
	if cap(m.freeSlots) > 4*n {
		m.freeSlots = nil
	}
	m.freeSlots = m.freeSlots[:0]
	m.class, m.live, m.bump = int32(c), 0, 0
	a.owned[c]++
	a.held++
}

// free releases the slot at loc and returns its value's length. empty is true
// when that emptied the slab and it did not go to warm: the caller releases
// the slab's memory and then calls reclaim(slab). Freeing a location that is
// not live panics.
func (a *slabAlloc) free(loc Loc) (n int, slab int, empty bool) {
	i, c, slot := a.split(loc)
	m := &a.slabs[i]
	if int(m.class) != c || m.lens[slot] == 0 {
		panic(fmt.Sprintf("tiers: free of location %#x that holds no value (double free?)", uint64(loc)))
	}
	n = int(m.lens[slot] - 1)
	m.lens[slot] = 0
	m.live--
	a.values--
	a.stored -= int64(n)
	if m.live == 0 {
		a.unlink(int32(i))
		if a.draining == int32(i) {
			a.draining = -1
		}
		a.owned[c]--
		m.class = -1
		if len(a.warm) < a.warmMax {
			a.warm = append(a.warm, int32(i))
			a.held--
			return n, i, false
		}
		return n, i, true
	}
	m.freeSlots = append(m.freeSlots, uint32(slot))
	if !m.inList && a.draining != int32(i) {
		a.pushPartial(int32(i))
	}
	return n, i, false
}

// reclaim returns an emptied slab, whose memory its owner released, to the
// pool.
func (a *slabAlloc) reclaim(slab int) {
	if a.slabs[slab].class != -1 || a.slabs[slab].live != 0 {
		panic(fmt.Sprintf("tiers: reclaim of slab %d that is in use", slab))
	}
	a.pool = append(a.pool, int32(slab))
	a.held--
}

// pushPartial puts slab i first on its class's list: a slab that just got
// a free slot is nearly full, and filling it first lets emptier slabs drain.
func (a *slabAlloc) pushPartial(i int32) {
	m := &a.slabs[i]
	c := m.class
	m.prev, m.next, m.inList = -1, a.partial[c], true
	if m.next >= 0 {
		a.slabs[m.next].prev = i
	}
	a.partial[c] = i
}

func (a *slabAlloc) unlink(i int32) {
	m := &a.slabs[i]
	if !m.inList {
		return
	}
	if m.prev >= 0 {
		a.slabs[m.prev].next = m.next
	} else {
		a.partial[m.class] = m.next
	}
	if m.next >= 0 {
		a.slabs[m.next].prev = m.prev
	}
	m.prev, m.next, m.inList = -1, -1, false
}

// evacuate picks the slab with the fewest live values among slabs not of
// class avoid, and marks it draining: it serves no allocation until it
// empties or another slab is picked. At most one slab drains at a time, so a
// slab whose values the owner could not free (pinned) goes back to service
// at the next evacuation instead of staying idle. ok is false when no slab
// qualifies.
func (a *slabAlloc) evacuate(avoid int) (slab int, ok bool) {
	best := int32(-1)
	for i := range a.slabs {
		m := &a.slabs[i]
		if m.class < 0 || int(m.class) == avoid || m.live == 0 {
			continue
		}
		if best < 0 || m.live < a.slabs[best].live {
			best = int32(i)
		}
	}
	if old := a.draining; old >= 0 && old != best {
		a.draining = -1
		if m := &a.slabs[old]; m.live < a.perSlab[m.class] {
			a.pushPartial(old)
		}
	}
	if best < 0 {
		return 0, false
	}
	a.draining = best
	a.unlink(best)
	return int(best), true
}

// live calls fn for every live slot of slab.
func (a *slabAlloc) live(slab int, fn func(loc Loc, off int64, n int)) {
	m := &a.slabs[slab]
	if m.class < 0 {
		return
	}
	for slot, l := range m.lens[:m.bump] {
		if l != 0 {
			fn(makeLoc(slab, int(m.class), slot), a.offset(slab, int(m.class), slot), int(l-1))
		}
	}
}

// valueLen returns the length of the live value at loc.
func (a *slabAlloc) valueLen(loc Loc) int {
	i, c, slot := a.split(loc)
	m := &a.slabs[i]
	if int(m.class) != c || m.lens[slot] == 0 {
		panic(fmt.Sprintf("tiers: location %#x holds no value", uint64(loc)))
	}
	return int(m.lens[slot] - 1)
}

func (a *slabAlloc) classHasMemory(c int) bool {
	return c >= 0 && c < len(a.owned) && a.owned[c] > 0
}

func (a *slabAlloc) stats(capacity int64) Stats {
	return Stats{Capacity: capacity, Reserved: a.held * a.slabSize, Warm: int64(len(a.warm)) * a.slabSize,
		Stored: a.stored, Values: a.values}
}

// keepWarm sets how many emptied slabs keep their memory (warmMax). With
// all set, every free slab counts as warm from now on: its memory is there
// (the owner has just touched all of it).
func (a *slabAlloc) keepWarm(n int, all bool) {
	a.warmMax = min(n, len(a.slabs))
	if all {
		a.warmMax = len(a.slabs)
		a.warm = append(a.warm, a.pool...)
		a.pool = a.pool[:0]
	}
}

// defaultSlabSize is DefaultSlabSize, or capacity rounded down to the page
// size (at least one page) when that is smaller.
func defaultSlabSize(capacity int64) int64 {
	page := int64(unix.Getpagesize())
	if capacity > 0 && capacity < DefaultSlabSize {
		return max(page, capacity/page*page)
	}
	return DefaultSlabSize
}

// arenaSlabs validates an arena's capacity and slab size, naming the fields
// of the options struct called opts, and returns how many slabs it holds.
func arenaSlabs(opts string, capacity, slabSize int64, pageSize int) (int, error) {
	switch {
	case slabSize < int64(pageSize) || slabSize > MaxSlabSize:
		return 0, fmt.Errorf("tiers: %s.SlabSize %d is outside [%d, %d]", opts, slabSize, pageSize, MaxSlabSize)
	case slabSize%int64(pageSize) != 0:
		return 0, fmt.Errorf("tiers: %s.SlabSize %d is not a multiple of the page size %d", opts, slabSize, pageSize)
	case capacity < slabSize:
		return 0, fmt.Errorf("tiers: %s.Capacity %d is less than one slab (SlabSize %d)", opts, capacity, slabSize)
	case capacity/slabSize > maxSlabs:
		return 0, fmt.Errorf("tiers: %s.Capacity %d is more than %d slabs of SlabSize %d", opts, capacity, maxSlabs, slabSize)
	}
	return int(capacity / slabSize), nil
}

// slabTier is what the DRAM and HBM tiers share: the allocator, its lock,
// and the close state. It touches no memory; the tier embedding it does.
type slabTier struct {
	capacity int64
	// closeMu is held for reading while a method uses the tier's memory,
	// and for writing by Close, which releases it.
	closeMu sync.RWMutex
	closed  bool // guarded by closeMu
	// alloc's class table (slabSize, classes, perSlab, len(slabs)) never
	// changes and is read without mu; the rest is guarded by mu.
	alloc *slabAlloc
	mu    sync.Mutex
}

// take allocates a slot for an n-byte value and calls fn with its header's
// offset under the lock, so that the slot's header is whole before
// Evacuate can read it. closeMu must be held for reading.
func (t *slabTier) take(n int, fn func(off int64)) (Loc, int64, error) {
	if t.closed {
		return 0, 0, ErrClosed
	}
	c := t.alloc.sizeClass(n)
	if c < 0 {
		return 0, 0, ErrTooLarge
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	loc, off, ok := t.alloc.alloc(c, n)
	if !ok {
		return 0, 0, ErrFull
	}
	if fn != nil {
		fn(off)
	}
	return loc, off, nil
}

// release frees loc. If that empties its slab, drop is called outside the
// lock with the slab's arena offset and size, to release its memory, before
// the slab returns to the pool: meanwhile it is in no class and not in the
// pool, so nothing is written into it. closeMu must be held for reading.
func (t *slabTier) release(loc Loc, drop func(off, size int64)) {
	if t.closed {
		return
	}
	t.mu.Lock()
	_, slab, empty := t.alloc.free(loc)
	t.mu.Unlock()
	if !empty {
		return
	}
	if drop != nil {
		drop(int64(slab)*t.alloc.slabSize, t.alloc.slabSize)
	}
	t.mu.Lock()
	t.alloc.reclaim(slab)
	t.mu.Unlock()
}

// holds reports whether loc holds a value: whether an index that names loc
// names a live slot (taken, not freed since).
func (t *slabTier) holds(loc Loc) bool {
	i, c, slot := splitLoc(loc)
	if i < 0 || i >= len(t.alloc.slabs) || c >= len(t.alloc.classes) || slot >= int(t.alloc.perSlab[c]) {
		return false
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	m := &t.alloc.slabs[i]
	return int(m.class) == c && m.lens[slot] != 0
}

// mustHold panics when an operation names loc and loc holds no value: the
// index that named it kept a location after it was freed. The invariants
// build calls it where a tier reads without asking its allocator.
func (t *slabTier) mustHold(tier string, loc Loc) {
	if !t.holds(loc) {
		panic(fmt.Sprintf("tiers: %s: location %#x holds no value: an index names a freed slot", tier, uint64(loc)))
	}
}

// evacuateLocked picks a slab to evacuate (see slabAlloc.evacuate) and
// returns a record for each of its values, keys not filled in, with the
// arena offset of each slot's header.
func (t *slabTier) evacuateLocked(avoid int) (recs []Record, offs []int64) {
	slab, ok := t.alloc.evacuate(avoid)
	if !ok {
		return nil, nil
	}
	live := t.alloc.slabs[slab].live
	recs, offs = make([]Record, 0, live), make([]int64, 0, live)
	t.alloc.live(slab, func(loc Loc, off int64, n int) {
		recs = append(recs, Record{Loc: loc, Len: n})
		offs = append(offs, off)
	})
	return recs, offs
}

// Stats returns the tier's usage. Reserved counts the whole slabs that are
// not in the pool: the memory the tier holds against Capacity.
func (t *slabTier) Stats() Stats {
	t.closeMu.RLock()
	defer t.closeMu.RUnlock()
	if t.closed {
		return Stats{Capacity: t.capacity}
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.alloc.stats(t.capacity)
}

// SizeClass returns the class that holds an n-byte value, or -1 if none does.
func (t *slabTier) SizeClass(n int) int { return t.alloc.sizeClass(n) }

// MaxValue returns the largest value the tier can hold.
func (t *slabTier) MaxValue() int { return t.alloc.maxValue() }

// ClassHasMemory reports whether class c holds at least one slab.
func (t *slabTier) ClassHasMemory(c int) bool {
	t.closeMu.RLock()
	defer t.closeMu.RUnlock()
	if t.closed {
		return false
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.alloc.classHasMemory(c)
}
