package client

import (
	"context"
	"errors"
	"slices"
	"sync/atomic"
	"testing"

	"github.com/kvmesh/kvmesh/prefixhash"
	kvmeshv1 "github.com/kvmesh/kvmesh/proto/kvmesh/v1"
)

// oldNode answers Lookup as nodes did before LookupRequest.chain: from the
// tokens alone, listing every cached block, with no runs. Its cache holds
// the first cached blocks of any prompt of testNS: blocks 0 and 1 on node
// "a" (DRAM, the node asked), the rest on "b".
type oldNode struct {
	flaky
	cached  int
	lookups atomic.Int64
}

func (o *oldNode) Lookup(_ context.Context, req *kvmeshv1.LookupRequest) (*kvmeshv1.LookupResponse, error) {
	o.lookups.Add(1)
	ns := testNS // the only namespace the tests ask about
	keys := prefixhash.Keys(ns, req.GetTokens())
	n := min(o.cached, len(keys))
	resp := &kvmeshv1.LookupResponse{CachedBlocks: uint32(n), CachedTokens: uint64(n * ns.BlockTokens),
		PromptBlocks: uint32(len(keys)), PromptTokens: uint64(len(req.GetTokens()))}
	for i := range n {
		b := &kvmeshv1.CachedBlock{Key: keys[i][:], NodeId: "b"}
		if i < 2 {
			b.NodeId, b.Tier = "a", "dram"
		}
		resp.Blocks = append(resp.Blocks, b)
	}
	return resp, nil
}

// TestLookupOfAnOlderNode: a node that predates the chain sees an empty
// prompt in Lookup's request; the client asks again with the tokens and
// folds the node's block listing into runs.
func TestLookupOfAnOlderNode(t *testing.T) {
	o := &oldNode{cached: 5}
	c := serve(t, o)
	tokens := make([]uint32, 7*testNS.BlockTokens+3)
	for i := range tokens {
		tokens[i] = uint32(i)
	}
	l, err := c.Lookup(context.Background(), testNS, Prompt{Tokens: tokens})
	if err != nil {
		t.Fatal(err)
	}
	keys := prefixhash.Keys(testNS, tokens)
	want := []Run{{Start: 0, Blocks: 2, NodeID: "a", Tier: "dram"}, {Start: 2, Blocks: 3, NodeID: "b"}}
	if l.CachedBlocks != 5 || l.PromptBlocks != 7 || l.PromptTokens != len(tokens) || !slices.Equal(l.Runs, want) || !slices.Equal(l.Keys, keys) {
		t.Fatalf("Lookup = %+v; want 5 of 7 blocks in runs %v", l, want)
	}
	if got := o.lookups.Load(); got != 2 {
		t.Fatalf("%d Lookup calls; want the chain, then the tokens", got)
	}
	bl := l.Blocks()
	if len(bl) != 5 || bl[1] != (CachedBlock{Key: keys[1], NodeID: "a", Tier: "dram"}) || bl[4] != (CachedBlock{Key: keys[4], NodeID: "b"}) {
		t.Fatalf("Blocks() = %+v", bl)
	}
	lt, err := c.Lookup(context.Background(), testNS, Prompt{Tokens: tokens}, SendTokens())
	if err != nil || lt.CachedBlocks != 5 || !slices.Equal(lt.Runs, want) || !slices.Equal(lt.Keys, keys[:5]) {
		t.Fatalf("LookupTokens = %+v, %v", lt, err)
	}
}

// TestLookupAnswerThatDoesNotAddUp: answers whose counts, runs or blocks
// disagree are errors, never a Lookup that indexes out of its Keys.
func TestLookupAnswerThatDoesNotAddUp(t *testing.T) {
	keys := prefixhash.Keys(testNS, make([]uint32, 4*testNS.BlockTokens))
	run := func(blocks, node uint32) *kvmeshv1.CachedRun { return &kvmeshv1.CachedRun{Blocks: blocks, Node: node} }
	for _, tc := range []struct {
		name string
		resp *kvmeshv1.LookupResponse
		keys []prefixhash.Key
	}{
		{"more cached than the prompt", &kvmeshv1.LookupResponse{CachedBlocks: 5, PromptBlocks: 4, Runs: []*kvmeshv1.CachedRun{run(5, 0)}, Nodes: []string{"a"}}, keys},
		{"another prompt length", &kvmeshv1.LookupResponse{CachedBlocks: 1, PromptBlocks: 3, Runs: []*kvmeshv1.CachedRun{run(1, 0)}, Nodes: []string{"a"}}, keys},
		{"runs short of the count", &kvmeshv1.LookupResponse{CachedBlocks: 3, PromptBlocks: 4, Runs: []*kvmeshv1.CachedRun{run(1, 0), run(1, 0)}, Nodes: []string{"a"}}, keys},
		{"runs past the count", &kvmeshv1.LookupResponse{CachedBlocks: 1, PromptBlocks: 4, Runs: []*kvmeshv1.CachedRun{run(1, 0), run(3, 0)}, Nodes: []string{"a"}}, keys},
		{"an unknown node", &kvmeshv1.LookupResponse{CachedBlocks: 1, PromptBlocks: 4, Runs: []*kvmeshv1.CachedRun{run(1, 1)}, Nodes: []string{"a"}}, keys},
		{"an empty run", &kvmeshv1.LookupResponse{CachedBlocks: 1, PromptBlocks: 4, Runs: []*kvmeshv1.CachedRun{run(0, 0), run(1, 0)}, Nodes: []string{"a"}}, keys},
		{"no runs", &kvmeshv1.LookupResponse{CachedBlocks: 1, PromptBlocks: 4}, keys},
		{"a listing short of the count", &kvmeshv1.LookupResponse{CachedBlocks: 2, PromptBlocks: 4, Blocks: []*kvmeshv1.CachedBlock{{Key: keys[0][:]}}}, nil},
		{"a short key", &kvmeshv1.LookupResponse{CachedBlocks: 1, PromptBlocks: 4, Blocks: []*kvmeshv1.CachedBlock{{Key: keys[0][:8]}}}, nil},
	} {
		if l, err := lookupAnswer(tc.resp, tc.keys); !errors.Is(err, errAnswer) {
			t.Errorf("%s: lookupAnswer = %+v, %v; want errAnswer", tc.name, l, err)
		}
	}
	l, err := lookupAnswer(&kvmeshv1.LookupResponse{PromptBlocks: 4}, keys)
	if err != nil || l.CachedBlocks != 0 || len(l.Runs) != 0 || len(l.Blocks()) != 0 {
		t.Fatalf("a miss: %+v, %v", l, err)
	}
}
