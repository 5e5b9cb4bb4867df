package node

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/kvmesh/kvmesh/client"
	"github.com/kvmesh/kvmesh/prefixhash"
	"github.com/kvmesh/kvmesh/transfer"
	"github.com/kvmesh/kvmesh/transfer/fabrictest"
)

func TestFabricChoice(t *testing.T) {
	arena := make([]byte, 4096)
	for _, tc := range []struct {
		mode  string
		tls   bool
		arena []byte
		start bool
	}{
		{TransportTCP, false, arena, false},
		{TransportAuto, false, arena, true},
		{TransportUCX, false, arena, true},
		{TransportAuto, true, arena, false},
		{TransportAuto, false, nil, false},
	} {
		if start, why := fabricChoice(tc.mode, tc.tls, tc.arena); start != tc.start || start == (why != "") {
			t.Errorf("%s, TLS %v, arena %d bytes: start %v (%q), want %v", tc.mode, tc.tls, len(tc.arena), start, why, tc.start)
		}
	}
	o := Options{Cluster: ClusterOptions{Transport: TransportUCX}, Security: SecurityOptions{TLS: &tls.Config{}}}
	o.EnsureDefaults()
	var oe *OptionError
	if err := o.Validate(); !errors.As(err, &oe) || oe.Field != "Cluster.Transport" {
		t.Errorf("--transport ucx with TLS: %v, want an error naming Transport", err)
	}
}

// withFabric makes the nodes of this test start fab (an in-process fabric
// reporting transports) where they would start UCX, or fail with err.
func withFabric(t *testing.T, fab transfer.Fabric, transports []string, err error) {
	old := startUCX
	startUCX = func(*transfer.UCXOptions) (transfer.Fabric, transfer.UCXInfo, func() error, error) {
		if err != nil {
			return nil, transfer.UCXInfo{}, nil, err
		}
		return fab, transfer.UCXInfo{Version: "test", Transports: transports}, func() error { return nil }, nil
	}
	t.Cleanup(func() { startUCX = old })
}

// TestClusterReadsOneSided: on --transport ucx, a prompt put through A is
// read through B, byte for byte, the blocks A owns arriving by one-sided
// reads of A's DRAM arena (counted per transport in B's /metrics); members
// show each node's fabric.
func TestClusterReadsOneSided(t *testing.T) {
	fab := fabrictest.New("ucx")
	withFabric(t, fab, []string{"cma/memory"}, nil)
	nodes := startClusterNodes(t, 2, func(_ int, o *Options) { o.Cluster.Transport = TransportUCX })
	a, b := nodes[0], nodes[1]
	ctx := context.Background()
	const blocks = 24
	tokens, payloads := clusterPrompt(3, blocks)
	keys, err := a.client.Put(ctx, clusterNS, client.Prompt{Tokens: tokens}, payloads)
	if err != nil || len(keys) != blocks {
		t.Fatalf("Put through A: %d keys, %v", len(keys), err)
	}
	waitHit(t, b.client, tokens, blocks)
	got, err := b.client.Get(ctx, clusterNS, client.Prompt{Tokens: tokens})
	if err != nil || len(got) != blocks {
		t.Fatalf("Get through B: %d blocks, %v", len(got), err)
	}
	onA := 0
	cb := b.cluster.cluster.ChunkBlocks(clusterNS.BlockTokens)
	for i, blk := range got {
		if !bytes.Equal(blk.Payload, payloads[i]) || blk.Key != keys[i] {
			t.Fatalf("block %d read through B differs from what was put through A", i)
		}
		if b.cluster.cluster.Owners(prefixhash.ChunkKey(keys, i, cb))[0] == a.ID() {
			onA++
		}
	}
	if onA == 0 {
		t.Fatal("A owns none of the prompt's chunks: the test reads nothing remotely")
	}
	st := b.cluster.fab.rma.Stats()
	if st.Reads < int64(onA) || fab.Reads() < onA {
		t.Errorf("B read %d blocks one-sidedly (the fabric %d spans); A owns %d", st.Reads, fab.Reads(), onA)
	}
	if v := metricValue(scrape(t, b.HTTPAddr()), `kvmesh_transfer_reads_total{transport="ucx"}`); v < float64(onA) {
		t.Errorf("B's kvmesh_transfer_reads_total{transport=\"ucx\"} = %v, want at least %d", v, onA)
	}
	if v := metricValue(scrape(t, a.HTTPAddr()), `kvmesh_transfer_values_total{op="get",transport="ucx"}`); v < float64(onA) {
		t.Errorf("A's kvmesh_transfer_values_total{op=\"get\",transport=\"ucx\"} = %v, want at least %d granted", v, onA)
	}
	m, err := b.client.Members(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, mb := range m.Members {
		if mb.Fabric != "ucx test cma/memory" {
			t.Errorf("member %s: fabric %q", mb.ID, mb.Fabric)
		}
	}
}

// TestClusterWithoutUCX: a node on --transport auto whose UCX cannot start
// (a build without it, a host without libucx) reads over TCP and says so;
// on --transport ucx it refuses to start, naming what is missing.
func TestClusterWithoutUCX(t *testing.T) {
	missing := fmt.Errorf("%w: load the UCX library libucp.so.0: not found", transfer.ErrNoFabric)
	withFabric(t, nil, nil, missing)
	nodes := startClusterNodes(t, 2, func(_ int, o *Options) { o.Cluster.Transport = TransportAuto })
	ctx := context.Background()
	tokens, payloads := clusterPrompt(4, 8)
	if _, err := nodes[0].client.Put(ctx, clusterNS, client.Prompt{Tokens: tokens}, payloads); err != nil {
		t.Fatal(err)
	}
	waitHit(t, nodes[1].client, tokens, 8)
	got, err := nodes[1].client.Get(ctx, clusterNS, client.Prompt{Tokens: tokens})
	if err != nil || len(got) != 8 {
		t.Fatalf("Get: %d blocks, %v", len(got), err)
	}
	m, err := nodes[1].client.Members(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, mb := range m.Members {
		if mb.Fabric != "tcp" {
			t.Errorf("member %s: fabric %q, want tcp", mb.ID, mb.Fabric)
		}
	}
	_, err = Open(Options{DataDir: t.TempDir(), Listen: ListenOptions{GRPCAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0", DataAddr: "127.0.0.1:0"},
		Cluster: ClusterOptions{GossipAddr: "127.0.0.1:0", Transport: TransportUCX}, Tiers: TierOptions{DRAMBytes: 32 * MiB, NVMeBytes: 128 * MiB}})
	if !errors.Is(err, transfer.ErrNoFabric) || !strings.Contains(err.Error(), "libucp.so.0") {
		t.Fatalf("Open on --transport ucx without UCX: %v, want an error naming the library", err)
	}
}
