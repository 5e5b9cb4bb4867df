package store

import (
	"context"
	"strings"
	"testing"

	"github.com/kvmesh/kvmesh/block/blocktest"
	"github.com/kvmesh/kvmesh/internal/invariants"
	"github.com/kvmesh/kvmesh/internal/testkit"
	"github.com/kvmesh/kvmesh/prefixhash"
	"github.com/kvmesh/kvmesh/tiers"
)

// TestStatsCheck: Check accepts consistent accounting and names each way it
// can break.
func TestStatsCheck(t *testing.T) {
	good := func() Stats {
		return Stats{
			Tiers: []TierStats{
				{Name: "dram", Blocks: 3, Bytes: 300, Stats: tiers.Stats{Capacity: 1000, Reserved: 300, Stored: 300, Values: 3}},
				{Name: "nvme", Blocks: 2, Bytes: 200, Evicted: TierEvictions{Capacity: 1}, Stats: tiers.Stats{Capacity: 1000, Reserved: 200, Stored: 200, Values: 2}},
			},
			Puts: 6, Recovered: 1, Evictions: 1, CorruptDrops: 1,
			Namespaces: []NamespaceStats{{Digest: 1, Blocks: 4}, {Digest: 2, Blocks: 1}},
		}
	}
	if err := good().Check(); err != nil {
		t.Fatalf("consistent stats: %v", err)
	}
	for _, c := range []struct {
		name   string
		mutate func(*Stats)
		want   string
	}{
		{"over capacity", func(s *Stats) { s.Tiers[0].Reserved = 1001 }, "reserves 1001 bytes"},
		{"index ahead of tier", func(s *Stats) { s.Tiers[1].Blocks = 3 }, "the index counts 3 blocks"},
		{"bytes differ", func(s *Stats) { s.Tiers[0].Stored = 299 }, "299 bytes"},
		{"a block unaccounted", func(s *Stats) { s.Puts++ }, "8 blocks came in"},
		{"a drop uncounted", func(s *Stats) { s.NamespaceDrops++ }, "8 are cached or were dropped"},
		{"namespaces short", func(s *Stats) { s.Namespaces[1].Blocks = 0 }, "namespaces hold 4 blocks"},
		{"a tier's eviction uncounted", func(s *Stats) { s.Tiers[0].Evicted.Unadmitted = 1 }, "the tiers count 2 blocks evicted"},
		{"more marked than cached", func(s *Stats) { s.ReusedBlocks = 6 }, "6 blocks marked reused, 5 cached"},
	} {
		s := good()
		c.mutate(&s)
		err := s.Check()
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: Check = %v, want an error with %q", c.name, err, c.want)
		}
	}
}

// TestCloseChecksAccounting: in the invariants build (-race, or -tags
// invariants), Close panics when the index and the tiers disagree.
func TestCloseChecksAccounting(t *testing.T) {
	if !invariants.Enabled {
		t.Skip("the check at Close runs in the invariants build only (-race or -tags invariants)")
	}
	l, err := Open(Options{DRAM: newFakeMem(64<<10, 16, 1024)})
	if err != nil {
		t.Fatal(err)
	}
	l.mu.Lock()
	l.mu.c.puts++ // a block counted in that never was
	l.mu.Unlock()
	defer func() {
		r := recover()
		if msg, _ := r.(string); !strings.Contains(msg, "1 blocks came in") {
			t.Fatalf("Close with broken accounting: recovered %v, want a panic naming the blocks", r)
		}
	}()
	l.Close()
	t.Fatal("Close with broken accounting returned")
}

// TestRefLeakReported: in the invariants build, a pinned Ref collected
// without Release ends the process with a report of where it was made (in
// a child process, since the report panics).
func TestRefLeakReported(t *testing.T) {
	if testkit.InChild(t) {
		l := openLocal(t, Options{DRAM: newFakeMem(64<<10, 16, 1024)})
		w := newWorld(t, 3, blocktest.NS())
		b := w.blocks[w.extend(-1)]
		if err := l.Put(context.Background(), b.enc); err != nil {
			t.Fatal(err)
		}
		leakRef(t, l, b.key)
		testkit.CollectGarbage()
		return
	}
	if !invariants.Enabled {
		t.Skip("leak reports are on in the invariants build only (-race or -tags invariants)")
	}
	testkit.ExpectCrash(t, "leaked, never released: store.Ref created at:", "leakRef")
}

//go:noinline
func leakRef(t *testing.T, l *Local, key prefixhash.Key) {
	r, err := l.Get(context.Background(), key)
	if err != nil || r.i == 0 {
		t.Fatalf("Get = %v, pinned %v: want a pinned Ref", err, r != nil && r.i != 0)
	}
}
