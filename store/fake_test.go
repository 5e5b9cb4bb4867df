package store

import (
	"fmt"
	"sync"

	"github.com/kvmesh/kvmesh/prefixhash"
	"github.com/kvmesh/kvmesh/tiers"
)

// Fakes of the tiers, written against tiers/tier.go only. They are strict:
// a use of a freed location panics, and freed memory is scribbled over, so a
// store that frees a block under a reader fails its tests (and -race sees the
// scribble race with the reader).

// fakeMem is a memory tier with size classes and slabs: Tier, Viewer, Classed.
type fakeMem struct {
	mu       sync.Mutex
	slabSize int
	classes  []int // value size of each class, ascending
	maxSlabs int
	slabs    []*fakeSlab
	corrupt  map[tiers.Loc]bool // Read returns ErrCorrupt
	fast     bool               // do not scribble freed memory (benchmarks)
	closed   bool
	puts     int
}

type fakeSlab struct {
	class int // -1: free, back in the pool
	mem   []byte
	keys  []prefixhash.Key
	lens  []int
	used  []bool
	live  int
}

var (
	_ tiers.Tier    = (*fakeMem)(nil)
	_ tiers.Viewer  = (*fakeMem)(nil)
	_ tiers.Classed = (*fakeMem)(nil)
)

// newFakeMem returns a memory tier of maxSlabs slabs of slabSize bytes whose
// classes hold values up to the given sizes.
func newFakeMem(slabSize, maxSlabs int, classes ...int) *fakeMem {
	return &fakeMem{slabSize: slabSize, classes: classes, maxSlabs: maxSlabs, corrupt: map[tiers.Loc]bool{}}
}

func (m *fakeMem) Name() string { return "dram" }

func (m *fakeMem) SizeClass(n int) int {
	for c, sz := range m.classes {
		if n <= sz && sz <= m.slabSize {
			return c
		}
	}
	return -1
}

func (m *fakeMem) ClassHasMemory(c int) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, s := range m.slabs {
		if s.class == c {
			return true
		}
	}
	return false
}

func (m *fakeMem) Evacuate(avoid int) []tiers.Record {
	m.mu.Lock()
	defer m.mu.Unlock()
	best := -1
	for k, s := range m.slabs {
		if s.class >= 0 && s.class != avoid && s.live > 0 && (best < 0 || s.live < m.slabs[best].live) {
			best = k
		}
	}
	if best < 0 {
		return nil
	}
	s := m.slabs[best]
	var recs []tiers.Record
	for j, u := range s.used {
		if u {
			recs = append(recs, tiers.Record{Key: s.keys[j], Loc: tiers.Loc(best)<<32 | tiers.Loc(j), Len: s.lens[j]})
		}
	}
	return recs
}

func (m *fakeMem) Put(key prefixhash.Key, val []byte) (tiers.Loc, error) {
	c := m.SizeClass(len(val))
	if c < 0 {
		return 0, tiers.ErrTooLarge
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return 0, tiers.ErrClosed
	}
	slots := m.slabSize / m.classes[c]
	pick := -1
	for k, s := range m.slabs {
		if s.class == c && s.live < slots {
			pick = k
			break
		}
	}
	if pick < 0 {
		for k, s := range m.slabs {
			if s.class < 0 {
				pick = k
				break
			}
		}
		if pick < 0 && len(m.slabs) < m.maxSlabs {
			m.slabs = append(m.slabs, &fakeSlab{mem: make([]byte, m.slabSize)})
			pick = len(m.slabs) - 1
		}
		if pick < 0 {
			return 0, tiers.ErrFull
		}
		s := m.slabs[pick]
		s.class = c
		s.keys, s.lens, s.used = make([]prefixhash.Key, slots), make([]int, slots), make([]bool, slots)
	}
	s := m.slabs[pick]
	for j, u := range s.used {
		if !u {
			s.used[j], s.keys[j], s.lens[j] = true, key, len(val)
			s.live++
			copy(s.mem[j*m.classes[c]:], val)
			m.puts++
			return tiers.Loc(pick)<<32 | tiers.Loc(j), nil
		}
	}
	panic("fakeMem: no free slot in a slab with room")
}

func (m *fakeMem) slot(loc tiers.Loc, op string) (*fakeSlab, int) {
	k, j := int(loc>>32), int(uint32(loc))
	if k >= len(m.slabs) || m.slabs[k].class < 0 || j >= len(m.slabs[k].used) || !m.slabs[k].used[j] {
		panic(fmt.Sprintf("fakeMem: %s of location %x, which is not live", op, uint64(loc)))
	}
	return m.slabs[k], j
}

// Holds reports whether loc holds a value of key (the store's index checks
// ask).
func (m *fakeMem) Holds(loc tiers.Loc, key prefixhash.Key) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	k, j := int(loc>>32), int(uint32(loc))
	return k < len(m.slabs) && m.slabs[k].class >= 0 && j < len(m.slabs[k].used) && m.slabs[k].used[j] && m.slabs[k].keys[j] == key
}

func (m *fakeMem) View(loc tiers.Loc, n int) []byte {
	m.mu.Lock()
	defer m.mu.Unlock()
	s, j := m.slot(loc, "View")
	if n != s.lens[j] {
		panic(fmt.Sprintf("fakeMem: View of %d bytes, value has %d", n, s.lens[j]))
	}
	off := j * m.classes[s.class]
	return s.mem[off : off+n : off+n]
}

func (m *fakeMem) Read(loc tiers.Loc, dst []byte) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	s, j := m.slot(loc, "Read")
	if len(dst) != s.lens[j] {
		return fmt.Errorf("fakeMem: Read into %d bytes, value has %d", len(dst), s.lens[j])
	}
	if m.corrupt[loc] {
		return tiers.ErrCorrupt
	}
	off := j * m.classes[s.class]
	copy(dst, s.mem[off:off+len(dst)])
	return nil
}

func (m *fakeMem) Free(loc tiers.Loc) {
	m.mu.Lock()
	defer m.mu.Unlock()
	s, j := m.slot(loc, "Free")
	if !m.fast {
		off := j * m.classes[s.class]
		scribble(s.mem[off : off+m.classes[s.class]])
	}
	s.used[j] = false
	s.live--
	delete(m.corrupt, loc)
	if s.live == 0 {
		s.class = -1
	}
}

func (m *fakeMem) Stats() tiers.Stats {
	m.mu.Lock()
	defer m.mu.Unlock()
	st := tiers.Stats{Capacity: int64(m.maxSlabs * m.slabSize)}
	for _, s := range m.slabs {
		if s.class < 0 {
			continue
		}
		st.Reserved += int64(m.slabSize)
		for j, u := range s.used {
			if u {
				st.Stored += int64(s.lens[j])
				st.Values++
			}
		}
	}
	return st
}

func (m *fakeMem) Close() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.closed = true
	return nil
}

// locOf returns where the tier holds key (for tests that damage bytes).
func (m *fakeMem) locOf(key prefixhash.Key) (tiers.Loc, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for k, s := range m.slabs {
		for j, u := range s.used {
			if u && s.keys[j] == key {
				return tiers.Loc(k)<<32 | tiers.Loc(j), true
			}
		}
	}
	return 0, false
}

// fakeDisk is a log-structured persistent tier: Tier, Segmented, Recoverable,
// Batcher. Its state lives in a fakeVolume that outlives it, so a test can
// close it and open another over the same volume (a restart).
type fakeDisk struct {
	v      *fakeVolume
	closed bool
	gets   int
}

type fakeVolume struct {
	mu      sync.Mutex
	segSize int
	maxSegs int
	segs    map[uint64]*fakeSeg
	order   []uint64 // live segments, oldest first
	nextSeg uint64
	batches int
}

type fakeSeg struct {
	data   []byte
	recs   []fakeRec
	sealed bool
}

type fakeRec struct {
	key     prefixhash.Key
	off, n  int
	live    bool
	corrupt bool // the tier's checksum fails
}

var (
	_ tiers.Tier        = (*fakeDisk)(nil)
	_ tiers.Segmented   = (*fakeDisk)(nil)
	_ tiers.Recoverable = (*fakeDisk)(nil)
	_ tiers.Batcher     = (*fakeDisk)(nil)
)

func newFakeVolume(segSize, maxSegs int) *fakeVolume {
	return &fakeVolume{segSize: segSize, maxSegs: maxSegs, segs: map[uint64]*fakeSeg{}, nextSeg: 1}
}

func (v *fakeVolume) open() *fakeDisk { return &fakeDisk{v: v} }

func (d *fakeDisk) Name() string { return "nvme" }

func (d *fakeDisk) Put(key prefixhash.Key, val []byte) (tiers.Loc, error) {
	v := d.v
	v.mu.Lock()
	defer v.mu.Unlock()
	return d.putLocked(key, val)
}

func (d *fakeDisk) putLocked(key prefixhash.Key, val []byte) (tiers.Loc, error) {
	v := d.v
	if d.closed {
		return 0, tiers.ErrClosed
	}
	if len(val) > v.segSize {
		return 0, tiers.ErrTooLarge
	}
	var head *fakeSeg
	var id uint64
	if n := len(v.order); n > 0 {
		id = v.order[n-1]
		head = v.segs[id]
	}
	if head == nil || head.sealed || len(head.data)+len(val) > v.segSize {
		if head != nil {
			head.sealed = true
		}
		if len(v.order) >= v.maxSegs {
			return 0, tiers.ErrFull
		}
		id = v.nextSeg
		v.nextSeg++
		head = &fakeSeg{data: make([]byte, 0, v.segSize)}
		v.segs[id] = head
		v.order = append(v.order, id)
	}
	head.recs = append(head.recs, fakeRec{key: key, off: len(head.data), n: len(val), live: true})
	head.data = append(head.data, val...)
	return tiers.Loc(id<<32 | uint64(len(head.recs)-1)), nil
}

// Holds reports whether loc holds a live record of key (the store's index
// checks ask).
func (d *fakeDisk) Holds(loc tiers.Loc, key prefixhash.Key) bool {
	v := d.v
	v.mu.Lock()
	defer v.mu.Unlock()
	seg, ok := v.segs[uint64(loc)>>32]
	j := int(uint32(loc))
	return ok && j < len(seg.recs) && seg.recs[j].live && seg.recs[j].key == key
}

func (d *fakeDisk) PutBatch(keys []prefixhash.Key, vals [][]byte, locs []tiers.Loc) (int, error) {
	v := d.v
	v.mu.Lock()
	defer v.mu.Unlock()
	v.batches++
	for k := range keys {
		loc, err := d.putLocked(keys[k], vals[k])
		if err != nil {
			return k, err
		}
		locs[k] = loc
	}
	return len(keys), nil
}

func (v *fakeVolume) rec(loc tiers.Loc, op string) (*fakeSeg, *fakeRec, error) {
	s := v.segs[uint64(loc)>>32]
	if s == nil {
		return nil, nil, fmt.Errorf("fakeDisk: %s of location %x: segment dropped", op, uint64(loc))
	}
	j := int(uint32(loc))
	if j >= len(s.recs) || !s.recs[j].live {
		panic(fmt.Sprintf("fakeDisk: %s of location %x, which is not live", op, uint64(loc)))
	}
	return s, &s.recs[j], nil
}

func (d *fakeDisk) Read(loc tiers.Loc, dst []byte) error {
	v := d.v
	v.mu.Lock()
	defer v.mu.Unlock()
	d.gets++
	s, r, err := v.rec(loc, "Read")
	if err != nil {
		return err
	}
	if len(dst) != r.n {
		return fmt.Errorf("fakeDisk: Read into %d bytes, value has %d", len(dst), r.n)
	}
	if r.corrupt {
		return tiers.ErrCorrupt
	}
	copy(dst, s.data[r.off:r.off+r.n])
	return nil
}

func (d *fakeDisk) Free(loc tiers.Loc) {
	v := d.v
	v.mu.Lock()
	defer v.mu.Unlock()
	_, r, err := v.rec(loc, "Free")
	if err != nil {
		panic(err) // freeing a location of a dropped segment is a bug
	}
	r.live = false
}

func (d *fakeDisk) OldestSegment() (uint64, []tiers.Record, bool, error) {
	v := d.v
	v.mu.Lock()
	defer v.mu.Unlock()
	for _, id := range v.order {
		s := v.segs[id]
		if !s.sealed {
			continue
		}
		recs := make([]tiers.Record, 0, len(s.recs))
		for j, r := range s.recs {
			recs = append(recs, tiers.Record{Key: r.key, Loc: tiers.Loc(id<<32 | uint64(j)), Len: r.n})
		}
		return id, recs, true, nil
	}
	return 0, nil, false, nil
}

func (d *fakeDisk) DropSegment(seg uint64) error {
	v := d.v
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.segs[seg] == nil {
		return fmt.Errorf("fakeDisk: drop segment %d: no such segment", seg)
	}
	delete(v.segs, seg)
	for k, id := range v.order {
		if id == seg {
			v.order = append(v.order[:k], v.order[k+1:]...)
			break
		}
	}
	return nil
}

func (d *fakeDisk) Range(fn func(tiers.Record) bool) error {
	v := d.v
	v.mu.Lock()
	var recs []tiers.Record
	for _, id := range v.order {
		for j, r := range v.segs[id].recs {
			if r.live {
				recs = append(recs, tiers.Record{Key: r.key, Loc: tiers.Loc(id<<32 | uint64(j)), Len: r.n})
			}
		}
	}
	v.mu.Unlock()
	for _, r := range recs {
		if !fn(r) {
			break
		}
	}
	return nil
}

func (d *fakeDisk) Stats() tiers.Stats {
	v := d.v
	v.mu.Lock()
	defer v.mu.Unlock()
	st := tiers.Stats{Capacity: int64(v.maxSegs * v.segSize), Reserved: int64(len(v.order) * v.segSize)}
	for _, id := range v.order {
		for _, r := range v.segs[id].recs {
			if r.live {
				st.Stored += int64(r.n)
				st.Values++
			}
		}
	}
	return st
}

func (d *fakeDisk) Close() error {
	d.v.mu.Lock()
	defer d.v.mu.Unlock()
	d.closed = true
	// Seal the head so that the next open appends to a new segment, as a
	// real log does after a restart.
	if n := len(d.v.order); n > 0 {
		d.v.segs[d.v.order[n-1]].sealed = true
	}
	return nil
}

// damage finds key's live record and marks it corrupt (the tier's checksum
// fails) or, silently, flips a payload byte (only the block's checksum can
// tell).
func (v *fakeVolume) damage(key prefixhash.Key, silent bool) bool {
	v.mu.Lock()
	defer v.mu.Unlock()
	for _, id := range v.order {
		s := v.segs[id]
		for j := range s.recs {
			r := &s.recs[j]
			if r.live && r.key == key {
				if silent {
					s.data[r.off+r.n-1] ^= 0x40
				} else {
					r.corrupt = true
				}
				return true
			}
		}
	}
	return false
}

// scribble fills freed memory with 0xdb, so that a reader of freed bytes
// sees them change.
func scribble(b []byte) {
	if len(b) == 0 {
		return
	}
	b[0] = 0xdb
	for n := 1; n < len(b); n *= 2 {
		copy(b[n:], b[:n])
	}
}
