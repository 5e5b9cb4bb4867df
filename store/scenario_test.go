package store

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/cockroachdb/datadriven"

	"github.com/kvmesh/kvmesh/auth"
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
//	open dram=<blocks> [nvme=<blocks>] [eviction=<policy>]
//	                                     a fresh Local, demoting one block at a time
//	put <name> [parent=<name>]           a new block under parent (default: the root)
//	chain <prefix> <n>                   n blocks <prefix>1..<prefix>n, each under the last
//	get <name>...                        hit (the tier it was in) or miss, released at once
//	lookup <name>...                     a lookup of each block alone: found or not
//	quota dram=<blocks> nvme=<blocks>    SetQuota for the namespace (0: unlimited)
//	where                                each named block's tier, or -
//	stats                                the counters that moved, then Stats.Check
func TestScenarios(t *testing.T) {
	datadriven.Walk(t, "testdata/scenarios", func(t *testing.T, path string) {
		s := &scenario{t: t}
		defer s.close()
		datadriven.RunTest(t, path, s.run)
	})
}

type scenario struct {
	t     *testing.T
	l     *Local
	ns    prefixhash.Namespace
	rng   *rand.Rand
	names []string // in creation order
	keys  map[string]prefixhash.Key
	enc   map[string][]byte
}

func (s *scenario) close() {
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
		var ev string
		d.MaybeScanArgs(t, "eviction", &ev)
		opts := Options{DRAM: newFakeMem(blockBytes, mem, blockBytes), DemoteBatchBytes: 1, Eviction: Eviction(ev)}
		if disk > 0 {
			opts.NVMe = newFakeVolume(blockBytes+64, disk).open()
		}
		l, err := Open(opts)
		if err != nil {
			return err.Error()
		}
		s.l, s.ns, s.rng = l, blocktest.NS(), rand.New(rand.NewPCG(1, 2))
		s.names, s.keys, s.enc = nil, map[string]prefixhash.Key{}, map[string][]byte{}
		return ""
	case "put":
		parent := ""
		d.MaybeScanArgs(t, "parent", &parent)
		return s.put(t, d.CmdArgs[0].Key, parent)
	case "chain":
		if len(d.CmdArgs) != 2 {
			t.Fatalf("%s: chain <prefix> <n>", d.Pos)
		}
		var n int
		fmt.Sscan(d.CmdArgs[1].Key, &n)
		var out []string
		parent := ""
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
