package store

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/kvmesh/kvmesh/internal/testkit"
	"github.com/kvmesh/kvmesh/prefixhash"
)

// roundsCluster is a cluster of 40 nodes with one block a chunk, a prompt of
// 100 blocks put through node 0 and pushed to its owners, and a node that
// owns none of its first chunks to look it up from.
func roundsCluster(t *testing.T, opts ClusterOptions) (*testCluster, []prefixhash.Key, *Cluster) {
	t.Helper()
	opts.ChunkTokens = 4 // one block a chunk
	tc := newTestCluster(t, 40, opts)
	ns := clusterNS()
	chain, blocks := prompt(t, rand.New(rand.NewPCG(35, 1)), ns, 100)
	a := tc.nodes[0]
	if err := a.Put(context.Background(), blocks, a.ChunkKeys(chain, ns.BlockTokens, 0, len(chain))); err != nil {
		t.Fatal(err)
	}
	flush(t, a)
	for _, c := range tc.nodes[1:] {
		if !c.Owns(chain[0]) && !c.Owns(chain[1]) && !c.Owns(chain[2]) {
			return tc, chain, c
		}
	}
	t.Fatal("every node owns one of the first chunks")
	return nil, nil, nil
}

// asked resets the record of lookups and returns a function that returns
// the members asked since.
func asked(tc *testCluster) func() []string {
	tc.net.mu.Lock()
	tc.net.asked = map[string][]string{}
	tc.net.mu.Unlock()
	return func() []string {
		tc.net.mu.Lock()
		defer tc.net.mu.Unlock()
		return slices.Clone(tc.net.asked["lookup"])
	}
}

// TestClusterLookupFirstChunkMisses: a long prompt whose first chunk is
// cached nowhere is answered by that chunk's owner alone; no other owner is
// asked.
func TestClusterLookupFirstChunkMisses(t *testing.T) {
	tc, _, from := roundsCluster(t, ClusterOptions{})
	other, _ := prompt(t, rand.New(rand.NewPCG(35, 2)), clusterNS(), 100)
	got := asked(tc)
	if n := from.LongestPrefix(context.Background(), other, clusterNS().BlockTokens); n != 0 {
		t.Fatalf("prefix %d of a prompt never put", n)
	}
	if a, owner := got(), from.Owners(other[0])[0]; len(a) != 1 || a[0] != owner {
		t.Fatalf("asked %v, want only %s, the first chunk's owner", a, owner)
	}
}

// TestClusterLookupEndsEarly: a prompt cached up to its third chunk is
// answered by the owners of its first chunks, not by one peer a chunk; a
// prompt cached whole is found whole, each owner asked once.
func TestClusterLookupEndsEarly(t *testing.T) {
	tc, chain, from := roundsCluster(t, ClusterOptions{})
	ns := clusterNS()
	tail, _ := prompt(t, rand.New(rand.NewPCG(35, 3)), ns, 97)
	mixed := append(slices.Clone(chain[:3]), tail...)
	got := asked(tc)
	if n := from.LongestPrefix(context.Background(), mixed, ns.BlockTokens); n != 3 {
		t.Fatalf("prefix %d, want the 3 shared blocks", n)
	}
	if a := got(); len(a) > 1+DefaultLookupRoundPeers {
		t.Fatalf("asked %d peers for a prefix that ends at the third chunk, want at most %d", len(a), 1+DefaultLookupRoundPeers)
	}

	got = asked(tc)
	if n := from.LongestPrefix(context.Background(), chain, ns.BlockTokens); n != len(chain) {
		t.Fatalf("prefix %d of the whole prompt, want %d", n, len(chain))
	}
	owners := map[string]bool{}
	for _, k := range chain {
		for _, o := range from.Owners(k) {
			if o != from.self {
				owners[o] = true
			}
		}
	}
	// Three rounds at most: an owner is asked at most once a round.
	if a := got(); len(a) < len(owners) || len(a) > len(owners)+1+DefaultLookupRoundPeers {
		t.Fatalf("asked %d times for a prompt with %d owners", len(a), len(owners))
	}
}

// TestClusterLookupOneRound: with LookupRoundPeers negative, every owner is
// asked at once, once, whatever the prompt.
func TestClusterLookupOneRound(t *testing.T) {
	tc, _, from := roundsCluster(t, ClusterOptions{LookupRoundPeers: -1})
	other, _ := prompt(t, rand.New(rand.NewPCG(35, 2)), clusterNS(), 100)
	owners := map[string]bool{}
	for _, k := range other {
		for _, o := range from.Owners(k) {
			if o != from.self {
				owners[o] = true
			}
		}
	}
	got := asked(tc)
	if n := from.LongestPrefix(context.Background(), other, clusterNS().BlockTokens); n != 0 {
		t.Fatalf("prefix %d of a prompt never put", n)
	}
	if a := got(); len(a) != len(owners) {
		t.Fatalf("asked %d peers, want all %d owners at once", len(a), len(owners))
	}
}

// TestClusterLookupStragglerOverlaps: a whole prompt's lookup does not wait
// for a slow owner of its second round before it asks the third: every
// owner is asked while that owner has not answered, and the prompt is
// found whole once it does. With two replicas a chunk is decided by the
// first that holds it, the other not waited for.
func TestClusterLookupStragglerOverlaps(t *testing.T) {
	for _, replicas := range []int{1, 2} {
		t.Run(fmt.Sprintf("replicas=%d", replicas), func(t *testing.T) {
			tc, chain, from := roundsCluster(t, ClusterOptions{Replicas: replicas})
			slow := from.Owners(chain[1])[0]
			if slices.Contains(from.Owners(chain[0]), slow) {
				slow = from.Owners(chain[2])[0]
			}
			owners := map[string]bool{} // of the chunks this node does not hold
			for _, k := range chain {
				if os := from.Owners(k); !slices.Contains(os, from.self) {
					for _, o := range os {
						owners[o] = true
					}
				}
			}
			gate := make(chan struct{})
			tc.net.mu.Lock()
			tc.net.gate = map[string]chan struct{}{slow: gate}
			tc.net.mu.Unlock()
			got := asked(tc)
			found := make(chan int, 1)
			go func() { found <- from.LongestPrefix(context.Background(), chain, clusterNS().BlockTokens) }()
			testkit.WaitFor(t, "every owner asked while one of the second round's has not answered", func() bool {
				seen := map[string]bool{}
				for _, o := range got() {
					seen[o] = true
				}
				return len(seen) == len(owners)
			})
			close(gate)
			if n := <-found; n != len(chain) {
				t.Fatalf("prefix %d, want the whole %d", n, len(chain))
			}
		})
	}
}
