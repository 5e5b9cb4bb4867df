package store

import (
	"bytes"
	"context"
	"errors"
	"math/rand/v2"
	"sync"
	"testing"

	"github.com/kvmesh/kvmesh/auth"
	"github.com/kvmesh/kvmesh/block"
)

// TestPartsUnderPressure: ranks write more blocks than DRAM holds, so
// incomplete blocks are dropped for room while parts are copied into them.
// Whatever completes is exactly its block, and the accounting holds.
func TestPartsUnderPressure(t *testing.T) {
	l := openLocal(t, Options{DRAM: realDRAM(t, 128<<10, 64<<10)})
	rng := rand.New(rand.NewPCG(25, 26))
	parts := rankParts(t, partsNS(), 4, 1)
	var bs []*partBlock
	for range 64 {
		bs = append(bs, newPartBlock(t, rng, partsNS()))
	}
	// More incomplete blocks than DRAM holds: the oldest go.
	for _, b := range bs {
		if err := l.Put(context.Background(), b.record(t, parts[0], nil)); err != nil {
			t.Fatal(err)
		}
	}
	if s := l.Stats(); s.PartialsDropped == 0 || s.PartialsOpen+int(s.PartialsDropped) != len(bs) {
		t.Fatalf("%d incomplete blocks open, %d dropped, of %d", s.PartialsOpen, s.PartialsDropped, len(bs))
	}
	// Ranks, out of step, write 12 blocks: with the incomplete blocks left
	// from above dropped as room is needed (oldest first), every one
	// completes, though slots are taken and dropped while parts are copied.
	hot := bs[:12]
	var wg sync.WaitGroup
	for k, p := range parts {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := range hot {
				b := hot[(j+k*3)%len(hot)]
				if err := l.Put(context.Background(), b.record(t, p, nil)); err != nil {
					t.Error(err)
				}
			}
		}()
	}
	wg.Wait()
	completed := 0
	for _, b := range bs {
		if r, err := l.Get(context.Background(), b.key); err == nil {
			if !bytes.Equal(r.Bytes(), b.whole) {
				t.Fatal("a block completed under pressure differs from its parts")
			}
			r.Release()
			completed++
		}
	}
	s := l.Stats()
	if completed != len(hot) || s.PartsCompleted != int64(len(hot)) || s.Evictions != 0 {
		t.Fatalf("%d blocks cached, %d completed, %d evicted; want the %d written", completed, s.PartsCompleted, s.Evictions, len(hot))
	}
	if err := s.Check(); err != nil {
		t.Fatal(err)
	}
}

// TestPartsRaceClose: Close while ranks put parts: every put ends with
// success or ErrClosed, and Close frees what was incomplete (the
// invariants build checks the tiers at Close).
func TestPartsRaceClose(t *testing.T) {
	l, err := Open(Options{DRAM: realDRAM(t, 8<<20, 1<<20)})
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(27, 28))
	parts := rankParts(t, partsNS(), 4, 1)
	var bs []*partBlock
	for range 32 {
		bs = append(bs, newPartBlock(t, rng, partsNS()))
	}
	var wg sync.WaitGroup
	for _, p := range parts {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for _, b := range bs {
				if err := l.Put(context.Background(), b.record(t, p, nil)); err != nil && !errors.Is(err, ErrClosed) {
					t.Error(err)
				}
			}
		}()
	}
	if err := l.Put(context.Background(), bs[0].record(t, parts[0], nil)); err != nil {
		t.Fatal(err)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
}

// TestPartsModel gives the store and a model of cells random parts of one
// block, each cut from one of two payloads: the model says a part
// conflicts when a cell it covers holds the other payload's bytes, else
// its cells take its payload; the block is complete, with the bytes of
// each cell's payload, once every cell is covered.
func TestPartsModel(t *testing.T) {
	ctx := context.Background()
	for seed := range uint64(40) {
		rng := rand.New(rand.NewPCG(seed, 29))
		l := openLocal(t, Options{DRAM: realDRAM(t, 4<<20, 1<<20)})
		b := newPartBlock(t, rng, partsNS())
		alt := make([]byte, len(b.payload))
		for i := range alt {
			alt[i] = byte(rng.Uint32())
		}
		srcs := [2][]byte{b.payload, alt}
		lay := block.LayoutOf(b.ns)
		layers, heads := lay.Cells()
		cell := make([]int, layers*heads) // -1: not covered, else the payload's index
		for i := range cell {
			cell[i] = -1
		}
		left, conflicts := len(cell), 0
		for step := 0; left > 0; step++ {
			w := []int{1, 2, 4, 8}[rng.IntN(4)]
			h0 := rng.IntN(heads/w) * w
			l0 := rng.IntN(layers)
			p := block.Part{L0: l0, L1: l0 + 1 + rng.IntN(layers-l0), H0: h0, H1: h0 + w}
			if p == lay.Whole() {
				continue // a whole block, not a part
			}
			src := 0
			if rng.IntN(4) == 0 {
				src = 1
			}
			want := error(nil)
			for layer := p.L0; layer < p.L1; layer++ {
				for h := p.H0; h < p.H1; h++ {
					if c := cell[layer*heads+h]; c >= 0 && c != src {
						want = ErrPartConflict
					}
				}
			}
			err := l.Put(ctx, b.record(t, p, srcs[src]))
			if !errors.Is(err, want) || (want == nil) != (err == nil) {
				t.Fatalf("seed %d step %d: part %s of payload %d: %v, model says %v", seed, step, p, src, err, want)
			}
			checkAccounting(t, step, l)
			if want != nil {
				conflicts++
				continue
			}
			for layer := p.L0; layer < p.L1; layer++ {
				for h := p.H0; h < p.H1; h++ {
					if c := &cell[layer*heads+h]; *c < 0 {
						*c = src
						left--
					}
				}
			}
			if left > 0 {
				if ps := l.Partials(); len(ps) != 1 || ps[0].Covered != len(cell)-left {
					t.Fatalf("seed %d step %d: Partials %+v, model covers %d", seed, step, ps, len(cell)-left)
				}
				if l.Contains(auth.Access{}, b.key) {
					t.Fatalf("seed %d step %d: incomplete block visible", seed, step)
				}
			}
		}
		want := make([]byte, len(b.payload))
		for layer := range layers {
			for h := range heads {
				p := block.Part{L0: layer, L1: layer + 1, H0: h, H1: h + 1}
				lay.PlacePart(want, lay.ExtractPart(nil, srcs[cell[layer*heads+h]], len(b.tokens), p), len(b.tokens), p)
			}
		}
		r, err := l.Get(ctx, b.key)
		if err != nil {
			t.Fatalf("seed %d: the completed block: %v", seed, err)
		}
		got, err := block.Decode(r.Bytes(), 0)
		if err != nil || !got.Whole() || !bytes.Equal(got.Payload, want) {
			t.Fatalf("seed %d: the block differs from the model's cells (%v)", seed, err)
		}
		r.Release()
		if s := l.Stats(); s.PartConflicts != int64(conflicts) || s.PartsCompleted != 1 {
			t.Fatalf("seed %d: conflicts %d (model %d), completed %d", seed, s.PartConflicts, conflicts, s.PartsCompleted)
		}
		checkPartialsFreed(t, l)
	}
}

// TestPartsNoReserver: over a memory tier that takes no reservations, an
// incomplete block is assembled in process memory and put when complete.
func TestPartsNoReserver(t *testing.T) {
	ctx := context.Background()
	l := openLocal(t, Options{DRAM: plainTier{realDRAM(t, 4<<20, 1<<20)}})
	b := newPartBlock(t, rand.New(rand.NewPCG(31, 32)), partsNS())
	parts := rankParts(t, b.ns, 2, 2)
	for _, p := range parts[:3] {
		if err := l.Put(ctx, b.record(t, p, nil)); err != nil {
			t.Fatal(err)
		}
	}
	if s := l.Stats(); s.PartialsOpen != 1 || s.PartialSlots != 0 || s.Check() != nil {
		t.Fatalf("an incomplete block in process memory: %+v (%v)", s, s.Check())
	}
	if err := l.Put(ctx, b.record(t, parts[3], nil)); err != nil {
		t.Fatal(err)
	}
	checkWhole(t, l, b)
	checkPartialsFreed(t, l)

	// They hold no more than the tier's capacity: the oldest go.
	small := openLocal(t, Options{DRAM: plainTier{realDRAM(t, 64<<10, 64<<10)}})
	rng := rand.New(rand.NewPCG(33, 34))
	for range 20 {
		if err := small.Put(ctx, newPartBlock(t, rng, partsNS()).record(t, parts[0], nil)); err != nil {
			t.Fatal(err)
		}
	}
	if s := small.Stats(); s.PartialBytes > 64<<10 || s.PartialsDropped == 0 {
		t.Fatalf("incomplete blocks in process memory: %d bytes, %d dropped", s.PartialBytes, s.PartialsDropped)
	}
}
