package store

import (
	"context"
	"errors"
	"testing"

	"github.com/kvmesh/kvmesh/block/blocktest"
	"github.com/kvmesh/kvmesh/prefixhash"
	"github.com/kvmesh/kvmesh/tiers"
)

// failingDisk is a persistent tier whose writes fail with an I/O error.
type failingDisk struct{ tiers.Tier }

var errIO = errors.New("input/output error")

func (failingDisk) Put(prefixhash.Key, []byte) (tiers.Loc, error) { return 0, errIO }

// TestLocalWriteErrorIsNotCorruption: a demotion that the persistent tier
// fails to write drops the block for room; its bytes were never corrupt, so
// CorruptDrops must stay 0 (it is the figure operators alert on).
func TestLocalWriteErrorIsNotCorruption(t *testing.T) {
	w := newWorld(t, 88, blocktest.NS())
	l := openLocal(t, Options{DRAM: newFakeMem(4096, 1, 1024), NVMe: failingDisk{newFakeVolume(64<<10, 8).open()}, DemoteBatchBytes: 1})
	for range 12 {
		if err := l.Put(context.Background(), w.blocks[w.extend(-1)].enc); err != nil {
			t.Fatal(err)
		}
	}
	if s := l.Stats(); s.CorruptDrops != 0 {
		t.Fatalf("%d corrupt drops after failed demotion writes; evictions %d", s.CorruptDrops, s.Evictions)
	}
}
