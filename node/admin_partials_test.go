package node

import (
	"context"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/auth"
	"github.com/kvmesh/kvmesh/block"
	"github.com/kvmesh/kvmesh/prefixhash"
	kvmeshv1 "github.com/kvmesh/kvmesh/proto/kvmesh/v1"
	"github.com/kvmesh/kvmesh/store"
)

// partialsCache is a fakeCache that assembles parts: its incomplete blocks
// are fixed.
type partialsCache struct {
	*fakeCache
	partials []store.PartialInfo
}

func (c *partialsCache) Partials(a auth.Access) []store.PartialInfo {
	var out []store.PartialInfo
	for _, p := range c.partials {
		if a.Allows(p.Tenant) {
			out = append(out, p)
		}
	}
	return out
}

func TestAdminPartials(t *testing.T) {
	ctx := context.Background()
	plain := startNode(t, nil)
	if _, _, err := plain.client.Partials(ctx, 0); err == nil {
		t.Fatal("Partials of a cache without parts: want Unimplemented")
	}

	want := []store.PartialInfo{
		{Key: prefixhash.Key{1}, Namespace: 7, Tokens: 16, Parts: []block.Part{{L0: 0, L1: 2, H0: 0, H1: 4}, {L0: 2, L1: 4, H0: 4, H1: 8}},
			Age: 3 * time.Second, Bytes: 4096, Layers: 4, Heads: 8, Covered: 16},
		{Key: prefixhash.Key{2}, Namespace: 7, Tokens: 16, Parts: []block.Part{{L0: 0, L1: 1, H0: 0, H1: 1}}, Layers: 1, Heads: 1},
	}
	s := &adminService{n: &Node{cache: &partialsCache{fakeCache: newFakeCache(1 << 20), partials: want}}}
	resp, err := s.Partials(ctx, &kvmeshv1.PartialsRequest{Limit: 1})
	if err != nil {
		t.Fatal(err)
	}
	if resp.GetTotal() != 2 || len(resp.GetBlocks()) != 1 {
		t.Fatalf("Partials(limit 1): %d of %d", len(resp.GetBlocks()), resp.GetTotal())
	}
	g, w := resp.GetBlocks()[0], want[0]
	if string(g.GetKey()) != string(w.Key[:]) || g.GetNamespaceDigest() != w.Namespace || g.GetTokens() != 16 || len(g.GetParts()) != 2 ||
		g.GetParts()[1].GetH0() != 4 || g.GetParts()[1].GetL1() != 4 || g.GetAgeSeconds() != 3 || g.GetBytes() != 4096 ||
		g.GetLayers() != 4 || g.GetHeads() != 8 || g.GetCovered() != 16 {
		t.Fatalf("Partials: %+v, want %+v", g, w)
	}
	// A tenant sees its own incomplete blocks only.
	want[1].Tenant = 9
	resp, err = s.Partials(auth.WithAccess(ctx, auth.Access{Scoped: true, Tag: 9}), &kvmeshv1.PartialsRequest{})
	if err != nil || resp.GetTotal() != 1 || string(resp.GetBlocks()[0].GetKey()) != string(want[1].Key[:]) {
		t.Fatalf("a tenant's Partials: %+v, %v", resp, err)
	}
}
