package store

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/auth"
	"github.com/kvmesh/kvmesh/block"
	"github.com/kvmesh/kvmesh/block/blocktest"
	"github.com/kvmesh/kvmesh/prefixhash"
)

// object encodes a one-piece object of ns with n random bytes.
func object(t testing.TB, rng *rand.Rand, ns prefixhash.Namespace, name string, n int, r block.Retention) ([]byte, prefixhash.Key) {
	t.Helper()
	payload := make([]byte, n)
	for i := range payload {
		payload[i] = byte(rng.Uint32())
	}
	b, key, err := block.EncodeObject(nil, 0, ns, block.Object{Name: name, Pieces: 1, Size: uint64(n), Generation: rng.Uint64(), Retention: r}, payload)
	if err != nil {
		t.Fatal(err)
	}
	return b, key
}

// served returns what the store serves under key, or nil on a miss.
func served(t testing.TB, l *Local, key prefixhash.Key) []byte {
	t.Helper()
	r, err := l.Get(context.Background(), key)
	if errors.Is(err, ErrNotFound) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	defer r.Release()
	return bytes.Clone(r.Bytes())
}

// TestObjects stores objects of many sizes beside a namespace's blocks: each
// is served whole, counted in the namespace's stats, removed by key, and
// dropped with the namespace; a second put of a name keeps the first value.
func TestObjects(t *testing.T) {
	ctx := context.Background()
	for _, disk := range []bool{false, true} {
		t.Run(fmt.Sprintf("nvme=%v", disk), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(33, 1))
			opts := Options{DRAM: newFakeMem(64<<10, 64, 512, 1024, 4096, 16<<10, 64<<10)}
			if disk {
				opts.NVMe = newFakeVolume(256<<10, 16).open()
			}
			l := openLocal(t, opts)
			ns := blocktest.NS()
			w := newWorld(t, 3, ns)
			w.putChain(t, l, 5)
			want := map[prefixhash.Key][]byte{}
			for i := range 40 {
				b, key := object(t, rng, ns, fmt.Sprintf("obj-%d", i), 1+rng.IntN(20000), block.Retention{})
				if err := l.Put(ctx, b); err != nil {
					t.Fatal(err)
				}
				want[key] = b
			}
			for key, b := range want {
				if got := served(t, l, key); !bytes.Equal(got, b) {
					t.Fatalf("object %s: got %d bytes, want %d", key, len(got), len(b))
				}
			}
			s := l.Stats()
			if err := s.Check(); err != nil {
				t.Fatal(err)
			}
			if u := usage(s, ns.Digest()); u.Objects != 40 || u.Blocks != 45 {
				t.Fatalf("namespace stats: %+v", u)
			}
			// A second put of a name keeps the first value (Mooncake's put).
			again, key := object(t, rng, ns, "obj-0", 100, block.Retention{})
			if err := l.Put(ctx, again); err != nil {
				t.Fatal(err)
			}
			if got := served(t, l, key); !bytes.Equal(got, want[key]) {
				t.Fatal("a second put replaced the object")
			}
			// Remove, then put again: the upsert.
			found, err := l.Remove(ctx, []prefixhash.Key{key, prefixhash.ObjectKey(ns.Root(), "absent")})
			if err != nil || !found[0] || found[1] {
				t.Fatalf("Remove: %v %v", found, err)
			}
			if served(t, l, key) != nil {
				t.Fatal("removed object still served")
			}
			if err := l.Put(ctx, again); err != nil {
				t.Fatal(err)
			}
			if got := served(t, l, key); !bytes.Equal(got, again) {
				t.Fatal("upsert: the new value is not served")
			}
			if n, err := l.DropNamespace(ns.Digest()); err != nil || n != 45 {
				t.Fatalf("DropNamespace dropped %d, %v", n, err)
			}
			s = l.Stats()
			if err := s.Check(); err != nil || s.Removed != 1 || len(s.Namespaces) != 0 {
				t.Fatalf("after the drop: %v, %+v", err, s)
			}
		})
	}
}

// TestObjectsQuota: a namespace's quota bounds its blocks and all its
// objects together, and an object makes room among the namespace's other
// object sizes.
func TestObjectsQuota(t *testing.T) {
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(33, 2))
	ns := blocktest.NS()
	quota := int64(40 << 10)
	l := openLocal(t, Options{DRAM: newFakeMem(64<<10, 64, 1024, 4096, 16<<10), NVMe: newFakeVolume(256<<10, 16).open(),
		Quotas: map[uint64]Quota{ns.Digest(): {DRAM: quota}}, DemoteBatchBytes: 1})
	for i := range 30 {
		size := []int{500, 3000, 9000}[i%3]
		b, _ := object(t, rng, ns, fmt.Sprintf("o%d", i), size, block.Retention{})
		if err := l.Put(ctx, b); err != nil {
			t.Fatalf("object %d: %v", i, err)
		}
		s := l.Stats()
		checkQuotas(t, i, s)
		if u := usage(s, ns.Digest()); u.DRAMBytes > quota {
			t.Fatalf("object %d: %d bytes in DRAM over the quota", i, u.DRAMBytes)
		}
	}
	s := l.Stats()
	if u := usage(s, ns.Digest()); u.Objects != 30 || u.NVMeBytes == 0 {
		t.Fatalf("the quota demoted nothing: %+v", u)
	}
	checkCursors(t, 0, l)
}

// TestObjectsReopen: objects on NVMe survive a restart, in their groups.
func TestObjectsReopen(t *testing.T) {
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(33, 3))
	ns := blocktest.NS()
	vol := newFakeVolume(256<<10, 16)
	l, err := Open(Options{DRAM: newFakeMem(16<<10, 1, 16<<10), NVMe: vol.open(), DemoteBatchBytes: 1})
	if err != nil {
		t.Fatal(err)
	}
	want := map[prefixhash.Key][]byte{}
	for i := range 12 {
		b, key := object(t, rng, ns, fmt.Sprintf("o%d", i), 2000+i*700, block.Retention{})
		if err := l.Put(ctx, b); err != nil {
			t.Fatal(err)
		}
		want[key] = b
	}
	onDisk := l.Stats().Tiers[1].Blocks
	if onDisk == 0 {
		t.Fatal("nothing went to NVMe")
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	l = openLocal(t, Options{DRAM: newFakeMem(16<<10, 1, 16<<10), NVMe: vol.open(), DemoteBatchBytes: 1, SkipRecoveryScan: true})
	nserved := 0
	for key, b := range want {
		if got := served(t, l, key); got != nil {
			if !bytes.Equal(got, b) {
				t.Fatalf("object %s differs after the restart", key)
			}
			nserved++
		}
	}
	if int64(nserved) != onDisk {
		t.Fatalf("%d objects served after the restart, %d were on NVMe", nserved, onDisk)
	}
	if u := usage(l.Stats(), ns.Digest()); u.Objects != onDisk {
		t.Fatalf("after reading them: %+v", u)
	}
}

// TestRetention: a hard pin is never evicted, a soft pin only once nothing
// unpinned is left, a lease until it lapses; limits refuse.
func TestRetention(t *testing.T) {
	for _, ev := range []Eviction{EvictLRU, EvictDedup, EvictReuse} {
		t.Run(string(ev), func(t *testing.T) { testRetention(t, ev) })
	}
}

// testRetention is TestRetention under one eviction policy.
func testRetention(t *testing.T, ev Eviction) {
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(33, 4))
	ns := blocktest.NS()
	clock := &fakeClock{now: time.Unix(1000, 0)}
	// Memory only, 8 slots of one class: pressure evicts.
	l := openLocal(t, Options{DRAM: newFakeMem(8<<10, 8, 8<<10), Now: clock.Now, MaxPinnedFraction: 0.5, Eviction: ev})
	put := func(name string, r block.Retention) prefixhash.Key {
		b, key := object(t, rng, ns, name, 6000, r)
		if err := l.Put(ctx, b); err != nil {
			t.Fatalf("put %s: %v", name, err)
		}
		return key
	}
	hard := put("hard", block.Retention{Pin: block.PinHard})
	lease := put("lease", block.Retention{TTL: time.Minute})
	soft := put("soft", block.Retention{Pin: block.PinSoft})
	if v, p := l.Retained(); v != 3 || p != 2*int64(block.ObjectHeaderLen(4)+6000) {
		t.Fatalf("Retained: %d values, %d bytes", v, p)
	}
	// Hard pins up to the node's limit (half of its 64 KiB), then refused.
	one := int64(block.ObjectHeaderLen(2) + 6000)
	var b []byte
	var key prefixhash.Key
	for i := 0; ; i++ {
		b, key = object(t, rng, ns, fmt.Sprintf("h%d", i), 6000, block.Retention{Pin: block.PinHard})
		err := l.Put(ctx, b)
		_, pinned := l.Retained()
		if errors.Is(err, ErrQuota) {
			if pinned+one <= 32<<10 {
				t.Fatalf("refused with %d bytes pinned, room for %d more", pinned, one)
			}
			break
		}
		if err != nil || pinned > 32<<10 {
			t.Fatalf("pin %d: %v, %d bytes pinned", i, err, pinned)
		}
	}
	if served(t, l, key) != nil {
		t.Fatal("the refused pinned value is stored")
	}
	// Fill with unpinned values: the retained ones stay.
	for i := range 20 {
		put(fmt.Sprintf("plain%d", i), block.Retention{})
	}
	for _, k := range []prefixhash.Key{hard, lease, soft} {
		if served(t, l, k) == nil {
			t.Fatalf("retained value %s evicted by plain values", k)
		}
	}
	// Only soft-pinned and retained values left: the soft one goes.
	l2 := openLocal(t, Options{DRAM: newFakeMem(8<<10, 2, 8<<10), Now: clock.Now, MaxPinnedFraction: 1, Eviction: ev})
	b, s1 := object(t, rng, ns, "s1", 6000, block.Retention{Pin: block.PinSoft})
	if err := l2.Put(ctx, b); err != nil {
		t.Fatal(err)
	}
	b, h1 := object(t, rng, ns, "h1", 6000, block.Retention{Pin: block.PinHard})
	if err := l2.Put(ctx, b); err != nil {
		t.Fatal(err)
	}
	b, p1 := object(t, rng, ns, "p1", 6000, block.Retention{})
	if err := l2.Put(ctx, b); err != nil {
		t.Fatal(err)
	}
	if served(t, l2, s1) != nil || served(t, l2, h1) == nil || served(t, l2, p1) == nil {
		t.Fatal("with only pinned values left, the soft pin should go and the hard pin stay")
	}
	// The lease lapses; then pressure may take it.
	clock.advance(2 * time.Minute)
	if v, _ := l.Retained(); v != 2+3 {
		t.Fatalf("after the lease lapsed, %d values retained, want 5", v)
	}
	// Retain by key: unpin the hard one, refuse a TTL over the limit.
	if _, err := l.Retain(ctx, []prefixhash.Key{hard}, block.Retention{TTL: 48 * time.Hour}); !errors.Is(err, ErrRetentionTTL) {
		t.Fatalf("TTL over MaxRetentionTTL: %v", err)
	}
	got, err := l.Retain(ctx, []prefixhash.Key{hard, key}, block.Retention{})
	if err != nil || !got[0] || got[1] {
		t.Fatalf("unpin: %v %v", got, err)
	}
	if err := l.Stats().Check(); err != nil {
		t.Fatal(err)
	}
}

// TestRetentionQuota: hard pins and leases count against the namespace's
// quota; another tenant can neither pin nor remove the namespace's values.
func TestRetentionQuota(t *testing.T) {
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(33, 5))
	ns := tenantNS("a")
	one := int64(block.ObjectHeaderLen(2) + 1000)
	l := openLocal(t, Options{DRAM: newFakeMem(64<<10, 16, 4096), Quotas: map[uint64]Quota{ns.Digest(): {DRAM: 3 * one}}})
	var keys []prefixhash.Key
	for i := range 3 {
		b, k := object(t, rng, ns, fmt.Sprintf("o%d", i), 1000, block.Retention{})
		if err := l.Put(ctx, b); err != nil {
			t.Fatal(err)
		}
		keys = append(keys, k)
	}
	if _, err := l.Retain(ctx, keys[:2], block.Retention{Pin: block.PinHard}); err != nil {
		t.Fatal(err)
	}
	if _, err := l.Retain(ctx, keys, block.Retention{Pin: block.PinHard}); err != nil {
		t.Fatalf("pinning all three, within the quota: %v", err)
	}
	b, k := object(t, rng, ns, "o9", 1000, block.Retention{Pin: block.PinHard})
	if err := l.Put(ctx, b); !errors.Is(err, ErrQuota) {
		t.Fatalf("a fourth pin over the quota: %v", err)
	}
	_ = k
	other := auth.WithAccess(ctx, auth.Access{Scoped: true, Tag: 77})
	if got, err := l.Retain(other, keys, block.Retention{}); err != nil || got[0] {
		t.Fatalf("another tenant unpinned: %v %v", got, err)
	}
	if got, err := l.Remove(other, keys); err != nil || got[0] {
		t.Fatalf("another tenant removed: %v %v", got, err)
	}
	if _, p := l.Retained(); p != 3*one {
		t.Fatalf("pinned bytes %d, want %d", p, 3*one)
	}
}

// TestRetainPrefix pins a prompt's blocks: memory pressure from other
// prompts evicts those, never the pinned prefix; unpinned, it may go.
func TestRetainPrefix(t *testing.T) {
	ctx := context.Background()
	w := newWorld(t, 34, blocktest.NS())
	l := openLocal(t, Options{DRAM: newFakeMem(blockBytes*4, 8, blockBytes), MaxPinnedFraction: 1})
	last := w.putChain(t, l, 6)
	keys := w.chain(last)
	got, err := l.Retain(ctx, keys, block.Retention{Pin: block.PinHard})
	if err != nil || len(got) != 6 || !got[5] {
		t.Fatalf("Retain: %v %v", got, err)
	}
	for range 10 {
		w.putChain(t, l, 4)
	}
	if n := cachedPrefix(t, l, keys); n != 6 {
		t.Fatalf("pinned prefix: %d of 6 blocks cached", n)
	}
	if info, ok := l.Info(auth.Access{}, keys[0]); !ok || info.Retention.Pin != block.PinHard {
		t.Fatalf("Info: %+v", info)
	}
	if _, err := l.Retain(ctx, keys, block.Retention{}); err != nil {
		t.Fatal(err)
	}
	for range 10 {
		w.putChain(t, l, 4)
	}
	if n := l.LongestPrefix(auth.Access{}, keys); n == 6 {
		t.Fatal("the unpinned prefix was never evicted")
	}
	if err := l.Stats().Check(); err != nil {
		t.Fatal(err)
	}
}
