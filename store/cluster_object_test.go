package store

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/auth"
	"github.com/kvmesh/kvmesh/block"
	"github.com/kvmesh/kvmesh/prefixhash"
)

// TestClusterObjects: an object put through one node is read through every
// node once pushed, is pinned at its owner by the retention in its record,
// and a Remove through a third node takes it from every node, the
// producer's copy included.
func TestClusterObjects(t *testing.T) {
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(33, 9))
	tc := newTestCluster(t, 3, ClusterOptions{})
	ns := clusterNS()
	var keys []prefixhash.Key
	var recs [][]byte
	for i := range 12 {
		b, key := object(t, rng, ns, fmt.Sprintf("obj/%d", i), 1500, block.Retention{Pin: block.PinHard})
		keys, recs = append(keys, key), append(recs, b)
	}
	if err := tc.nodes[0].Put(ctx, recs, keys); err != nil { // an object is its own placement chunk
		t.Fatal(err)
	}
	if err := tc.nodes[0].Flush(ctx); err != nil {
		t.Fatal(err)
	}
	for n, c := range tc.nodes {
		f, err := c.GetKeys(ctx, keys, keys, time.Time{})
		if err != nil {
			t.Fatal(err)
		}
		for i, b := range f.Blocks {
			if !bytes.Equal(b, recs[i]) {
				t.Fatalf("node %d: object %d not served", n, i)
			}
		}
		f.Release()
	}
	// The owners keep the pin their records ask for; copies do not.
	pinned := 0
	for n, c := range tc.nodes {
		v, _ := c.Local().Retained()
		for _, k := range keys {
			if c.Owns(k) && !c.Local().Contains(auth.Access{}, k) {
				t.Fatalf("node %d owns %s but does not hold it", n, k)
			}
		}
		pinned += v
	}
	if pinned != len(keys) {
		t.Fatalf("%d pinned values in the cluster, want %d (one per owner)", pinned, len(keys))
	}
	got, err := tc.nodes[2].Retain(ctx, keys, keys, block.Retention{Pin: block.PinSoft})
	if err != nil || !allTrue(got) {
		t.Fatalf("Retain through a third node: %v %v", got, err)
	}
	found, err := tc.nodes[1].Remove(ctx, keys[:6])
	if err != nil || !allTrue(found) {
		t.Fatalf("Remove: %v %v", found, err)
	}
	for n, c := range tc.nodes {
		for i, k := range keys[:6] {
			if c.Local().Contains(auth.Access{}, k) {
				t.Fatalf("node %d still holds removed object %d", n, i)
			}
		}
	}
	if present, _ := tc.nodes[0].Exists(ctx, keys, keys); !present[7] || present[0] {
		t.Fatalf("Exists after Remove: %v", present)
	}
}

func allTrue(bs []bool) bool {
	for _, b := range bs {
		if !b {
			return false
		}
	}
	return len(bs) > 0
}
