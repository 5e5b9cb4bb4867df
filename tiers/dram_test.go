package tiers

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/kvmesh/kvmesh/internal/prefault"
	"github.com/kvmesh/kvmesh/prefixhash"
)

func newTestDRAM(t testing.TB, opts DRAMOptions) *DRAM {
	t.Helper()
	d, err := NewDRAM(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = d.Close() })
	return d
}

func testKey(i uint64) prefixhash.Key {
	var k prefixhash.Key
	for j := range k {
		k[j] = byte(i >> (8 * (j % 8)))
	}
	k[15] ^= 0xa5
	return k
}

// fill writes a pattern that depends on seed into b.
func fill(b []byte, seed uint64) {
	r := rand.New(rand.NewPCG(seed, 7))
	for i := 0; i < len(b); i += 8 {
		v := r.Uint64()
		for j := i; j < min(i+8, len(b)); j++ {
			b[j] = byte(v)
			v >>= 8
		}
	}
}

type modelValue struct {
	key prefixhash.Key
	val []byte
}

// TestDRAMModel runs random Put/Read/View/Free/Evacuate sequences of random
// sizes against a map and checks, after every step, the bytes, the usage
// counters and the capacity bound.
func TestDRAMModel(t *testing.T) {
	for seed := range uint64(4) {
		t.Run(fmt.Sprint(seed), func(t *testing.T) { testDRAMModel(t, seed) })
	}
}

func testDRAMModel(t *testing.T, seed uint64) {
	const slab = 64 << 10
	opts := DRAMOptions{Capacity: 24*slab + 12345, SlabSize: slab, WarmSlabs: 3}
	d := newTestDRAM(t, opts)
	r := rand.New(rand.NewPCG(seed, 1))
	warm := warmModel{max: opts.WarmSlabs}
	model := map[Loc]modelValue{}
	var locs []Loc // the keys of model, for random picks
	blockSizes := []int{0, 1000, 4096, 16<<10 - 64, 30000, d.MaxValue()}
	size := func() int {
		if r.IntN(2) == 0 {
			return blockSizes[r.IntN(len(blockSizes))]
		}
		return r.IntN(d.MaxValue() + 100)
	}
	remove := func(i int) Loc {
		loc := locs[i]
		locs[i] = locs[len(locs)-1]
		locs = locs[:len(locs)-1]
		delete(model, loc)
		d.Free(loc)
		return loc
	}
	slabOf := func(loc Loc) int { s, _, _ := splitLoc(loc); return s }
	classOf := func(loc Loc) int { _, c, _ := splitLoc(loc); return c }
	var nput, nfull, nevac int
	for step := range 3000 {
		switch op := r.IntN(100); {
		case op < 40:
			n := size()
			val := make([]byte, n)
			fill(val, uint64(step))
			key := testKey(uint64(step))
			loc, err := d.Put(key, val)
			switch {
			case n > d.MaxValue():
				if !errors.Is(err, ErrTooLarge) || d.SizeClass(n) != -1 {
					t.Fatalf("step %d: Put of %d bytes (max %d): %v, class %d", step, n, d.MaxValue(), err, d.SizeClass(n))
				}
			case errors.Is(err, ErrFull):
				nfull++
				if st := d.Stats(); st.Reserved != opts.Capacity/slab*slab {
					t.Fatalf("step %d: ErrFull with %d of %d bytes in slabs", step, st.Reserved, opts.Capacity/slab*slab)
				}
			case err != nil:
				t.Fatalf("step %d: Put of %d bytes: %v", step, n, err)
			default:
				nput++
				if _, ok := model[loc]; ok {
					t.Fatalf("step %d: Put returned live location %#x", step, uint64(loc))
				}
				if c := classOf(loc); c != d.SizeClass(n) {
					t.Fatalf("step %d: %d bytes stored in class %d, SizeClass says %d", step, n, c, d.SizeClass(n))
				}
				model[loc] = modelValue{key, val}
				locs = append(locs, loc)
			}
		case op < 60 && len(locs) > 0:
			loc := locs[r.IntN(len(locs))]
			want := model[loc].val
			got := make([]byte, len(want))
			if err := d.Read(loc, got); err != nil {
				t.Fatalf("step %d: Read: %v", step, err)
			}
			if !bytes.Equal(got, want) {
				t.Fatalf("step %d: Read of %d bytes differs", step, len(want))
			}
			if err := d.Read(loc, make([]byte, len(want)+1)); err == nil {
				t.Fatalf("step %d: Read into a buffer one byte too long succeeded", step)
			}
		case op < 75 && len(locs) > 0:
			loc := locs[r.IntN(len(locs))]
			want := model[loc].val
			if got := d.View(loc, len(want)); !bytes.Equal(got, want) || cap(got) != len(want) {
				t.Fatalf("step %d: View of %d bytes differs (cap %d)", step, len(want), cap(got))
			}
		case op < 95 && len(locs) > 0:
			remove(r.IntN(len(locs)))
		case op >= 95:
			avoid := -1
			if len(locs) > 0 && r.IntN(2) == 0 {
				avoid = classOf(locs[r.IntN(len(locs))])
			}
			recs := d.Evacuate(avoid)
			// The slab named must be the one with the fewest live values
			// among slabs not of class avoid.
			live := map[int]int{}
			for loc := range model {
				if classOf(loc) != avoid {
					live[slabOf(loc)]++
				}
			}
			fewest := -1
			for _, n := range live {
				if fewest < 0 || n < fewest {
					fewest = n
				}
			}
			if len(recs) == 0 {
				if fewest >= 0 {
					t.Fatalf("step %d: Evacuate(%d) named nothing, a slab holds %d", step, avoid, fewest)
				}
				break
			}
			nevac++
			if len(recs) != fewest || len(recs) != live[slabOf(recs[0].Loc)] {
				t.Fatalf("step %d: Evacuate(%d) named %d values of a slab with %d; fewest is %d",
					step, avoid, len(recs), live[slabOf(recs[0].Loc)], fewest)
			}
			for _, rec := range recs {
				m, ok := model[rec.Loc]
				if !ok || m.key != rec.Key || len(m.val) != rec.Len || slabOf(rec.Loc) != slabOf(recs[0].Loc) || classOf(rec.Loc) == avoid {
					t.Fatalf("step %d: Evacuate(%d) record %+v does not match the model", step, avoid, rec)
				}
			}
			// Usually the owner frees them all; sometimes it cannot.
			if r.IntN(4) > 0 {
				for _, rec := range recs {
					for i, loc := range locs {
						if loc == rec.Loc {
							remove(i)
							break
						}
					}
				}
			}
		}
		checkStats(t, step, d, opts, model, &warm)
		if c := r.IntN(len(d.alloc.classes) + 1); c < len(d.alloc.classes) {
			has := false
			for loc := range model {
				has = has || classOf(loc) == c
			}
			if d.ClassHasMemory(c) != has {
				t.Fatalf("step %d: ClassHasMemory(%d) = %v, model says %v", step, c, !has, has)
			}
		}
	}
	if nput < 300 || nfull < 10 || nevac < 10 {
		t.Fatalf("the sequence exercised too little: %d puts, %d full, %d evacuations", nput, nfull, nevac)
	}
	for loc, m := range model {
		if got := d.View(loc, len(m.val)); !bytes.Equal(got, m.val) {
			t.Fatalf("final View of %d bytes differs", len(m.val))
		}
	}
}

// warmModel follows how many emptied slabs a DRAM tier keeps warm: a slab
// that empties joins them while fewer than max are, and a slab a class
// takes is a warm one while any is.
type warmModel struct{ held, warm, max int }

func (w *warmModel) update(held int) {
	for ; w.held < held; w.held++ {
		w.warm = max(w.warm-1, 0)
	}
	for ; w.held > held; w.held-- {
		w.warm = min(w.warm+1, w.max)
	}
}

func checkStats(t *testing.T, step int, d *DRAM, opts DRAMOptions, model map[Loc]modelValue, warm *warmModel) {
	t.Helper()
	st := d.Stats()
	var stored int64
	slabs := map[int]bool{}
	for loc, m := range model {
		stored += int64(len(m.val))
		s, _, _ := splitLoc(loc)
		slabs[s] = true
	}
	warm.update(len(slabs))
	want := Stats{Capacity: opts.Capacity, Reserved: int64(len(slabs)) * opts.SlabSize, Warm: int64(warm.warm) * opts.SlabSize,
		Stored: stored, Values: int64(len(model))}
	if st != want {
		t.Fatalf("step %d: Stats = %+v, model says %+v", step, st, want)
	}
	if st.Reserved > st.Capacity {
		t.Fatalf("step %d: Reserved %d > Capacity %d", step, st.Reserved, st.Capacity)
	}
}

func TestDRAMTooLarge(t *testing.T) {
	d := newTestDRAM(t, DRAMOptions{Capacity: 1 << 20, SlabSize: 64 << 10})
	max := d.MaxValue()
	if want := 64<<10 - slotHeaderLen; max != want {
		t.Fatalf("MaxValue = %d, want %d", max, want)
	}
	val := make([]byte, max+1)
	if _, err := d.Put(testKey(1), val); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("Put of MaxValue+1 bytes: %v, want ErrTooLarge", err)
	}
	loc, err := d.Put(testKey(1), val[:max])
	if err != nil {
		t.Fatalf("Put of MaxValue bytes: %v", err)
	}
	if st := d.Stats(); st.Values != 1 || st.Reserved != 64<<10 {
		t.Fatalf("Stats after one Put of a slab-sized value: %+v", st)
	}
	d.Free(loc)
}

// TestDRAMEvacuate fills the arena with values of class A, then frees room
// for class B by evacuating the slab of A with the fewest values.
func TestDRAMEvacuate(t *testing.T) {
	const slab = 64 << 10
	d := newTestDRAM(t, DRAMOptions{Capacity: 4 * slab, SlabSize: slab})
	small, big := make([]byte, 1000), make([]byte, 20000)
	a, b := d.SizeClass(len(small)), d.SizeClass(len(big))
	if a == b {
		t.Fatal("test sizes share a class")
	}
	var locs []Loc
	for i := 0; ; i++ {
		fill(small, uint64(i))
		loc, err := d.Put(testKey(uint64(i)), small)
		if errors.Is(err, ErrFull) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		locs = append(locs, loc)
	}
	perSlab := len(locs) / 4
	if st := d.Stats(); st.Reserved != 4*slab || len(locs)%4 != 0 {
		t.Fatalf("full arena: %d values, %+v", len(locs), st)
	}
	if _, err := d.Put(testKey(1e6), big); !errors.Is(err, ErrFull) {
		t.Fatalf("Put of class B into a full arena: %v, want ErrFull", err)
	}
	if !d.ClassHasMemory(a) || d.ClassHasMemory(b) {
		t.Fatalf("ClassHasMemory(A, B) = %v, %v; want true, false", d.ClassHasMemory(a), d.ClassHasMemory(b))
	}
	if recs := d.Evacuate(a); recs != nil {
		t.Fatalf("Evacuate(A) with only class A slabs named %d values", len(recs))
	}
	// The values come out slab by slab: make the third slab the emptiest.
	third := locs[2*perSlab : 3*perSlab]
	for _, loc := range third[:perSlab/2] {
		d.Free(loc)
	}
	recs := d.Evacuate(b)
	if len(recs) != perSlab-perSlab/2 {
		t.Fatalf("Evacuate named %d values, want the %d left in the emptiest slab", len(recs), perSlab-perSlab/2)
	}
	for i, rec := range recs {
		j := 2*perSlab + perSlab/2 + i
		if rec.Loc != locs[j] || rec.Key != testKey(uint64(j)) || rec.Len != len(small) {
			t.Fatalf("record %d = %+v, want loc %#x key %v", i, rec, uint64(locs[j]), testKey(uint64(j)))
		}
	}
	// While it drains, the slab takes no new values, even of its class and
	// after some of its values are freed.
	d.Free(recs[0].Loc)
	if _, err := d.Put(testKey(2e6), small); !errors.Is(err, ErrFull) {
		t.Fatalf("Put of class A while its only free slots drain: %v, want ErrFull", err)
	}
	for _, rec := range recs[1:] {
		d.Free(rec.Loc)
	}
	if st := d.Stats(); st.Reserved != 3*slab {
		t.Fatalf("after evacuation: %+v, want 3 slabs reserved", st)
	}
	fill(big, 42)
	loc, err := d.Put(testKey(42), big)
	if err != nil {
		t.Fatalf("Put of class B after evacuation: %v", err)
	}
	if !d.ClassHasMemory(b) {
		t.Fatal("ClassHasMemory(B) = false after a Put of class B")
	}
	got := make([]byte, len(big))
	if err := d.Read(loc, got); err != nil || !bytes.Equal(got, big) {
		t.Fatalf("Read of class B value: %v", err)
	}
}

// TestDRAMUndrain checks that a slab the owner could not empty serves values
// again once another slab is evacuated.
func TestDRAMUndrain(t *testing.T) {
	const slab = 64 << 10
	d := newTestDRAM(t, DRAMOptions{Capacity: 2 * slab, SlabSize: slab})
	val := make([]byte, 1000)
	var locs []Loc
	for i := 0; ; i++ {
		loc, err := d.Put(testKey(uint64(i)), val)
		if err != nil {
			break
		}
		locs = append(locs, loc)
	}
	d.Free(locs[0]) // slab 0 now has the fewest values
	if recs := d.Evacuate(-1); len(recs) != len(locs)/2-1 {
		t.Fatalf("Evacuate named %d values", len(recs))
	}
	if _, err := d.Put(testKey(1e6), val); !errors.Is(err, ErrFull) {
		t.Fatalf("Put into a draining slab: %v, want ErrFull", err)
	}
	// The owner gives up on slab 0 and frees two values of slab 1: the next
	// evacuation picks slab 1, and slab 0 serves again.
	d.Free(locs[len(locs)-1])
	d.Free(locs[len(locs)-2])
	if recs := d.Evacuate(-1); len(recs) != len(locs)/2-2 {
		t.Fatalf("second Evacuate named %d values", len(recs))
	}
	if _, err := d.Put(testKey(2e6), val); err != nil {
		t.Fatalf("Put after the drain moved on: %v", err)
	}
}

// residentPages counts the pages of mem that are in memory.
func residentPages(t *testing.T, mem []byte) int {
	t.Helper()
	n, err := prefault.Resident(mem)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// TestDRAMReleasesMemory checks that an emptied slab's pages leave the
// process's resident memory when no slab is kept warm.
func TestDRAMReleasesMemory(t *testing.T) {
	const slab = 1 << 20
	d := newTestDRAM(t, DRAMOptions{Capacity: 4 * slab, SlabSize: slab, WarmSlabs: -1})
	resident := func() int { return residentPages(t, d.arena[:slab]) }
	if n := resident(); n != 0 {
		t.Fatalf("%d pages resident before any Put", n)
	}
	val := make([]byte, 200<<10)
	var locs []Loc
	for i := range 4 {
		loc, err := d.Put(testKey(uint64(i)), val)
		if err != nil {
			t.Fatal(err)
		}
		locs = append(locs, loc)
	}
	if n := resident(); n < 4*len(val)/unix.Getpagesize() {
		t.Fatalf("%d pages resident after writing %d bytes", n, 4*len(val))
	}
	for _, loc := range locs[:3] {
		d.Free(loc)
	}
	if n := resident(); n == 0 {
		t.Fatal("pages released while the slab still holds a value")
	}
	d.Free(locs[3])
	if n := resident(); n != 0 {
		t.Fatalf("%d pages still resident after the slab emptied", n)
	}
}

// TestDRAMWarmSlabs checks that up to WarmSlabs emptied slabs keep their
// pages, that the next slab a class needs is a warm one, and that the
// slabs past WarmSlabs still release theirs.
func TestDRAMWarmSlabs(t *testing.T) {
	const slab = 1 << 20
	d := newTestDRAM(t, DRAMOptions{Capacity: 4 * slab, SlabSize: slab, WarmSlabs: 1})
	val := make([]byte, slab-slotHeaderLen) // one value fills a slab
	for i := range val {
		val[i] = byte(i)
	}
	var locs []Loc
	for i := range 3 {
		loc, err := d.Put(testKey(uint64(i)), val)
		if err != nil {
			t.Fatal(err)
		}
		locs = append(locs, loc)
	}
	slabOf := func(loc Loc) int { s, _, _ := splitLoc(loc); return s }
	d.Free(locs[0]) // kept warm
	d.Free(locs[1]) // warm is full: released
	a, b := slabOf(locs[0]), slabOf(locs[1])
	if n := residentPages(t, d.arena[a*slab:(a+1)*slab]); n != slab/unix.Getpagesize() {
		t.Fatalf("warm slab %d: %d of %d pages resident", a, n, slab/unix.Getpagesize())
	}
	if n := residentPages(t, d.arena[b*slab:(b+1)*slab]); n != 0 {
		t.Fatalf("slab %d past WarmSlabs: %d pages still resident", b, n)
	}
	if st := d.Stats(); st.Warm != slab || st.Reserved != slab {
		t.Fatalf("Stats: warm %d reserved %d, want %d and %d", st.Warm, st.Reserved, slab, slab)
	}
	loc, err := d.Put(testKey(9), val)
	if err != nil {
		t.Fatal(err)
	}
	if slabOf(loc) != a {
		t.Fatalf("Put took slab %d, not the warm slab %d", slabOf(loc), a)
	}
	got := make([]byte, len(val))
	if err := d.Read(loc, got); err != nil || !bytes.Equal(got, val) {
		t.Fatalf("value in the reused warm slab: err %v, equal %v", err, bytes.Equal(got, val))
	}
	if st := d.Stats(); st.Warm != 0 || st.Reserved != 2*slab {
		t.Fatalf("Stats after reuse: warm %d reserved %d", st.Warm, st.Reserved)
	}
}

// TestDRAMPopulate checks that Populate backs the whole arena at open, and
// that emptied slabs keep their memory.
func TestDRAMPopulate(t *testing.T) {
	const slab = 1 << 20
	d := newTestDRAM(t, DRAMOptions{Capacity: 4 * slab, SlabSize: slab, WarmSlabs: -1, Populate: true})
	all := 4 * slab / unix.Getpagesize()
	if n := residentPages(t, d.arena); n != all {
		t.Fatalf("%d of %d pages resident after open", n, all)
	}
	if st := d.Stats(); st.Warm != 4*slab || st.Reserved != 0 {
		t.Fatalf("Stats after open: warm %d reserved %d", st.Warm, st.Reserved)
	}
	loc, err := d.Put(testKey(1), make([]byte, 100<<10))
	if err != nil {
		t.Fatal(err)
	}
	d.Free(loc)
	if n := residentPages(t, d.arena); n != all {
		t.Fatalf("%d of %d pages resident after a slab emptied", n, all)
	}
}

func TestDRAMOptionsWarmSlabs(t *testing.T) {
	o := DRAMOptions{Capacity: 1 << 30}
	o.EnsureDefaults()
	if want := DefaultWarmSlabs(int(o.Capacity / o.SlabSize)); o.WarmSlabs != want || want < 1 {
		t.Fatalf("default WarmSlabs %d, want %d", o.WarmSlabs, want)
	}
	o.WarmSlabs = -2
	if err := o.Validate(); err == nil {
		t.Fatal("WarmSlabs -2 validated")
	}
}

// TestDRAMConcurrent runs writers, readers and an evacuating observer at
// once; run it under -race.
func TestDRAMConcurrent(t *testing.T) {
	const slab = 64 << 10
	d := newTestDRAM(t, DRAMOptions{Capacity: 16 * slab, SlabSize: slab})
	sizes := []int{100, 1000, 5000, 20000}
	var wg sync.WaitGroup
	errc := make(chan error, 8)
	stop := make(chan struct{})
	for w := range 4 {
		wg.Go(func() {
			r := rand.New(rand.NewPCG(uint64(w), 2))
			type held struct {
				loc  Loc
				seed uint64
				n    int
			}
			var mine []held
			for i := range 2000 {
				switch {
				case r.IntN(3) > 0 || len(mine) == 0:
					n := sizes[r.IntN(len(sizes))]
					seed := uint64(w)<<32 | uint64(i)
					val := make([]byte, n)
					fill(val, seed)
					loc, err := d.Put(testKey(seed), val)
					if errors.Is(err, ErrFull) && len(mine) > 0 {
						d.Free(mine[0].loc)
						mine = mine[1:]
						continue
					}
					if err != nil && !errors.Is(err, ErrFull) {
						errc <- err
						return
					}
					if err == nil {
						mine = append(mine, held{loc, seed, n})
					}
				case r.IntN(2) == 0:
					h := mine[r.IntN(len(mine))]
					want := make([]byte, h.n)
					fill(want, h.seed)
					got := make([]byte, h.n)
					if err := d.Read(h.loc, got); err != nil || !bytes.Equal(got, want) {
						errc <- fmt.Errorf("worker %d: Read of value %d: %v, equal %v", w, h.seed, err, bytes.Equal(got, want))
						return
					}
					if !bytes.Equal(d.View(h.loc, h.n), want) {
						errc <- fmt.Errorf("worker %d: View of value %d differs", w, h.seed)
						return
					}
				default:
					j := r.IntN(len(mine))
					d.Free(mine[j].loc)
					mine = append(mine[:j], mine[j+1:]...)
				}
			}
			for _, h := range mine {
				d.Free(h.loc)
			}
		})
	}
	var observer sync.WaitGroup
	observer.Go(func() {
		for i := 0; i < 10000; i++ {
			select {
			case <-stop:
				return
			default:
			}
			d.Evacuate(i%len(sizes) - 1)
			if st := d.Stats(); st.Reserved > st.Capacity || st.Values < 0 || st.Stored < 0 {
				errc <- fmt.Errorf("Stats %+v", st)
				return
			}
			d.ClassHasMemory(i % 8)
		}
	})
	wg.Wait()
	close(stop)
	observer.Wait()
	close(errc)
	for err := range errc {
		t.Error(err)
	}
	if st := d.Stats(); st != (Stats{Capacity: 16 * slab, Warm: int64(DefaultWarmSlabs(16)) * slab}) {
		t.Fatalf("after every value was freed: %+v", st)
	}
}

func TestDRAMClose(t *testing.T) {
	d, err := NewDRAM(DRAMOptions{Capacity: 1 << 20, SlabSize: 64 << 10})
	if err != nil {
		t.Fatal(err)
	}
	val := []byte("value")
	loc, err := d.Put(testKey(1), val)
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := d.Put(testKey(2), val); !errors.Is(err, ErrClosed) {
		t.Errorf("Put after Close: %v", err)
	}
	if err := d.Read(loc, make([]byte, len(val))); !errors.Is(err, ErrClosed) {
		t.Errorf("Read after Close: %v", err)
	}
	if v := d.View(loc, len(val)); v != nil {
		t.Errorf("View after Close returned %d bytes", len(v))
	}
	d.Free(loc) // does nothing
	if recs := d.Evacuate(-1); recs != nil {
		t.Errorf("Evacuate after Close named %d values", len(recs))
	}
	if d.ClassHasMemory(d.SizeClass(len(val))) {
		t.Error("ClassHasMemory after Close")
	}
	if st := d.Stats(); st != (Stats{Capacity: 1 << 20}) {
		t.Errorf("Stats after Close: %+v", st)
	}
	if err := d.Close(); !errors.Is(err, ErrClosed) {
		t.Errorf("second Close: %v", err)
	}
}

// TestDRAMCloseWhileReading closes the tier under readers and writers: each
// either completes or gets ErrClosed, and none touches unmapped memory.
func TestDRAMCloseWhileReading(t *testing.T) {
	d, err := NewDRAM(DRAMOptions{Capacity: 1 << 20, SlabSize: 64 << 10})
	if err != nil {
		t.Fatal(err)
	}
	val := make([]byte, 10000)
	loc, err := d.Put(testKey(1), val)
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	started := make(chan struct{}, 4)
	for w := range 4 {
		wg.Go(func() {
			started <- struct{}{}
			dst := make([]byte, len(val))
			for i := range 100000 {
				var err error
				if w%2 == 0 {
					err = d.Read(loc, dst)
				} else {
					var l Loc
					if l, err = d.Put(testKey(uint64(i)), val); err == nil {
						d.Free(l)
					} else if errors.Is(err, ErrFull) {
						err = nil
					}
				}
				if errors.Is(err, ErrClosed) {
					return
				}
				if err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	for range 4 {
		<-started
	}
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
}

func TestDRAMFreeTwicePanics(t *testing.T) {
	d := newTestDRAM(t, DRAMOptions{Capacity: 1 << 20, SlabSize: 64 << 10})
	a, _ := d.Put(testKey(1), make([]byte, 100))
	if _, err := d.Put(testKey(2), make([]byte, 100)); err != nil {
		t.Fatal(err)
	}
	d.Free(a)
	defer func() {
		if r := recover(); r == nil || !strings.Contains(fmt.Sprint(r), "double free") {
			t.Fatalf("second Free: recovered %v, want a double-free panic", r)
		}
	}()
	d.Free(a)
}

func TestDRAMOptions(t *testing.T) {
	var o DRAMOptions
	o.EnsureDefaults()
	if o.Capacity != DefaultDRAMCapacity || o.SlabSize != DefaultSlabSize {
		t.Fatalf("defaults: %+v", o)
	}
	if err := o.Validate(); err != nil {
		t.Fatalf("defaults do not validate: %v", err)
	}
	small := DRAMOptions{Capacity: 100 << 10}
	small.EnsureDefaults()
	if err := small.Validate(); err != nil || small.SlabSize != 100<<10 {
		t.Fatalf("capacity below one default slab: %+v, %v", small, err)
	}
	for _, tc := range []struct {
		opts  DRAMOptions
		field string
	}{
		{DRAMOptions{Capacity: -1}, "DRAMOptions.Capacity"},
		{DRAMOptions{Capacity: 100}, "DRAMOptions.Capacity"},
		{DRAMOptions{Capacity: 1 << 20, SlabSize: 2 << 20}, "DRAMOptions.Capacity"},
		{DRAMOptions{Capacity: 1 << 50, SlabSize: 4096}, "DRAMOptions.Capacity"},
		{DRAMOptions{SlabSize: 1000}, "DRAMOptions.SlabSize"},
		{DRAMOptions{SlabSize: 64<<10 + 64}, "DRAMOptions.SlabSize"},
		{DRAMOptions{SlabSize: 2 << 30}, "DRAMOptions.SlabSize"},
		{DRAMOptions{SlabSize: -4096}, "DRAMOptions.SlabSize"},
	} {
		tc.opts.EnsureDefaults()
		err := tc.opts.Validate()
		if err == nil || !strings.Contains(err.Error(), tc.field) {
			t.Errorf("%+v: Validate() = %v, want an error naming %s", tc.opts, err, tc.field)
			continue
		}
		if _, nerr := NewDRAM(tc.opts); nerr == nil || nerr.Error() != err.Error() {
			t.Errorf("%+v: NewDRAM error %v, Validate %v", tc.opts, nerr, err)
		}
	}
}
