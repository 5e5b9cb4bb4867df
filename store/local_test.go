package store

import (
	"bytes"
	"context"
	"errors"
	"testing"

	"github.com/kvmesh/kvmesh/auth"
	"github.com/kvmesh/kvmesh/block"
	"github.com/kvmesh/kvmesh/block/blocktest"
	"github.com/kvmesh/kvmesh/internal/testkit"
	"github.com/kvmesh/kvmesh/prefixhash"
	"github.com/kvmesh/kvmesh/tiers"
)

// blockBytes is the encoded size of blockNS blocks.
var blockBytes = block.EncodedLen(blocktest.NS().BlockTokens, blocktest.NS().BlockBytes())

// TestLocalChainEvictsLeavesFirst puts a long chain into a memory tier that
// holds half of it: what stays is a prefix of the chain, never a suffix.
func TestLocalChainEvictsLeavesFirst(t *testing.T) {
	w := newWorld(t, 31, blocktest.NS())
	l := openLocal(t, Options{DRAM: newFakeMem(4096, 4, 1024), DemoteBatchBytes: 1}) // 16 blocks
	keys := w.chain(w.putChain(t, l, 32))
	n := cachedPrefix(t, l, keys)
	t.Logf("cached prefix: %d of %d blocks", n, len(keys))
}

// cachedPrefix returns how many leading blocks of keys are cached, and fails
// unless the root is and no block past them is.
func cachedPrefix(t *testing.T, l *Local, keys []prefixhash.Key) int {
	t.Helper()
	n := l.LongestPrefix(auth.Access{}, keys)
	if n == 0 {
		t.Fatal("the chain's root was evicted")
	}
	for _, k := range keys[n:] {
		if l.Contains(auth.Access{}, k) {
			t.Fatalf("a descendant is cached past the cached prefix of %d blocks", n)
		}
	}
	return n
}

// TestLocalClassed exercises size classes: a block whose class owns no
// memory gets room by evacuating a slab of another class, whose blocks are
// demoted (or dropped without NVMe), never by growing the tier.
func TestLocalClassed(t *testing.T) {
	small := blocktest.NS()
	big := blocktest.NS()
	big.HeadDim = 32 // 2176-byte blocks, class 1
	for _, disk := range []bool{false, true} {
		mem := newFakeMem(8192, 4, 1024, 4096)
		opts := Options{DRAM: mem, DemoteBatchBytes: 1}
		if disk {
			opts.NVMe = newFakeVolume(64<<10, 16).open()
		}
		l := openLocal(t, opts)
		ctx := context.Background()
		ws, wb := newWorld(t, 41, small), newWorld(t, 42, big)
		for range 40 { // fills all 4 slabs with class 0
			if err := l.Put(ctx, ws.blocks[ws.grow()].enc); err != nil {
				t.Fatal(err)
			}
		}
		if mem.ClassHasMemory(1) {
			t.Fatal("class 1 owns memory before any big block")
		}
		for range 3 {
			b := wb.blocks[wb.grow()]
			if err := l.Put(ctx, b.enc); err != nil {
				t.Fatalf("disk=%v: big block: %v", disk, err)
			}
			if info, ok := l.Info(auth.Access{}, b.key); !ok || info.Tier != "dram" {
				t.Fatalf("disk=%v: big block is in %+v, want dram", disk, info)
			}
		}
		s := l.Stats()
		if s.Tiers[0].Reserved > s.Tiers[0].Capacity {
			t.Fatalf("memory tier over capacity: %+v", s.Tiers[0])
		}
		if disk && s.Demotions == 0 || !disk && s.Evictions == 0 {
			t.Fatalf("disk=%v: no slab was evacuated: %+v", disk, s)
		}
		for _, b := range ws.blocks {
			if r, err := l.Get(ctx, b.key); err == nil {
				if !bytes.Equal(r.Bytes(), b.enc) {
					t.Fatal("a small block came back different")
				}
				r.Release()
			}
		}
	}
}

// TestLocalBadInput feeds blocks that must be refused with a clear error.
func TestLocalBadInput(t *testing.T) {
	ns := blocktest.NS()
	w := newWorld(t, 51, ns)
	cached := w.blocks[w.grow()].enc
	good := w.blocks[w.grow()].enc
	l := openLocal(t, Options{DRAM: newFakeMem(4096, 4, 1024), MaxBlockBytes: ns.BlockBytes()})
	ctx := context.Background()

	wrongLayout := func() []byte {
		// A block of another layout whose header claims ns's digest.
		other := ns
		other.HeadDim = 4
		b, _, _, _ := blocktest.Random(t, w.rng, other, ns.Root())
		d := ns.Digest()
		for i := range 8 {
			b[16+i] = byte(d >> (8 * i))
		}
		blocktest.Reseal(b)
		return b
	}
	big := ns
	big.HeadDim = 16
	bigBlock, _, _, _ := blocktest.Random(t, w.rng, big, big.Root())
	flipped := append([]byte(nil), good...)
	flipped[len(flipped)-1] ^= 1

	if err := l.Put(ctx, cached); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name  string
		block []byte
		want  error
	}{
		{"nil", nil, block.ErrCorrupt},
		{"garbage", bytes.Repeat([]byte("kvmesh"), 100), block.ErrCorrupt},
		{"truncated", good[:len(good)-1], block.ErrCorrupt},
		{"header only", good[:block.HeaderLen(ns.BlockTokens)], block.ErrCorrupt},
		{"extended", append(append([]byte(nil), good...), 0), block.ErrCorrupt},
		{"payload flipped", flipped, block.ErrCorrupt},
		{"over MaxBlockBytes", bigBlock, block.ErrTooLarge},
		{"wrong layout for its namespace", wrongLayout(), ErrLayout},
		{"cached key, truncated", cached[:len(cached)-1], block.ErrCorrupt},
	} {
		if err := l.Put(ctx, tc.block); !errors.Is(err, tc.want) {
			t.Errorf("%s: Put = %v, want %v", tc.name, err, tc.want)
		}
	}
	// A block no tier can hold.
	l2 := openLocal(t, Options{DRAM: newFakeMem(512, 4, 512)})
	if err := l2.Put(ctx, good); !errors.Is(err, block.ErrTooLarge) {
		t.Errorf("block larger than any size class: %v", err)
	}
	if _, err := Open(Options{}); err == nil {
		t.Error("Open without a memory tier succeeded")
	}
	if _, err := Open(Options{DRAM: newFakeMem(4096, 1, 1024), MaxBlockBytes: -1}); err == nil {
		t.Error("negative MaxBlockBytes accepted")
	}
	s := l.Stats()
	if s.Puts != 1 || totalBlocks(s) != 1 || l.Contains(auth.Access{}, w.blocks[1].key) {
		t.Fatalf("bad input changed the cache: %+v", s)
	}
}

// TestLocalFull: with every block pinned, a write is refused with ErrFull
// and nothing is freed under a reader.
func TestLocalFull(t *testing.T) {
	w := newWorld(t, 61, blocktest.NS())
	mem := newFakeMem(4096, 2, 1024) // 8 blocks
	l := openLocal(t, Options{DRAM: mem})
	ctx := context.Background()
	var refs []*Ref
	for range 8 {
		refs = append(refs, putGet(t, l, w.blocks[w.grow()]))
	}
	if err := l.Put(ctx, w.blocks[w.extend(-1)].enc); !errors.Is(err, ErrFull) {
		t.Fatalf("Put with everything pinned = %v, want ErrFull", err)
	}
	for k, r := range refs {
		if !bytes.Equal(r.Bytes(), w.blocks[k].enc) {
			t.Fatal("a pinned block changed")
		}
		r.Release()
	}
	if err := l.Put(ctx, w.blocks[w.grow()].enc); err != nil {
		t.Fatalf("Put after releasing: %v", err)
	}
	if s := l.Stats(); s.Refused != 1 {
		t.Fatalf("refused writes counted %d, want 1", s.Refused)
	}
}

// TestLocalCorrupt damages stored blocks: each read becomes a counted miss,
// the block and its descendants are dropped, and wrong bytes are never
// served.
func TestLocalCorrupt(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name   string
		silent bool
	}{{"tier checksum", false}, {"block checksum", true}} {
		t.Run(tc.name, func(t *testing.T) {
			w := newWorld(t, 71, blocktest.NS())
			vol := newFakeVolume(64<<10, 8)
			l := openLocal(t, Options{DRAM: newFakeMem(4096, 1, 1024), NVMe: vol.open(), DemoteBatchBytes: 1})
			last := w.putChain(t, l, 12) // memory holds 4: the chain's head goes to disk
			keys := w.chain(last)
			if info, _ := l.Info(auth.Access{}, keys[1]); info.Tier != "nvme" {
				t.Fatalf("block 1 is in %q, want nvme", info.Tier)
			}
			if !vol.damage(keys[1], tc.silent) {
				t.Fatal("block 1 not on the volume")
			}
			if _, err := l.Get(ctx, keys[1]); !errors.Is(err, ErrNotFound) {
				t.Fatalf("Get of a corrupt block = %v, want ErrNotFound", err)
			}
			if n := l.LongestPrefix(auth.Access{}, keys); n != 1 {
				t.Fatalf("after block 1 was dropped, the cached prefix is %d blocks, want 1", n)
			}
			for _, k := range keys[1:] {
				if l.Contains(auth.Access{}, k) {
					t.Fatal("a descendant of the corrupt block is still cached")
				}
			}
			s := l.Stats()
			if s.CorruptDrops != 1 || s.Misses != 1 || s.Cascaded != int64(len(keys)-2) {
				t.Fatalf("counters after one corrupt read: %+v", s)
			}
		})
	}
	t.Run("memory", func(t *testing.T) {
		w := newWorld(t, 72, blocktest.NS())
		mem := newFakeMem(4096, 1, 1024)
		l := openLocal(t, Options{DRAM: mem, VerifyMemoryHits: true})
		b := w.blocks[w.grow()]
		if err := l.Put(ctx, b.enc); err != nil {
			t.Fatal(err)
		}
		loc, _ := mem.locOf(b.key)
		mem.View(loc, len(b.enc))[len(b.enc)-1] ^= 1 // memory went bad
		if _, err := l.Get(ctx, b.key); !errors.Is(err, ErrNotFound) {
			t.Fatalf("Get of corrupt memory = %v, want ErrNotFound", err)
		}
		if s := l.Stats(); s.CorruptDrops != 1 || s.Hits != 0 || s.Misses != 1 || mem.Stats().Values != 0 {
			t.Fatalf("after a corrupt memory hit: %+v, tier %+v", s, mem.Stats())
		}
	})
}

// TestLocalReopen closes a node and opens it again over the same volume: the
// blocks that were on NVMe are served again, and the background scan
// resolves their namespace and parents.
func TestLocalReopen(t *testing.T) {
	ctx := context.Background()
	for _, skipScan := range []bool{false, true} {
		w := newWorld(t, 81, blocktest.NS())
		vol := newFakeVolume(64<<10, 8)
		l, err := Open(Options{DRAM: newFakeMem(4096, 1, 1024), NVMe: vol.open(), DemoteBatchBytes: 1})
		if err != nil {
			t.Fatal(err)
		}
		last := w.putChain(t, l, 20)
		keys := w.chain(last)
		onDisk := l.Stats().Tiers[1].Blocks
		var diskKeys []prefixhash.Key
		prefix := -1
		for n, k := range keys {
			if info, _ := l.Info(auth.Access{}, k); info.Tier == "nvme" {
				diskKeys = append(diskKeys, k)
			} else if prefix < 0 {
				prefix = n
			}
		}
		if err := l.Close(); err != nil {
			t.Fatal(err)
		}

		l = openLocal(t, Options{DRAM: newFakeMem(4096, 1, 1024), NVMe: vol.open(), DemoteBatchBytes: 1, SkipRecoveryScan: skipScan})
		s := l.Stats()
		if s.Recovered != onDisk || s.Recovered == 0 {
			t.Fatalf("recovered %d blocks, %d were on NVMe", s.Recovered, onDisk)
		}
		if n := l.LongestPrefix(auth.Access{}, keys); n != prefix || n == 0 {
			t.Fatalf("cached prefix after reopen: %d blocks, want %d", n, prefix)
		}
		if !skipScan {
			testkit.WaitFor(t, "the background scan to read every recovered header", func() bool {
				for _, n := range l.Stats().Namespaces {
					if n.Digest == 0 {
						return false
					}
				}
				return true
			})
			if s := l.Stats(); len(s.Namespaces) != 1 || s.Namespaces[0].Digest != blocktest.NS().Digest() ||
				s.Namespaces[0].Tokens != onDisk*int64(blocktest.NS().BlockTokens) {
				t.Fatalf("namespaces after the scan: %+v", s.Namespaces)
			}
			if info, _ := l.Info(auth.Access{}, keys[1]); !info.Parent {
				t.Fatal("recovered block 1 is not linked to block 0")
			}
			if info, _ := l.Info(auth.Access{}, keys[0]); info.Tokens != blocktest.NS().BlockTokens {
				t.Fatalf("recovered block 0: %+v", info)
			}
		}
		for i, k := range diskKeys {
			r, err := l.Get(ctx, k)
			if err != nil {
				t.Fatalf("recovered block %d: %v", i, err)
			}
			if !bytes.Equal(r.Bytes(), w.blocks[w.byKey[k]].enc) {
				t.Fatalf("recovered block %d differs", i)
			}
			r.Release()
		}
		if skipScan {
			// Reads resolved them.
			if n := l.Stats().Namespaces; len(n) != 1 || n[0].Digest != blocktest.NS().Digest() {
				t.Fatalf("namespaces after reading every block: %+v", n)
			}
		}
	}
}

// TestLocalDropNamespaceUnresolved drops a namespace while its recovered
// blocks are unread: reading them later is a miss.
func TestLocalDropNamespaceUnresolved(t *testing.T) {
	ctx := context.Background()
	w := newWorld(t, 82, blocktest.NS())
	vol := newFakeVolume(64<<10, 8)
	l, err := Open(Options{DRAM: newFakeMem(4096, 1, 1024), NVMe: vol.open(), DemoteBatchBytes: 1})
	if err != nil {
		t.Fatal(err)
	}
	w.putGrown(t, l, 10)
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	l = openLocal(t, Options{DRAM: newFakeMem(4096, 1, 1024), NVMe: vol.open(), SkipRecoveryScan: true})
	if _, err := l.DropNamespace(blocktest.NS().Digest()); err != nil {
		t.Fatal(err)
	}
	for _, b := range w.blocks {
		if _, err := l.Get(ctx, b.key); !errors.Is(err, ErrNotFound) {
			t.Fatalf("Get after DropNamespace = %v, want ErrNotFound", err)
		}
	}
	s := l.Stats()
	if totalBlocks(s) != 0 || s.NamespaceDrops != s.Recovered {
		t.Fatalf("after dropping: %+v", s)
	}
}

func TestLocalDropNamespace(t *testing.T) {
	ctx := context.Background()
	a, b := blocktest.NS(), blocktest.NS()
	b.TenantSalt = "tenant b"
	wa, wb := newWorld(t, 91, a), newWorld(t, 92, b)
	mem := newFakeMem(64<<10, 16, 1024)
	l := openLocal(t, Options{DRAM: mem})
	for range 50 {
		for _, w := range []*world{wa, wb} {
			if err := l.Put(ctx, w.blocks[w.grow()].enc); err != nil {
				t.Fatal(err)
			}
		}
	}
	pinned, err := l.Get(ctx, wa.blocks[0].key)
	if err != nil {
		t.Fatal(err)
	}
	n, err := l.DropNamespace(a.Digest())
	if err != nil || n != 50 {
		t.Fatalf("DropNamespace = %d, %v; want 50", n, err)
	}
	for _, blk := range wa.blocks {
		if l.Contains(auth.Access{}, blk.key) {
			t.Fatal("a block of the dropped namespace is still cached")
		}
	}
	for _, blk := range wb.blocks {
		if !l.Contains(auth.Access{}, blk.key) {
			t.Fatal("a block of the other namespace was dropped")
		}
	}
	if !bytes.Equal(pinned.Bytes(), wa.blocks[0].enc) {
		t.Fatal("a pinned block changed when its namespace was dropped")
	}
	pinned.Release()
	s := l.Stats()
	if len(s.Namespaces) != 1 || s.Namespaces[0].Digest != b.Digest() || s.Namespaces[0].Blocks != 50 ||
		s.Tiers[0].Values != 50 || mem.Stats().Values != 50 {
		t.Fatalf("after dropping a namespace: %+v", s)
	}
}

func TestLocalInfo(t *testing.T) {
	ctx := context.Background()
	w := newWorld(t, 101, blocktest.NS())
	l := openLocal(t, Options{DRAM: newFakeMem(4096, 4, 1024)})
	p := w.extend(-1)
	c := w.extend(p)
	for _, i := range []int{p, c} {
		if err := l.Put(ctx, w.blocks[i].enc); err != nil {
			t.Fatal(err)
		}
	}
	r, err := l.Get(ctx, w.blocks[p].key)
	if err != nil {
		t.Fatal(err)
	}
	info, ok := l.Info(auth.Access{}, w.blocks[p].key)
	want := BlockInfo{Key: w.blocks[p].key, Tier: "dram", Size: blockBytes, Namespace: blocktest.NS().Digest(),
		Tokens: blocktest.NS().BlockTokens, Hits: 1, Pins: 1, Children: 1}
	if !ok || info != want {
		t.Fatalf("Info = %+v, want %+v", info, want)
	}
	r.Release()
	if info, _ := l.Info(auth.Access{}, w.blocks[c].key); !info.Parent || info.Children != 0 {
		t.Fatalf("child Info = %+v", info)
	}
	if _, ok := l.Info(auth.Access{}, randKey(w.rng)); ok {
		t.Fatal("Info of an absent key")
	}
}

// TestLocalClose: Close refuses while a Ref is live, then succeeds.
func TestLocalClose(t *testing.T) {
	ctx := context.Background()
	w := newWorld(t, 111, blocktest.NS())
	mem := newFakeMem(4096, 4, 1024)
	l, err := Open(Options{DRAM: mem})
	if err != nil {
		t.Fatal(err)
	}
	b := w.blocks[w.grow()]
	r := putGet(t, l, b)
	if err := l.Close(); !errors.Is(err, ErrPinned) {
		t.Fatalf("Close with a live Ref = %v, want ErrPinned", err)
	}
	if _, err := l.Get(ctx, b.key); !errors.Is(err, ErrClosed) {
		t.Fatalf("Get after Close = %v", err)
	}
	if err := l.Put(ctx, w.blocks[w.grow()].enc); !errors.Is(err, ErrClosed) {
		t.Fatalf("Put after Close = %v", err)
	}
	if !bytes.Equal(r.Bytes(), b.enc) {
		t.Fatal("the Ref's bytes changed")
	}
	r.Release()
	r.Release() // a second Release does nothing
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	if !mem.closed {
		t.Fatal("Close left the tier open")
	}
	if err := l.Close(); !errors.Is(err, ErrClosed) {
		t.Fatalf("second Close = %v", err)
	}
}

// TestLocalNoViewer runs over a memory tier that cannot be viewed in place:
// Gets copy.
func TestLocalNoViewer(t *testing.T) {
	ctx := context.Background()
	w := newWorld(t, 121, blocktest.NS())
	mem := newFakeMem(4096, 2, 1024)
	l := openLocal(t, Options{DRAM: plainTier{mem}, NVMe: newFakeVolume(64<<10, 4).open(), DemoteBatchBytes: 1})
	w.putGrown(t, l, 20)
	for _, b := range w.blocks {
		r, err := l.Get(ctx, b.key)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(r.Bytes(), b.enc) {
			t.Fatal("Get returned other bytes")
		}
		r.Release()
	}
	loc, _ := mem.locOf(w.blocks[19].key)
	mem.corrupt[loc] = true
	if _, err := l.Get(ctx, w.blocks[19].key); !errors.Is(err, ErrNotFound) {
		t.Fatalf("Get of a corrupt block = %v", err)
	}
	if s := l.Stats(); s.CorruptDrops != 1 {
		t.Fatalf("corrupt drops = %d", s.CorruptDrops)
	}
}

// plainTier hides every optional interface of a tier.
type plainTier struct{ t tiers.Tier }

func (p plainTier) Name() string                                      { return p.t.Name() }
func (p plainTier) Put(k prefixhash.Key, v []byte) (tiers.Loc, error) { return p.t.Put(k, v) }
func (p plainTier) Read(loc tiers.Loc, dst []byte) error              { return p.t.Read(loc, dst) }
func (p plainTier) Free(loc tiers.Loc)                                { p.t.Free(loc) }
func (p plainTier) Stats() tiers.Stats                                { return p.t.Stats() }
func (p plainTier) Close() error                                      { return p.t.Close() }

// TestLocalMaxBlocks: the index never holds more than MaxBlocks blocks,
// whatever the tiers could hold.
func TestLocalMaxBlocks(t *testing.T) {
	for _, disk := range []bool{false, true} {
		w := newWorld(t, 161, blocktest.NS())
		opts := Options{DRAM: newFakeMem(64<<10, 16, 1024), MaxBlocks: 10, DemoteBatchBytes: 1}
		if disk {
			opts.DRAM = newFakeMem(4096, 1, 1024)
			opts.NVMe = newFakeVolume(2*blockBytes, 16).open()
		}
		l := openLocal(t, opts)
		for range 50 {
			w.putGrown(t, l, 1)
			if n := totalBlocks(l.Stats()); n > 10 {
				t.Fatalf("disk=%v: %d blocks cached, MaxBlocks is 10", disk, n)
			}
		}
		if s := l.Stats(); totalBlocks(s) < 5 || s.Evictions == 0 {
			t.Fatalf("disk=%v: %+v", disk, s)
		}
	}
}

// FuzzLocalPut puts arbitrary bytes: Put must never panic, and what it
// accepts must come back from Get byte for byte.
func FuzzLocalPut(f *testing.F) {
	w := newWorld(f, 171, blocktest.NS())
	good := w.blocks[w.grow()].enc
	f.Add(good)
	f.Add(good[:block.HeaderLen(blocktest.NS().BlockTokens)])
	f.Add([]byte("KVMB"))
	f.Fuzz(func(t *testing.T, data []byte) {
		l := openLocal(t, Options{DRAM: newFakeMem(64<<10, 4, 1024, 16<<10, 64<<10), MaxBlockBytes: 32 << 10})
		if err := l.Put(context.Background(), data); err != nil {
			return
		}
		h, err := block.DecodeHeader(data, 0)
		if err != nil {
			t.Fatalf("Put accepted bytes that do not decode: %v", err)
		}
		if !h.Whole() {
			return // a part: FuzzPutPart covers them
		}
		r, err := l.Get(context.Background(), h.Key)
		if err != nil {
			t.Fatalf("Get of the block just put: %v", err)
		}
		defer r.Release()
		if !bytes.Equal(r.Bytes(), data) {
			t.Fatal("Get returned other bytes than Put accepted")
		}
	})
}

// TestLocalLookupDoesNotTouch: a lookup leaves LRU order alone (the oldest
// block is still the first evicted after it is looked up), a read touches.
func TestLocalLookupDoesNotTouch(t *testing.T) {
	w := newWorld(t, 33, blocktest.NS())
	l := openLocal(t, Options{DRAM: newFakeMem(4096, 4, 1024), DemoteBatchBytes: 1}) // 16 blocks
	ctx := context.Background()
	var roots []int
	for range 16 {
		roots = append(roots, w.extend(-1))
		if err := l.Put(ctx, w.blocks[roots[len(roots)-1]].enc); err != nil {
			t.Fatal(err)
		}
	}
	key := func(i int) prefixhash.Key { return w.blocks[roots[i]].key }
	for range 3 {
		if n := l.LongestPrefix(auth.Access{}, []prefixhash.Key{key(0)}); n != 1 {
			t.Fatalf("lookup of a cached block: %d", n)
		}
	}
	r := putGet(t, l, w.blocks[roots[1]]) // already there: a read
	r.Release()
	for range 2 {
		roots = append(roots, w.extend(-1))
		if err := l.Put(ctx, w.blocks[roots[len(roots)-1]].enc); err != nil {
			t.Fatal(err)
		}
	}
	if l.Contains(auth.Access{}, key(0)) {
		t.Error("the oldest block, only looked up, outlived newer ones: the lookup touched it")
	}
	if !l.Contains(auth.Access{}, key(1)) {
		t.Error("the block just read was evicted before older ones")
	}
	if l.Contains(auth.Access{}, key(2)) {
		t.Error("block 2, older than the read one, was kept")
	}
}

// TestLocalGetManyFromDisk: a GetMany whose blocks are mostly on the
// persistent tier reads them in parallel and returns each block's own
// bytes, a miss as nil, and leaves nothing pinned.
func TestLocalGetManyFromDisk(t *testing.T) {
	w := newWorld(t, 35, blocktest.NS())
	l := openLocal(t, Options{DRAM: newFakeMem(4096, 4, 1024), NVMe: newFakeVolume(64<<10, 16).open(), DemoteBatchBytes: 1})
	ctx := context.Background()
	var keys []prefixhash.Key
	var want [][]byte
	for range 40 {
		b := w.blocks[w.extend(-1)]
		if err := l.Put(ctx, b.enc); err != nil {
			t.Fatal(err)
		}
		keys, want = append(keys, b.key), append(want, b.enc)
	}
	missing := w.blocks[w.extend(-1)]
	keys, want = append(keys, missing.key), append(want, nil)
	for round := range 3 {
		refs, err := l.GetMany(ctx, keys)
		if err != nil {
			t.Fatal(err)
		}
		for k, r := range refs {
			switch {
			case want[k] == nil && r != nil:
				t.Fatalf("round %d: the missing block was found", round)
			case want[k] != nil && r == nil:
				t.Fatalf("round %d: block %d missing", round, k)
			case r != nil && !bytes.Equal(r.Bytes(), want[k]):
				t.Fatalf("round %d: block %d came back with other bytes", round, k)
			}
		}
		for _, r := range refs {
			if r != nil {
				r.Release()
			}
		}
	}
	if s := l.Stats(); s.Tiers[1].Blocks == 0 {
		t.Fatalf("no block on the persistent tier: %+v", s)
	}
}

// TestLocalPromoteOnSecondHit: with memory full, a block's first hit on the
// persistent tier is served from the bytes read without demoting anything;
// its second hit promotes it.
func TestLocalPromoteOnSecondHit(t *testing.T) {
	w := newWorld(t, 37, blocktest.NS())
	l := openLocal(t, Options{DRAM: newFakeMem(4096, 4, 1024), NVMe: newFakeVolume(64<<10, 16).open(), DemoteBatchBytes: 1})
	ctx := context.Background()
	var onDisk *wblock
	for range 40 {
		b := w.blocks[w.extend(-1)]
		if err := l.Put(ctx, b.enc); err != nil {
			t.Fatal(err)
		}
	}
	for k := range w.blocks {
		if info, ok := l.Info(auth.Access{}, w.blocks[k].key); ok && info.Tier != "dram" && info.Tier != "" {
			onDisk = &w.blocks[k]
			break
		}
	}
	if onDisk == nil {
		t.Fatal("no block was demoted")
	}
	get := func() {
		t.Helper()
		r, err := l.Get(ctx, onDisk.key)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(r.Bytes(), onDisk.enc) {
			t.Fatal("the block came back with other bytes")
		}
		r.Release()
	}
	before := l.Stats()
	get()
	first := l.Stats()
	if first.Demotions != before.Demotions || first.Promotions != before.Promotions || first.Hits != before.Hits+1 {
		t.Fatalf("first hit on disk with memory full: before %+v, after %+v", before, first)
	}
	get()
	second := l.Stats()
	if second.Promotions != first.Promotions+1 {
		t.Fatalf("second hit did not promote: %+v", second)
	}
	if info, _ := l.Info(auth.Access{}, onDisk.key); info.Tier != "dram" {
		t.Fatalf("after its second hit the block is in %q", info.Tier)
	}
}
