package store

import (
	"bytes"
	"context"
	"errors"
	"testing"

	"github.com/kvmesh/kvmesh/auth"
	"github.com/kvmesh/kvmesh/block/blocktest"
	"github.com/kvmesh/kvmesh/gpu/gputest"
	"github.com/kvmesh/kvmesh/prefixhash"
	"github.com/kvmesh/kvmesh/tiers"
)

// testHBM is an HBM tier of slabs slabs of 4 KiB on a fake GPU.
func testHBM(t testing.TB, slabs int) (*tiers.HBM, *gputest.Device) {
	t.Helper()
	dev := gputest.New()
	h, err := tiers.NewHBM(dev, tiers.HBMOptions{Capacity: int64(slabs) * 4096, SlabSize: 4096, StagingBytes: 8 << 10, Lanes: 2})
	if err != nil {
		t.Fatal(err)
	}
	return h, dev
}

func tierOfKey(t *testing.T, l *Local, b wblock) string {
	t.Helper()
	info, ok := l.Info(auth.Access{}, b.key)
	if !ok {
		return "none"
	}
	return info.Tier
}

func getBytes(t *testing.T, l *Local, b wblock) {
	t.Helper()
	r, err := l.Get(context.Background(), b.key)
	if err != nil {
		t.Fatalf("Get %s: %v", b.key, err)
	}
	defer r.Release()
	if !bytes.Equal(r.Bytes(), b.enc) {
		t.Fatalf("Get %s returned other bytes", b.key)
	}
}

// TestLocalHBMTierOrder: writes land in HBM; HBM pressure demotes its least
// recently used blocks into DRAM, DRAM pressure pushes on into NVMe; a hit
// in DRAM or NVMe promotes the block to HBM; every block read back is the
// one put, from any tier; Close releases the device.
func TestLocalHBMTierOrder(t *testing.T) {
	ctx := context.Background()
	hbm, dev := testHBM(t, 1)
	l, err := Open(Options{HBM: hbm, DRAM: newFakeMem(4096, 2, 1024), NVMe: newFakeVolume(8*blockBytes, 8).open(), DemoteBatchBytes: 1})
	if err != nil {
		t.Fatal(err)
	}
	w := newWorld(t, 31, blocktest.NS())
	var bs []wblock
	for range 24 {
		b := w.blocks[w.extend(-1)] // unrelated blocks: no chain ordering
		if err := l.Put(ctx, b.enc); err != nil {
			t.Fatal(err)
		}
		bs = append(bs, b)
	}
	count := map[string]int{}
	for _, b := range bs {
		count[tierOfKey(t, l, b)]++
	}
	if count["hbm"] == 0 || count["dram"] == 0 || count["nvme"] == 0 || count["none"] != 0 {
		t.Fatalf("blocks by tier %v: want some in each of hbm, dram and nvme, none lost", count)
	}
	if got := tierOfKey(t, l, bs[len(bs)-1]); got != "hbm" {
		t.Fatalf("the last block written is in %s, want hbm", got)
	}
	if got := tierOfKey(t, l, bs[0]); got != "nvme" {
		t.Fatalf("the first block written is in %s, want nvme (HBM → DRAM → NVMe)", got)
	}
	s := l.Stats()
	if s.HBMDemotions == 0 || s.Demotions == 0 {
		t.Fatalf("no demotions: %+v", s)
	}

	// Hits promote to HBM, from DRAM and from NVMe.
	for _, from := range []string{"dram", "nvme"} {
		var b wblock
		for _, c := range bs {
			if tierOfKey(t, l, c) == from {
				b = c
				break
			}
		}
		getBytes(t, l, b)
		if got := tierOfKey(t, l, b); got != "hbm" {
			t.Fatalf("a block hit in %s is now in %s, want hbm", from, got)
		}
	}
	if s := l.Stats(); s.HBMPromotions == 0 || s.Promotions == 0 {
		t.Fatalf("no promotions: %+v", s)
	}

	// Every block comes back, through Get and GetMany, wherever it is.
	for _, b := range bs {
		getBytes(t, l, b)
	}
	keys := make([]prefixhash.Key, len(bs))
	for k, b := range bs {
		keys[k] = b.key
	}
	refs, err := l.GetMany(ctx, keys)
	if err != nil {
		t.Fatal(err)
	}
	for k, r := range refs {
		if r == nil || !bytes.Equal(r.Bytes(), bs[k].enc) {
			t.Fatalf("GetMany block %d: %v", k, r)
		}
		r.Release()
	}
	checkInvariants(t, 0, l, w, nil)
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	if !dev.Closed() {
		allocs, pinned, streams := dev.Live()
		t.Fatalf("Close left the device open: %d allocations, %d pinned buffers, %d streams", allocs, pinned, streams)
	}
}

// TestLocalHBMPressure: random chains, gets and lookups through HBM, DRAM
// and NVMe all far too small, with the invariants checked after every step
// (the index agrees with each tier, HBM included).
func TestLocalHBMPressure(t *testing.T) {
	for _, disk := range []bool{false, true} {
		hbm, _ := testHBM(t, 2)
		opts := Options{HBM: hbm, DRAM: newFakeMem(4096, 8, 1024), DemoteBatchBytes: 2 * blockBytes}
		if disk {
			opts.NVMe = newFakeVolume(6*blockBytes, 5).open()
		}
		l := openLocal(t, opts)
		s := runPressure(t, l, newWorld(t, 32, blocktest.NS()), 1500)
		if s.HBMDemotions == 0 || s.HBMPromotions == 0 || disk && s.Demotions == 0 {
			t.Fatalf("disk %t: tiers never exchanged blocks: %+v", disk, s)
		}
	}
}

// TestLocalHBMDeviceFault: when the device fails, writes still succeed (in
// DRAM), a block whose HBM copy cannot be read is a miss and is dropped,
// and the store keeps serving the rest.
func TestLocalHBMDeviceFault(t *testing.T) {
	ctx := context.Background()
	hbm, dev := testHBM(t, 1)
	l := openLocal(t, Options{HBM: hbm, DRAM: newFakeMem(4096, 4, 1024)})
	w := newWorld(t, 33, blocktest.NS())
	inHBM := w.blocks[w.extend(-1)]
	if err := l.Put(ctx, inHBM.enc); err != nil {
		t.Fatal(err)
	}
	if got := tierOfKey(t, l, inHBM); got != "hbm" {
		t.Fatalf("first block in %s, want hbm", got)
	}
	dev.SetFail(errors.New("gputest: device lost"))
	later := w.blocks[w.extend(-1)]
	if err := l.Put(ctx, later.enc); err != nil {
		t.Fatalf("Put with a failing device: %v", err)
	}
	if got := tierOfKey(t, l, later); got != "dram" {
		t.Fatalf("a block put while the device fails is in %s, want dram", got)
	}
	if _, err := l.Get(ctx, inHBM.key); !errors.Is(err, ErrNotFound) {
		t.Fatalf("Get of a block on the failed device = %v, want ErrNotFound", err)
	}
	if l.Contains(auth.Access{}, inHBM.key) {
		t.Fatal("the unreadable block is still indexed")
	}
	dev.SetFail(nil)
	getBytes(t, l, later)
}
