package tiers

import (
	"bytes"
	"encoding/binary"
	"errors"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2"

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

// TestNVMeCorruption damages segment files behind the tier's back: every
// value is then read back intact, reported ErrCorrupt, or (if the file got
// shorter) not recovered at all. Never wrong bytes.
func TestNVMeCorruption(t *testing.T) {
	for _, tc := range []struct {
		name   string
		damage func(t *testing.T, path string, rng *rand.Rand)
	}{
		{"flip value bytes", func(t *testing.T, path string, rng *rand.Rand) {
			nvmeFlipBytes(t, path, rng, 20, func(off int64) bool { return off%segAlign < segAlign-segHeaderSize })
		}},
		{"flip header bytes", func(t *testing.T, path string, rng *rand.Rand) {
			nvmeFlipBytes(t, path, rng, 20, func(off int64) bool { return off%segAlign >= segAlign-segHeaderSize })
		}},
		{"truncate", func(t *testing.T, path string, rng *rand.Rand) {
			fi, err := os.Stat(path)
			if err != nil {
				t.Fatal(err)
			}
			if err := os.Truncate(path, rng.Int64N(fi.Size()-1)); err != nil {
				t.Fatal(err)
			}
		}},
		{"zero a block", func(t *testing.T, path string, rng *rand.Rand) {
			fi, err := os.Stat(path)
			if err != nil {
				t.Fatal(err)
			}
			f, err := os.OpenFile(path, os.O_WRONLY, 0)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			if _, err := f.WriteAt(make([]byte, segAlign), rng.Int64N(fi.Size()/segAlign)*segAlign); err != nil {
				t.Fatal(err)
			}
		}},
		{"swap two blocks", func(t *testing.T, path string, rng *rand.Rand) {
			b, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			blocks := int64(len(b)) / segAlign
			if blocks < 2 {
				t.Fatalf("segment of %d bytes", len(b))
			}
			i := rng.Int64N(blocks)
			j := (i + 1 + rng.Int64N(blocks-1)) % blocks
			bi := slices.Clone(b[i*segAlign : (i+1)*segAlign])
			copy(b[i*segAlign:], b[j*segAlign:(j+1)*segAlign])
			copy(b[j*segAlign:], bi)
			if err := os.WriteFile(path, b, 0o644); err != nil {
				t.Fatal(err)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rng := rand.New(rand.NewPCG(3, uint64(len(tc.name))))
			opts := nvmeTestOptions(t.TempDir())
			n := openTestNVMe(t, opts)
			written := make(map[Loc]prefixhash.Key)
			for i := range 30 {
				k := nvmeTestKey(uint64(i))
				loc, err := n.Put(k, nvmeTestVal(k, int(k.Lo()%9000)))
				if err != nil {
					t.Fatalf("Put: %v", err)
				}
				written[loc] = k
			}
			n.Close()
			// Reopen once, so that files end at their last record and
			// every byte damaged below belongs to one.
			openTestNVMe(t, opts).Close()
			paths, _ := filepath.Glob(filepath.Join(opts.Dir, "segments", "*"+segFileSuffix))
			if len(paths) == 0 {
				t.Fatal("no segment files")
			}
			for _, p := range paths {
				tc.damage(t, p, rng)
			}
			n = openTestNVMe(t, opts)
			defer n.Close()
			var intact, corrupt int
			for loc, r := range nvmeRangeAll(t, n) {
				k, ok := written[loc]
				if !ok || k != r.Key || r.Len != int(k.Lo()%9000) {
					t.Fatalf("Range reports %+v, never written", r)
				}
				got := make([]byte, r.Len)
				switch err := n.Read(loc, got); {
				case err == nil:
					if !bytes.Equal(got, nvmeTestVal(k, r.Len)) {
						t.Fatalf("Read(%x) returned wrong bytes", loc)
					}
					intact++
				case errors.Is(err, ErrCorrupt):
					corrupt++
				default:
					t.Fatalf("Read(%x) = %v, want nil or ErrCorrupt", loc, err)
				}
			}
			t.Logf("%d intact, %d corrupt, %d not recovered", intact, corrupt, len(written)-intact-corrupt)
			if intact == len(written) {
				t.Fatalf("damage went unnoticed: all %d values intact", intact)
			}
		})
	}
}

// nvmeFlipBytes flips count random bytes of the file at offsets that pick
// accepts, within written records (the file's extent).
func nvmeFlipBytes(t *testing.T, path string, rng *rand.Rand, count int, pick func(off int64) bool) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	for flipped := 0; flipped < count; {
		off := rng.Int64N(int64(len(b)))
		if !pick(off) {
			continue
		}
		b[off] ^= byte(1 + rng.IntN(255))
		flipped++
	}
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestNVMeTornTail: bytes past the last indexed record of a segment (a write
// that was not acknowledged) are cut off on open; so are index entries whose
// segment file is gone, and segments no entry names.
func TestNVMeTornTail(t *testing.T) {
	opts := nvmeTestOptions(t.TempDir())
	n := openTestNVMe(t, opts)
	k := nvmeTestKey(1)
	loc, err := n.Put(k, nvmeTestVal(k, 6000))
	if err != nil {
		t.Fatal(err)
	}
	n.Close()
	segs := filepath.Join(opts.Dir, "segments")
	path := filepath.Join(segs, segFileName(locSeg(loc)))
	// A torn record after the last one: garbage and a valid-looking header.
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	var hdr [segHeaderSize]byte
	encodeSegHeader(hdr[:], segHeader{loc: segLoc(locSeg(loc), 8192), key: nvmeTestKey(2), n: 100})
	if _, err := f.WriteAt(hdr[:], 8192+segAlign-segHeaderSize); err != nil {
		t.Fatal(err)
	}
	f.Close()
	// A segment file no entry names, and an entry naming a missing file.
	if err := os.WriteFile(filepath.Join(segs, segFileName(locSeg(loc)+5)), make([]byte, segAlign), 0o644); err != nil {
		t.Fatal(err)
	}
	n = openTestNVMe(t, opts)
	k9 := nvmeTestKey(9)
	loc9, err := n.Put(k9, nvmeTestVal(k9, 10))
	if err != nil {
		t.Fatal(err)
	}
	n.Close()
	if err := os.Remove(filepath.Join(segs, segFileName(locSeg(loc9)))); err != nil {
		t.Fatal(err)
	}

	n = openTestNVMe(t, opts)
	defer n.Close()
	if got := nvmeRangeAll(t, n); len(got) != 1 || got[loc] != (Record{Key: k, Loc: loc, Len: 6000}) {
		t.Fatalf("Range = %+v, want only %x", got, loc)
	}
	nvmeMustRead(t, n, loc, nvmeTestVal(k, 6000))
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Size() != segRecordLen(6000) {
		t.Fatalf("segment is %d bytes after open, want its one record (%d)", fi.Size(), segRecordLen(6000))
	}
	if _, err := os.Stat(filepath.Join(segs, segFileName(locSeg(loc)+5))); !os.IsNotExist(err) {
		t.Fatalf("unindexed segment survived open: %v", err)
	}
	if st := n.Stats(); st.Values != 1 || st.Reserved != segRecordLen(6000) {
		t.Fatalf("Stats = %+v", st)
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

// TestNVMeRecoveryVerifiesNewestSegment: on open, the records of the newest
// segment are read back and a damaged one is dropped; older segments are
// checked on Read.
func TestNVMeRecoveryVerifiesNewestSegment(t *testing.T) {
	opts := nvmeTestOptions(t.TempDir())
	opts.SegmentSize = 16 << 10 // two 5000-byte values per segment
	n := openTestNVMe(t, opts)
	var locs []Loc
	var keys []prefixhash.Key
	for i := range 4 {
		k := nvmeTestKey(uint64(i))
		loc, err := n.Put(k, nvmeTestVal(k, 5000))
		if err != nil {
			t.Fatal(err)
		}
		locs, keys = append(locs, loc), append(keys, k)
	}
	n.Close()
	if locSeg(locs[0]) != locSeg(locs[1]) || locSeg(locs[2]) != locSeg(locs[3]) || locSeg(locs[1]) == locSeg(locs[2]) {
		t.Fatalf("unexpected layout %x", locs)
	}
	for _, l := range []Loc{locs[0], locs[2]} {
		f, err := os.OpenFile(filepath.Join(opts.Dir, "segments", segFileName(locSeg(l))), os.O_RDWR, 0)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := f.WriteAt([]byte{0xff, 0xfe}, locOff(l)+100); err != nil {
			t.Fatal(err)
		}
		f.Close()
	}
	n = openTestNVMe(t, opts)
	defer n.Close()
	got := nvmeRangeAll(t, n)
	if _, ok := got[locs[2]]; ok || len(got) != 3 {
		t.Fatalf("Range = %+v: want all but the damaged value of the newest segment", got)
	}
	if err := n.Read(locs[0], make([]byte, 5000)); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("Read of a damaged value = %v, want ErrCorrupt", err)
	}
	nvmeMustRead(t, n, locs[1], nvmeTestVal(keys[1], 5000))
	nvmeMustRead(t, n, locs[3], nvmeTestVal(keys[3], 5000))
}

// TestNVMeDropsOtherFormat: segments an older kvmesh wrote (index format
// kvmesh-nvme-1, xxhash64 keys) are dropped on open, files and index
// entries, with one log line saying how much and why; the tier then serves
// new writes, and they survive the next reopen without another drop.
func TestNVMeDropsOtherFormat(t *testing.T) {
	opts := nvmeTestOptions(t.TempDir())
	n := openTestNVMe(t, opts)
	for i := range 4 {
		k := nvmeTestKey(uint64(i))
		if _, err := n.Put(k, nvmeTestVal(k, 40<<10)); err != nil { // one per 64 KiB segment
			t.Fatal(err)
		}
	}
	if err := n.Close(); err != nil {
		t.Fatal(err)
	}
	segFiles := func() (int, int64) {
		ents, err := os.ReadDir(filepath.Join(opts.Dir, "segments"))
		if err != nil {
			t.Fatal(err)
		}
		var c int
		var size int64
		for _, e := range ents {
			if _, ok := parseSegFileName(e.Name()); ok {
				fi, _ := e.Info()
				c, size = c+1, size+fi.Size()
			}
		}
		return c, size
	}
	wantSegs, wantBytes := segFiles()
	if wantSegs < 4 {
		t.Fatalf("%d segment files, want at least 4", wantSegs)
	}
	setIndexFormat(t, opts.Dir, "kvmesh-nvme-1")

	var logs bytes.Buffer
	opts.Logger = slog.New(slog.NewTextHandler(&logs, nil))
	n = openTestNVMe(t, opts)
	if recs := nvmeRangeAll(t, n); len(recs) != 0 {
		t.Fatalf("%d records survived a format change", len(recs))
	}
	if st := n.Stats(); st.Values != 0 || st.Stored != 0 || st.Reserved != 0 {
		t.Fatalf("Stats after the drop = %+v", st)
	}
	if c, _ := segFiles(); c != 0 {
		t.Fatalf("%d segment files left", c)
	}
	var drops []string
	for _, line := range strings.Split(logs.String(), "\n") {
		if strings.Contains(line, "dropped segments") {
			drops = append(drops, line)
		}
	}
	if len(drops) != 1 {
		t.Fatalf("want one line about the drop, got %q", logs.String())
	}
	for _, want := range []string{"segments=" + itoa(wantSegs), "values=4", "bytes=" + itoa(int(wantBytes)), "format=kvmesh-nvme-1", "key_version=" + itoa(prefixhash.KeyVersion)} {
		if !strings.Contains(drops[0], want) {
			t.Errorf("drop line %q lacks %q", drops[0], want)
		}
	}
	k := nvmeTestKey(100)
	loc, err := n.Put(k, nvmeTestVal(k, 5000))
	if err != nil {
		t.Fatalf("Put after the drop: %v", err)
	}
	nvmeMustRead(t, n, loc, nvmeTestVal(k, 5000))
	if err := n.Close(); err != nil {
		t.Fatal(err)
	}

	logs.Reset()
	n = openTestNVMe(t, opts)
	defer n.Close()
	if recs := nvmeRangeAll(t, n); len(recs) != 1 || recs[loc].Key != k {
		t.Fatalf("after reopen: %+v, want the one new record", recs)
	}
	nvmeMustRead(t, n, loc, nvmeTestVal(k, 5000))
	if strings.Contains(logs.String(), "dropped segments") {
		t.Fatalf("a reopen of the current format dropped segments: %s", logs.String())
	}
}

// TestNVMeRefusesForeignIndex: an index that is not kvmesh-nvme's is an
// error, not something to clear.
func TestNVMeRefusesForeignIndex(t *testing.T) {
	opts := nvmeTestOptions(t.TempDir())
	n := openTestNVMe(t, opts)
	if err := n.Close(); err != nil {
		t.Fatal(err)
	}
	setIndexFormat(t, opts.Dir, "someone-else-1")
	if n, err := OpenNVMe(opts); err == nil {
		n.Close()
		t.Fatal("OpenNVMe accepted a foreign index")
	}
}

func setIndexFormat(t *testing.T, dir, format string) {
	t.Helper()
	db, err := pebble.Open(filepath.Join(dir, "index"), &pebble.Options{Logger: nvmePebbleLogger{slog.New(slog.DiscardHandler)}})
	if err != nil {
		t.Fatal(err)
	}
	if err := db.Set(idxFormatKey, []byte(format), pebble.Sync); err != nil {
		t.Fatal(err)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
}

func itoa(n int) string { return strconv.Itoa(n) }
