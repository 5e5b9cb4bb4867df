package tiers

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"

	"github.com/kvmesh/kvmesh/gpu/gputest"
	"github.com/kvmesh/kvmesh/prefixhash"
)

func TestHBMOptions(t *testing.T) {
	ok := HBMOptions{Capacity: 1 << 30}
	ok.EnsureDefaults()
	if ok.SlabSize != DefaultSlabSize || ok.Lanes != 4 || ok.StagingBytes != 4<<20 || ok.Validate() != nil {
		t.Fatalf("defaults: %+v, %v", ok, ok.Validate())
	}
	for _, tc := range []struct {
		opts  HBMOptions
		field string
	}{
		{HBMOptions{}, "HBMOptions.Capacity"},
		{HBMOptions{Capacity: -5}, "HBMOptions.Capacity"},
		{HBMOptions{Capacity: 1 << 30, Lanes: -1}, "HBMOptions.Lanes"},
		{HBMOptions{Capacity: 1 << 30, StagingBytes: 100}, "HBMOptions.StagingBytes"},
		{HBMOptions{Capacity: 1 << 30, SlabSize: 1000}, "HBMOptions.SlabSize"},
		{HBMOptions{Capacity: 1 << 20, SlabSize: 2 << 20}, "HBMOptions.Capacity"},
	} {
		tc.opts.EnsureDefaults()
		if err := tc.opts.Validate(); err == nil || !strings.Contains(err.Error(), tc.field) {
			t.Errorf("%+v: Validate() = %v, want an error naming %s", tc.opts, err, tc.field)
		}
	}
}

func newTestHBM(t *testing.T, opts HBMOptions) (*HBM, *gputest.Device) {
	t.Helper()
	dev := gputest.New()
	h, err := NewHBM(dev, opts)
	if err != nil {
		t.Fatal(err)
	}
	return h, dev
}

// TestHBMRoundTrip: values of many sizes, several of them larger than a
// staging half, come back byte for byte, and Close frees everything.
func TestHBMRoundTrip(t *testing.T) {
	h, dev := newTestHBM(t, HBMOptions{Capacity: 16 * DefaultSlabSize, StagingBytes: 8 << 10, Lanes: 2})
	rng := rand.New(rand.NewPCG(1, 2))
	type kv struct {
		loc Loc
		val []byte
	}
	var got []kv
	for i, n := range []int{0, 1, 63, 64, 4095, 4096, 4097, 8192, 12345, 100 << 10, 3 << 20} {
		val := make([]byte, n)
		for j := range val {
			val[j] = byte(rng.Uint32())
		}
		loc, err := h.Put(prefixhash.Key{byte(i)}, val)
		if err != nil {
			t.Fatalf("Put %d bytes: %v", n, err)
		}
		got = append(got, kv{loc, val})
	}
	for _, g := range got {
		dst := make([]byte, len(g.val))
		if err := h.Read(g.loc, dst); err != nil {
			t.Fatalf("Read %d bytes: %v", len(g.val), err)
		}
		if !bytes.Equal(dst, g.val) {
			t.Fatalf("Read of %d bytes returned other bytes", len(g.val))
		}
	}
	if err := h.Read(got[3].loc, make([]byte, 1)); err == nil {
		t.Fatal("Read into a short buffer succeeded")
	}
	if s := h.Stats(); s.Values != int64(len(got)) {
		t.Fatalf("Stats().Values = %d, want %d", s.Values, len(got))
	}
	for _, g := range got {
		h.Free(g.loc)
	}
	if s := h.Stats(); s.Values != 0 || s.Reserved != 0 {
		t.Fatalf("after freeing everything: %+v", s)
	}
	if err := h.Close(); err != nil {
		t.Fatal(err)
	}
	if !dev.Closed() {
		t.Fatal("Close did not close the device")
	}
	if _, err := h.Put(prefixhash.Key{}, nil); !errors.Is(err, ErrClosed) {
		t.Fatalf("Put after Close = %v, want ErrClosed", err)
	}
}

// TestHBMFullAndEvacuate: the tier fills to its capacity, says ErrFull, and
// Evacuate names the keys that live in one slab, read back from the device.
func TestHBMFullAndEvacuate(t *testing.T) {
	slab := int64(1 << 20)
	h, _ := newTestHBM(t, HBMOptions{Capacity: 2 * slab, SlabSize: slab, StagingBytes: 8 << 10})
	defer h.Close()
	val := make([]byte, 200<<10)
	keys := map[Loc]prefixhash.Key{}
	for i := 0; ; i++ {
		k := prefixhash.Key{byte(i), 0xaa}
		loc, err := h.Put(k, val)
		if errors.Is(err, ErrFull) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		keys[loc] = k
	}
	if len(keys) != 10 {
		t.Fatalf("a 2 MiB tier held %d values of 200 KiB, want 10", len(keys))
	}
	recs := h.Evacuate(-1)
	if len(recs) != 5 {
		t.Fatalf("Evacuate named %d values, want a slab's 5", len(recs))
	}
	for _, r := range recs {
		if keys[r.Loc] != r.Key || r.Len != len(val) {
			t.Fatalf("Evacuate: %+v, want key %x", r, keys[r.Loc])
		}
		h.Free(r.Loc)
	}
	if _, err := h.Put(prefixhash.Key{1}, make([]byte, 900<<10)); err != nil {
		t.Fatalf("Put into the evacuated slab: %v", err)
	}
}

// TestHBMCopyTo: a value reaches another device buffer unchanged.
func TestHBMCopyTo(t *testing.T) {
	h, dev := newTestHBM(t, HBMOptions{Capacity: DefaultSlabSize})
	defer h.Close()
	val := bytes.Repeat([]byte("kv"), 5000)
	loc, err := h.Put(prefixhash.Key{7}, val)
	if err != nil {
		t.Fatal(err)
	}
	dst, _ := dev.Alloc(int64(len(val)))
	defer dev.Free(dst)
	if err := h.CopyTo(loc, dst, len(val)); err != nil {
		t.Fatal(err)
	}
	b, _ := dev.Bytes(dst, int64(len(val)))
	if !bytes.Equal(b, val) {
		t.Fatal("CopyTo moved other bytes")
	}
	if err := h.CopyTo(loc, dst, 3); err == nil {
		t.Fatal("CopyTo with a wrong length succeeded")
	}
}

// TestHBMCopyError: a failed copy fails Put and frees its slot.
func TestHBMCopyError(t *testing.T) {
	h, dev := newTestHBM(t, HBMOptions{Capacity: DefaultSlabSize})
	defer h.Close()
	dev.SetFail(errors.New("fake: ECC error"))
	if _, err := h.Put(prefixhash.Key{}, make([]byte, 100)); err == nil || !strings.Contains(err.Error(), "ECC") {
		t.Fatalf("Put over a failing device = %v", err)
	}
	if s := h.Stats(); s.Values != 0 {
		t.Fatalf("a failed Put left %d values", s.Values)
	}
	dev.SetFail(nil)
}

// TestHBMConcurrent: more goroutines than lanes put and read at once; every
// value comes back whole (run under -race).
func TestHBMConcurrent(t *testing.T) {
	h, _ := newTestHBM(t, HBMOptions{Capacity: 8 * DefaultSlabSize, StagingBytes: 16 << 10, Lanes: 3})
	defer h.Close()
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for g := range 8 {
		wg.Go(func() {
			for i := range 50 {
				val := bytes.Repeat([]byte{byte(g), byte(i)}, 1000+g*3000+i)
				loc, err := h.Put(prefixhash.Key{byte(g), byte(i)}, val)
				if err != nil {
					errs <- err
					return
				}
				dst := make([]byte, len(val))
				if err := h.Read(loc, dst); err != nil || !bytes.Equal(dst, val) {
					errs <- fmt.Errorf("goroutine %d value %d: %v, equal %t", g, i, err, bytes.Equal(dst, val))
					return
				}
				h.Free(loc)
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}
