package store

import (
	"context"
	"testing"

	"github.com/kvmesh/kvmesh/auth"
	"github.com/kvmesh/kvmesh/block/blocktest"
)

// TestReserveMaxBlocks: a client reserves a whole prompt's blocks before it
// commits any (the shared-memory data plane does), with memory too small
// for two prompts and MaxBlocks two prompts' worth. Room in the index is made
// when a block is reserved, open reservations counted, so every prompt is
// cached whole after its commits and the index never exceeds MaxBlocks.
// (Reservations not counted made room in memory first, demoting the older
// prompt to NVMe, and each commit then found the index full and dropped the
// coldest memory block: the new prompt's own.) When every block is on NVMe
// and no segment can be reclaimed, the coldest idle NVMe block makes room.
func TestReserveMaxBlocks(t *testing.T) {
	ctx := context.Background()
	const chain, maxBlocks = 5, 10 // memory holds 5 blocks
	l := openLocal(t, Options{DRAM: realDRAM(t, 4096, 4096), NVMe: realNVMe(t, t.TempDir(), 4<<20, 64<<10),
		MaxBlocks: maxBlocks, DemoteBatchBytes: 1})
	w := newWorld(t, 404, blocktest.NS())
	for p := range 6 {
		var idx []int
		parent := -1
		for range chain {
			parent = w.extend(parent)
			idx = append(idx, parent)
		}
		var rs []*Reservation
		for k, i := range idx {
			pk := w.ns.Root()
			if k > 0 {
				pk = w.blocks[idx[k-1]].key
			}
			rs = append(rs, reserveWrite(t, l, ctx, w.blocks[i], pk, w.blocks[i].enc))
		}
		for _, r := range rs {
			if err := r.Commit(); err != nil {
				t.Fatalf("prompt %d: commit: %v", p, err)
			}
		}
		if n := totalBlocks(l.Stats()); n > maxBlocks {
			t.Fatalf("prompt %d: %d blocks cached, MaxBlocks %d", p, n, maxBlocks)
		}
		for k, i := range idx {
			if !l.Contains(auth.Access{}, w.blocks[i].key) {
				t.Fatalf("prompt %d: its block %d is not cached after its commits (tiers %+v)", p, k, l.Stats().Tiers)
			}
		}
		checkNoLeak(t, l)
	}
}
