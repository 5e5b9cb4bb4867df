package store

import (
	"context"
	"sync"
	"testing"

	"github.com/kvmesh/kvmesh/block/blocktest"
)

// TestLocalMaxBlocksIsHard: concurrent Puts of distinct blocks must never
// leave more than MaxBlocks blocks in the index.
func TestLocalMaxBlocksIsHard(t *testing.T) {
	const max = 4
	w := newWorld(t, 77, blocktest.NS())
	for range 64 * 20 {
		w.extend(-1)
	}
	l := openLocal(t, Options{DRAM: newFakeMem(64<<10, 256, 1024), MaxBlocks: max})
	for round := range 20 {
		var wg sync.WaitGroup
		start := make(chan struct{})
		for g := range 64 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				l.Put(context.Background(), w.blocks[round*64+g].enc)
			}()
		}
		close(start)
		wg.Wait()
		if n := totalBlocks(l.Stats()); n > max {
			t.Fatalf("round %d: %d blocks cached, MaxBlocks %d", round, n, max)
		}
	}
}
