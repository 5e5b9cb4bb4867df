package store

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"

	"github.com/kvmesh/kvmesh/auth"
	"github.com/kvmesh/kvmesh/block/blocktest"
	"github.com/kvmesh/kvmesh/internal/testkit"
	"github.com/kvmesh/kvmesh/prefixhash"
)

// tenantNS is blockNS for one tenant: namespaces that differ only by salt.
func tenantNS(salt string) prefixhash.Namespace {
	ns := blocktest.NS()
	ns.TenantSalt = salt
	return ns
}

// bb is the encoded size of a blockNS block, as a quota.
var bb = int64(blockBytes)

// usage returns what Stats says namespace digest holds.
func usage(s Stats, digest uint64) NamespaceStats {
	for _, n := range s.Namespaces {
		if n.Digest == digest {
			return n
		}
	}
	return NamespaceStats{Digest: digest}
}

// checkQuotas fails when a namespace holds more than its quota in a tier.
func checkQuotas(t *testing.T, step int, s Stats) {
	t.Helper()
	for _, n := range s.Namespaces {
		if q := n.Quota.DRAM; q != 0 && n.DRAMBytes > q {
			t.Fatalf("step %d: namespace %016x holds %d bytes in DRAM, quota %d", step, n.Digest, n.DRAMBytes, q)
		}
		if q := n.Quota.NVMe; q != 0 && n.NVMeBytes > q {
			t.Fatalf("step %d: namespace %016x holds %d bytes in NVMe, quota %d", step, n.Digest, n.NVMeBytes, q)
		}
		if n.DRAMBytes+n.NVMeBytes != n.Bytes {
			t.Fatalf("step %d: namespace %016x: %d + %d bytes by tier, %d in all", step, n.Digest, n.DRAMBytes, n.NVMeBytes, n.Bytes)
		}
	}
}

// checkCursors checks the cold cursors against their definition: a
// namespace's cursor for a tier is an entry of that tier's list of the
// namespace, and no block of the namespace in the list is colder.
func checkCursors(t *testing.T, step int, l *Local) {
	t.Helper()
	var bad string
	l.mu.Lock()
	x := &l.mu.x
	registered := 0
	for id := range l.mu.ns.list {
		n := &l.mu.ns.list[id]
		for tier, c := range n.cursor {
			if c == 0 {
				continue
			}
			registered++
			e := x.at(c)
			list := l.mu.diskList
			if tier == tierMem {
				list = l.memListLocked(n.class)
			}
			if !e.has(flagCursor) || e.prev == 0 || tierOf(e) != tier {
				bad = fmt.Sprintf("cursor %d of namespace %016x, tier %d, is on entry %d (flags %b), not listed there", tier, n.digest, tier, c, e.flags)
			}
			j := e.next
			for ; j != list && bad == ""; j = x.at(j).next {
				if x.at(j).has(flagSentinel) {
					bad = fmt.Sprintf("cursor of namespace %016x, tier %d, is in another list", n.digest, tier)
				} else if x.at(j).ns == uint32(id) {
					bad = fmt.Sprintf("a block of namespace %016x in tier %d is colder than its cursor", n.digest, tier)
				}
			}
		}
	}
	refs := 0
	for i, rs := range l.mu.cursors {
		refs += len(rs)
		if !x.at(i).has(flagCursor) {
			bad = fmt.Sprintf("entry %d carries cursors without flagCursor", i)
		}
	}
	if refs != registered {
		bad = fmt.Sprintf("%d cursors registered, namespaces have %d", refs, registered)
	}
	l.mu.Unlock()
	if bad != "" {
		t.Fatalf("step %d: %s", step, bad)
	}
}

// tenant is one namespace of the quota model test.
type tenant struct {
	name   string
	w      *world
	q      Quota
	limit  int // blocks its world may grow to; 0: no limit
	linked map[prefixhash.Key]bool
}

// TestQuotaModel runs three tenants with quotas over one node through random
// puts, gets and lookups, and lowers and raises quotas at run time. The
// quotas add up to less than the tiers hold, so the node is never under
// pressure as a whole. After every operation:
//   - no namespace holds more than its quota in any tier;
//   - an operation of one tenant left every other tenant's blocks as they
//     were (none evicted, demoted or promoted to make the first one room);
//   - tenant c, whose quota is larger than all it ever puts, agrees exactly
//     with a map (the reference model): every block it put is served;
//   - the store's own invariants and the cold cursors hold.
func TestQuotaModel(t *testing.T) {
	for _, disk := range []bool{false, true} {
		t.Run(fmt.Sprintf("nvme=%v", disk), func(t *testing.T) {
			ctx := context.Background()
			a := &tenant{name: "a", w: newWorld(t, 201, tenantNS("a")), q: Quota{DRAM: 10 * bb, NVMe: 12 * bb}}
			b := &tenant{name: "b", w: newWorld(t, 202, tenantNS("b")), q: Quota{DRAM: 6*bb + bb/2, NVMe: 8*bb + 1}}
			c := &tenant{name: "c", w: newWorld(t, 203, tenantNS("c")), q: Quota{DRAM: 40 * bb, NVMe: 40 * bb}, limit: 36}
			tenants := []*tenant{a, b, c}
			opts := Options{
				DRAM:             newFakeMem(4096, 16, 1024), // 64 blocks
				DemoteBatchBytes: 3 * blockBytes,
				Quotas:           map[uint64]Quota{a.w.ns.Digest(): a.q, b.w.ns.Digest(): b.q},
				DefaultQuota:     c.q, // c has none of its own
			}
			if disk {
				opts.NVMe = newFakeVolume(64<<10, 64).open() // never reclaims in this test
			}
			l := openLocal(t, opts)
			model := refModel{} // tenant c
			var held []*Ref     // a few Refs of tenant a, held across steps
			defer func() {
				for _, r := range held {
					r.Release()
				}
			}()
			for _, tn := range tenants {
				tn.linked = map[prefixhash.Key]bool{}
			}

			for step := range 2500 {
				var tn *tenant
				switch r := a.w.rng.IntN(10); {
				case r < 4:
					tn = a
				case r < 8:
					tn = b
				default:
					tn = c
				}
				w := tn.w
				before := l.Stats()
				switch op := w.rng.IntN(10); {
				case step == 800 || step == 1700:
					// Run-time changes: a shrinks to 4 blocks of DRAM and
					// 5 of NVMe, and later grows back.
					tn = a
					q := Quota{DRAM: 4 * bb, NVMe: 5 * bb}
					if step == 1700 {
						q = Quota{DRAM: 10 * bb, NVMe: 12 * bb}
					}
					before = l.Stats()
					if err := l.SetQuota(a.w.ns.Digest(), q); err != nil {
						t.Fatalf("step %d: SetQuota: %v", step, err)
					}
					a.q = q
				case op < 4 || len(w.blocks) == 0:
					i := -1
					if tn.limit == 0 || len(w.blocks) < tn.limit {
						i = w.grow()
					}
					if i < 0 || w.rng.IntN(5) == 0 {
						i = w.randomBlock()
					}
					blk := w.blocks[i]
					was := l.Contains(auth.Access{}, blk.key)
					if err := l.Put(ctx, blk.enc); err != nil {
						t.Fatalf("step %d: tenant %s: Put: %v", step, tn.name, err)
					}
					if !was {
						tn.linked[blk.key] = blk.parent >= 0 && l.Contains(auth.Access{}, w.blocks[blk.parent].key)
					}
					if tn == c {
						model.put(blk.key, blk.enc)
					}
				case op < 7:
					blk := w.blocks[w.randomBlock()]
					r, err := l.Get(ctx, blk.key)
					switch {
					case err == nil:
						if !bytes.Equal(r.Bytes(), blk.enc) {
							t.Fatalf("step %d: tenant %s: Get returned other bytes", step, tn.name)
						}
						if tn == a && len(held) < 2 && w.rng.IntN(4) == 0 {
							held = append(held, r)
						} else {
							r.Release()
						}
					case !errors.Is(err, ErrNotFound):
						t.Fatalf("step %d: tenant %s: Get: %v", step, tn.name, err)
					}
					if _, ok := model.get(blk.key); tn == c && ok != (err == nil) {
						t.Fatalf("step %d: Get of a block of c = %v, model has it: %v", step, err, ok)
					}
				case op < 9:
					keys := w.chain(w.randomBlock())
					n := getManyPrefix(t, step, l, w, keys)
					if tn == c && n != model.longestPrefix(keys) {
						t.Fatalf("step %d: LongestPrefix of c = %d, model %d", step, n, model.longestPrefix(keys))
					}
				default:
					if len(held) > 0 {
						held[0].Release()
						held = held[1:]
					}
				}

				after := l.Stats()
				checkQuotas(t, step, after)
				for _, other := range tenants {
					d := other.w.ns.Digest()
					if u := usage(after, d); u.Blocks > 0 && u.Quota != other.q {
						t.Fatalf("step %d: tenant %s: Stats reports quota %+v, want %+v", step, other.name, u.Quota, other.q)
					}
					if other == tn {
						continue
					}
					if u0, u1 := usage(before, d), usage(after, d); u0 != u1 {
						t.Fatalf("step %d: an operation of tenant %s changed tenant %s: %+v, then %+v", step, tn.name, other.name, u0, u1)
					}
				}
				checkCursors(t, step, l)
				if len(held) == 0 {
					for _, tn := range tenants {
						checkInvariants(t, step, l, tn.w, tn.linked)
					}
				}
			}

			s := l.Stats()
			t.Logf("%+v", s)
			for _, blk := range c.w.blocks {
				if !l.Contains(auth.Access{}, blk.key) {
					t.Fatal("a block of tenant c, under its quota, is not cached")
				}
			}
			if s.QuotaRefused != 0 || s.Refused != 0 {
				t.Fatalf("writes were refused: %+v", s)
			}
			if disk && (s.Demotions == 0 || s.Promotions == 0) || s.Evictions == 0 {
				t.Fatalf("the quotas exerted no pressure: %+v", s)
			}
			if mem := s.Tiers[0]; mem.Reserved >= mem.Capacity {
				t.Fatalf("the memory tier filled up (%+v): the test means to keep the node out of global pressure", mem)
			}
		})
	}
}

// TestQuotaRefuses: a namespace whose blocks are all pinned cannot make room
// within its quota, and its write is refused with ErrQuota, while another
// namespace writes freely; with NVMe the write goes there when the
// namespace's NVMe quota has room.
func TestQuotaRefuses(t *testing.T) {
	ctx := context.Background()
	for _, disk := range []bool{false, true} {
		t.Run(fmt.Sprintf("nvme=%v", disk), func(t *testing.T) {
			wa, wb := newWorld(t, 211, tenantNS("a")), newWorld(t, 212, tenantNS("b"))
			da := wa.ns.Digest()
			opts := Options{DRAM: newFakeMem(4096, 16, 1024), DemoteBatchBytes: 1,
				Quotas: map[uint64]Quota{da: {DRAM: 3 * bb, NVMe: bb - 1}}}
			if disk {
				opts.NVMe = newFakeVolume(64<<10, 16).open()
			}
			l := openLocal(t, opts)
			var refs []*Ref
			for range 3 {
				refs = append(refs, putGet(t, l, wa.blocks[wa.extend(-1)]))
			}
			err := l.Put(ctx, wa.blocks[wa.extend(-1)].enc)
			if !errors.Is(err, ErrQuota) || errors.Is(err, ErrFull) {
				t.Fatalf("Put over quota with every block pinned = %v, want ErrQuota", err)
			}
			t.Log(err)
			wb.putGrown(t, l, 20) // b has no quota, and the tier has room
			s := l.Stats()
			if s.QuotaRefused != 1 || s.Refused != 1 || usage(s, da).Blocks != 3 || usage(s, wb.ns.Digest()).Blocks != 20 {
				t.Fatalf("after the refusal: %+v", s)
			}

			if disk {
				// Room in a's NVMe quota: the write goes there.
				if err := l.SetQuota(da, Quota{DRAM: 3 * bb, NVMe: 2 * bb}); err != nil {
					t.Fatal(err)
				}
				var last prefixhash.Key
				for range 3 {
					blk := wa.blocks[wa.extend(-1)]
					if err := l.Put(ctx, blk.enc); err != nil {
						t.Fatal(err)
					}
					last = blk.key
					if info, ok := l.Info(auth.Access{}, blk.key); !ok || info.Tier != "nvme" {
						t.Fatalf("a block past a pinned DRAM quota is in %+v, want nvme", info)
					}
				}
				if u := usage(l.Stats(), da); u.NVMeBytes != 2*bb || u.DRAMBytes != 3*bb {
					t.Fatalf("a holds %+v", u)
				}
				// An NVMe hit that cannot be promoted is served anyway.
				r, err := l.Get(ctx, last)
				if err != nil {
					t.Fatal(err)
				}
				r.Release()
				if info, _ := l.Info(auth.Access{}, last); info.Tier != "nvme" {
					t.Fatalf("a block promoted past a pinned DRAM quota: %+v", info)
				}
			}

			// Once a pin goes, the namespace makes room among its own blocks.
			refs[0].Release()
			if err := l.Put(ctx, wa.blocks[wa.extend(-1)].enc); err != nil {
				t.Fatal(err)
			}
			s = l.Stats()
			checkQuotas(t, 0, s)
			if u := usage(s, wb.ns.Digest()); u.Blocks != 20 || u.DRAMBytes != 20*bb {
				t.Fatalf("b lost blocks to a's quota: %+v", u)
			}
			for _, r := range refs[1:] {
				r.Release()
			}
		})
	}
}

// TestQuotaChainLeavesFirst: a namespace that puts a chain longer than its
// quota keeps a prefix of it, as the node keeps a prefix under pressure.
func TestQuotaChainLeavesFirst(t *testing.T) {
	for _, disk := range []bool{false, true} {
		t.Run(fmt.Sprintf("nvme=%v", disk), func(t *testing.T) {
			w := newWorld(t, 221, tenantNS("a"))
			opts := Options{DRAM: newFakeMem(4096, 16, 1024), DemoteBatchBytes: 1,
				Quotas: map[uint64]Quota{w.ns.Digest(): {DRAM: 8 * bb, NVMe: 6 * bb}}}
			if disk {
				opts.NVMe = newFakeVolume(64<<10, 16).open()
			}
			l := openLocal(t, opts)
			n := cachedPrefix(t, l, w.chain(w.putChain(t, l, 40)))
			s := l.Stats()
			checkQuotas(t, 0, s)
			want := 8
			if disk {
				want = 14
			}
			if n != want {
				t.Fatalf("cached prefix of %d blocks, the quota holds %d", n, want)
			}
		})
	}
}

// TestQuotaAtRunTime changes quotas on a running node: lowering one trims the
// namespace to it at once, keeping its hottest blocks; ClearQuota and
// SetDefaultQuota apply the default; pinned blocks delay a trim until the
// next write.
func TestQuotaAtRunTime(t *testing.T) {
	ctx := context.Background()
	w := newWorld(t, 231, tenantNS("a"))
	other := newWorld(t, 232, tenantNS("b"))
	d := w.ns.Digest()
	l := openLocal(t, Options{DRAM: newFakeMem(4096, 16, 1024)})
	var roots []wblock
	for range 20 {
		blk := w.blocks[w.extend(-1)]
		roots = append(roots, blk)
		if err := l.Put(ctx, blk.enc); err != nil {
			t.Fatal(err)
		}
	}
	other.putGrown(t, l, 10)
	for _, blk := range roots[:5] { // the hottest, now
		r, err := l.Get(ctx, blk.key)
		if err != nil {
			t.Fatal(err)
		}
		r.Release()
	}
	if err := l.SetQuota(d, Quota{DRAM: 5 * bb}); err != nil {
		t.Fatal(err)
	}
	for k, blk := range roots {
		if l.Contains(auth.Access{}, blk.key) != (k < 5) {
			t.Fatalf("after the quota went down to 5 blocks, block %d cached: %v", k, l.Contains(auth.Access{}, blk.key))
		}
	}
	if u := usage(l.Stats(), other.ns.Digest()); u.Blocks != 10 {
		t.Fatalf("trimming a touched another namespace: %+v", u)
	}
	if q, def := l.Quotas(); len(q) != 1 || q[d] != (Quota{DRAM: 5 * bb}) || def != (Quota{}) {
		t.Fatalf("Quotas() = %v, %v", q, def)
	}

	// Back to the default, then a default that trims (b opts out of it:
	// its own quota is unlimited).
	if err := l.ClearQuota(d); err != nil {
		t.Fatal(err)
	}
	if err := l.SetQuota(other.ns.Digest(), Quota{}); err != nil {
		t.Fatal(err)
	}
	if q, _ := l.Quotas(); len(q) != 1 {
		t.Fatalf("Quotas() after ClearQuota = %v", q)
	}
	if err := l.SetDefaultQuota(Quota{DRAM: 3 * bb}); err != nil {
		t.Fatal(err)
	}
	s := l.Stats()
	checkQuotas(t, 0, s)
	if u := usage(s, d); u.Blocks != 3 || u.Quota.DRAM != 3*bb {
		t.Fatalf("after SetDefaultQuota: %+v", u)
	}
	if u := usage(l.Stats(), other.ns.Digest()); u.Blocks != 10 {
		t.Fatalf("b was trimmed by a default it opted out of: %+v", u)
	}

	// Pinned blocks keep a namespace over a lowered quota until its next
	// write.
	var refs []*Ref
	for _, blk := range roots {
		if r, err := l.Get(ctx, blk.key); err == nil {
			refs = append(refs, r)
		}
	}
	if len(refs) != 3 {
		t.Fatalf("a holds %d blocks, its quota 3", len(refs))
	}
	if err := l.SetQuota(d, Quota{DRAM: 1 * bb}); !errors.Is(err, ErrQuota) {
		t.Fatalf("SetQuota below pinned blocks = %v, want ErrQuota", err)
	}
	for _, r := range refs {
		r.Release()
	}
	if err := l.Put(ctx, w.blocks[w.extend(-1)].enc); err != nil {
		t.Fatal(err)
	}
	if u := usage(l.Stats(), d); u.DRAMBytes > bb {
		t.Fatalf("the write after a delayed trim left %+v", u)
	}

	for _, bad := range []Quota{{DRAM: -1}, {NVMe: -1}} {
		if err := l.SetQuota(d, bad); err == nil {
			t.Fatalf("SetQuota(%+v) accepted", bad)
		}
		opts := Options{DRAM: newFakeMem(4096, 1, 1024), Quotas: map[uint64]Quota{d: bad}}
		opts.EnsureDefaults()
		if err := opts.Validate(); err == nil || !strings.Contains(err.Error(), "Quotas[") {
			t.Fatalf("Validate with quota %+v = %v, want an error naming Quotas", bad, err)
		}
	}
}

// TestTenantIsolation: two namespaces that differ only by tenant salt never
// share a hit, even for the same tokens and bytes; a block forged to hang
// from another tenant's block is not linked to it; dropping one tenant
// leaves the other whole.
func TestTenantIsolation(t *testing.T) {
	ctx := context.Background()
	for _, disk := range []bool{false, true} {
		t.Run(fmt.Sprintf("nvme=%v", disk), func(t *testing.T) {
			nsA, nsB := tenantNS("tenant a"), tenantNS("tenant b")
			opts := Options{DRAM: newFakeMem(4096, 16, 1024), DemoteBatchBytes: 1}
			if disk {
				opts.DRAM = newFakeMem(4096, 2, 1024) // most blocks go to NVMe
				opts.NVMe = newFakeVolume(64<<10, 16).open()
			}
			l := openLocal(t, opts)
			// The same tokens and payloads under both namespaces.
			chain := func(ns prefixhash.Namespace) (keys []prefixhash.Key, blocks [][]byte) {
				rng := rand.New(rand.NewPCG(7, 7))
				parent := ns.Root()
				for range 16 {
					b, k, _, _ := blocktest.Random(t, rng, ns, parent)
					keys, blocks = append(keys, k), append(blocks, b)
					parent = k
				}
				return keys, blocks
			}
			ka, ba := chain(nsA)
			kb, bbs := chain(nsB)
			for i := range ka {
				if ka[i] == kb[i] {
					t.Fatalf("block %d has the same key in both tenants", i)
				}
			}
			if err := l.PutMany(ctx, ba); err != nil {
				t.Fatal(err)
			}
			if n := l.LongestPrefix(auth.Access{}, ka); n != len(ka) {
				t.Fatalf("tenant a's own prefix: %d of %d blocks", n, len(ka))
			}
			if n := l.LongestPrefix(auth.Access{}, kb); n != 0 {
				t.Fatalf("tenant b sees %d blocks of tenant a's prompt", n)
			}
			for _, k := range kb {
				if l.Contains(auth.Access{}, k) {
					t.Fatal("Contains answers tenant b with tenant a's block")
				}
				if _, err := l.Get(ctx, k); !errors.Is(err, ErrNotFound) {
					t.Fatalf("tenant b's Get = %v, want ErrNotFound", err)
				}
			}
			refs, err := l.GetMany(ctx, kb)
			if err != nil {
				t.Fatal(err)
			}
			for _, r := range refs {
				if r != nil {
					t.Fatal("GetMany served tenant b a block of tenant a")
				}
			}

			if err := l.PutMany(ctx, bbs); err != nil {
				t.Fatal(err)
			}
			// A block of b that claims a's block as its parent (a forger
			// who knows a's key): cached, but not tied to a's tree.
			forged, fk, _, _ := blocktest.Random(t, rand.New(rand.NewPCG(8, 8)), nsB, ka[3])
			if err := l.Put(ctx, forged); err != nil {
				t.Fatal(err)
			}
			if info, ok := l.Info(auth.Access{}, fk); !ok || info.Parent {
				t.Fatalf("forged block: %+v", info)
			}
			if n, err := l.DropNamespace(nsA.Digest()); err != nil || n != len(ka) {
				t.Fatalf("DropNamespace(a) = %d, %v; want %d", n, err, len(ka))
			}
			if n := l.LongestPrefix(auth.Access{}, ka); n != 0 {
				t.Fatalf("tenant a still has %d blocks", n)
			}
			if n := l.LongestPrefix(auth.Access{}, kb); n != len(kb) || !l.Contains(auth.Access{}, fk) {
				t.Fatalf("dropping tenant a took tenant b's blocks: %d of %d left", n, len(kb))
			}
			for i, k := range kb {
				r, err := l.Get(ctx, k)
				if err != nil {
					t.Fatal(err)
				}
				if !bytes.Equal(r.Bytes(), bbs[i]) {
					t.Fatal("tenant b's block changed")
				}
				r.Release()
			}
			s := l.Stats()
			if len(s.Namespaces) != 1 || s.Namespaces[0].Digest != nsB.Digest() || s.Namespaces[0].Blocks != int64(len(kb)+1) {
				t.Fatalf("namespaces after dropping a: %+v", s.Namespaces)
			}
		})
	}
}

// TestQuotaConcurrent runs tenants with quotas side by side under -race,
// with a quota changing under them: at every moment Stats shows no
// namespace over the largest quota it had, and at the end every invariant
// holds.
func TestQuotaConcurrent(t *testing.T) {
	for _, disk := range []bool{false, true} {
		t.Run(fmt.Sprintf("nvme=%v", disk), func(t *testing.T) {
			ctx := context.Background()
			wa, wb := newWorld(t, 241, tenantNS("a")), newWorld(t, 242, tenantNS("b"))
			for range 40 { // the quotas hold about half of each
				wa.grow()
				wb.grow()
			}
			qa := Quota{DRAM: 8 * bb, NVMe: 10 * bb}
			qb := Quota{DRAM: 5 * bb, NVMe: 6 * bb}
			opts := Options{DRAM: newFakeMem(4096, 8, 1024), DemoteBatchBytes: 2 * blockBytes,
				Quotas: map[uint64]Quota{wa.ns.Digest(): qa, wb.ns.Digest(): qb}}
			if disk {
				opts.NVMe = newFakeVolume(64<<10, 64).open()
			}
			l := openLocal(t, opts)
			var wg sync.WaitGroup
			errc := make(chan error, 16)
			worker := func(w *world, g int) {
				defer wg.Done()
				for n := range 1500 {
					blk := w.blocks[(n*7+g*31)%len(w.blocks)]
					switch n % 4 {
					case 0, 1:
						if err := l.Put(ctx, blk.enc); err != nil && !errors.Is(err, ErrQuota) {
							errc <- err
							return
						}
					case 2: // the block put last: a hit unless evicted since
						blk = w.blocks[((n-1)*7+g*31)%len(w.blocks)]
						r, err := l.Get(ctx, blk.key)
						if err == nil {
							if !bytes.Equal(r.Bytes(), blk.enc) {
								errc <- errors.New("Get returned other bytes")
								return
							}
							r.Release()
						} else if !errors.Is(err, ErrNotFound) {
							errc <- err
							return
						}
					case 3:
						l.LongestPrefix(auth.Access{}, w.chain((n+g)%len(w.blocks)))
					}
				}
			}
			for g := range 2 {
				wg.Add(2)
				go worker(wa, g)
				go worker(wb, g)
			}
			done := make(chan struct{})
			go func() { // a's DRAM quota goes down and up under the writers
				defer close(done)
				for n := range 40 {
					q := qa
					if n%2 == 0 {
						q.DRAM = 4 * bb
					}
					if err := l.SetQuota(wa.ns.Digest(), q); err != nil && !errors.Is(err, ErrQuota) {
						errc <- err
						return
					}
				}
			}()
			for n := 0; n < 200; n++ {
				s := l.Stats()
				for _, u := range s.Namespaces {
					q := qb
					if u.Digest == wa.ns.Digest() {
						q = qa
					}
					if u.DRAMBytes > q.DRAM || disk && u.NVMeBytes > q.NVMe {
						t.Fatalf("namespace %016x holds %+v, quota %+v", u.Digest, u, q)
					}
				}
			}
			wg.Wait()
			<-done
			close(errc)
			for err := range errc {
				t.Fatal(err)
			}
			// A write after the last change brings a within its quota
			// even if a Ref delayed the last trim.
			if err := l.SetQuota(wa.ns.Digest(), qa); err != nil {
				t.Fatal(err)
			}
			s := l.Stats()
			checkQuotas(t, 0, s)
			checkCursors(t, 0, l)
			checkInvariants(t, 0, l, wa, map[prefixhash.Key]bool{})
			t.Logf("%+v", s)
		})
	}
}

// TestQuotaReopen: blocks recovered from NVMe count against their
// namespace's quota once resolved; a node reopened with a smaller quota
// evicts what does not fit as it resolves it.
func TestQuotaReopen(t *testing.T) {
	ctx := context.Background()
	w := newWorld(t, 251, tenantNS("a"))
	vol := newFakeVolume(64<<10, 8)
	l, err := Open(Options{DRAM: newFakeMem(4096, 1, 1024), NVMe: vol.open(), DemoteBatchBytes: 1})
	if err != nil {
		t.Fatal(err)
	}
	for range 12 {
		if err := l.Put(ctx, w.blocks[w.extend(-1)].enc); err != nil {
			t.Fatal(err)
		}
	}
	onDisk := l.Stats().Tiers[1].Blocks
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	l = openLocal(t, Options{DRAM: newFakeMem(4096, 1, 1024), NVMe: vol.open(), DemoteBatchBytes: 1,
		Quotas: map[uint64]Quota{w.ns.Digest(): {NVMe: 3 * bb}}})
	testkit.WaitFor(t, "the recovery scan to resolve every block", func() bool { return usage(l.Stats(), 0).Blocks == 0 })
	s := l.Stats()
	checkQuotas(t, 0, s)
	if u := usage(s, w.ns.Digest()); u.NVMeBytes != 3*bb || s.Evictions != onDisk-3 {
		t.Fatalf("%d blocks recovered under a quota of 3: %+v, %d evictions", onDisk, u, s.Evictions)
	}
	served := 0
	for _, blk := range w.blocks {
		if r, err := l.Get(ctx, blk.key); err == nil {
			if !bytes.Equal(r.Bytes(), blk.enc) {
				t.Fatal("a recovered block differs")
			}
			r.Release()
			served++
		}
	}
	if served != 3 { // the DRAM blocks went with the first node
		t.Fatalf("served %d recovered blocks, the quota kept 3", served)
	}
	checkInvariants(t, 0, l, w, map[prefixhash.Key]bool{})
}
