package node

import (
	"context"
	"encoding/base64"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"google.golang.org/grpc/codes"

	"github.com/kvmesh/kvmesh/client"
	kvmeshv1 "github.com/kvmesh/kvmesh/proto/kvmesh/v1"
)

func TestParsePage(t *testing.T) {
	good := pageToken(pageQuotas, digestCursor(7))
	for _, tc := range []struct {
		name   string
		size   int32
		token  string
		reason kvmeshv1.ErrorReason // 0: accepted
		want   int
	}{
		{"defaults", 0, "", 0, maxPageSize},
		{"small", 3, "", 0, 3},
		{"capped", maxPageSize + 1, "", 0, maxPageSize},
		{"next page", 2, good, 0, 2},
		{"negative size", -1, "", kvmeshv1.ErrorReason_ERROR_REASON_INVALID_FIELD, 0},
		{"not base64", 0, "!!", kvmeshv1.ErrorReason_ERROR_REASON_INVALID_PAGE_TOKEN, 0},
		{"too short", 0, base64.RawURLEncoding.EncodeToString([]byte{pageTokenVersion}), kvmeshv1.ErrorReason_ERROR_REASON_INVALID_PAGE_TOKEN, 0},
		{"another list's", 0, pageToken(pageStats, digestCursor(7)), kvmeshv1.ErrorReason_ERROR_REASON_INVALID_PAGE_TOKEN, 0},
		{"another version", 0, base64.RawURLEncoding.EncodeToString([]byte{9, byte(pageQuotas)}), kvmeshv1.ErrorReason_ERROR_REASON_INVALID_PAGE_TOKEN, 0},
	} {
		p, err := parsePage(pageQuotas, tc.size, tc.token)
		if tc.reason != 0 {
			wantRefusal(t, err, codes.InvalidArgument, tc.reason)
			continue
		}
		if err != nil || p.size != tc.want || p.first != (tc.token == "") {
			t.Errorf("%s: %+v, %v", tc.name, p, err)
		}
	}
}

// TestPageOfModel walks random sorted lists page by page, changing them
// between pages, against a model: every entry present for the whole walk is
// listed exactly once, in order, and nothing is listed twice.
func TestPageOfModel(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	key := func(d uint64) []byte { return digestCursor(d) }
	for round := range 300 {
		list := map[uint64]bool{}
		for range rng.IntN(30) {
			list[rng.Uint64N(100)] = true
		}
		stay := map[uint64]bool{} // never removed during the walk
		for d := range list {
			stay[d] = true
		}
		size := 1 + rng.IntN(6)
		var got []uint64
		p, err := parsePage(pageStats, int32(size), "")
		if err != nil {
			t.Fatal(err)
		}
		for pages := 0; ; pages++ {
			if pages > 200 {
				t.Fatalf("round %d: the walk does not end", round)
			}
			sorted := slices.Sorted(func(yield func(uint64) bool) {
				for d := range list {
					if !yield(d) {
						return
					}
				}
			})
			out, next := pageOf(pageStats, sorted, key, p.cursor, p.size)
			got = append(got, out...)
			if next == "" {
				break
			}
			if p, err = parsePage(pageStats, int32(size), next); err != nil {
				t.Fatalf("round %d: the node refuses its own token: %v", round, err)
			}
			// Between pages, entries come and go.
			for range 2 {
				d := rng.Uint64N(100)
				if list[d] {
					delete(list, d)
					delete(stay, d)
				} else {
					list[d] = true
				}
			}
		}
		if !slices.IsSorted(got) || len(slices.Compact(slices.Clone(got))) != len(got) {
			t.Fatalf("round %d: pages listed %v: not sorted, or repeated", round, got)
		}
		for d := range stay {
			if !slices.Contains(got, d) {
				t.Fatalf("round %d: %d, present all along, missing from %v", round, d, got)
			}
		}
	}
}

// TestPagedLists: Stats' and Quotas' namespaces and Members, walked a few
// at a time through a real node, add up to the whole list.
func TestPagedLists(t *testing.T) {
	nodes := startClusterNodes(t, 2, nil)
	n := nodes[0]
	ctx := context.Background()
	var digests []uint64
	for i := range 5 {
		ns := tenantNS(fmt.Sprintf("page-%d", i))
		digests = append(digests, ns.Digest())
		if i < 3 {
			tok, pay := clusterPrompt(i, 1)
			if _, err := n.client.Put(ctx, ns, client.Prompt{Tokens: tok}, pay); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := n.client.SetQuota(ctx, ns, client.Quota{DRAMBytes: 1 << 30}); err != nil {
			t.Fatal(err)
		}
	}
	slices.Sort(digests)
	a := rawAPI(t, n.GRPCAddr())

	var quotas []uint64
	var token string
	for pages := 1; ; pages++ {
		resp, err := a.admin.Quotas(ctx, &kvmeshv1.QuotasRequest{PageSize: 2, PageToken: token})
		if err != nil {
			t.Fatal(err)
		}
		if len(resp.GetNamespaces()) > 2 || resp.GetDefaultQuota() == nil {
			t.Fatalf("page %d: %v", pages, resp)
		}
		for _, r := range resp.GetNamespaces() {
			quotas = append(quotas, r.GetDigest())
		}
		if token = resp.GetNextPageToken(); token == "" {
			if pages != 3 {
				t.Errorf("5 namespaces in %d pages of 2", pages)
			}
			break
		}
	}
	if !slices.Equal(quotas, digests) {
		t.Errorf("Quotas' pages list %x, want %x", quotas, digests)
	}

	var held []uint64
	token = ""
	for {
		resp, err := a.cache.Stats(ctx, &kvmeshv1.StatsRequest{PageSize: 1, PageToken: token})
		if err != nil {
			t.Fatal(err)
		}
		if len(resp.GetTiers()) == 0 {
			t.Fatalf("a page of Stats without the tiers: %v", resp)
		}
		for _, x := range resp.GetNamespaces() {
			held = append(held, x.GetDigest())
		}
		if token = resp.GetNextPageToken(); token == "" {
			break
		}
	}
	whole, err := a.cache.Stats(ctx, &kvmeshv1.StatsRequest{})
	if err != nil || whole.GetNextPageToken() != "" || len(held) != 3 || len(whole.GetNamespaces()) != 3 {
		t.Fatalf("Stats: pages list %x, the whole list %v, %v; want the 3 namespaces with blocks", held, whole, err)
	}
	for i, x := range whole.GetNamespaces() {
		if x.GetDigest() != held[i] {
			t.Errorf("Stats: pages list %x, the whole list %v", held, whole.GetNamespaces())
		}
	}

	p1, err := a.admin.Members(ctx, &kvmeshv1.MembersRequest{PageSize: 1})
	if err != nil || len(p1.GetMembers()) != 1 || p1.GetMembers()[0].GetId() != "n0" || p1.GetNextPageToken() == "" {
		t.Fatalf("Members' first page of 1: %v, %v; want n0 itself and a token", p1, err)
	}
	p2, err := a.admin.Members(ctx, &kvmeshv1.MembersRequest{PageSize: 1, PageToken: p1.GetNextPageToken()})
	if err != nil || len(p2.GetMembers()) != 1 || p2.GetMembers()[0].GetId() != "n1" || p2.GetNextPageToken() != "" {
		t.Fatalf("Members' second page: %v, %v; want n1, the last", p2, err)
	}

	// A token is refused by another list, and a refused page leaves the
	// node serving.
	_, err = a.admin.Quotas(ctx, &kvmeshv1.QuotasRequest{PageToken: p1.GetNextPageToken()})
	wantRefusal(t, err, codes.InvalidArgument, kvmeshv1.ErrorReason_ERROR_REASON_INVALID_PAGE_TOKEN)
	_, err = a.cache.Stats(ctx, &kvmeshv1.StatsRequest{PageToken: "not a token"})
	wantRefusal(t, err, codes.InvalidArgument, kvmeshv1.ErrorReason_ERROR_REASON_INVALID_PAGE_TOKEN)
	if _, err := a.cache.Stats(ctx, &kvmeshv1.StatsRequest{}); err != nil {
		t.Fatalf("Stats after the refusals: %v", err)
	}
}
