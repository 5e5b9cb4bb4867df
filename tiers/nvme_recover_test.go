package tiers

import (
	"bytes"
	"errors"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/cockroachdb/pebble/v2"

	"github.com/kvmesh/kvmesh/prefixhash"
)

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
