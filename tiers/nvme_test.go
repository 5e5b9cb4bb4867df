package tiers

import (
	"bytes"
	"encoding/binary"
	"errors"
	"log/slog"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/prefixhash"
)

// nvmeTestKey returns the i-th test key.
func nvmeTestKey(i uint64) prefixhash.Key {
	return prefixhash.BlockKey(prefixhash.Key{}, []uint32{uint32(i), uint32(i >> 32)})
}

// nvmeTestVal returns the n-byte value the tests store under k: a function
// of k, so that a reader can check what it reads without remembering it.
func nvmeTestVal(k prefixhash.Key, n int) []byte {
	v := make([]byte, n)
	x := k.Hi() ^ k.Lo() | 1
	for i := 0; i < n; i += 8 {
		x ^= x << 13
		x ^= x >> 7
		x ^= x << 17
		var b [8]byte
		binary.LittleEndian.PutUint64(b[:], x)
		copy(v[i:], b[:])
	}
	return v
}

func nvmeTestOptions(dir string) NVMeOptions {
	return NVMeOptions{
		Dir:          dir,
		SegmentSize:  64 << 10,
		Capacity:     1 << 20,
		WriteBuffer:  16 << 10,
		DiskHeadroom: -1,
		Logger:       slog.New(slog.DiscardHandler),
	}
}

func openTestNVMe(t testing.TB, opts NVMeOptions) *NVMe {
	t.Helper()
	n, err := OpenNVMe(opts)
	if err != nil {
		t.Fatalf("OpenNVMe: %v", err)
	}
	return n
}

func nvmeMustRead(t testing.TB, n *NVMe, loc Loc, want []byte) {
	t.Helper()
	got := make([]byte, len(want))
	if err := n.Read(loc, got); err != nil {
		t.Fatalf("Read(%x): %v", loc, err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("Read(%x): wrong bytes", loc)
	}
}

func nvmeRangeAll(t testing.TB, n *NVMe) map[Loc]Record {
	t.Helper()
	m := make(map[Loc]Record)
	if err := n.Range(func(r Record) bool { m[r.Loc] = r; return true }); err != nil {
		t.Fatalf("Range: %v", err)
	}
	return m
}

func TestNVMeRoundTripAndReopen(t *testing.T) {
	opts := nvmeTestOptions(t.TempDir())
	n := openTestNVMe(t, opts)
	// Sizes around the 4 KiB record boundary, an empty value, one larger
	// than the write buffer, and the largest a segment holds.
	sizes := []int{0, 1, 100, 4096 - segHeaderSize, 4096 - segHeaderSize + 1, 4096, 40 << 10, 64<<10 - segHeaderSize}
	locs := make(map[Loc]prefixhash.Key)
	var stored int64
	for i, size := range sizes {
		k := nvmeTestKey(uint64(i))
		loc, err := n.Put(k, nvmeTestVal(k, size))
		if err != nil {
			t.Fatalf("Put(%d bytes): %v", size, err)
		}
		locs[loc] = k
		stored += int64(size)
		nvmeMustRead(t, n, loc, nvmeTestVal(k, size))
	}
	if _, err := n.Put(nvmeTestKey(99), make([]byte, 64<<10-segHeaderSize+1)); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("Put(too large) = %v, want ErrTooLarge", err)
	}
	st := n.Stats()
	if st.Values != int64(len(sizes)) || st.Stored != stored || st.Capacity != opts.Capacity || st.Reserved < stored || st.Reserved > opts.Capacity {
		t.Fatalf("Stats = %+v, want %d values, %d bytes stored", st, len(sizes), stored)
	}
	if err := n.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}

	n = openTestNVMe(t, opts)
	defer n.Close()
	got := nvmeRangeAll(t, n)
	if len(got) != len(locs) {
		t.Fatalf("Range after reopen: %d records, want %d", len(got), len(locs))
	}
	for loc, k := range locs {
		r, ok := got[loc]
		if !ok || r.Key != k {
			t.Fatalf("Range after reopen: %x = %+v, want key %v", loc, r, k)
		}
		nvmeMustRead(t, n, loc, nvmeTestVal(k, r.Len))
	}
	if st2 := n.Stats(); st2.Values != st.Values || st2.Stored != st.Stored {
		t.Fatalf("Stats after reopen = %+v, before %+v", st2, st)
	}
	// A reopened tier appends to a new segment.
	k := nvmeTestKey(100)
	loc, err := n.Put(k, nvmeTestVal(k, 5000))
	if err != nil {
		t.Fatalf("Put after reopen: %v", err)
	}
	if _, dup := locs[loc]; dup {
		t.Fatalf("Put after reopen reused location %x", loc)
	}
	nvmeMustRead(t, n, loc, nvmeTestVal(k, 5000))
}

func TestNVMeModel(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	opts := nvmeTestOptions(t.TempDir())
	opts.SegmentSize = 64 << 10
	opts.Capacity = 512 << 10
	n := openTestNVMe(t, opts)
	defer func() { n.Close() }()
	// Values of up to 10 KiB, and one in five up to 60 KiB (written and read
	// without a copy when their memory is aligned, which a test value's is
	// from 32 KiB up unless unaligned() moves it).
	randSize := func() int {
		if rng.IntN(5) == 0 {
			return rng.IntN(60 << 10)
		}
		return rng.IntN(10 << 10)
	}
	unaligned := func(v []byte) []byte {
		if rng.IntN(3) != 0 {
			return v
		}
		b := make([]byte, len(v)+1)
		copy(b[1:], v)
		return b[1:]
	}

	type entry struct {
		key prefixhash.Key
		n   int
	}
	model := make(map[Loc]entry)
	var nextKey uint64
	randLoc := func() (Loc, bool) {
		if len(model) == 0 {
			return 0, false
		}
		locs := slices.Sorted(func(yield func(Loc) bool) {
			for l := range model {
				if !yield(l) {
					return
				}
			}
		})
		return locs[rng.IntN(len(locs))], true
	}
	dropOldest := func() {
		t.Helper()
		seg, recs, ok, err := n.OldestSegment()
		if err != nil || !ok {
			t.Fatalf("OldestSegment = %d, %v, %v", seg, ok, err)
		}
		inSeg := 0
		for l, e := range model {
			if locSeg(l) == seg {
				inSeg++
				if !slices.Contains(recs, Record{Key: e.key, Loc: l, Len: e.n}) {
					t.Fatalf("OldestSegment %d does not list %x", seg, l)
				}
			}
		}
		if inSeg != len(recs) {
			t.Fatalf("OldestSegment %d lists %d values, model has %d", seg, len(recs), inSeg)
		}
		if err := n.DropSegment(seg); err != nil {
			t.Fatalf("DropSegment(%d): %v", seg, err)
		}
		for _, r := range recs {
			delete(model, r.Loc)
		}
	}
	put := func(keys []prefixhash.Key, sizes []int) {
		t.Helper()
		vals := make([][]byte, len(keys))
		for i := range keys {
			vals[i] = unaligned(nvmeTestVal(keys[i], sizes[i]))
		}
		locs := make([]Loc, len(keys))
		for attempt := 0; ; attempt++ {
			var stored int
			var err error
			if len(keys) == 1 && rng.IntN(2) == 0 {
				locs[0], err = n.Put(keys[0], vals[0])
				if err == nil {
					stored = 1
				}
			} else {
				stored, err = n.PutBatch(keys, vals, locs)
			}
			for i := range stored {
				model[locs[i]] = entry{keys[i], sizes[i]}
			}
			keys, vals, sizes, locs = keys[stored:], vals[stored:], sizes[stored:], locs[stored:]
			if err == nil {
				return
			}
			if !errors.Is(err, ErrFull) || attempt > 3 {
				t.Fatalf("put: %v", err)
			}
			dropOldest()
		}
	}

	for op := range 1000 {
		switch p := rng.IntN(100); {
		case p < 35:
			nextKey++
			put([]prefixhash.Key{nvmeTestKey(nextKey)}, []int{randSize()})
		case p < 45:
			var keys []prefixhash.Key
			var sizes []int
			for range 1 + rng.IntN(6) {
				nextKey++
				keys = append(keys, nvmeTestKey(nextKey))
				sizes = append(sizes, randSize())
			}
			put(keys, sizes)
		case p < 70:
			if l, ok := randLoc(); ok {
				e := model[l]
				want := nvmeTestVal(e.key, e.n)
				got := unaligned(make([]byte, e.n))
				if err := n.Read(l, got); err != nil || !bytes.Equal(got, want) {
					t.Fatalf("op %d: Read(%x) = %v or wrong bytes", op, l, err)
				}
			}
		case p < 85:
			if l, ok := randLoc(); ok {
				n.Free(l)
				delete(model, l)
			}
		case p < 92:
			if _, _, ok, _ := n.OldestSegment(); ok {
				dropOldest()
			}
		case p < 95:
			if err := n.Close(); err != nil {
				t.Fatalf("op %d: Close: %v", op, err)
			}
			n = openTestNVMe(t, opts)
			got := nvmeRangeAll(t, n)
			if len(got) != len(model) {
				t.Fatalf("op %d: Range after reopen: %d records, model %d", op, len(got), len(model))
			}
			for l, e := range model {
				if got[l] != (Record{Key: e.key, Loc: l, Len: e.n}) {
					t.Fatalf("op %d: Range after reopen: %x = %+v, model %+v", op, l, got[l], e)
				}
			}
		default:
			st := n.Stats()
			var stored int64
			for _, e := range model {
				stored += int64(e.n)
			}
			if st.Values != int64(len(model)) || st.Stored != stored || st.Reserved > opts.Capacity {
				t.Fatalf("op %d: Stats = %+v, model has %d values, %d bytes", op, st, len(model), stored)
			}
		}
	}
}

func TestNVMeFullAndDrop(t *testing.T) {
	opts := nvmeTestOptions(t.TempDir())
	opts.SegmentSize = 16 << 10 // three 4 KiB records per segment (plus a 4 KiB tail)
	opts.Capacity = 48 << 10    // three segments
	n := openTestNVMe(t, opts)
	defer n.Close()
	if _, _, ok, err := n.OldestSegment(); ok || err != nil {
		t.Fatalf("OldestSegment on an empty tier = %v, %v", ok, err)
	}
	var locs []Loc
	var keys []prefixhash.Key
	var full error
	for i := range 100 {
		k := nvmeTestKey(uint64(i))
		loc, err := n.Put(k, nvmeTestVal(k, 5000)) // two 4 KiB blocks each
		if err != nil {
			full = err
			break
		}
		locs, keys = append(locs, loc), append(keys, k)
	}
	if !errors.Is(full, ErrFull) {
		t.Fatalf("Put into a full tier = %v, want ErrFull", full)
	}
	if len(locs) != 6 {
		t.Fatalf("%d values fit, want 6 (two per segment, three segments)", len(locs))
	}
	if st := n.Stats(); st.Reserved != opts.Capacity || st.Values != 6 {
		t.Fatalf("Stats = %+v, want Reserved %d and 6 values", st, opts.Capacity)
	}
	seg, recs, ok, err := n.OldestSegment()
	if err != nil || !ok {
		t.Fatalf("OldestSegment: %v, %v", ok, err)
	}
	want := []Record{{keys[0], locs[0], 5000}, {keys[1], locs[1], 5000}}
	if !slices.Equal(recs, want) {
		t.Fatalf("OldestSegment = %d, %+v; want %+v", seg, recs, want)
	}
	n.Free(locs[1])
	if _, recs, _, _ = n.OldestSegment(); !slices.Equal(recs, want[:1]) {
		t.Fatalf("OldestSegment after Free = %+v; want %+v", recs, want[:1])
	}
	if err := n.DropSegment(seg); err != nil {
		t.Fatalf("DropSegment: %v", err)
	}
	if err := n.DropSegment(seg); err != nil {
		t.Fatalf("DropSegment twice: %v", err)
	}
	if err := n.Read(locs[0], make([]byte, 5000)); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("Read of a dropped value = %v, want ErrCorrupt", err)
	}
	if st := n.Stats(); st.Reserved != opts.Capacity-opts.SegmentSize || st.Values != 4 || st.Stored != 4*5000 {
		t.Fatalf("Stats after drop = %+v", st)
	}
	k := nvmeTestKey(1000)
	loc, err := n.Put(k, nvmeTestVal(k, 5000))
	if err != nil {
		t.Fatalf("Put after drop: %v", err)
	}
	nvmeMustRead(t, n, loc, nvmeTestVal(k, 5000))
	for i := 2; i < 6; i++ {
		nvmeMustRead(t, n, locs[i], nvmeTestVal(keys[i], 5000))
	}
	// The segment being written cannot be dropped.
	if err := n.DropSegment(locSeg(loc)); err == nil {
		t.Fatalf("DropSegment of the active segment succeeded")
	}
	// A batch stops at the first value that does not fit and says how many
	// it stored.
	bk := []prefixhash.Key{nvmeTestKey(2000), nvmeTestKey(2001), nvmeTestKey(2002)}
	bv := [][]byte{nvmeTestVal(bk[0], 5000), make([]byte, 1<<20), nvmeTestVal(bk[2], 10)}
	bl := make([]Loc, 3)
	if stored, err := n.PutBatch(bk, bv, bl); stored != 1 || !errors.Is(err, ErrTooLarge) {
		t.Fatalf("PutBatch with a too-large value = %d, %v; want 1, ErrTooLarge", stored, err)
	}
	nvmeMustRead(t, n, bl[0], bv[0])
}

func TestNVMeDropWhileReading(t *testing.T) {
	opts := nvmeTestOptions(t.TempDir())
	opts.SegmentSize = 16 << 10
	n := openTestNVMe(t, opts)
	defer n.Close()
	const count = 40
	keys := make([]prefixhash.Key, count)
	locs := make([]Loc, count)
	vals := make([][]byte, count)
	for i := range keys {
		keys[i] = nvmeTestKey(uint64(i))
		vals[i] = nvmeTestVal(keys[i], 3000)
	}
	if stored, err := n.PutBatch(keys, vals, locs); stored != count || err != nil {
		t.Fatalf("PutBatch = %d, %v", stored, err)
	}
	var wg sync.WaitGroup
	stop := make(chan struct{})
	for r := range 4 {
		wg.Go(func() {
			buf := make([]byte, 3000)
			for i := r; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				j := i % count
				err := n.Read(locs[j], buf)
				if err == nil && !bytes.Equal(buf, vals[j]) {
					t.Errorf("Read(%x) returned wrong bytes", locs[j])
					return
				}
				if err != nil && !errors.Is(err, ErrCorrupt) {
					t.Errorf("Read(%x) = %v, want nil or ErrCorrupt", locs[j], err)
					return
				}
			}
		})
	}
	for {
		seg, _, ok, err := n.OldestSegment()
		if err != nil {
			t.Fatalf("OldestSegment: %v", err)
		}
		if !ok {
			break
		}
		if err := n.DropSegment(seg); err != nil {
			t.Fatalf("DropSegment: %v", err)
		}
	}
	close(stop)
	wg.Wait()
}

func TestNVMeConcurrentPuts(t *testing.T) {
	opts := nvmeTestOptions(t.TempDir())
	opts.Capacity = 8 << 20
	n := openTestNVMe(t, opts)
	const writers, each = 8, 40
	type put struct {
		loc Loc
		key prefixhash.Key
		n   int
	}
	results := make([][]put, writers)
	var wg sync.WaitGroup
	for w := range writers {
		wg.Go(func() {
			for i := range each {
				k := nvmeTestKey(uint64(w*each + i))
				size := (w*each + i) * 97 % 9000
				if i%4 == 3 {
					keys := []prefixhash.Key{k, nvmeTestKey(uint64(1e6 + w*each + i))}
					vals := [][]byte{nvmeTestVal(keys[0], size), nvmeTestVal(keys[1], 100)}
					locs := make([]Loc, 2)
					if stored, err := n.PutBatch(keys, vals, locs); stored != 2 || err != nil {
						t.Errorf("PutBatch = %d, %v", stored, err)
						return
					}
					results[w] = append(results[w], put{locs[0], keys[0], size}, put{locs[1], keys[1], 100})
					continue
				}
				loc, err := n.Put(k, nvmeTestVal(k, size))
				if err != nil {
					t.Errorf("Put: %v", err)
					return
				}
				results[w] = append(results[w], put{loc, k, size})
			}
		})
	}
	wg.Wait()
	if t.Failed() {
		n.Close()
		return
	}
	seen := make(map[Loc]bool)
	for _, rs := range results {
		for _, p := range rs {
			if seen[p.loc] {
				t.Fatalf("location %x handed out twice", p.loc)
			}
			seen[p.loc] = true
			nvmeMustRead(t, n, p.loc, nvmeTestVal(p.key, p.n))
		}
	}
	n.Close()
	n = openTestNVMe(t, opts)
	defer n.Close()
	got := nvmeRangeAll(t, n)
	for _, rs := range results {
		for _, p := range rs {
			if got[p.loc] != (Record{Key: p.key, Loc: p.loc, Len: p.n}) {
				t.Fatalf("after reopen %x = %+v", p.loc, got[p.loc])
			}
		}
	}
}

func TestNVMeOptionsValidate(t *testing.T) {
	base := NVMeOptions{Dir: "x"}
	base.EnsureDefaults()
	if err := base.Validate(); err != nil {
		t.Fatalf("defaults: %v", err)
	}
	if base.SegmentSize != 64<<20 || base.Capacity != 10<<30 || base.WriteBuffer != 4<<20 || base.QueueDepth != 256 || base.DiskHeadroom != 256<<20 || base.Logger == nil {
		t.Fatalf("defaults = %+v", base)
	}
	for _, tc := range []struct {
		field string
		set   func(o *NVMeOptions)
	}{
		{"Dir", func(o *NVMeOptions) { o.Dir = "" }},
		{"SegmentSize", func(o *NVMeOptions) { o.SegmentSize = 100_000 }},
		{"SegmentSize", func(o *NVMeOptions) { o.SegmentSize = 8 << 10 }},
		{"SegmentSize", func(o *NVMeOptions) { o.SegmentSize = 128 << 30 }},
		{"Capacity", func(o *NVMeOptions) { o.Capacity = o.SegmentSize - 1 }},
		{"WriteBuffer", func(o *NVMeOptions) { o.WriteBuffer = 1000 }},
		{"QueueDepth", func(o *NVMeOptions) { o.QueueDepth = -1 }},
	} {
		o := base
		tc.set(&o)
		err := o.Validate()
		if err == nil || !strings.Contains(err.Error(), "NVMeOptions."+tc.field) {
			t.Errorf("Validate with bad %s = %v", tc.field, err)
		}
	}
	if _, err := OpenNVMe(NVMeOptions{}); err == nil {
		t.Errorf("OpenNVMe without Dir succeeded")
	}
}

func TestNVMeClosed(t *testing.T) {
	opts := nvmeTestOptions(t.TempDir())
	n := openTestNVMe(t, opts)
	k := nvmeTestKey(1)
	loc, err := n.Put(k, nvmeTestVal(k, 10))
	if err != nil {
		t.Fatal(err)
	}
	if err := n.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := n.Put(k, nil); !errors.Is(err, ErrClosed) {
		t.Errorf("Put after Close = %v", err)
	}
	if _, err := n.PutBatch([]prefixhash.Key{k}, [][]byte{nil}, make([]Loc, 1)); !errors.Is(err, ErrClosed) {
		t.Errorf("PutBatch after Close = %v", err)
	}
	if err := n.Read(loc, make([]byte, 10)); !errors.Is(err, ErrClosed) {
		t.Errorf("Read after Close = %v", err)
	}
	n.Free(loc)
	if _, _, _, err := n.OldestSegment(); !errors.Is(err, ErrClosed) {
		t.Errorf("OldestSegment after Close = %v", err)
	}
	if err := n.DropSegment(1); !errors.Is(err, ErrClosed) {
		t.Errorf("DropSegment after Close = %v", err)
	}
	if err := n.Range(func(Record) bool { return true }); !errors.Is(err, ErrClosed) {
		t.Errorf("Range after Close = %v", err)
	}
	if err := n.Close(); !errors.Is(err, ErrClosed) {
		t.Errorf("second Close = %v", err)
	}
}

// TestNVMeCloseWithPutsInFlight: Puts racing with Close either complete
// (durable, found after reopen) or fail with ErrClosed.
func TestNVMeCloseWithPutsInFlight(t *testing.T) {
	opts := nvmeTestOptions(t.TempDir())
	opts.Capacity = 16 << 20
	n := openTestNVMe(t, opts)
	var mu sync.Mutex
	acked := make(map[Loc]prefixhash.Key)
	enough := make(chan struct{})
	var once sync.Once
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Go(func() {
			for i := range 200 {
				k := nvmeTestKey(uint64(w<<20 | i))
				loc, err := n.Put(k, nvmeTestVal(k, 3000))
				if errors.Is(err, ErrClosed) {
					return
				}
				if err != nil {
					t.Errorf("Put: %v", err)
					return
				}
				mu.Lock()
				acked[loc] = k
				if len(acked) == 10 {
					once.Do(func() { close(enough) })
				}
				mu.Unlock()
			}
		})
	}
	// Close once some Puts have been acknowledged.
	select {
	case <-enough:
	case <-time.After(time.Minute):
		t.Fatal("no Put acknowledged within a minute")
	}
	if err := n.Close(); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	n = openTestNVMe(t, opts)
	defer n.Close()
	got := nvmeRangeAll(t, n)
	for loc, k := range acked {
		if got[loc].Key != k {
			t.Fatalf("acknowledged %x missing after reopen", loc)
		}
		nvmeMustRead(t, n, loc, nvmeTestVal(k, 3000))
	}
}

func TestNVMeBufferedIO(t *testing.T) {
	opts := nvmeTestOptions(t.TempDir())
	opts.BufferedIO = true
	n := openTestNVMe(t, opts)
	defer n.Close()
	if n.DirectIO() {
		t.Fatal("DirectIO with BufferedIO set")
	}
	k := nvmeTestKey(7)
	loc, err := n.Put(k, nvmeTestVal(k, 12345))
	if err != nil {
		t.Fatal(err)
	}
	nvmeMustRead(t, n, loc, nvmeTestVal(k, 12345))
}
