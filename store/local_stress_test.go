package store

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"

	"github.com/kvmesh/kvmesh/auth"
	"github.com/kvmesh/kvmesh/block/blocktest"
	"github.com/kvmesh/kvmesh/prefixhash"
)

func TestLocalStressRealTiers(t *testing.T) {
	nsA := blocktest.NS()
	nsB := blocktest.NS()
	nsB.Model = "other"
	nsB.HeadDim = 32 // bigger blocks: another class
	worlds := []*world{newWorld(t, 901, nsA), newWorld(t, 902, nsB)}
	for _, w := range worlds {
		for range 600 {
			w.grow()
		}
	}
	dir := t.TempDir()
	l := openLocal(t, Options{DRAM: realDRAM(t, 8*16<<10, 16<<10), NVMe: realNVMe(t, dir, 6*64<<10, 64<<10), DemoteBatchBytes: 2 * blockBytes, MaxBlocks: 300})
	ctx := context.Background()
	var wg sync.WaitGroup
	errc := make(chan error, 64)
	for g := range 6 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(g), 7))
			for n := 0; n < 1500; n++ {
				w := worlds[rng.IntN(2)]
				b := w.blocks[rng.IntN(len(w.blocks))]
				switch op := rng.IntN(20); {
				case op < 8:
					put := l.Put
					if op < 3 {
						put = l.PutCopy // a copy under the default policy (dedup)
					}
					if err := put(ctx, b.enc); err != nil && !errors.Is(err, ErrFull) && !errors.Is(err, ErrQuota) {
						errc <- fmt.Errorf("put: %w", err)
						return
					}
				case op < 13:
					r, err := l.Get(ctx, b.key)
					if err != nil {
						if !errors.Is(err, ErrNotFound) {
							errc <- err
							return
						}
						continue
					}
					if !bytes.Equal(r.Bytes(), b.enc) {
						errc <- errors.New("wrong bytes")
						return
					}
					r.Release()
				case op < 16:
					i := rng.IntN(len(w.blocks))
					ch := w.chain(i)
					refs, err := l.GetMany(ctx, ch)
					if err != nil {
						errc <- err
						return
					}
					for k, r := range refs {
						if r != nil {
							if !bytes.Equal(r.Bytes(), w.blocks[w.byKey[ch[k]]].enc) {
								errc <- errors.New("wrong bytes (many)")
								return
							}
							r.Release()
						}
					}
				case op < 17:
					l.LongestPrefix(auth.Access{}, w.chain(rng.IntN(len(w.blocks))))
				case op < 18:
					if n%50 == 0 {
						l.DropNamespace(w.ns.Digest())
					}
				default:
					q := Quota{DRAM: int64(rng.IntN(4)) * 3 * int64(blockBytes), NVMe: int64(rng.IntN(4)) * 20 * int64(blockBytes)}
					if err := l.SetQuota(w.ns.Digest(), q); err != nil && !errors.Is(err, ErrQuota) {
						errc <- err
						return
					}
				}
			}
		}()
	}
	wg.Wait()
	close(errc)
	for err := range errc {
		t.Fatal(err)
	}
	s := l.Stats()
	if err := s.Check(); err != nil {
		t.Fatalf("%v (%+v)", err, s)
	}
	if totalBlocks(s) > 300 {
		t.Fatalf("%d blocks, MaxBlocks 300", totalBlocks(s))
	}
	for _, n := range s.Namespaces {
		if n.Quota.DRAM > 0 && n.DRAMBytes > n.Quota.DRAM || n.Quota.NVMe > 0 && n.NVMeBytes > n.Quota.NVMe {
			t.Logf("namespace over quota (may be pinned-at-change): %+v", n)
		}
	}
	t.Logf("%+v", s)
	_ = prefixhash.Key{}
}
