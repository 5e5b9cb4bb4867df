package node

import (
	"context"
	"github.com/kvmesh/kvmesh/auth"
	"sync/atomic"
	"testing"

	"github.com/kvmesh/kvmesh/prefixhash"
	"github.com/kvmesh/kvmesh/store"
	"github.com/kvmesh/kvmesh/tiers"
	"github.com/kvmesh/kvmesh/transfer"
)

// TestSinkPublishBeforeCluster: a publish request that arrives before the
// cluster started stores its blocks but reports them as misses, so that the
// client sends them through BatchPut, which publishes them; a block that is
// not what it claims is refused either way.
func TestSinkPublishBeforeCluster(t *testing.T) {
	dram, err := tiers.NewDRAM(tiers.DRAMOptions{Capacity: 16 * MiB})
	if err != nil {
		t.Fatal(err)
	}
	local, err := store.Open(store.Options{DRAM: dram, MaxBlockBytes: MiB})
	if err != nil {
		t.Fatal(err)
	}
	defer local.Close()
	var refused atomic.Int64
	sink := localSink{l: local, maxBlock: MiB, refused: &refused, cluster: &atomic.Pointer[store.Cluster]{}}
	ns := benchNamespace(4096)
	good, key := benchBlock(ns, 1, make([]byte, 4096))
	_, other := benchBlock(ns, 2, make([]byte, 4096))
	keys := []prefixhash.Key{key, other}
	st := make([]transfer.Status, 2)
	sink.PutPublish(context.Background(), keys, keys, [][]byte{good, good}, st)
	if st[0] != transfer.StatusMiss || st[1] != transfer.StatusError || refused.Load() != 1 {
		t.Fatalf("statuses %v, %d refused: want a miss (stored, not published) and an error", st, refused.Load())
	}
	if local.LongestPrefix(auth.Access{}, keys[:1]) != 1 {
		t.Fatal("the block was not stored")
	}
}
