package store

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/cockroachdb/datadriven"

	"github.com/kvmesh/kvmesh/auth"
	"github.com/kvmesh/kvmesh/prefixhash"
)

// TestClusterScenarios runs the scripts under testdata/cluster: a loopback
// cluster of Locals (newTestCluster) through which prompts are put, nodes
// hand off, leave or die, and lookups are made, each step followed by what
// a user would see. -rewrite regenerates the expected output.
//
// Commands:
//
//	cluster nodes=<n>                  n nodes n0.., 2 blocks per placement chunk
//	prompt <name> blocks=<n> seed=<s>  a chain of n blocks (not put anywhere)
//	put <prompt> via=<node>            Put through node, then wait for its pushes
//	holders <prompt>                   how many of the prompt's blocks each live node holds
//	lookup <prompt> via=<node>         the cached prefix through node, in blocks
//	handoff <node>                     the node pushes what it holds to the owners without it
//	leave <node>                       every member drops node from its list; node stops answering
func TestClusterScenarios(t *testing.T) {
	datadriven.Walk(t, "testdata/cluster", func(t *testing.T, path string) {
		s := &clusterScenario{prompts: map[string]*scenarioPrompt{}, gone: map[string]bool{}}
		datadriven.RunTest(t, path, func(t *testing.T, d *datadriven.TestData) string { return s.run(t, d) })
	})
}

type scenarioPrompt struct {
	chain  []prefixhash.Key
	blocks [][]byte
}

type clusterScenario struct {
	tc      *testCluster
	prompts map[string]*scenarioPrompt
	gone    map[string]bool
}

func (s *clusterScenario) node(t *testing.T, d *datadriven.TestData, id string) *Cluster {
	for _, c := range s.tc.nodes {
		if c.self == id {
			return c
		}
	}
	t.Fatalf("%s: no node %q", d.Pos, id)
	return nil
}

func (s *clusterScenario) prompt(t *testing.T, d *datadriven.TestData) *scenarioPrompt {
	p, ok := s.prompts[d.CmdArgs[0].Key]
	if !ok {
		t.Fatalf("%s: no prompt %q", d.Pos, d.CmdArgs[0].Key)
	}
	return p
}

func (s *clusterScenario) run(t *testing.T, d *datadriven.TestData) string {
	ctx := context.Background()
	ns := clusterNS()
	switch d.Cmd {
	case "cluster":
		var n int
		d.ScanArgs(t, "nodes", &n)
		s.tc = newTestCluster(t, n, ClusterOptions{ChunkTokens: 2 * ns.BlockTokens})
		return ""
	case "prompt":
		var n int
		var seed uint64
		d.ScanArgs(t, "blocks", &n)
		d.ScanArgs(t, "seed", &seed)
		chain, blocks := prompt(t, rand.New(rand.NewPCG(seed, seed)), ns, n)
		s.prompts[d.CmdArgs[0].Key] = &scenarioPrompt{chain: chain, blocks: blocks}
		return ""
	case "put":
		p := s.prompt(t, d)
		var via string
		d.ScanArgs(t, "via", &via)
		c := s.node(t, d, via)
		if err := c.Put(ctx, p.blocks, c.ChunkKeys(p.chain, ns.BlockTokens, 0, len(p.chain))); err != nil {
			return err.Error()
		}
		flush(t, c)
		return "ok"
	case "holders":
		p := s.prompt(t, d)
		var out []string
		for _, c := range s.tc.nodes {
			if s.gone[c.self] {
				continue
			}
			held := 0
			for _, k := range p.chain {
				if c.Local().Contains(auth.Access{}, k) {
					held++
				}
			}
			out = append(out, fmt.Sprintf("%s: %d of %d", c.self, held, len(p.chain)))
		}
		return strings.Join(out, "\n")
	case "lookup":
		p := s.prompt(t, d)
		var via string
		d.ScanArgs(t, "via", &via)
		n := s.node(t, d, via).LongestPrefix(ctx, p.chain, ns.BlockTokens)
		return fmt.Sprintf("%d of %d blocks", n, len(p.chain))
	case "handoff":
		c := s.node(t, d, d.CmdArgs[0].Key)
		held := c.Local().Stats().Tiers[0].Blocks
		n := len(c.Handoff(ctx, 1<<30))
		return fmt.Sprintf("held %d, pushed %d", held, n)
	case "leave":
		id := d.CmdArgs[0].Key
		s.node(t, d, id)
		s.gone[id] = true
		var ms []Member
		for _, c := range s.tc.nodes {
			if !s.gone[c.self] {
				ms = append(ms, Member{ID: c.self, Weight: 1})
			}
		}
		for _, sm := range s.tc.members {
			sm.set(ms)
		}
		s.tc.net.mu.Lock()
		s.tc.net.fault[id] = "dead"
		s.tc.net.mu.Unlock()
		return ""
	default:
		t.Fatalf("%s: unknown command %q", d.Pos, d.Cmd)
		return ""
	}
}
