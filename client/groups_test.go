package client_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/kvmesh/kvmesh/block"
	"github.com/kvmesh/kvmesh/block/blocktest"
	"github.com/kvmesh/kvmesh/client"
	"github.com/kvmesh/kvmesh/node"
	"github.com/kvmesh/kvmesh/prefixhash"
)

// groupsNode starts a node with a data plane and a DRAM tier of a slab
// per group, and returns a client of it.
func groupsNode(t *testing.T) *client.Client {
	t.Helper()
	n, err := node.Open(node.Options{NodeID: "groups", DataDir: t.TempDir(),
		Listen: node.ListenOptions{GRPCAddr: "127.0.0.1:0", DataAddr: "127.0.0.1:0"},
		Tiers:  node.TierOptions{DRAMBytes: 5 * 17 << 20, NVMeBytes: 64 << 20},
		Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- n.Serve(ctx) }()
	c, err := client.Dial(n.GRPCAddr(), client.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		c.Close()
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	})
	return c
}

// TestClientGroups: a hybrid prompt put group by group (the sliding group
// by two pipeline stages' parts) is found by Lookup with each group's part;
// Get by Tokens returns exactly what resuming needs, by Keys any record; a
// missing state makes the hit shorter and Lookup says so; bad groups and
// states of the wrong size are ErrInvalid before anything is sent.
func TestClientGroups(t *testing.T) {
	c := groupsNode(t)
	ctx := context.Background()
	ns := blocktest.Hybrid()
	rng := rand.New(rand.NewPCG(31, 6))
	const n = 6
	tokens := make([]uint32, n*ns.BlockTokens+1)
	for i := range tokens {
		tokens[i] = rng.Uint32()
	}
	recs := make([][][]byte, ns.Groups.Len()) // [group][block]
	for g := range recs {
		for range n {
			b := make([]byte, ns.GroupBytes(g))
			for j := range b {
				b[j] = byte(rng.Uint32())
			}
			recs[g] = append(recs[g], b)
		}
	}
	chain := prefixhash.Keys(ns, tokens)
	for g := range recs {
		payloads := recs[g]
		if g == 2 {
			payloads = payloads[:n-1] // no state at the last block yet
		}
		if g == 1 {
			continue // below, in parts
		}
		keys, err := c.Put(ctx, ns, client.Prompt{Tokens: tokens, Group: g}, payloads)
		if err != nil {
			t.Fatalf("group %d: %v", g, err)
		}
		if len(keys) != len(payloads) || keys[0] != prefixhash.GroupKey(chain[0], g) {
			t.Fatalf("group %d: keys %v", g, keys)
		}
	}
	// The sliding group's layers 0, 2, 3, 5 as two pipeline stages hold
	// them: [0,3) and [3,4).
	lay := block.GroupLayout(ns, 1)
	for stage := range 2 {
		r := client.Rank{PPRank: stage, PPSize: 2}
		p, err := block.RankGroupPart(ns, 1, 0, 1, stage, 2)
		if err != nil {
			t.Fatal(err)
		}
		var parts [][]byte
		for i := range n {
			parts = append(parts, lay.ExtractPart(nil, recs[1][i], ns.BlockTokens, p))
		}
		if _, err := c.Put(ctx, ns, client.Prompt{Tokens: tokens, Group: 1, Rank: r}, parts); err != nil {
			t.Fatalf("stage %d: %v", stage, err)
		}
	}

	l, err := c.Lookup(ctx, ns, client.Prompt{Tokens: tokens})
	if err != nil {
		t.Fatal(err)
	}
	want := []client.GroupLookup{{prefixhash.GroupFull, n}, {prefixhash.GroupSliding, n}, {prefixhash.GroupState, n - 1}, {prefixhash.GroupIndexer, n}}
	if l.CachedBlocks != n-1 || !slices.Equal(l.Groups, want) {
		t.Fatalf("Lookup: %d blocks, groups %+v; want %d, %+v", l.CachedBlocks, l.Groups, n-1, want)
	}
	check := func(p int) {
		t.Helper()
		blocks, err := c.Get(ctx, ns, client.Prompt{Tokens: tokens})
		if err != nil {
			t.Fatal(err)
		}
		got := map[[2]int][]byte{}
		for _, b := range blocks {
			got[[2]int{b.Index, b.Group}] = b.Payload
		}
		w := ns.Groups.At(1).WindowBlocks(ns.BlockTokens)
		count := 0
		for i := range p {
			for g, gr := range ns.Groups.All() {
				need := gr.Kind.EveryBlock() || gr.Kind == prefixhash.GroupSliding && i >= p-w || gr.Kind == prefixhash.GroupState && i == p-1
				if b, ok := got[[2]int{i, g}]; ok != need || ok && !bytes.Equal(b, recs[g][i]) {
					t.Fatalf("resume at %d: block %d group %d read %v (%d bytes), needed %v", p, i, g, ok, len(b), need)
				}
				if need {
					count++
				}
			}
		}
		if len(blocks) != count {
			t.Fatalf("resume at %d: %d records read, %d needed", p, len(blocks), count)
		}
	}
	check(n - 1)

	if _, err := c.Put(ctx, ns, client.Prompt{Tokens: tokens, Group: 2}, append(make([][]byte, n-1), recs[2][n-1])); err != nil {
		t.Fatal(err)
	}
	if l, err = c.Lookup(ctx, ns, client.Prompt{Tokens: tokens}); err != nil || l.CachedBlocks != n {
		t.Fatalf("with the last state: %+v, %v", l, err)
	}
	check(n)

	// By keys: records of any group, verified and named.
	keys := []prefixhash.Key{prefixhash.GroupKey(chain[2], 2), prefixhash.GroupKey(chain[3], 3), prefixhash.GroupKey(chain[4], 1)}
	blocks, err := c.Get(ctx, ns, client.Prompt{Keys: keys})
	if err != nil {
		t.Fatal(err)
	}
	for j, b := range blocks {
		g, i := []int{2, 3, 1}[j], []int{2, 3, 4}[j]
		if !b.Found || b.Group != g || !bytes.Equal(b.Payload, recs[g][i]) {
			t.Fatalf("by key %d: found %v, group %d, %d bytes", j, b.Found, b.Group, len(b.Payload))
		}
	}

	for _, tc := range []struct {
		name, says string
		p          client.Prompt
		payloads   [][]byte
	}{
		{"state size", "groups[2].state_bytes", client.Prompt{Tokens: tokens, Group: 2}, [][]byte{make([]byte, 12)}},
		{"unknown group", "Group 9", client.Prompt{Tokens: tokens, Group: 9}, nil},
		{"stage without the group", "none of group 2", client.Prompt{Tokens: tokens, Group: 2, Rank: client.Rank{PPRank: 0, PPSize: 2}}, nil},
	} {
		_, err := c.Put(ctx, ns, tc.p, tc.payloads)
		if !errors.Is(err, client.ErrInvalid) || !strings.Contains(err.Error(), tc.says) {
			t.Errorf("%s: %v, want ErrInvalid saying %q", tc.name, err, tc.says)
		}
	}
	if _, err := c.Get(ctx, ns, client.Prompt{Tokens: tokens}, client.Into(nil)); !errors.Is(err, client.ErrInvalid) {
		t.Errorf("Get Into of a namespace with groups: %v", err)
	}
	if _, err := c.Put(ctx, blocktest.NS(), client.Prompt{Tokens: tokens, Group: 1}, nil); !errors.Is(err, client.ErrInvalid) {
		t.Errorf("a group in a namespace without groups: %v", err)
	}
}
