package store

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/auth"
	"github.com/kvmesh/kvmesh/block"
	"github.com/kvmesh/kvmesh/block/blocktest"
	"github.com/kvmesh/kvmesh/prefixhash"
	"github.com/kvmesh/kvmesh/tiers"
)

// partsNS is a namespace with a grid of 4 layers × 8 KV heads, enough
// cells for 8 ranks.
func partsNS() prefixhash.Namespace {
	return prefixhash.Namespace{Model: "kvmesh/parts-test", DType: prefixhash.Float16, BlockTokens: 4,
		Layers: 4, KVHeads: 8, HeadDim: 8}
}

func latentNS() prefixhash.Namespace {
	return prefixhash.Namespace{Model: "kvmesh/mla-test", DType: prefixhash.Float16, BlockTokens: 4,
		Layers: 4, Layout: prefixhash.LatentKV, LatentDim: 32}
}

// partBlock is a random whole block of ns and the means to cut parts of it.
type partBlock struct {
	ns      prefixhash.Namespace
	key     prefixhash.Key
	parent  prefixhash.Key
	tokens  []uint32
	payload []byte
	whole   []byte
}

func newPartBlock(t testing.TB, rng *rand.Rand, ns prefixhash.Namespace) *partBlock {
	enc, key, tokens, payload := blocktest.Random(t, rng, ns, ns.Root())
	return &partBlock{ns: ns, key: key, parent: ns.Root(), tokens: tokens, payload: payload, whole: enc}
}

// record encodes part p of the block, its payload taken from payload (nil:
// the block's own).
func (b *partBlock) record(t testing.TB, p block.Part, payload []byte) []byte {
	t.Helper()
	if payload == nil {
		payload = b.payload
	}
	lay := block.LayoutOf(b.ns)
	part := lay.ExtractPart(nil, payload, len(b.tokens), p)
	rec, _, err := block.AppendPartHeaderExt(nil, 0, b.ns, prefixhash.KeyLink(b.parent), b.tokens, nil, p, part)
	if err != nil {
		t.Fatal(err)
	}
	return append(rec, part...)
}

// rankParts returns the parts of tp × pp ranks.
func rankParts(t testing.TB, ns prefixhash.Namespace, tp, pp int) []block.Part {
	t.Helper()
	var ps []block.Part
	for r := range tp {
		for s := range pp {
			p, err := block.RankPart(ns, r, tp, s, pp)
			if err != nil {
				t.Fatal(err)
			}
			ps = append(ps, p)
		}
	}
	return ps
}

// checkWhole fails unless the block is cached with exactly its whole encoding.
func checkWhole(t testing.TB, l *Local, b *partBlock) {
	t.Helper()
	r, err := l.Get(context.Background(), b.key)
	if err != nil {
		t.Fatalf("the completed block: %v", err)
	}
	defer r.Release()
	if !bytes.Equal(r.Bytes(), b.whole) {
		t.Fatal("the block assembled from parts differs from the whole block's encoding")
	}
}

// checkPartialsFreed fails unless no incomplete block holds memory and the
// memory tier holds what the index says.
func checkPartialsFreed(t testing.TB, l *Local) {
	t.Helper()
	s := l.Stats()
	if s.PartialsOpen != 0 || s.PartialBytes != 0 {
		t.Fatalf("%d incomplete blocks still hold %d bytes", s.PartialsOpen, s.PartialBytes)
	}
	checkNoLeak(t, l)
	if err := s.Check(); err != nil {
		t.Fatal(err)
	}
}

func TestPartsAssembleConcurrently(t *testing.T) {
	for _, c := range []struct{ tp, pp int }{{2, 1}, {4, 1}, {8, 1}, {4, 2}, {1, 4}, {2, 3}} {
		t.Run(fmt.Sprintf("tp%d_pp%d", c.tp, c.pp), func(t *testing.T) {
			l := openLocal(t, Options{DRAM: realDRAM(t, 8<<20, 1<<20)})
			rng := rand.New(rand.NewPCG(uint64(c.tp), uint64(c.pp)))
			parts := rankParts(t, partsNS(), c.tp, c.pp)
			const blocks = 6
			var bs []*partBlock
			for range blocks {
				bs = append(bs, newPartBlock(t, rng, partsNS()))
			}
			var wg sync.WaitGroup
			errs := make(chan error, len(parts)*blocks)
			for _, p := range parts {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for _, b := range bs {
						if err := l.Put(context.Background(), b.record(t, p, nil)); err != nil {
							errs <- err
						}
					}
				}()
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				t.Fatal(err)
			}
			for _, b := range bs {
				checkWhole(t, l, b)
			}
			s := l.Stats()
			if s.PartsCompleted != blocks || s.PartsStored != int64(blocks*len(parts)) || s.Puts != blocks {
				t.Fatalf("completed %d, parts stored %d, puts %d; want %d, %d, %d", s.PartsCompleted, s.PartsStored, s.Puts, blocks, blocks*len(parts), blocks)
			}
			checkPartialsFreed(t, l)
		})
	}
}

func TestPartsIncompleteInvisible(t *testing.T) {
	ctx := context.Background()
	l := openLocal(t, Options{DRAM: realDRAM(t, 4<<20, 1<<20)})
	b := newPartBlock(t, rand.New(rand.NewPCG(1, 2)), partsNS())
	parts := rankParts(t, b.ns, 4, 1)
	for _, p := range parts[:3] { // a rank died mid-put
		if err := l.Put(ctx, b.record(t, p, nil)); err != nil {
			t.Fatal(err)
		}
	}
	if l.Contains(auth.Access{}, b.key) || l.LongestPrefix(auth.Access{}, []prefixhash.Key{b.key}) != 0 {
		t.Fatal("an incomplete block is visible to lookups")
	}
	if _, err := l.Get(ctx, b.key); !errors.Is(err, ErrNotFound) {
		t.Fatalf("Get of an incomplete block: %v, want ErrNotFound", err)
	}
	ps := l.Partials()
	if len(ps) != 1 || ps[0].Key != b.key || len(ps[0].Parts) != 3 || ps[0].Covered != 24 || ps[0].Layers != 4 || ps[0].Heads != 8 {
		t.Fatalf("Partials: %+v", ps)
	}
	s := l.Stats()
	if s.PartialsOpen != 1 || s.PartialBytes != int64(len(b.whole)) || s.Puts != 0 {
		t.Fatalf("stats: %d open, %d bytes, %d puts", s.PartialsOpen, s.PartialBytes, s.Puts)
	}
	if err := s.Check(); err != nil {
		t.Fatal(err) // the slot is accounted as an incomplete block's
	}
	// The last part completes it; a part of a complete block is a no-op.
	if err := l.Put(ctx, b.record(t, parts[3], nil)); err != nil {
		t.Fatal(err)
	}
	checkWhole(t, l, b)
	if err := l.Put(ctx, b.record(t, parts[0], nil)); err != nil {
		t.Fatal(err)
	}
	if s := l.Stats(); s.PartialsOpen != 0 || s.PartsStored != 4 {
		t.Fatalf("a part of a complete block opened a partial or was stored: %+v", s)
	}
	checkPartialsFreed(t, l)
}

func TestPartsOverlap(t *testing.T) {
	ctx := context.Background()
	l := openLocal(t, Options{DRAM: realDRAM(t, 4<<20, 1<<20)})
	rng := rand.New(rand.NewPCG(3, 4))
	b := newPartBlock(t, rng, partsNS())
	other := make([]byte, len(b.payload))
	for i := range other {
		other[i] = b.payload[i] ^ 0x5a
	}
	put := func(p block.Part, payload []byte) error { return l.Put(ctx, b.record(t, p, payload)) }
	if err := put(block.Part{L0: 0, L1: 2, H0: 0, H1: 4}, nil); err != nil {
		t.Fatal(err)
	}
	// Identical overlap: a no-op.
	if err := put(block.Part{L0: 1, L1: 2, H0: 0, H1: 2}, nil); err != nil {
		t.Fatalf("identical overlapping part: %v", err)
	}
	// Different bytes over covered cells: refused whole, even the cells
	// it would add (layers 2..3).
	for _, p := range []block.Part{{L0: 0, L1: 1, H0: 0, H1: 4}, {L0: 1, L1: 4, H0: 0, H1: 4}, {L0: 0, L1: 4, H0: 0, H1: 4}} {
		if err := put(p, other); !errors.Is(err, ErrPartConflict) {
			t.Fatalf("conflicting part %s: %v, want ErrPartConflict", p, err)
		}
	}
	s := l.Stats()
	if s.PartConflicts != 3 || s.PartsStored != 1 {
		t.Fatalf("conflicts %d, parts stored %d; want 3, 1", s.PartConflicts, s.PartsStored)
	}
	if ps := l.Partials(); len(ps) != 1 || ps[0].Covered != 8 {
		t.Fatalf("a refused part changed the coverage: %+v", ps)
	}
	// The same ranges with the right bytes complete the block: an overlap
	// with identical bytes copies the cells it adds.
	if err := put(block.Part{L0: 0, L1: 4, H0: 0, H1: 4}, nil); err != nil {
		t.Fatal(err)
	}
	if err := put(block.Part{L0: 0, L1: 4, H0: 4, H1: 8}, nil); err != nil {
		t.Fatal(err)
	}
	checkWhole(t, l, b)
	checkPartialsFreed(t, l)

	// A whole block put while its parts are being assembled supersedes them.
	b2 := newPartBlock(t, rng, partsNS())
	if err := l.Put(ctx, b2.record(t, block.Part{L0: 0, L1: 1, H0: 0, H1: 8}, nil)); err != nil {
		t.Fatal(err)
	}
	if err := l.Put(ctx, b2.whole); err != nil {
		t.Fatal(err)
	}
	checkWhole(t, l, b2)
	checkPartialsFreed(t, l)
}

// TestPartsOverlapConcurrently: ranks of instances of TP 2, 4 and 8 write
// the same blocks at once: their parts overlap with identical bytes, some
// wait for cells being copied, none conflicts, and each block completes
// with its own bytes.
func TestPartsOverlapConcurrently(t *testing.T) {
	l := openLocal(t, Options{DRAM: realDRAM(t, 8<<20, 1<<20)})
	rng := rand.New(rand.NewPCG(23, 24))
	var parts []block.Part
	for _, tp := range []int{2, 4, 8} {
		parts = append(parts, rankParts(t, partsNS(), tp, 1)...)
	}
	var bs []*partBlock
	for range 8 {
		bs = append(bs, newPartBlock(t, rng, partsNS()))
	}
	var wg sync.WaitGroup
	for k, p := range parts {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := range bs {
				b := bs[(j+k)%len(bs)]
				if err := l.Put(context.Background(), b.record(t, p, nil)); err != nil {
					t.Error(err)
				}
			}
		}()
	}
	wg.Wait()
	for _, b := range bs {
		checkWhole(t, l, b)
	}
	if s := l.Stats(); s.PartConflicts != 0 || s.PartsCompleted != int64(len(bs)) {
		t.Fatalf("conflicts %d, completed %d", s.PartConflicts, s.PartsCompleted)
	}
	checkPartialsFreed(t, l)
}

// fakeClock is an injectable Options.Now.
type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

func TestPartialsExpire(t *testing.T) {
	ctx := context.Background()
	clock := &fakeClock{now: time.Unix(1000, 0)}
	l := openLocal(t, Options{DRAM: realDRAM(t, 4<<20, 1<<20), Now: clock.Now, PartialTTL: time.Minute, ClaimTTL: time.Minute})
	rng := rand.New(rand.NewPCG(5, 6))
	b1, b2 := newPartBlock(t, rng, partsNS()), newPartBlock(t, rng, partsNS())
	half := block.Part{L0: 0, L1: 4, H0: 0, H1: 4}
	if err := l.Put(ctx, b1.record(t, half, nil)); err != nil {
		t.Fatal(err)
	}
	clock.advance(40 * time.Second)
	if err := l.Put(ctx, b2.record(t, half, nil)); err != nil {
		t.Fatal(err)
	}
	clock.advance(30 * time.Second) // b1 is 70 s old, b2 30 s
	l.sweep()                       // what the ticker does on an idle node
	ps := l.Partials()
	if len(ps) != 1 || ps[0].Key != b2.key || ps[0].Age != 30*time.Second {
		t.Fatalf("after b1's TTL: %+v", ps)
	}
	if s := l.Stats(); s.PartialsExpired != 1 || s.PartialBytes != int64(len(b2.whole)) {
		t.Fatalf("expired %d, partial bytes %d", s.PartialsExpired, s.PartialBytes)
	}
	// An expired block's parts start over: b1's other half alone stays incomplete.
	if err := l.Put(ctx, b1.record(t, block.Part{L0: 0, L1: 4, H0: 4, H1: 8}, nil)); err != nil {
		t.Fatal(err)
	}
	if l.Contains(auth.Access{}, b1.key) {
		t.Fatal("half a block completed with an expired half")
	}
	clock.advance(2 * time.Minute)
	l.sweep()
	checkPartialsFreed(t, l)
	if s := l.Stats(); s.PartialsExpired != 3 {
		t.Fatalf("expired %d, want 3", s.PartialsExpired)
	}
}

func TestPartialsDroppedFirstForRoom(t *testing.T) {
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(7, 8))
	ns := partsNS()
	open := func() *Local { return openLocal(t, Options{DRAM: realDRAM(t, 256<<10, 64<<10)}) }
	// How many whole blocks fit before the first eviction.
	l := open()
	fit := 0
	for l.Stats().Evictions == 0 {
		if err := l.Put(ctx, newPartBlock(t, rng, ns).whole); err != nil {
			t.Fatal(err)
		}
		fit++
	}
	fit--
	l = open()
	old, young := newPartBlock(t, rng, ns), newPartBlock(t, rng, ns)
	half := block.Part{L0: 0, L1: 2, H0: 0, H1: 8}
	for _, b := range []*partBlock{old, young} {
		if err := l.Put(ctx, b.record(t, half, nil)); err != nil {
			t.Fatal(err)
		}
	}
	var whole []*partBlock
	for range fit - 1 { // with the two partials, one more than fits
		whole = append(whole, newPartBlock(t, rng, ns))
		if err := l.Put(ctx, whole[len(whole)-1].whole); err != nil {
			t.Fatal(err)
		}
	}
	s := l.Stats()
	if s.Evictions != 0 || s.Demotions != 0 || s.PartialsDropped != 1 {
		t.Fatalf("evictions %d, demotions %d, partials dropped %d: want the oldest incomplete block dropped first", s.Evictions, s.Demotions, s.PartialsDropped)
	}
	if ps := l.Partials(); len(ps) != 1 || ps[0].Key != young.key {
		t.Fatalf("the younger incomplete block should remain: %+v", ps)
	}
	for _, b := range whole {
		if !l.Contains(auth.Access{}, b.key) {
			t.Fatal("a complete block went while an incomplete one was held")
		}
	}
	if err := s.Check(); err != nil {
		t.Fatal(err)
	}
}

func TestReserveCommitPart(t *testing.T) {
	ctx := context.Background()
	l := openLocal(t, Options{DRAM: realDRAM(t, 4<<20, 1<<20)})
	b := newPartBlock(t, rand.New(rand.NewPCG(9, 10)), partsNS())
	parts := rankParts(t, b.ns, 2, 1)
	for _, p := range parts {
		rec := b.record(t, p, nil)
		r, err := l.Reserve(ctx, b.key, b.parent, len(rec))
		if err != nil {
			t.Fatal(err)
		}
		copy(r.Buf(), rec)
		if err := r.Commit(); err != nil {
			t.Fatal(err)
		}
	}
	checkWhole(t, l, b)
	checkPartialsFreed(t, l)
}

// TestReserveCommitPartOneSlab: over a memory tier of a single slab, a
// part committed through its reservation is assembled (its slot is given
// back before the whole block's slot is taken); the next part finds no
// slot of its own to reserve while the incomplete block holds the slab,
// and completes the block through Put (what the data planes fall back to).
func TestReserveCommitPartOneSlab(t *testing.T) {
	ctx := context.Background()
	b := newPartBlock(t, rand.New(rand.NewPCG(9, 11)), partsNS())
	slab := int64(64 << 10)
	for slab < int64(len(b.whole))+64 {
		slab *= 2
	}
	l := openLocal(t, Options{DRAM: realDRAM(t, slab, slab)})
	for i, p := range rankParts(t, b.ns, 2, 1) {
		rec := b.record(t, p, nil)
		r, err := l.Reserve(ctx, b.key, b.parent, len(rec))
		if i > 0 { // the incomplete block holds the only slab
			if !errors.Is(err, tiers.ErrFull) {
				t.Fatalf("reserve for part %s beside the incomplete block: %v, want tiers.ErrFull", p, err)
			}
			if err := l.Put(ctx, rec); err != nil {
				t.Fatalf("put of part %s: %v", p, err)
			}
			continue
		}
		if err != nil {
			t.Fatalf("reserve for part %s: %v", p, err)
		}
		copy(r.Buf(), rec)
		if err := r.Commit(); err != nil {
			t.Fatalf("commit of part %s: %v", p, err)
		}
	}
	checkWhole(t, l, b)
	checkPartialsFreed(t, l)
}

func TestClaim(t *testing.T) {
	ctx := context.Background()
	clock := &fakeClock{now: time.Unix(1000, 0)}
	l := openLocal(t, Options{DRAM: realDRAM(t, 4<<20, 1<<20), Now: clock.Now, ClaimTTL: 10 * time.Second})
	b := newPartBlock(t, rand.New(rand.NewPCG(11, 12)), partsNS())
	left, right := block.Part{L0: 0, L1: 4, H0: 0, H1: 4}, block.Part{L0: 0, L1: 4, H0: 4, H1: 8}
	want := func(p block.Part, st block.ClaimStatus) {
		t.Helper()
		got, err := l.Claim(ctx, b.key, p)
		if err != nil || got != st {
			t.Fatalf("Claim %s: %v, %v; want %v", p, got, err, st)
		}
	}
	want(left, block.ClaimWrite)
	want(left, block.ClaimClaimed)
	want(block.Part{L0: 0, L1: 1, H0: 2, H1: 4}, block.ClaimClaimed) // overlaps
	want(right, block.ClaimWrite)
	clock.advance(11 * time.Second) // right's claim lapses, left's too
	want(right, block.ClaimWrite)
	want(left, block.ClaimWrite)
	if err := l.Put(ctx, b.record(t, left, nil)); err != nil {
		t.Fatal(err)
	}
	want(left, block.ClaimCovered) // the put released left's claim; its cells are stored
	want(block.Part{L0: 2, L1: 3, H0: 0, H1: 2}, block.ClaimCovered)
	want(right, block.ClaimClaimed)
	if _, err := l.Claim(ctx, b.key, block.Part{L0: 0, L1: 4, H0: 0, H1: 3}); !errors.Is(err, block.ErrBadPart) {
		t.Fatalf("Claim of a bad range: %v", err)
	}
	if err := l.Put(ctx, b.record(t, right, nil)); err != nil {
		t.Fatal(err)
	}
	want(right, block.ClaimComplete)
	s := l.Stats()
	if s.Claims != [4]int64{4, 1, 2, 3} {
		t.Fatalf("claims by kind %v", s.Claims)
	}
	l.mu.Lock()
	n := l.mu.parts.nclaims
	l.mu.Unlock()
	if n != 0 {
		t.Fatalf("%d claims remain after the block completed", n)
	}
}

// TestMLAOneCopy: 8 tensor-parallel ranks of a latent-attention model hold
// the same latent; each Claims its part and sends it only on block.ClaimWrite, so
// one copy is sent and stored.
func TestMLAOneCopy(t *testing.T) {
	for _, pp := range []int{1, 2} {
		t.Run(fmt.Sprintf("pp%d", pp), func(t *testing.T) {
			ctx := context.Background()
			l := openLocal(t, Options{DRAM: realDRAM(t, 4<<20, 1<<20)})
			b := newPartBlock(t, rand.New(rand.NewPCG(13, uint64(pp))), latentNS())
			parts := rankParts(t, b.ns, 8, pp)
			var wg sync.WaitGroup
			var mu sync.Mutex
			sent := 0
			for _, p := range parts {
				wg.Add(1)
				go func() {
					defer wg.Done()
					st, err := l.Claim(ctx, b.key, p)
					if err != nil {
						t.Error(err)
						return
					}
					if st != block.ClaimWrite {
						return
					}
					rec := b.record(t, p, nil)
					if err := l.Put(ctx, rec); err != nil {
						t.Error(err)
					}
					mu.Lock()
					sent += len(rec) - block.NamespaceHeaderLen(b.ns)
					mu.Unlock()
				}()
			}
			wg.Wait()
			checkWhole(t, l, b)
			if sent != len(b.payload) {
				t.Fatalf("ranks sent %d payload bytes, one copy is %d", sent, len(b.payload))
			}
			s := l.Stats()
			if s.Puts != 1 || s.Tiers[0].Bytes != int64(len(b.whole)) {
				t.Fatalf("%d blocks, %d bytes stored; want one copy (%d bytes)", s.Puts, s.Tiers[0].Bytes, len(b.whole))
			}
			checkPartialsFreed(t, l)
		})
	}
}

func TestPartsBadInput(t *testing.T) {
	ctx := context.Background()
	l := openLocal(t, Options{DRAM: realDRAM(t, 4<<20, 1<<20), MaxBlockBytes: 2 << 10})
	b := newPartBlock(t, rand.New(rand.NewPCG(15, 16)), partsNS())
	p := block.Part{L0: 0, L1: 1, H0: 0, H1: 8}
	rec := b.record(t, p, nil)
	if err := l.Put(ctx, rec); !errors.Is(err, block.ErrTooLarge) {
		t.Fatalf("a part of a block over MaxBlockBytes: %v", err)
	}
	l = openLocal(t, Options{DRAM: realDRAM(t, 4<<20, 1<<20)})
	bad := bytes.Clone(rec)
	bad[len(bad)-1] ^= 1
	if err := l.Put(ctx, bad); !errors.Is(err, block.ErrCorrupt) {
		t.Fatalf("a part with a bad payload checksum: %v", err)
	}
	tenant := auth.WithAccess(ctx, auth.Access{Tag: 7, Scoped: true})
	if err := l.Put(tenant, rec); !errors.Is(err, ErrTenant) {
		t.Fatalf("a part of another tenant: %v", err)
	}
	// A block of more cells than MaxPartCells (4096 layers × 32 heads of
	// one int8 each): its 2 KiB record would have the node allocate its
	// grids.
	huge := prefixhash.Namespace{Model: "kvmesh/huge-grid", DType: prefixhash.Int8, BlockTokens: 1, Layers: 4096, KVHeads: 32, HeadDim: 1}
	hb := newPartBlock(t, rand.New(rand.NewPCG(17, 18)), huge)
	if err := l.Put(ctx, hb.record(t, block.Part{L0: 0, L1: 1, H0: 0, H1: 32}, nil)); !errors.Is(err, block.ErrBadPart) {
		t.Fatalf("a part of a block of %d cells: %v", 4096*32, err)
	}
	if s := l.Stats(); s.PartialsOpen != 0 || s.PartsStored != 0 {
		t.Fatalf("a refused part was kept: %+v", s)
	}
	if err := l.Put(ctx, rec); err != nil {
		t.Fatalf("the node stopped taking parts: %v", err)
	}
}

// TestPartsClose: Close frees the incomplete blocks (the invariants build
// checks the tiers at Close).
func TestPartsClose(t *testing.T) {
	l, err := Open(Options{DRAM: realDRAM(t, 4<<20, 1<<20)})
	if err != nil {
		t.Fatal(err)
	}
	b := newPartBlock(t, rand.New(rand.NewPCG(17, 18)), partsNS())
	if err := l.Put(context.Background(), b.record(t, block.Part{L0: 0, L1: 1, H0: 0, H1: 8}, nil)); err != nil {
		t.Fatal(err)
	}
	if _, err := l.Claim(context.Background(), b.key, block.Part{L0: 1, L1: 2, H0: 0, H1: 8}); err != nil {
		t.Fatal(err)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	if s := l.Stats(); s.PartialsOpen != 0 || s.PartialBytes != 0 {
		t.Fatalf("after Close: %d incomplete blocks, %d bytes", s.PartialsOpen, s.PartialBytes)
	}
}

// FuzzPutPart: whatever header and part bytes arrive after a first part,
// Put never panics, and the block is indexed only as a valid sealed whole
// block whose bytes the parts gave.
func FuzzPutPart(f *testing.F) {
	rng := rand.New(rand.NewPCG(19, 20))
	ns := blocktest.NS() // 2 layers × 2 heads
	b := newPartBlock(f, rng, ns)
	first := block.Part{L0: 0, L1: 1, H0: 0, H1: 2}
	f.Add(b.record(f, block.Part{L0: 1, L1: 2, H0: 0, H1: 2}, nil))
	f.Add(b.record(f, block.Part{L0: 1, L1: 2, H0: 1, H1: 2}, nil))
	f.Add(b.record(f, block.Part{L0: 0, L1: 2, H0: 0, H1: 1}, nil))
	f.Add(b.whole)
	f.Add(b.record(f, first, nil)[:100])
	f.Fuzz(func(t *testing.T, data []byte) {
		l := openLocal(t, Options{DRAM: realDRAM(t, 1<<20, 1<<20), MaxBlockBytes: 32 << 10})
		ctx := context.Background()
		if err := l.Put(ctx, b.record(t, first, nil)); err != nil {
			t.Fatal(err)
		}
		_ = l.Put(ctx, data)
		_ = l.Put(ctx, data) // again: identical, a no-op or the same refusal
		h, err := block.DecodeHeader(data, 0)
		keys := []prefixhash.Key{b.key}
		if err == nil {
			keys = append(keys, h.Key)
		}
		for _, k := range keys {
			r, err := l.Get(ctx, k)
			if err != nil {
				continue
			}
			got, derr := block.Decode(r.Bytes(), 0)
			switch {
			case derr != nil:
				t.Fatalf("indexed a block that does not decode: %v", derr)
			case !got.Header.Whole():
				t.Fatalf("indexed a part %s", got.Header.Part)
			case k == b.key && (err != nil || h.Key != b.key || !h.Whole()) &&
				!bytes.Equal(block.LayoutOf(ns).ExtractPart(nil, got.Payload, len(b.tokens), first), b.record(t, first, nil)[len(b.whole)-len(b.payload):]):
				t.Fatal("the block assembled lost the first part's bytes")
			}
			r.Release()
		}
		if err := l.Stats().Check(); err != nil {
			t.Fatal(err)
		}
	})
}
