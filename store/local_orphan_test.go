package store

import (
	"context"
	"testing"

	"github.com/kvmesh/kvmesh/auth"
	"github.com/kvmesh/kvmesh/block/blocktest"
)

// orphanWorld opens a Local whose blocks are nearly all in NVMe, over
// several sealed segments, and returns the index entry of an idle block in
// the oldest one: the segment reclaim drops next.
func orphanWorld(t *testing.T) (*Local, *fakeVolume, uint32) {
	t.Helper()
	w := newWorld(t, 151, blocktest.NS())
	vol := newFakeVolume(4*blockBytes, 64)
	l := openLocal(t, Options{DRAM: newFakeMem(4096, 1, 1024), NVMe: vol.open(), DemoteBatchBytes: 1})
	w.putGrown(t, l, 24)
	_, recs, ok, err := l.seg.OldestSegment()
	if err != nil || !ok {
		t.Fatalf("no sealed segment: %v", err)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, r := range recs {
		if i := l.mu.x.find(r.Key); i != 0 {
			if e := l.mu.x.at(i); e.persistent() && e.getLoc() == r.Loc && !e.busy() {
				return l, vol, i
			}
		}
	}
	t.Fatal("no idle block indexed in the oldest segment")
	return nil, nil, 0
}

// checkTiersAgree fails unless the index and the tiers agree on what is
// stored, with nothing pinned.
func checkTiersAgree(t *testing.T, l *Local) {
	t.Helper()
	s := l.Stats()
	for _, ts := range s.Tiers {
		if ts.Blocks != ts.Values || ts.Bytes != ts.Stored {
			t.Fatalf("index and tier disagree: %+v", ts)
		}
	}
}

// TestLocalDropFreeRacesReclaim: a drop takes a block out of the index under
// the lock and frees its NVMe location after releasing it (as DropNamespace
// does, a page at a time); in between, reclaim drops the segment holding
// that location. The Free must not reach the tier: the location died with
// its segment (the fake tier panics on it, as TestLocalPinsUnderEviction
// once did now and then).
func TestLocalDropFreeRacesReclaim(t *testing.T) {
	l, _, i := orphanWorld(t)
	var fr []freeLoc
	l.mu.Lock()
	if n := l.dropLocked(i, reasonNamespace, &fr); n == 0 {
		t.Fatal("nothing dropped")
	}
	l.mu.Unlock()
	if len(fr) == 0 {
		t.Fatal("the drop left nothing to free")
	}
	if !l.reclaim() {
		t.Fatal("nothing reclaimed")
	}
	l.freeAll(fr)
	checkTiersAgree(t, l)
	l.mu.Lock()
	left := len(l.mu.orphans)
	l.mu.Unlock()
	if left != 0 {
		t.Fatalf("%d orphaned locations still recorded after their frees", left)
	}
}

// TestLocalPromotionDropReclaim: a promotion holds a block of the oldest
// segment; the block is dropped meanwhile (so it leaves the table and reclaim
// cannot find it), then reclaim drops its segment. When the promotion
// finishes it must not free the location either.
func TestLocalPromotionDropReclaim(t *testing.T) {
	l, _, i := orphanWorld(t)
	l.mu.Lock()
	e := l.mu.x.at(i)
	key := e.key
	e.set(flagMoving) // as Get does before promote
	m := l.movedLocked(i)
	l.mu.active++ // as Get does: Close waits for it
	defer l.exit()
	var fr []freeLoc
	l.dropLocked(i, reasonNamespace, &fr)
	l.mu.Unlock()
	l.freeAll(fr) // its descendants
	if !l.reclaim() {
		t.Fatal("nothing reclaimed")
	}
	if r, err := l.promote(context.Background(), m); err == nil {
		r.Release() // the read may still find the bytes: either is fine
	}
	if l.Contains(auth.Access{}, key) {
		t.Fatal("a dropped block is still indexed")
	}
	checkTiersAgree(t, l)
}
