package store

import (
	"context"
	"math/rand/v2"
	"testing"

	"github.com/kvmesh/kvmesh/internal/testkit"
)

// TestClusterDepartedOwnerWorkerRetires: a push worker whose owner left the
// membership while its queue was idle must retire (cluster_push.go says so); with
// membership churn, workers must not pile up.
func TestClusterDepartedOwnerWorkerRetires(t *testing.T) {
	tc := newTestCluster(t, 2, ClusterOptions{ChunkTokens: 4})
	ns := clusterNS()
	chain, blocks := prompt(t, rand.New(rand.NewPCG(9, 9)), ns, 20)
	a := tc.nodes[0]
	if err := a.Put(context.Background(), blocks, a.ChunkKeys(chain, ns.BlockTokens, 0, len(chain))); err != nil {
		t.Fatal(err)
	}
	flush(t, a)
	queues := func() int { a.mu.Lock(); defer a.mu.Unlock(); return len(a.mu.queues) }
	if queues() != 1 {
		t.Fatalf("%d push queues, want 1 (for n1)", queues())
	}
	// n1 leaves for good; a keeps serving (lookups, gets, puts to itself).
	tc.members[0].set([]Member{{ID: "n0", Weight: 1}})
	for range 10 {
		a.LongestPrefix(context.Background(), chain, ns.BlockTokens)
		if err := a.Put(context.Background(), blocks, a.ChunkKeys(chain, ns.BlockTokens, 0, len(chain))); err != nil {
			t.Fatal(err)
		}
	}
	testkit.WaitFor(t, "the push worker of the departed peer to retire", func() bool { return queues() == 0 })
}

// TestClusterReplicaServesGet: with R=2, a block that LongestPrefix finds on
// one replica must be returned by Get when the other replica, asked first,
// is dead or lacks the block (it was down when the block was pushed).
func TestClusterReplicaServesGet(t *testing.T) {
	for _, n1Dead := range []bool{true, false} {
		tc := newTestCluster(t, 4, ClusterOptions{ChunkTokens: 4, Replicas: 2})
		ns := clusterNS()
		chain, blocks := prompt(t, rand.New(rand.NewPCG(10, 10)), ns, 40)
		tc.net.mu.Lock()
		tc.net.fault["n1"] = "dead" // n1 misses every push
		tc.net.mu.Unlock()
		a := tc.nodes[0]
		if err := a.Put(context.Background(), blocks, a.ChunkKeys(chain, ns.BlockTokens, 0, len(chain))); err != nil {
			t.Fatal(err)
		}
		flush(t, a)
		if !n1Dead {
			tc.net.mu.Lock()
			delete(tc.net.fault, "n1") // back, but empty
			tc.net.mu.Unlock()
		}
		c := tc.nodes[3]
		ctx := context.Background()
		n := c.LongestPrefix(ctx, chain, ns.BlockTokens)
		if n != len(chain) {
			t.Fatalf("n1 dead=%v: lookup found %d of %d blocks", n1Dead, n, len(chain))
		}
		f, err := c.Get(ctx, chain, ns.BlockTokens, 0, n)
		if err != nil {
			t.Fatal(err)
		}
		for i, b := range f.Blocks {
			if b == nil {
				t.Errorf("n1 dead=%v: block %d: LongestPrefix found it, Get missed it (owners %v)",
					n1Dead, i, c.Owners(c.ChunkKeys(chain, ns.BlockTokens, i, i+1)[0]))
				break
			}
		}
		f.Release()
	}
}
