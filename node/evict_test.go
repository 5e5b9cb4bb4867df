package node

import (
	"context"
	"testing"

	"github.com/kvmesh/kvmesh/auth"
	"github.com/kvmesh/kvmesh/client"
	"github.com/kvmesh/kvmesh/prefixhash"
)

// TestEvictionDedupHoldsEachBlockOnce: a prompt put through one node of a
// two-node cluster whose nodes hold only as many blocks as they own
// (--max-blocks) is found whole through the other: under the default
// policy (dedup) the producer's copies of what the other node owns go
// first, and they reach their owner even when evicted at once. The client
// puts over the data plane (PutPublish).
func TestEvictionDedupHoldsEachBlockOnce(t *testing.T) {
	const blocks = 32 // 8 chunks of 4 blocks
	tokens, payloads := clusterPrompt(7, blocks)
	keys := prefixhash.Keys(clusterNS, tokens[:blocks*clusterNS.BlockTokens])
	// Who owns what does not depend on the nodes' options: find out on a
	// first cluster, then size a second one to it.
	probe := startClusterNodes(t, 2, nil)
	owned := map[string]int{}
	for i := range keys {
		ck := prefixhash.ChunkKey(keys, i, probe[0].cluster.cluster.ChunkBlocks(clusterNS.BlockTokens))
		owned[probe[0].cluster.cluster.Owners(ck)[0]]++
	}
	for _, n := range probe {
		n.stop(t)
	}
	if owned["n0"] == 0 || owned["n1"] == 0 {
		t.Fatalf("one node owns every chunk (%v): the test proves nothing", owned)
	}
	nodes := startClusterNodes(t, 2, func(i int, o *Options) {
		o.Tiers.MaxBlocks = owned[o.NodeID]
	})
	ctx := context.Background()
	if _, err := nodes[0].client.Put(ctx, clusterNS, client.Prompt{Tokens: tokens}, payloads); err != nil {
		t.Fatal(err)
	}
	waitHit(t, nodes[1].client, tokens, blocks)
	if got := nodes[0].cluster.local.LongestPrefix(auth.Access{}, keys); got == blocks {
		t.Fatalf("the producer holds all %d blocks with room for %d", blocks, owned["n0"])
	}
}
