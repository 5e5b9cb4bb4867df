package tiers

import (
	"errors"
	"sync"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/kvmesh/kvmesh/prefixhash"
)

// faultFiles is the NVMe tier's file operations with faults injected
// (pebble's errorfs): an op ("write", "read", "sync") can fail with a
// given error instead of reaching the system, and writes and reads can be
// short, moving about half of what was asked (in whole 4 KiB blocks, as
// O_DIRECT transfers are), as a kernel may.
type faultFiles struct {
	fileOps
	mu    sync.Mutex
	fail  map[string]error
	short bool
	calls map[string]int // calls that reached the system, by op
}

func newFaultFiles() *faultFiles {
	return &faultFiles{fileOps: sysFiles{}, fail: map[string]error{}, calls: map[string]int{}}
}

// set makes op fail with err from now on; nil heals it.
func (f *faultFiles) set(op string, err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.fail[op] = err
}

func (f *faultFiles) setShort(short bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.short = short
}

// before returns op's injected error, or counts the call and says whether
// it is to be short.
func (f *faultFiles) before(op string) (bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.fail[op]; err != nil {
		return false, err
	}
	f.calls[op]++
	return f.short, nil
}

func (f *faultFiles) count(op string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.calls[op]
}

// shorten returns the first half of iov's bytes, rounded down to whole
// 4 KiB blocks; iov itself when it is a block or less.
func shorten(iov [][]byte) [][]byte {
	total := 0
	for _, b := range iov {
		total += len(b)
	}
	want := (total / 2) &^ (segAlign - 1)
	if want == 0 {
		return iov
	}
	var out [][]byte
	for _, b := range iov {
		if want == 0 {
			break
		}
		n := min(len(b), want)
		out, want = append(out, b[:n]), want-n
	}
	return out
}

func (f *faultFiles) Pwritev(fd int, iov [][]byte, off int64) (int, error) {
	short, err := f.before("write")
	if err != nil {
		return 0, err
	}
	if short {
		iov = shorten(iov)
	}
	return f.fileOps.Pwritev(fd, iov, off)
}

func (f *faultFiles) Preadv(fd int, iov [][]byte, off int64) (int, error) {
	short, err := f.before("read")
	if err != nil {
		return 0, err
	}
	if short {
		iov = shorten(iov)
	}
	return f.fileOps.Preadv(fd, iov, off)
}

func (f *faultFiles) Fdatasync(fd int) error {
	if _, err := f.before("sync"); err != nil {
		return err
	}
	return f.fileOps.Fdatasync(fd)
}

// TestNVMeShortTransfers: writes and reads that the kernel cuts short are
// finished by the tier; what it stored reads back whole, before and after a
// reopen.
func TestNVMeShortTransfers(t *testing.T) {
	opts := nvmeTestOptions(t.TempDir())
	n := openTestNVMe(t, opts)
	ff := newFaultFiles()
	ff.setShort(true)
	n.files = ff
	sizes := []int{100, 5000, 20_000, 40_000}
	locs := make([]Loc, len(sizes))
	for i, sz := range sizes {
		k := nvmeTestKey(uint64(i))
		loc, err := n.Put(k, nvmeTestVal(k, sz))
		if err != nil {
			t.Fatalf("Put of %d bytes with short writes: %v", sz, err)
		}
		locs[i] = loc
	}
	for i, sz := range sizes {
		k := nvmeTestKey(uint64(i))
		nvmeMustRead(t, n, locs[i], nvmeTestVal(k, sz))
	}
	if ff.count("write") <= len(sizes)/2 || ff.count("read") <= len(sizes) {
		t.Fatalf("%d writes, %d reads reached the files: the short transfers were not retried", ff.count("write"), ff.count("read"))
	}
	n.Close()
	n = openTestNVMe(t, opts)
	defer n.Close()
	for i, sz := range sizes {
		k := nvmeTestKey(uint64(i))
		nvmeMustRead(t, n, locs[i], nvmeTestVal(k, sz))
	}
}

// TestNVMeReadErrors: a read that fails (EIO) or finds the file short is
// reported as ErrCorrupt, with the cause, and leaves the value in place: the
// next read, the disk healed, returns it.
func TestNVMeReadErrors(t *testing.T) {
	n := openTestNVMe(t, nvmeTestOptions(t.TempDir()))
	defer n.Close()
	ff := newFaultFiles()
	n.files = ff
	k := nvmeTestKey(7)
	loc, err := n.Put(k, nvmeTestVal(k, 9000))
	if err != nil {
		t.Fatal(err)
	}
	ff.set("read", unix.EIO)
	dst := make([]byte, 9000)
	if err := n.Read(loc, dst); !errors.Is(err, ErrCorrupt) || !errors.Is(err, unix.EIO) {
		t.Fatalf("Read with EIO = %v, want ErrCorrupt wrapping EIO", err)
	}
	ff.set("read", nil)
	nvmeMustRead(t, n, loc, nvmeTestVal(k, 9000))
	if st := n.Stats(); st.Values != 1 {
		t.Fatalf("after a failed read the tier holds %d values, want 1", st.Values)
	}
}

// TestNVMeWriteErrors: a failed write or sync fails the Puts of its group
// (a full disk as ErrFull), indexes nothing, and the tier carries on in a new
// segment; the broken one is sealed, so the owner can drop it.
func TestNVMeWriteErrors(t *testing.T) {
	for _, tc := range []struct {
		op      string
		err     error
		wantErr error
	}{
		{"write", unix.ENOSPC, ErrFull},
		{"write", unix.EIO, unix.EIO},
		{"sync", unix.ENOSPC, ErrFull},
		{"sync", unix.EIO, unix.EIO},
	} {
		t.Run(tc.op+"/"+tc.err.Error(), func(t *testing.T) {
			opts := nvmeTestOptions(t.TempDir())
			n := openTestNVMe(t, opts)
			ff := newFaultFiles()
			n.files = ff
			k1, k2, k3 := nvmeTestKey(1), nvmeTestKey(2), nvmeTestKey(3)
			loc1, err := n.Put(k1, nvmeTestVal(k1, 5000))
			if err != nil {
				t.Fatal(err)
			}
			before := n.Stats()
			ff.set(tc.op, tc.err)
			if _, err := n.Put(k2, nvmeTestVal(k2, 50_000)); !errors.Is(err, tc.wantErr) {
				t.Fatalf("Put with a failing %s = %v, want %v", tc.op, err, tc.wantErr)
			}
			locs := make([]Loc, 2)
			if stored, err := n.PutBatch([]prefixhash.Key{k2, k3}, [][]byte{nvmeTestVal(k2, 10), nvmeTestVal(k3, 10)}, locs); stored != 0 || !errors.Is(err, tc.wantErr) {
				t.Fatalf("PutBatch with a failing %s = %d, %v", tc.op, stored, err)
			}
			ff.set(tc.op, nil)
			if st := n.Stats(); st.Values != before.Values || st.Stored != before.Stored {
				t.Fatalf("Stats after failed Puts = %+v, before %+v", st, before)
			}
			loc3, err := n.Put(k3, nvmeTestVal(k3, 7000))
			if err != nil {
				t.Fatalf("Put after the fault: %v", err)
			}
			if locSeg(loc3) == locSeg(loc1) {
				t.Fatalf("Put after a failed %s went to the broken segment %d", tc.op, locSeg(loc1))
			}
			seg, recs, ok, err := n.OldestSegment()
			if err != nil || !ok || seg != locSeg(loc1) || len(recs) != 1 || recs[0].Loc != loc1 {
				t.Fatalf("OldestSegment = %d, %+v, %v, %v; want the broken segment %d with its one value", seg, recs, ok, err, locSeg(loc1))
			}
			nvmeMustRead(t, n, loc1, nvmeTestVal(k1, 5000))
			n.Close()
			n = openTestNVMe(t, opts)
			defer n.Close()
			got := nvmeRangeAll(t, n)
			if len(got) != 2 || got[loc1].Key != k1 || got[loc3].Key != k3 {
				t.Fatalf("Range after reopen = %+v", got)
			}
			nvmeMustRead(t, n, loc3, nvmeTestVal(k3, 7000))
		})
	}
}
