package store

import (
	"bytes"
	"context"
	"errors"
	"testing"

	"github.com/kvmesh/kvmesh/auth"
	"github.com/kvmesh/kvmesh/block/blocktest"
	"github.com/kvmesh/kvmesh/prefixhash"
)

// TestLocalModel gives the store and a map the same random operations, in a
// configuration that never evicts, and requires the same answers.
func TestLocalModel(t *testing.T) {
	for _, disk := range []bool{false, true} {
		w := newWorld(t, 11, blocktest.NS())
		opts := Options{DRAM: newFakeMem(64<<10, 256, 1024)}
		if disk {
			// A small memory tier in front of a large disk: blocks move,
			// none is dropped.
			opts.DRAM = newFakeMem(4096, 4, 1024)
			opts.NVMe = newFakeVolume(64<<10, 256).open()
			opts.DemoteBatchBytes = 1
		}
		l := openLocal(t, opts)
		m := refModel{}
		ctx := context.Background()
		for step := range 4000 {
			switch op := w.rng.IntN(10); {
			case op < 3 || len(w.blocks) == 0:
				i := w.grow()
				if w.rng.IntN(4) == 0 && len(w.blocks) > 1 {
					i = w.randomBlock() // a duplicate put
				}
				b := w.blocks[i]
				if err := l.Put(ctx, b.enc); err != nil {
					t.Fatalf("step %d: Put: %v", step, err)
				}
				m.put(b.key, b.enc)
			case op < 6:
				k := w.blocks[w.randomBlock()].key
				want, ok := m.get(k)
				r, err := l.Get(ctx, k)
				if ok != (err == nil) || (err != nil && !errors.Is(err, ErrNotFound)) {
					t.Fatalf("step %d: Get = %v, model has it: %v", step, err, ok)
				}
				if err == nil {
					if !bytes.Equal(r.Bytes(), want) {
						t.Fatalf("step %d: Get returned other bytes", step)
					}
					r.Release()
				}
			case op < 8:
				k := w.blocks[w.randomBlock()].key
				if _, ok := m[k]; l.Contains(auth.Access{}, k) != ok {
					t.Fatalf("step %d: Contains = %v, model %v", step, !ok, ok)
				}
			default:
				keys := w.chain(w.randomBlock())
				if w.rng.IntN(2) == 0 {
					keys = append(keys, randKey(w.rng))
				}
				if got, want := l.LongestPrefix(auth.Access{}, keys), m.longestPrefix(keys); got != want {
					t.Fatalf("step %d: LongestPrefix = %d, model %d", step, got, want)
				}
			}
			// The whole check walks every block: after every 16th
			// operation here, where the index grows to a thousand
			// blocks (the other model tests check after each).
			if step%16 == 0 {
				checkAccounting(t, step, l)
			}
		}
		checkAccounting(t, 4000, l)
		s := l.Stats()
		if s.Evictions != 0 || s.Puts != int64(len(m)) || totalBlocks(s) != int64(len(m)) {
			t.Fatalf("disk=%v: %d evictions, %d puts, %d blocks; model holds %d", disk, s.Evictions, s.Puts, totalBlocks(s), len(m))
		}
		if disk && (s.Demotions == 0 || s.Promotions == 0) {
			t.Fatalf("blocks never moved between tiers: %+v", s)
		}
	}
}

func totalBlocks(s Stats) int64 {
	n := int64(0)
	for _, t := range s.Tiers {
		n += t.Blocks
	}
	return n
}

// checkAccounting fails the test when, after an operation, the store's
// accounting does not add up or its index disagrees with its tiers
// (Local.checkQuiescent: Stats.Check, every indexed location live in its
// tier and named once, every linked parent in the table). The model tests
// call it after each operation.
func checkAccounting(t *testing.T, step int, l *Local) Stats {
	t.Helper()
	s, err := l.checkQuiescent()
	if err != nil {
		t.Fatalf("step %d: %v", step, err)
	}
	return s
}

// checkInvariants asserts what must hold whenever no operation is in flight.
func checkInvariants(t *testing.T, step int, l *Local, w *world, linked map[prefixhash.Key]bool) {
	t.Helper()
	s := checkAccounting(t, step, l)
	if s.Pinned != 0 {
		t.Fatalf("step %d: %d pins with no Ref live", step, s.Pinned)
	}
	if step%5 != 0 {
		return // the full scan below is the slow part
	}
	for _, b := range w.blocks {
		if linked[b.key] && l.Contains(auth.Access{}, b.key) && !l.Contains(auth.Access{}, w.blocks[b.parent].key) {
			t.Fatalf("step %d: %s is cached, its parent (cached when it was put) is not", step, b.key)
		}
	}
}

// TestLocalPressure runs random chains and lookups through tiers far too
// small for them, and checks the invariants after every step: capacities
// hold, bytes served are bytes put, no cached descendant outlives its
// ancestor, counters add up.
func TestLocalPressure(t *testing.T) {
	for _, tc := range []struct {
		name string
		disk bool
	}{{"memory-only", false}, {"memory+nvme", true}} {
		t.Run(tc.name, func(t *testing.T) {
			// 8 slabs of 4 blocks; a disk of 5 segments of 6 blocks.
			opts := Options{DRAM: newFakeMem(4096, 8, 1024), DemoteBatchBytes: 2 * blockBytes}
			if tc.disk {
				opts.NVMe = newFakeVolume(6*blockBytes, 5).open()
			}
			l := openLocal(t, opts)
			s := runPressure(t, l, newWorld(t, 21, blocktest.NS()), 3000)
			if tc.disk && (s.Demotions == 0 || s.Promotions == 0 || s.Rewrites == 0) {
				t.Fatalf("tiers never exchanged blocks: %+v", s)
			}
		})
	}
}

// runPressure runs steps random operations on l (puts of chains growing from
// w, gets, lookups followed by GetMany), checks the invariants after each,
// and requires that something was evicted.
func runPressure(t *testing.T, l *Local, w *world, steps int) Stats {
	ctx := context.Background()
	linked := map[prefixhash.Key]bool{}
	for step := range steps {
		switch op := w.rng.IntN(10); {
		case op < 4 || len(w.blocks) == 0:
			i := w.grow()
			if w.rng.IntN(5) == 0 {
				i = w.randomBlock()
			}
			b := w.blocks[i]
			was := l.Contains(auth.Access{}, b.key)
			if err := l.Put(ctx, b.enc); err != nil {
				t.Fatalf("step %d: Put: %v", step, err)
			}
			if !was {
				linked[b.key] = b.parent >= 0 && l.Contains(auth.Access{}, w.blocks[b.parent].key)
			}
		case op < 7:
			b := w.blocks[w.randomBlock()]
			r, err := l.Get(ctx, b.key)
			switch {
			case err == nil:
				if !bytes.Equal(r.Bytes(), b.enc) {
					t.Fatalf("step %d: Get returned other bytes", step)
				}
				r.Release()
			case !errors.Is(err, ErrNotFound):
				t.Fatalf("step %d: Get: %v", step, err)
			}
		default:
			keys := w.chain(w.randomBlock())
			getManyPrefix(t, step, l, w, keys)
		}
		checkInvariants(t, step, l, w, linked)
	}
	s := l.Stats()
	t.Logf("%+v", s)
	if s.Evictions == 0 || s.Cascaded == 0 {
		t.Fatalf("the test exerted no pressure: %+v", s)
	}
	return s
}

// getManyPrefix looks keys up, gets the cached prefix with GetMany, checks
// the bytes of every block served and returns the prefix's length.
func getManyPrefix(t *testing.T, step int, l *Local, w *world, keys []prefixhash.Key) int {
	t.Helper()
	n := l.LongestPrefix(auth.Access{}, keys)
	refs, err := l.GetMany(context.Background(), keys[:n])
	if err != nil {
		t.Fatalf("step %d: GetMany: %v", step, err)
	}
	for k, r := range refs {
		if r != nil {
			if !bytes.Equal(r.Bytes(), w.blocks[w.byKey[keys[k]]].enc) {
				t.Fatalf("step %d: GetMany returned other bytes", step)
			}
			r.Release()
		}
	}
	return n
}
