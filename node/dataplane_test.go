package node

import (
	"bytes"
	"context"
	"github.com/kvmesh/kvmesh/auth"
	"sync/atomic"
	"testing"

	"github.com/kvmesh/kvmesh/block"
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

// TestDataPlaneParts: the node's data plane serves any rank's slice of a
// block it holds whole (a get-part request over TCP): the record decodes
// as the part asked for and carries that slice of the stored payload; a
// range that is not a part of the block is an error for that item only,
// and the node serves on.
func TestDataPlaneParts(t *testing.T) {
	dram, err := tiers.NewDRAM(tiers.DRAMOptions{Capacity: 16 * MiB})
	if err != nil {
		t.Fatal(err)
	}
	local, err := store.Open(store.Options{DRAM: dram, MaxBlockBytes: MiB})
	if err != nil {
		t.Fatal(err)
	}
	defer local.Close()
	ns := benchNamespace(256 << 10) // 16 tokens, 4 layers, 8 KV heads
	payload := make([]byte, ns.BlockBytes())
	for i := range payload {
		payload[i] = byte(i * 7)
	}
	whole, key := benchBlock(ns, 1, payload)
	if err := local.Put(context.Background(), whole); err != nil {
		t.Fatal(err)
	}
	var refused atomic.Int64
	srv, err := transfer.NewServer(localSource{local}, localSink{l: local, maxBlock: MiB, refused: &refused, cluster: &atomic.Pointer[store.Cluster]{}}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	addr, err := srv.Listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	c, err := transfer.NewClient(addr.String(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	lay := block.LayoutOf(ns)
	for _, r := range [][4]int{{0, 1, 0, 1}, {1, 2, 0, 1}, {3, 8, 0, 1}, {0, 2, 1, 2}, {5, 8, 1, 2}} {
		p, err := block.RankPart(ns, r[0], r[1], r[2], r[3])
		if err != nil {
			t.Fatal(err)
		}
		bad := block.Part{L0: p.L0, L1: p.L1, H0: 1, H1: 4} // heads [1,4): not aligned
		res, err := c.GetParts(context.Background(), []prefixhash.Key{key, key}, []block.Part{bad, p})
		if err != nil {
			t.Fatalf("%s: %v", p, err)
		}
		if res.Status[0] != transfer.StatusError || res.Status[1] != transfer.StatusOK {
			t.Fatalf("%s: statuses %v, want an error for heads [1,4) and the part", p, res.Status)
		}
		b, err := block.Decode(res.Values[1], 0)
		if err != nil || b.Part != p || b.Key != key {
			t.Fatalf("%s: record of %s, %v", p, b.Part, err)
		}
		if want := lay.ExtractPart(nil, payload, ns.BlockTokens, p); !bytes.Equal(b.Payload, want) {
			t.Fatalf("%s: the record's payload is not that slice of the block", p)
		}
		res.Release()
	}
}
