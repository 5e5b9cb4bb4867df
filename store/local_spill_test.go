package store

import (
	"bytes"
	"context"
	"testing"

	"github.com/kvmesh/kvmesh/auth"
	"github.com/kvmesh/kvmesh/block/blocktest"
	"github.com/kvmesh/kvmesh/prefixhash"
)

// TestLocalSpill: blocks only memory holds are written to the persistent
// tier by Spill and served after a reopen, byte for byte; a budget bounds
// what is written, the blocks given as later go last, a pinned block stays
// in memory, and a second Spill of what the budget allowed finds nothing
// left to write.
func TestLocalSpill(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name          string
		budget        int64 // in blocks
		later         int   // the first later blocks of the chain are "taken"
		pin           bool
		wantSpilled   int
		wantLeft      int
		wantSpilledIn func(i int) bool // which chain positions must be on disk
	}{
		{name: "all", budget: 100, wantSpilled: 20, wantSpilledIn: func(int) bool { return true }},
		{name: "budget", budget: 5, wantSpilled: 5, wantLeft: 15},
		{name: "taken go last", budget: 5, later: 15, wantSpilled: 5, wantLeft: 15, wantSpilledIn: func(i int) bool { return i >= 15 }},
		{name: "a pinned block stays", budget: 100, pin: true, wantSpilled: 19, wantLeft: 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := newWorld(t, 82, blocktest.NS())
			vol := newFakeVolume(64<<10, 8)
			l, err := Open(Options{DRAM: newFakeMem(64<<10, 4, 1024), NVMe: vol.open()})
			if err != nil {
				t.Fatal(err)
			}
			keys := w.chain(w.putChain(t, l, 20))
			if s := l.Stats(); s.Tiers[1].Blocks != 0 {
				t.Fatalf("%d blocks on disk before the spill; the test wants them all in memory", s.Tiers[1].Blocks)
			}
			var pinned *Ref
			if tc.pin {
				if pinned, err = l.Get(ctx, keys[7]); err != nil {
					t.Fatal(err)
				}
			}
			var progress []SpillStats
			st := l.Spill(ctx, tc.budget*int64(blockBytes), keys[:tc.later], func(s SpillStats) { progress = append(progress, s) })
			if st.Blocks != tc.wantSpilled || st.Bytes != int64(tc.wantSpilled*blockBytes) || st.Left != tc.wantLeft {
				t.Fatalf("spill: %+v; want %d blocks written, %d left", st, tc.wantSpilled, tc.wantLeft)
			}
			if len(progress) == 0 || progress[len(progress)-1].Blocks != st.Blocks {
				t.Fatalf("progress %+v does not end at the spill's %d blocks", progress, st.Blocks)
			}
			if tc.budget >= int64(len(keys)) {
				if again := l.Spill(ctx, 1<<30, nil, nil); again.Blocks != 0 || again.Left != tc.wantLeft {
					t.Fatalf("a second spill: %+v; want nothing written, %d left", again, tc.wantLeft)
				}
			}
			if pinned != nil {
				pinned.Release()
			}
			if err := l.Close(); err != nil {
				t.Fatal(err)
			}

			l = openLocal(t, Options{DRAM: newFakeMem(64<<10, 4, 1024), NVMe: vol.open()})
			if got := l.Stats().Recovered; got != int64(tc.wantSpilled) {
				t.Fatalf("recovered %d blocks after the spill; want %d", got, tc.wantSpilled)
			}
			for i, k := range keys {
				r, err := l.Get(ctx, k)
				if err != nil {
					if tc.wantSpilledIn != nil && tc.wantSpilledIn(i) {
						t.Fatalf("block %d of the chain was not spilled: %v", i, err)
					}
					continue
				}
				if !bytes.Equal(r.Bytes(), w.blocks[w.byKey[k]].enc) {
					t.Fatalf("block %d differs after the spill and a reopen", i)
				}
				r.Release()
			}
			if tc.name == "all" {
				if n := l.LongestPrefix(auth.Access{}, keys); n != len(keys) {
					t.Fatalf("cached prefix after the spill and a reopen: %d of %d blocks", n, len(keys))
				}
			}
		})
	}
}

// TestLocalSpillNoDisk: without a persistent tier, Spill writes nothing and
// says what memory holds.
func TestLocalSpillNoDisk(t *testing.T) {
	w := newWorld(t, 83, blocktest.NS())
	l := openLocal(t, Options{DRAM: newFakeMem(64<<10, 4, 1024)})
	w.putChain(t, l, 6)
	if st := l.Spill(context.Background(), 1<<30, []prefixhash.Key{}, nil); st.Blocks != 0 || st.Left != 6 {
		t.Fatalf("spill without a disk: %+v", st)
	}
}
