package store

import (
	"context"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/datadriven"

	"github.com/kvmesh/kvmesh/auth"
	"github.com/kvmesh/kvmesh/block"
	"github.com/kvmesh/kvmesh/block/blocktest"
	"github.com/kvmesh/kvmesh/prefixhash"
)

// TestScenarios runs the scripts under testdata/scenarios: sequences of
// operations on one Local whose point is the order (eviction, demotion,
// promotion, quotas), each followed by what a user would see (pebble's and
// raft's datadriven habit). Run with -rewrite to regenerate the expected
// output, then read the diff: it is the behaviour change.
//
// Commands (sizes in blocks; every block has blockBytes encoded bytes):
//
//	open dram=<blocks> [nvme=<blocks>] [max=<blocks>] [eviction=<policy>] [hybrid] [pinned=<fraction>] [reused-only] [batch=<blocks>]
//	                                     a fresh Local, demoting one block at a time
//	                                     (batch: Options.DemoteBatchBytes of that many blocks;
//	                                     reused-only: Options.NVMeReusedOnly);
//	                                     hybrid: blocks of blocktest.Hybrid, one record per
//	                                     group named <block>.full, .win, .state, .idx, each
//	                                     taking one block's room
//	put <name> [parent=<name>]           a new block under parent (default: the root)
//	chain <prefix> <n> [parent=<name>]   n blocks <prefix>1..<prefix>n, each under the last
//	get <name>...                        hit (the tier it was in) or miss, released at once
//	hold <name>...                       get, keeping the Ref (a reader holding the block)
//	release <name>...                    release held Refs, checking their bytes first
//	lookup <name>...                     a lookup of each block alone: found or not
//	retain <name>... [pin=soft|hard] [ttl=<duration>]
//	                                     Retain: applied or not, or the error
//	advance <duration>                   move the Local's clock on
//	quota dram=<blocks> nvme=<blocks>    SetQuota for the namespace (0: unlimited)
//	where                                each named block's tier, or -
//	stats                                the counters that moved, then Stats.Check
//	evicted                              each tier's evictions by reason, and the
//	                                     blocks written to it (NVMe), when any
//
// The files under testdata/scenarios/rules state rules every policy keeps:
// each runs once per policy (an open without eviction= opens that policy),
// with the same expected output.
func TestScenarios(t *testing.T) {
	datadriven.Walk(t, "testdata/scenarios", func(t *testing.T, path string) {
		if filepath.Base(filepath.Dir(path)) != "rules" {
			s := &scenario{t: t}
			defer s.close()
			datadriven.RunTest(t, path, s.run)
			return
		}
		forEachEviction(t, func(t *testing.T, ev Eviction) {
			s := &scenario{t: t, policy: ev}
			defer s.close()
			datadriven.RunTest(t, path, s.run)
		})
	})
}

type scenario struct {
	t      *testing.T
	policy Eviction // for an open without eviction=
	l      *Local
	clock  *fakeClock
	ns     prefixhash.Namespace
	hybrid bool
	rng    *rand.Rand
	names  []string // in creation order (with groups: records)
	keys   map[string]prefixhash.Key
	enc    map[string][]byte
	links  map[string]prefixhash.Link // with groups: each block's link
	held   map[string]*Ref
}

// groupNames name blocktest.Hybrid's groups' records in scenarios.
var groupNames = []string{"full", "win", "state", "idx"}

func (s *scenario) close() {
	for _, r := range s.held {
		r.Release()
	}
	s.held = nil
	if s.l != nil {
		if err := s.l.Close(); err != nil {
			s.t.Errorf("Close: %v", err)
		}
		s.l = nil
	}
}

func (s *scenario) run(t *testing.T, d *datadriven.TestData) string {
	switch d.Cmd {
	case "open":
		s.close()
		var mem, disk int
		d.ScanArgs(t, "dram", &mem)
		d.MaybeScanArgs(t, "nvme", &disk)
		ev := string(s.policy)
		d.MaybeScanArgs(t, "eviction", &ev)
		pinned, maxBlocks, batch := 0.0, 0, 0
		d.MaybeScanArgs(t, "pinned", &pinned)
		d.MaybeScanArgs(t, "batch", &batch)
		d.MaybeScanArgs(t, "max", &maxBlocks)
		s.hybrid = d.HasArg("hybrid")
		s.ns = blocktest.NS()
		slot := blockBytes
		if s.hybrid {
			s.ns = blocktest.Hybrid()
			slot = 0
			for g := range groupNames {
				slot = max(slot, block.NamespaceHeaderLen(s.ns)+s.ns.GroupBytes(g))
			}
		}
		s.clock = &fakeClock{now: time.Unix(1000, 0)}
		opts := Options{DRAM: newFakeMem(slot, mem, slot), DemoteBatchBytes: max(1, batch*slot), Eviction: Eviction(ev),
			Now: s.clock.Now, MaxPinnedFraction: pinned, NVMeReusedOnly: d.HasArg("reused-only"), MaxBlocks: maxBlocks}
		if disk > 0 {
			opts.NVMe = newFakeVolume(slot+64, disk).open()
		}
		l, err := Open(opts)
		if err != nil {
			return err.Error()
		}
		s.l, s.rng = l, rand.New(rand.NewPCG(1, 2))
		s.names, s.keys, s.enc, s.links = nil, map[string]prefixhash.Key{}, map[string][]byte{}, map[string]prefixhash.Link{}
		s.held = map[string]*Ref{}
		return ""
	case "put":
		parent := ""
		d.MaybeScanArgs(t, "parent", &parent)
		return s.put(t, d.CmdArgs[0].Key, parent)
	case "chain":
		if len(d.CmdArgs) < 2 || len(d.CmdArgs[1].Vals) > 0 {
			t.Fatalf("%s: chain <prefix> <n> [parent=<name>]", d.Pos)
		}
		var n int
		fmt.Sscan(d.CmdArgs[1].Key, &n)
		var out []string
		parent := ""
		d.MaybeScanArgs(t, "parent", &parent)
		for i := 1; i <= n; i++ {
			name := fmt.Sprintf("%s%d", d.CmdArgs[0].Key, i)
			if r := s.put(t, name, parent); r != "ok" {
				out = append(out, name+": "+r)
			}
			parent = name
		}
		if len(out) == 0 {
			return "ok"
		}
		return strings.Join(out, "\n")
	case "get":
		var out []string
		for _, a := range d.CmdArgs {
			key, ok := s.keys[a.Key]
			if !ok {
				t.Fatalf("%s: no block %s", d.Pos, a.Key)
			}
			was := s.tier(a.Key)
			r, err := s.l.Get(context.Background(), key)
			if err != nil {
				out = append(out, fmt.Sprintf("%s: %v", a.Key, err))
				continue
			}
			if !slices.Equal(r.Bytes(), s.enc[a.Key]) {
				t.Fatalf("%s: get %s: wrong bytes", d.Pos, a.Key)
			}
			r.Release()
			out = append(out, fmt.Sprintf("%s: hit in %s", a.Key, was))
		}
		return strings.Join(out, "\n")
	case "hold":
		var out []string
		for _, a := range d.CmdArgs {
			r, err := s.l.Get(context.Background(), s.key(t, a.Key))
			if err != nil {
				out = append(out, fmt.Sprintf("%s: %v", a.Key, err))
				continue
			}
			if s.held[a.Key] != nil {
				t.Fatalf("%s: %s held twice", d.Pos, a.Key)
			}
			s.held[a.Key] = r
			out = append(out, a.Key+": held")
		}
		return strings.Join(out, "\n")
	case "release":
		for _, a := range d.CmdArgs {
			r := s.held[a.Key]
			if r == nil {
				t.Fatalf("%s: %s not held", d.Pos, a.Key)
			}
			if !slices.Equal(r.Bytes(), s.enc[a.Key]) {
				t.Fatalf("%s: held %s: its bytes changed", d.Pos, a.Key)
			}
			r.Release()
			delete(s.held, a.Key)
		}
		return "ok"
	case "retain":
		var r block.Retention
		var keys []prefixhash.Key
		var names []string
		for _, a := range d.CmdArgs {
			switch a.Key {
			case "pin":
				switch a.Vals[0] {
				case "soft":
					r.Pin = block.PinSoft
				case "hard":
					r.Pin = block.PinHard
				default:
					t.Fatalf("%s: pin %s", d.Pos, a.Vals[0])
				}
			case "ttl":
				ttl, err := time.ParseDuration(a.Vals[0])
				if err != nil {
					t.Fatalf("%s: %v", d.Pos, err)
				}
				r.TTL = ttl
			default:
				keys = append(keys, s.key(t, a.Key))
				names = append(names, a.Key)
			}
		}
		got, err := s.l.Retain(context.Background(), keys, r)
		if err != nil {
			return err.Error()
		}
		var out []string
		for k, ok := range got {
			out = append(out, fmt.Sprintf("%s: applied %v", names[k], ok))
		}
		return strings.Join(out, "\n")
	case "advance":
		dur, err := time.ParseDuration(d.CmdArgs[0].Key)
		if err != nil {
			t.Fatalf("%s: %v", d.Pos, err)
		}
		s.clock.advance(dur)
		return "ok"
	case "evicted":
		var out []string
		for _, ts := range s.l.Stats().Tiers {
			var rs []string
			for _, c := range []struct {
				name string
				v    int64
			}{
				{"capacity", ts.Evicted.Capacity}, {"expired", ts.Evicted.Expired}, {"demoted", ts.Evicted.Demoted},
				{"refused", ts.Evicted.Refused}, {"unadmitted", ts.Evicted.Unadmitted},
			} {
				if c.v != 0 {
					rs = append(rs, fmt.Sprintf("%s=%d", c.name, c.v))
				}
			}
			if ts.WrittenBytes > 0 && !s.hybrid { // in blocks: every block has blockBytes
				rs = append(rs, fmt.Sprintf("written=%d", ts.WrittenBytes/int64(blockBytes)))
			}
			if len(rs) > 0 {
				out = append(out, ts.Name+": "+strings.Join(rs, " "))
			}
		}
		return strings.Join(out, "\n")
	case "lookup":
		var out []string
		for _, a := range d.CmdArgs {
			key, ok := s.keys[a.Key]
			if !ok {
				t.Fatalf("%s: no block %s", d.Pos, a.Key)
			}
			found := "not found"
			if s.l.LongestPrefix(auth.Access{}, []prefixhash.Key{key}) == 1 {
				found = "found"
			}
			out = append(out, a.Key+": "+found)
		}
		return strings.Join(out, "\n")
	case "quota":
		var mem, disk int64
		d.MaybeScanArgs(t, "dram", &mem)
		d.MaybeScanArgs(t, "nvme", &disk)
		if err := s.l.SetQuota(s.ns.Digest(), Quota{DRAM: mem * int64(blockBytes), NVMe: disk * int64(blockBytes)}); err != nil {
			return err.Error()
		}
		return "ok"
	case "where":
		var out []string
		for _, n := range s.names {
			out = append(out, n+" "+s.tier(n))
		}
		return strings.Join(out, "\n")
	case "stats":
		st := s.l.Stats()
		var out []string
		for _, c := range []struct {
			name string
			v    int64
		}{
			{"puts", st.Puts}, {"refused", st.Refused}, {"quota-refused", st.QuotaRefused},
			{"demotions", st.Demotions}, {"promotions", st.Promotions}, {"rewrites", st.Rewrites},
			{"evictions", st.Evictions}, {"cascaded", st.Cascaded}, {"hits", st.Hits}, {"misses", st.Misses},
			{"second-chances", st.SecondChances},
		} {
			if c.v != 0 {
				out = append(out, fmt.Sprintf("%s=%d", c.name, c.v))
			}
		}
		for _, ts := range st.Tiers {
			out = append(out, fmt.Sprintf("%s: %d blocks", ts.Name, ts.Blocks))
		}
		check := "check: ok"
		if err := st.Check(); err != nil {
			check = "check: " + err.Error()
		}
		return strings.Join(append(out, check), "\n")
	default:
		t.Fatalf("%s: unknown command %q", d.Pos, d.Cmd)
		return ""
	}
}

// put makes a new block named name under parent ("" for the root) and puts
// it: "ok", or the error.
func (s *scenario) put(t *testing.T, name, parent string) string {
	if _, ok := s.keys[name]; ok {
		t.Fatalf("block %s made twice", name)
	}
	if s.hybrid {
		return s.putHybrid(t, name, parent)
	}
	pk := s.ns.Root()
	if parent != "" {
		k, ok := s.keys[parent]
		if !ok {
			t.Fatalf("no parent %s", parent)
		}
		pk = k
	}
	enc, key, _, _ := blocktest.Random(t, s.rng, s.ns, pk)
	s.names = append(s.names, name)
	s.keys[name], s.enc[name] = key, enc
	if err := s.l.Put(context.Background(), enc); err != nil {
		return err.Error()
	}
	return "ok"
}

// tier names the tier holding name's block, or "-" when the node does not
// have it.
func (s *scenario) tier(name string) string {
	info, ok := s.l.Info(auth.Access{}, s.keys[name])
	if !ok {
		return "-"
	}
	return info.Tier
}

// putHybrid makes a new block of a namespace with groups and puts its
// records, group by group: "ok", or the errors.
func (s *scenario) putHybrid(t *testing.T, name, parent string) string {
	pl := s.ns.RootLink()
	if parent != "" {
		l, ok := s.links[parent]
		if !ok {
			t.Fatalf("no parent %s", parent)
		}
		pl = l
	}
	tokens := make([]uint32, s.ns.BlockTokens)
	for i := range tokens {
		tokens[i] = s.rng.Uint32()
	}
	var out []string
	for g, gn := range groupNames {
		rec, link := blocktest.Record(t, s.rng, s.ns, g, pl, tokens)
		n := name + "." + gn
		s.links[name] = link
		s.names = append(s.names, n)
		s.keys[n], s.enc[n] = prefixhash.GroupKey(link.Key(), g), rec
		if err := s.l.Put(context.Background(), rec); err != nil {
			out = append(out, n+": "+err.Error())
		}
	}
	if len(out) == 0 {
		return "ok"
	}
	return strings.Join(out, "\n")
}

// key is the key of the block (record) named name.
func (s *scenario) key(t *testing.T, name string) prefixhash.Key {
	k, ok := s.keys[name]
	if !ok {
		t.Fatalf("no block %s", name)
	}
	return k
}
