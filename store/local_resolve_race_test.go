package store

import (
	"context"
	"sync"
	"testing"

	"github.com/kvmesh/kvmesh/auth"
	"github.com/kvmesh/kvmesh/block/blocktest"
	"github.com/kvmesh/kvmesh/prefixhash"
	"github.com/kvmesh/kvmesh/tiers"
)

// gatedDisk delegates to a fakeDisk; its first Read completes and then waits
// for the test before returning (a read in flight while its segment goes).
type gatedDisk struct {
	*fakeDisk
	once    sync.Once
	reading chan tiers.Loc
	release chan struct{}
}

func (g *gatedDisk) Read(loc tiers.Loc, dst []byte) error {
	err := g.fakeDisk.Read(loc, dst)
	g.once.Do(func() {
		g.reading <- loc
		<-g.release
	})
	return err
}

// TestLocalResolveRacesReclaim: the background resolution reads a recovered
// block; meanwhile its segment is reclaimed (the block was not hit, so it is
// not rewritten). After both, the index must not keep the block at a location
// whose segment is gone: it is either served or not cached.
func TestLocalResolveRacesReclaim(t *testing.T) {
	w := newWorld(t, 99, blocktest.NS())
	vol := newFakeVolume(4*blockBytes, 64)
	l, err := Open(Options{DRAM: newFakeMem(4096, 1, 1024), NVMe: vol.open(), DemoteBatchBytes: 1})
	if err != nil {
		t.Fatal(err)
	}
	w.putGrown(t, l, 24)
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	g := &gatedDisk{fakeDisk: vol.open(), reading: make(chan tiers.Loc), release: make(chan struct{})}
	l = openLocal(t, Options{DRAM: newFakeMem(4096, 1, 1024), NVMe: g, DemoteBatchBytes: 1})
	loc := <-g.reading // the resolver has read a block of the oldest segment
	var key prefixhash.Key
	l.mu.Lock()
	for i := uint32(1); i < l.mu.x.next; i++ {
		if e := l.mu.x.at(i); e.persistent() && e.getLoc() == loc && !e.has(flagDropped) {
			key = e.key
		}
	}
	l.mu.Unlock()
	if !l.reclaim() {
		t.Fatal("nothing reclaimed")
	}
	close(g.release)
	<-l.resolveDone
	if l.Contains(auth.Access{}, key) {
		r, err := l.Get(context.Background(), key)
		if err != nil {
			t.Fatalf("the index still lists the block after its segment was dropped, and Get misses it: %v", err)
		}
		r.Release()
	}
}
