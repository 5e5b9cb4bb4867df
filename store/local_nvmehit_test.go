package store

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/kvmesh/kvmesh/auth"
	"github.com/kvmesh/kvmesh/block"
	"github.com/kvmesh/kvmesh/block/blocktest"
	"github.com/kvmesh/kvmesh/prefixhash"
	"github.com/kvmesh/kvmesh/tiers"
)

// distinctBlocks returns n root blocks of ns whose payloads all differ, so
// that each can be found in a segment file by its bytes.
func distinctBlocks(t testing.TB, ns prefixhash.Namespace, n int) ([][]byte, []prefixhash.Key) {
	t.Helper()
	var blocks [][]byte
	var keys []prefixhash.Key
	for i := range n {
		payload := make([]byte, ns.BlockBytes())
		for j := 0; j+8 <= len(payload); j += 8 {
			binary.LittleEndian.PutUint64(payload[j:], uint64(i)<<40|uint64(j)*0x9e3779b1)
		}
		tokens := make([]uint32, ns.BlockTokens)
		for j := range tokens {
			tokens[j] = uint32(i*len(tokens) + j)
		}
		enc, key, err := block.Encode(nil, ns, prefixhash.Key{}, tokens, payload)
		if err != nil {
			t.Fatal(err)
		}
		blocks, keys = append(blocks, enc), append(keys, key)
	}
	return blocks, keys
}

// damageOnDisk flips one byte of the payload of enc where it lies in a file
// under dir, and reports whether it found it.
func damageOnDisk(t *testing.T, dir string, enc []byte) bool {
	t.Helper()
	tail := enc[len(enc)-256:]
	found := false
	err := filepath.WalkDir(dir, func(path string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() || found {
			return err
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		at := bytes.Index(b, tail)
		if at < 0 {
			return nil
		}
		f, err := os.OpenFile(path, os.O_WRONLY, 0)
		if err != nil {
			return err
		}
		defer f.Close()
		if _, err := f.WriteAt([]byte{b[at+100] ^ 0x40}, int64(at+100)); err != nil {
			return err
		}
		found = true
		return f.Sync()
	})
	if err != nil {
		t.Fatal(err)
	}
	return found
}

// TestLocalRealNVMeHits reads blocks that live on the real NVMe tier over
// and over, concurrently: every Get returns the block's own bytes though the
// buffers they are read into are pooled and reused, and the payload is not
// hashed twice (the tier checks it). A block whose bytes are damaged on disk
// is not served: it is dropped as corrupt, and the others still are.
func TestLocalRealNVMeHits(t *testing.T) {
	ctx := context.Background()
	ns := benchNS(64 << 10)
	blocks, keys := distinctBlocks(t, ns, 12)
	slot := int64(len(blocks[0])+64+4095) &^ 4095
	dir := t.TempDir()
	l := openLocal(t, Options{DRAM: realDRAM(t, 2*slot, slot), NVMe: realNVMe(t, dir, 64<<20, 4<<20), DemoteBatchBytes: 1})
	if !l.diskChecked {
		t.Fatal("the NVMe tier checks its reads, Local does not know it")
	}
	for _, b := range blocks {
		if err := l.Put(ctx, b); err != nil {
			t.Fatal(err)
		}
	}
	var onDisk []int
	for k, key := range keys {
		if info, ok := l.Info(auth.Access{}, key); ok && info.Tier == "nvme" {
			onDisk = append(onDisk, k)
		}
	}
	if len(onDisk) < 8 {
		t.Fatalf("%d of %d blocks on NVMe, want at least 8", len(onDisk), len(blocks))
	}
	check := func(want []int) {
		var wg sync.WaitGroup
		for w := range 4 {
			wg.Go(func() {
				for round := range 3 {
					ks := make([]prefixhash.Key, len(want))
					for j, k := range want {
						ks[(j+w+round)%len(want)] = keys[k]
					}
					refs, err := l.GetMany(ctx, ks)
					if err != nil {
						t.Error(err)
						return
					}
					for j, r := range refs {
						k := want[(j+len(want)-(w+round)%len(want))%len(want)]
						if r == nil || !bytes.Equal(r.Bytes(), blocks[k]) {
							t.Errorf("worker %d round %d: block %d missing or not its bytes", w, round, k)
						}
						r.Release()
					}
				}
			})
		}
		wg.Wait()
	}
	check(onDisk)
	if t.Failed() {
		return
	}

	// Damage a block on disk that is still there.
	victim := -1
	for _, k := range onDisk {
		if info, ok := l.Info(auth.Access{}, keys[k]); ok && info.Tier == "nvme" {
			victim = k
			break
		}
	}
	if victim < 0 {
		t.Fatal("every block was promoted")
	}
	if !damageOnDisk(t, dir, blocks[victim]) {
		t.Fatal("the block's bytes are in no file")
	}
	before := l.Stats().CorruptDrops
	if r, err := l.Get(ctx, keys[victim]); !errors.Is(err, ErrNotFound) {
		r.Release()
		t.Fatalf("a block damaged on disk: %v, want ErrNotFound", err)
	}
	if got := l.Stats().CorruptDrops - before; got != 1 {
		t.Fatalf("%d corrupt drops, want 1", got)
	}
	var rest []int
	for k := range blocks {
		if k != victim {
			rest = append(rest, k)
		}
	}
	check(rest)
}

// TestLocalVerifyRead: with a checked persistent tier, a block read back is
// still refused when its header is damaged, its length is not the header's
// or it is another key's; without one (or with VerifyMemoryHits), a damaged
// payload is refused too.
func TestLocalVerifyRead(t *testing.T) {
	ns := benchNS(64 << 10)
	blocks, keys := distinctBlocks(t, ns, 2)
	good, key := blocks[0], keys[0]
	damaged := func(at int) []byte {
		b := bytes.Clone(good)
		b[at] ^= 1
		return b
	}
	for _, checked := range []bool{true, false} {
		l := openLocal(t, Options{DRAM: newFakeMem(1<<20, 4)})
		l.diskChecked = checked
		if _, err := l.verifyRead(key, good); err != nil {
			t.Fatalf("checked %v: a good block: %v", checked, err)
		}
		cases := map[string][]byte{
			"header":   damaged(30),
			"short":    good[:len(good)-1],
			"long":     append(bytes.Clone(good), 0),
			"other":    blocks[1],
			"tokens":   damaged(block.FixedHeaderLen + 2),
			"checksum": damaged(121),
		}
		if !checked {
			cases["payload"] = damaged(len(good) - 7)
		}
		for name, b := range cases {
			if _, err := l.verifyRead(key, b); !errors.Is(err, block.ErrCorrupt) {
				t.Errorf("checked %v: %s: %v, want ErrCorrupt", checked, name, err)
			}
		}
	}
	l := openLocal(t, Options{DRAM: realDRAM(t, 1<<20, 1<<20), NVMe: realNVMe(t, t.TempDir(), 16<<20, 4<<20), VerifyMemoryHits: true})
	if l.diskChecked {
		t.Fatal("VerifyMemoryHits: NVMe reads must be hashed again")
	}
}

// writeGatedDisk is a fakeDisk whose batch writes (demotions), while gated, tell
// entered and wait for open.
type writeGatedDisk struct {
	*fakeDisk
	mu      sync.Mutex
	gated   bool
	entered chan struct{}
	open    chan struct{}
}

func (d *writeGatedDisk) PutBatch(keys []prefixhash.Key, vals [][]byte, locs []tiers.Loc) (int, error) {
	d.mu.Lock()
	gated := d.gated
	d.mu.Unlock()
	if gated {
		d.entered <- struct{}{}
		<-d.open
	}
	return d.fakeDisk.PutBatch(keys, vals, locs)
}

// TestLocalPromotionRoomOneAtATime: while one promotion (a block's second hit
// on NVMe, memory full) waits for the demotion that makes its room, another
// block's second hit is served from the bytes read, without a demotion of
// its own, and stays on NVMe; it is promoted at a later hit.
func TestLocalPromotionRoomOneAtATime(t *testing.T) {
	ctx := context.Background()
	w := newWorld(t, 41, blocktest.NS())
	disk := &writeGatedDisk{fakeDisk: newFakeVolume(64<<10, 16).open(), entered: make(chan struct{}, 2), open: make(chan struct{})}
	l := openLocal(t, Options{DRAM: newFakeMem(4096, 4, 1024), NVMe: disk, DemoteBatchBytes: 1})
	for range 40 {
		if err := l.Put(ctx, w.blocks[w.extend(-1)].enc); err != nil {
			t.Fatal(err)
		}
	}
	var a, b *wblock
	for k := range w.blocks {
		if info, ok := l.Info(auth.Access{}, w.blocks[k].key); ok && info.Tier == "nvme" {
			if a == nil {
				a = &w.blocks[k]
			} else {
				b = &w.blocks[k]
				break
			}
		}
	}
	if b == nil {
		t.Fatal("fewer than two blocks were demoted")
	}
	get := func(blk *wblock) error {
		r, err := l.Get(ctx, blk.key)
		if err != nil {
			return err
		}
		defer r.Release()
		if !bytes.Equal(r.Bytes(), blk.enc) {
			return errors.New("the block came back with other bytes")
		}
		return nil
	}
	tier := func(blk *wblock) string {
		info, _ := l.Info(auth.Access{}, blk.key)
		return info.Tier
	}
	for _, blk := range []*wblock{a, b} { // first hits: no room made
		if err := get(blk); err != nil {
			t.Fatal(err)
		}
	}
	disk.mu.Lock()
	disk.gated = true
	disk.mu.Unlock()
	aDone := make(chan error, 1)
	go func() { aDone <- get(a) }()
	<-disk.entered // a's promotion is writing the blocks it demotes
	bDone := make(chan error, 1)
	go func() { bDone <- get(b) }()
	select {
	case err := <-bDone:
		if err != nil {
			t.Fatal(err)
		}
	case <-disk.entered:
		close(disk.open)
		<-aDone
		<-bDone
		t.Fatal("a second promotion made room while another was making it")
	}
	if got := tier(b); got != "nvme" {
		t.Fatalf("b, hit while a made room, is in %q", got)
	}
	if s := l.Stats(); s.PromotionsDeferred != 1 {
		t.Fatalf("%d promotions deferred, want 1 (b's)", s.PromotionsDeferred)
	}
	disk.mu.Lock()
	disk.gated = false
	disk.mu.Unlock()
	close(disk.open)
	if err := <-aDone; err != nil {
		t.Fatal(err)
	}
	if got := tier(a); got != "dram" {
		t.Fatalf("a, promoted, is in %q", got)
	}
	if err := get(b); err != nil {
		t.Fatal(err)
	}
	if got := tier(b); got != "dram" {
		t.Fatalf("b, hit again, is in %q", got)
	}
}

// TestLocalPromotionMakesOwnRoom: a promotion into a full memory tier
// demotes one block, the room it needs, not a DemoteBatchBytes batch whose
// spare room would go to blocks hit once; a write still demotes a batch.
func TestLocalPromotionMakesOwnRoom(t *testing.T) {
	ctx := context.Background()
	w := newWorld(t, 43, blocktest.NS())
	// 128 blocks of DRAM: a sixteenth of it holds the batch.
	l := openLocal(t, Options{DRAM: newFakeMem(4096, 32, 1024), NVMe: newFakeVolume(64<<10, 16).open(), DemoteBatchBytes: 8 * blockBytes})
	for range 160 {
		if err := l.Put(ctx, w.blocks[w.extend(-1)].enc); err != nil {
			t.Fatal(err)
		}
	}
	var onDisk *wblock
	for k := range w.blocks {
		if info, ok := l.Info(auth.Access{}, w.blocks[k].key); ok && info.Tier == "nvme" {
			onDisk = &w.blocks[k]
			break
		}
	}
	if onDisk == nil {
		t.Fatal("no block was demoted")
	}
	get := func(blk *wblock) {
		t.Helper()
		r, err := l.Get(ctx, blk.key)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(r.Bytes(), blk.enc) {
			t.Fatal("the block came back with other bytes")
		}
		r.Release()
	}
	get(onDisk) // first hit: served from the bytes read
	first := l.Stats()
	get(onDisk) // second: promoted
	second := l.Stats()
	if info, _ := l.Info(auth.Access{}, onDisk.key); info.Tier != "dram" {
		t.Fatalf("after its second hit the block is in %q", info.Tier)
	}
	if p, d := second.Promotions-first.Promotions, second.Demotions-first.Demotions; p != 1 || d != 1 {
		t.Fatalf("the promotion: %d promotions, %d demotions, want 1 and 1", p, d)
	}
	if err := l.Put(ctx, w.blocks[w.extend(-1)].enc); err != nil {
		t.Fatal(err)
	}
	if d := l.Stats().Demotions - second.Demotions; d < 8 {
		t.Fatalf("a write into full memory demoted %d blocks, want a batch of 8", d)
	}
}
