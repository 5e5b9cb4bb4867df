package store

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"

	"github.com/kvmesh/kvmesh/auth"
	"github.com/kvmesh/kvmesh/block/blocktest"
	"github.com/kvmesh/kvmesh/internal/testkit"
)

// TestLocalPinsUnderEviction holds Refs while other goroutines put, get and
// drop hard enough to evict everything evictable: a Ref's bytes never change
// (the fake tier scribbles freed memory, and -race sees any free racing with
// a reader), and once everything is released the index and tiers agree.
func TestLocalPinsUnderEviction(t *testing.T) {
	for _, disk := range []bool{false, true} {
		t.Run(fmt.Sprintf("nvme=%v", disk), func(t *testing.T) {
			ctx := context.Background()
			w := newWorld(t, 131, blocktest.NS())
			for range 400 {
				w.grow()
			}
			mem := newFakeMem(4096, 4, 1024) // 16 blocks
			opts := Options{DRAM: mem, DemoteBatchBytes: blockBytes}
			if disk {
				opts.NVMe = newFakeVolume(4*blockBytes, 4).open()
			}
			l := openLocal(t, opts)
			// A long-lived reader pins a few blocks through all of it.
			var held []*Ref
			var heldBlocks []wblock
			for _, b := range w.blocks[:4] {
				held = append(held, putGet(t, l, b))
				heldBlocks = append(heldBlocks, b)
			}
			var wg sync.WaitGroup
			errc := make(chan error, 8)
			stop := make(chan struct{})
			const workers = 4
			for g := range workers {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for n := 0; n < 3000; n++ {
						select {
						case <-stop:
							return
						default:
						}
						b := w.blocks[(n*7+g*101)%len(w.blocks)]
						switch n % 4 {
						case 0, 1:
							if err := l.Put(ctx, b.enc); err != nil && !errors.Is(err, ErrFull) {
								errc <- err
								return
							}
						case 2:
							r, err := l.Get(ctx, b.key)
							if err != nil {
								if !errors.Is(err, ErrNotFound) {
									errc <- err
									return
								}
								continue
							}
							for range 3 {
								if !bytes.Equal(r.Bytes(), b.enc) {
									errc <- errors.New("a pinned block changed under its reader")
									return
								}
							}
							r.Release()
						case 3:
							l.LongestPrefix(auth.Access{}, w.chain((n+g)%len(w.blocks)))
						}
					}
				}()
			}
			if _, err := l.DropNamespace(blocktest.NS().Digest()); err != nil {
				t.Fatal(err)
			}
			for range 200 {
				for k, r := range held {
					if !bytes.Equal(r.Bytes(), heldBlocks[k].enc) {
						t.Fatal("a long-held Ref changed")
					}
				}
			}
			wg.Wait()
			close(stop)
			close(errc)
			for err := range errc {
				t.Fatal(err)
			}
			for k, r := range held {
				if !bytes.Equal(r.Bytes(), heldBlocks[k].enc) {
					t.Fatal("a long-held Ref changed")
				}
				r.Release()
			}
			s := l.Stats()
			if err := s.Check(); err != nil {
				t.Fatalf("after the storm: %v (%+v)", err, s)
			}
			if s.Pinned != 0 {
				t.Fatalf("%d pins left", s.Pinned)
			}
			t.Logf("%+v", s)
		})
	}
}

// TestLocalConcurrentPromotion: many readers of one block on NVMe get the
// same bytes; one of them promotes it.
func TestLocalConcurrentPromotion(t *testing.T) {
	ctx := context.Background()
	w := newWorld(t, 141, blocktest.NS())
	vol := newFakeVolume(64<<10, 8)
	l := openLocal(t, Options{DRAM: newFakeMem(4096, 2, 1024), NVMe: vol.open(), DemoteBatchBytes: 1})
	w.putGrown(t, l, 16)
	b := onDisk(t, l, w)
	var wg sync.WaitGroup
	errc := make(chan error, 16)
	for range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r, err := l.Get(ctx, b.key)
			if err != nil {
				errc <- err
				return
			}
			if !bytes.Equal(r.Bytes(), b.enc) {
				errc <- errors.New("concurrent Get returned other bytes")
			}
			r.Release()
		}()
	}
	wg.Wait()
	close(errc)
	for err := range errc {
		t.Fatal(err)
	}
	if s := l.Stats(); s.Promotions < 1 || s.Hits != 16 {
		t.Fatalf("after 16 concurrent Gets: %+v", s)
	}
	if info, _ := l.Info(auth.Access{}, b.key); info.Tier != "dram" {
		t.Fatalf("the block is in %s after its hits", info.Tier)
	}
}

// TestLocalGetCanceled: a Get waiting for another's promotion returns when
// its context ends.
func TestLocalGetCanceled(t *testing.T) {
	w := newWorld(t, 151, blocktest.NS())
	l := openLocal(t, Options{DRAM: newFakeMem(4096, 1, 1024), NVMe: newFakeVolume(64<<10, 8).open(), DemoteBatchBytes: 1})
	w.putGrown(t, l, 8)
	b := onDisk(t, l, w)
	// Pretend a mover holds it.
	l.mu.Lock()
	i := l.mu.x.find(b.key)
	l.mu.x.at(i).set(flagMoving)
	l.mu.Unlock()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		_, err := l.Get(ctx, b.key)
		done <- err
	}()
	testkit.WaitFor(t, "the Get to wait on the block", func() bool { l.mu.Lock(); defer l.mu.Unlock(); return l.mu.waiters[i] != nil })
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("canceled Get = %v", err)
	}
	l.mu.Lock()
	l.doneMovingLocked(i)
	l.mu.Unlock()
	r, err := l.Get(context.Background(), b.key)
	if err != nil {
		t.Fatal(err)
	}
	r.Release()
}

// onDisk returns a block of w that l holds on NVMe.
func onDisk(t *testing.T, l *Local, w *world) wblock {
	t.Helper()
	for _, b := range w.blocks {
		if info, ok := l.Info(auth.Access{}, b.key); ok && info.Tier == "nvme" {
			return b
		}
	}
	t.Fatal("no block on NVMe")
	return wblock{}
}
