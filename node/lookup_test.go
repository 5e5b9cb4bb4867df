package node

import (
	"bytes"
	"context"
	"slices"
	"testing"

	"github.com/kvmesh/kvmesh/client"
	"github.com/kvmesh/kvmesh/prefixhash"
	kvmeshv1 "github.com/kvmesh/kvmesh/proto/kvmesh/v1"
)

// TestLookupSummaryMatchesListing: on a 3-node cluster, the compact answer
// client.Lookup asks for (the chain in, counts and runs out) says what the
// full listing says (tokens in, every block listed: LookupTokens, and an
// old-style request through the raw API), for a fully cached prompt, one
// that diverges halfway and one with nothing cached; and an old-style
// request still gets every block listed.
func TestLookupSummaryMatchesListing(t *testing.T) {
	nodes := startClusterNodes(t, 3, nil)
	a, c := nodes[0], nodes[2]
	ctx := context.Background()
	const blocks = 24                            // 6 chunks, on all three nodes
	tokens, payloads := clusterPrompt(3, blocks) // as TestClusterPutOnAHitOnC: chunks on every node
	if _, err := a.client.Put(ctx, clusterNS, client.Prompt{Tokens: tokens}, payloads); err != nil {
		t.Fatal(err)
	}
	waitHit(t, c.client, tokens, blocks)
	diverging := slices.Clone(tokens)
	diverging[13*clusterNS.BlockTokens+1]++ // blocks 0..12 stay cached
	miss, _ := clusterPrompt(4, 3)
	raw := rawAPI(t, c.GRPCAddr())

	for _, tc := range []struct {
		name   string
		tokens []uint32
		cached int
	}{{"cached", tokens, blocks}, {"diverging", diverging, 13}, {"a miss", miss, 0}, {"shorter than a block", tokens[:3], 0}} {
		keys := prefixhash.Keys(clusterNS, tc.tokens)
		l, err := c.client.Lookup(ctx, clusterNS, client.Prompt{Tokens: tc.tokens})
		if err != nil {
			t.Fatal(err)
		}
		if l.CachedBlocks != tc.cached || l.CachedTokens != tc.cached*clusterNS.BlockTokens ||
			l.PromptBlocks != len(keys) || l.PromptTokens != len(tc.tokens) || !slices.Equal(l.Keys, keys) {
			t.Fatalf("%s: Lookup = %d of %d blocks (%d of %d tokens); want %d of %d (%d tokens)", tc.name,
				l.CachedBlocks, l.PromptBlocks, l.CachedTokens, l.PromptTokens, tc.cached, len(keys), len(tc.tokens))
		}
		full, err := c.client.LookupTokens(ctx, clusterNS, tc.tokens)
		if err != nil {
			t.Fatal(err)
		}
		if full.CachedBlocks != l.CachedBlocks || full.CachedTokens != l.CachedTokens || full.PromptBlocks != l.PromptBlocks ||
			full.PromptTokens != l.PromptTokens || !slices.Equal(full.Runs, l.Runs) || !slices.Equal(full.Blocks(), l.Blocks()) {
			t.Fatalf("%s: the listing says %+v\nthe summary %+v", tc.name, full, l)
		}
		if tc.cached == blocks && len(l.Runs) < 3 {
			t.Fatalf("%s: runs %+v; the prompt's chunks are on three nodes", tc.name, l.Runs)
		}

		// An old-style request: tokens, no summary. Every block is listed,
		// in order, where the runs say.
		resp, err := raw.cache.Lookup(ctx, &kvmeshv1.LookupRequest{Namespace: client.NamespaceProto(clusterNS), Tokens: tc.tokens})
		if err != nil {
			t.Fatal(err)
		}
		if int(resp.GetCachedBlocks()) != tc.cached || len(resp.GetBlocks()) != tc.cached {
			t.Fatalf("%s: an old-style Lookup lists %d blocks of %d cached; want %d", tc.name, len(resp.GetBlocks()), resp.GetCachedBlocks(), tc.cached)
		}
		for i, b := range l.Blocks() {
			got := resp.GetBlocks()[i]
			if !bytes.Equal(got.GetKey(), keys[i][:]) || got.GetNodeId() != b.NodeID || got.GetTier() != b.Tier {
				t.Fatalf("%s: old-style block %d = %v; the runs say %+v", tc.name, i, got, b)
			}
		}
		// A summary request lists nothing.
		resp, err = raw.cache.Lookup(ctx, &kvmeshv1.LookupRequest{Namespace: client.NamespaceProto(clusterNS), Tokens: tc.tokens, Summary: true})
		if err != nil || int(resp.GetCachedBlocks()) != tc.cached || len(resp.GetBlocks()) != 0 {
			t.Fatalf("%s: a summary Lookup = %d cached, %d listed, %v", tc.name, resp.GetCachedBlocks(), len(resp.GetBlocks()), err)
		}
	}
}

//lint:file-ignore SA1019 the node's tests call the client's deprecated methods, kept one release (client/deprecated.go).
