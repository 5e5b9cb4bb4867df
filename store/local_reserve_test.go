package store

import (
	"bytes"
	"context"
	"errors"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/kvmesh/kvmesh/auth"
	"github.com/kvmesh/kvmesh/block"
	"github.com/kvmesh/kvmesh/block/blocktest"
	"github.com/kvmesh/kvmesh/prefixhash"
)

// checkNoLeak fails unless no reservation is open and the memory tier holds
// exactly the blocks the index knows: nothing reserved was left behind.
func checkNoLeak(t testing.TB, l *Local) {
	t.Helper()
	s := l.Stats()
	mem := s.Tiers[0]
	if s.Reservations != 0 || mem.Values != mem.Blocks || mem.Stored != mem.Bytes {
		t.Fatalf("leaked reservations: %d open; memory tier holds %d values (%d bytes), the index %d blocks (%d bytes)",
			s.Reservations, mem.Values, mem.Stored, mem.Blocks, mem.Bytes)
	}
}

// reserveWrite reserves room for b's block and writes enc into it.
func reserveWrite(t testing.TB, l *Local, ctx context.Context, b wblock, parent prefixhash.Key, enc []byte) *Reservation {
	t.Helper()
	r, err := l.Reserve(ctx, b.key, parent, len(b.enc))
	if err != nil {
		t.Fatal(err)
	}
	copy(r.Buf(), enc)
	return r
}

func TestReserveCommit(t *testing.T) {
	ctx := context.Background()
	l := openLocal(t, Options{DRAM: realDRAM(t, 4<<20, 1<<20)})
	w := newWorld(t, 301, blocktest.NS())
	root := w.ns.Root()
	b := w.blocks[w.extend(-1)]

	r := reserveWrite(t, l, ctx, b, root, b.enc)
	if l.Contains(auth.Access{}, b.key) {
		t.Fatal("an uncommitted reservation is visible")
	}
	if err := r.Commit(); err != nil {
		t.Fatal(err)
	}
	ref, err := l.Get(ctx, b.key)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(ref.Bytes(), b.enc) {
		t.Fatal("committed block reads back different bytes")
	}
	ref.Release()
	if err := r.Commit(); !errors.Is(err, ErrReservation) {
		t.Fatalf("second Commit: %v, want ErrReservation", err)
	}
	r.Abort() // after Commit: nothing
	checkNoLeak(t, l)

	// A reservation for a block already cached commits as a no-op and
	// gives its slot back.
	r = reserveWrite(t, l, ctx, b, root, b.enc)
	if err := r.Commit(); err != nil {
		t.Fatal(err)
	}
	if s := l.Stats(); s.Tiers[0].Blocks != 1 {
		t.Fatalf("%d blocks after committing a duplicate", s.Tiers[0].Blocks)
	}
	checkNoLeak(t, l)
}

func TestReserveCommitRefusesBadBytes(t *testing.T) {
	ctx := context.Background()
	l := openLocal(t, Options{DRAM: realDRAM(t, 4<<20, 1<<20)})
	w := newWorld(t, 302, blocktest.NS())
	root := w.ns.Root()
	b := w.blocks[w.extend(-1)]
	other := w.blocks[w.extend(-1)]

	flipped := bytes.Clone(b.enc)
	flipped[len(flipped)-1] ^= 1 // payload: the checksum fails
	for name, tc := range map[string]struct {
		enc    []byte
		parent prefixhash.Key
	}{
		"payload checksum": {flipped, root},
		"another block":    {other.enc, root},
		"wrong parent":     {b.enc, other.key},
		"zeros":            {make([]byte, len(b.enc)), root},
	} {
		r := reserveWrite(t, l, ctx, b, tc.parent, tc.enc)
		if err := r.Commit(); !errors.Is(err, block.ErrCorrupt) {
			t.Fatalf("%s: Commit = %v, want block.ErrCorrupt", name, err)
		}
		if l.Contains(auth.Access{}, b.key) {
			t.Fatalf("%s: a refused commit left the key present", name)
		}
		checkNoLeak(t, l)
	}
	if s := l.Stats(); s.CorruptCommits != 4 {
		t.Fatalf("CorruptCommits = %d, want 4", s.CorruptCommits)
	}
	if _, err := l.Reserve(ctx, b.key, root, 0); !errors.Is(err, block.ErrTooLarge) {
		t.Fatalf("reserving 0 bytes: %v", err)
	}
	if _, err := l.Reserve(ctx, b.key, root, 8<<20); !errors.Is(err, block.ErrTooLarge) {
		t.Fatalf("reserving more than a slot: %v", err)
	}
}

// A reservation whose context ends is freed, never leaked, and cannot be
// committed.
func TestReserveExpires(t *testing.T) {
	l := openLocal(t, Options{DRAM: realDRAM(t, 4<<20, 1<<20)})
	w := newWorld(t, 303, blocktest.NS())
	b := w.blocks[w.extend(-1)]
	ctx, cancel := context.WithCancel(context.Background())
	r := reserveWrite(t, l, ctx, b, w.ns.Root(), b.enc)
	if s := l.Stats(); s.Reservations != 1 || s.Tiers[0].Values != 1 {
		t.Fatalf("after Reserve: %d reservations, %d values", s.Reservations, s.Tiers[0].Values)
	}
	cancel()
	// AfterFunc runs in its own goroutine: Commit either loses to it
	// (ErrReservation) or wins before it and sees the ended context.
	if err := r.Commit(); err == nil {
		t.Fatal("committed a reservation whose context ended")
	}
	checkNoLeak(t, l)
	if l.Contains(auth.Access{}, b.key) {
		t.Fatal("an expired reservation's block is visible")
	}
}

// Reservations, commits and aborts race with puts, gets and the evictions
// that a memory tier far too small for the load forces. Every committed
// block that is found reads back exactly; no slot leaks.
func TestReserveUnderEviction(t *testing.T) {
	l := openLocal(t, Options{DRAM: realDRAM(t, 8*16<<10, 16<<10)})
	w := newWorld(t, 304, blocktest.NS())
	const n = 400
	for range n {
		w.grow()
	}
	var wg sync.WaitGroup
	var committed atomic.Int64
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(g), 7))
			ctx := context.Background()
			for range 300 {
				b := w.blocks[rng.IntN(n)]
				parent := w.ns.Root()
				if b.parent >= 0 {
					parent = w.blocks[b.parent].key
				}
				switch rng.IntN(4) {
				case 0:
					_ = l.Put(ctx, b.enc)
				case 1:
					if ref, err := l.Get(ctx, b.key); err == nil {
						if !bytes.Equal(ref.Bytes(), b.enc) {
							t.Error("a block read back different bytes")
						}
						ref.Release()
					}
				default:
					r, err := l.Reserve(ctx, b.key, parent, len(b.enc))
					if err != nil {
						continue // full of pinned or reserved slots
					}
					copy(r.Buf(), b.enc)
					if rng.IntN(3) == 0 {
						r.Abort()
					} else if err := r.Commit(); err == nil {
						committed.Add(1)
					} else if !errors.Is(err, ErrFull) && !errors.Is(err, ErrQuota) {
						t.Errorf("commit: %v", err)
					}
				}
			}
		}()
	}
	wg.Wait()
	checkNoLeak(t, l)
	if s := l.Stats(); committed.Load() < 100 || s.Evictions == 0 {
		t.Fatalf("%d commits, %d evictions: the load did not exercise reservations under eviction", committed.Load(), s.Evictions)
	}
}

// FuzzReserveCommit writes arbitrary bytes into a reservation and commits
// them: a commit succeeds only with the reserved block's exact bytes, which
// then read back; anything else is refused, the key stays absent, and no
// slot is left behind. The seed corpus (the block, and damaged copies) runs
// as a normal test.
func FuzzReserveCommit(f *testing.F) {
	w := newWorld(f, 305, blocktest.NS())
	b := w.blocks[w.extend(-1)]
	f.Add(b.enc)
	for _, at := range []int{0, 30, 100, len(b.enc) / 2, len(b.enc) - 1} {
		d := bytes.Clone(b.enc)
		d[at] ^= 0x40
		f.Add(d)
	}
	f.Add(b.enc[:len(b.enc)/2])
	f.Add([]byte{})
	l := openLocal(f, Options{DRAM: realDRAM(f, 4<<20, 1<<20)})
	f.Fuzz(func(t *testing.T, data []byte) {
		ctx := context.Background()
		r, err := l.Reserve(ctx, b.key, w.ns.Root(), len(b.enc))
		if err != nil {
			t.Fatal(err)
		}
		copy(r.Buf(), data) // a short write leaves the rest as it was: zeros or stale bytes
		err = r.Commit()
		ref, gerr := l.Get(ctx, b.key)
		switch {
		case err == nil && gerr != nil:
			t.Fatalf("committed, then Get: %v", gerr)
		case err == nil:
			if !bytes.Equal(ref.Bytes(), b.enc) {
				t.Fatal("a commit stored bytes that are not the block")
			}
			ref.Release()
			if _, err := l.DropNamespace(w.ns.Digest()); err != nil {
				t.Fatal(err)
			}
		case gerr == nil:
			ref.Release()
			t.Fatalf("commit refused (%v) yet the key is present", err)
		}
		checkNoLeak(t, l)
	})
}
