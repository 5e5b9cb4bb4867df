package node

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/kvmesh/kvmesh/block"
	"github.com/kvmesh/kvmesh/client"
	"github.com/kvmesh/kvmesh/internal/testkit"
	"github.com/kvmesh/kvmesh/prefixhash"
	kvmeshv1 "github.com/kvmesh/kvmesh/proto/kvmesh/v1"
)

// tenantNS returns clusterNS under a tenant salt.
func tenantNS(salt string) prefixhash.Namespace {
	ns := clusterNS
	ns.TenantSalt = salt
	return ns
}

// api is a node's gRPC API, raw.
type api struct {
	cache kvmeshv1.CacheServiceClient
	admin kvmeshv1.AdminServiceClient
}

func rawAPI(t testing.TB, addr string) api {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return api{kvmeshv1.NewCacheServiceClient(conn), kvmeshv1.NewAdminServiceClient(conn)}
}

// batchGet streams a BatchGet and returns, per index, whether the block was
// found, and its payload.
func batchGet(ctx context.Context, c kvmeshv1.CacheServiceClient, req *kvmeshv1.BatchGetRequest) (found []bool, payloads [][]byte, err error) {
	s, err := c.BatchGet(ctx, req)
	if err != nil {
		return nil, nil, err
	}
	for {
		f, err := s.Recv()
		if errors.Is(err, io.EOF) {
			return found, payloads, nil
		}
		if err != nil {
			return nil, nil, err
		}
		if len(f.GetKey()) > 0 { // a block's first frame
			found = append(found, f.GetFound())
			payloads = append(payloads, nil)
		}
		payloads[len(payloads)-1] = append(payloads[len(payloads)-1], f.GetData()...)
	}
}

func keyBytesOf(keys []prefixhash.Key) [][]byte {
	out := make([][]byte, len(keys))
	for i := range keys {
		out[i] = keyBytes(keys[i])
	}
	return out
}

// TestTenantsNeverShareAHit: through the gRPC API of either node of a
// cluster, a prompt BatchPut under one tenant's salt is never a hit under
// another's: Lookup finds nothing, BatchGet by tokens and Exists by keys
// miss, and even the other tenant's exact keys, asked for under this
// tenant's namespace, are answered as misses (the node never serves a block
// of another namespace), counted as refused.
func TestTenantsNeverShareAHit(t *testing.T) {
	nodes := startClusterNodes(t, 2, nil)
	ctx := context.Background()
	nsA, nsB := tenantNS("tenant-a"), tenantNS("tenant-b")
	tokens, payloads := clusterPrompt(11, 12) // three chunks: some on each node
	grpcOnly, err := client.Dial(nodes[0].GRPCAddr(), client.Options{Transport: client.TransportGRPC})
	if err != nil {
		t.Fatal(err)
	}
	defer grpcOnly.Close()
	if _, err := grpcOnly.Put(ctx, nsA, client.Prompt{Tokens: tokens}, payloads); err != nil { // BatchPut
		t.Fatal(err)
	}
	keysA, keysB := prefixhash.Keys(nsA, tokens), prefixhash.Keys(nsB, tokens)
	for i := range keysA {
		if keysA[i] == keysB[i] {
			t.Fatalf("block %d has the same key under both tenants", i)
		}
	}
	testkit.WaitFor(t, "tenant A's prompt to be a hit through both nodes", func() bool {
		for _, n := range nodes {
			if l, err := n.client.Lookup(ctx, nsA, client.Prompt{Tokens: tokens}); err != nil || l.CachedBlocks != len(payloads) {
				return false
			}
		}
		return true
	})
	for _, n := range nodes {
		a := rawAPI(t, n.GRPCAddr())
		l, err := a.cache.Lookup(ctx, &kvmeshv1.LookupRequest{Namespace: client.NamespaceProto(nsB), Tokens: tokens})
		if err != nil || l.GetCachedBlocks() != 0 {
			t.Fatalf("%s: Lookup under tenant B = %v, %v; want no block", n.ID(), l, err)
		}
		found, _, err := batchGet(ctx, a.cache, &kvmeshv1.BatchGetRequest{Namespace: client.NamespaceProto(nsB), Tokens: tokens})
		if err != nil || len(found) != len(payloads) || slicesContains(found, true) {
			t.Fatalf("%s: BatchGet of the prompt under tenant B = %v, %v; want %d misses", n.ID(), found, err, len(payloads))
		}
		ex, err := a.cache.Exists(ctx, &kvmeshv1.ExistsRequest{Keys: keyBytesOf(keysB)})
		if err != nil || slicesContains(ex.GetPresent(), true) {
			t.Fatalf("%s: Exists of tenant B's keys = %v, %v", n.ID(), ex.GetPresent(), err)
		}
		// Tenant A's own keys, asked for under tenant B's namespace.
		found, _, err = batchGet(ctx, a.cache, &kvmeshv1.BatchGetRequest{Namespace: client.NamespaceProto(nsB), Keys: keyBytesOf(keysA)})
		if err != nil || len(found) != len(payloads) || slicesContains(found, true) {
			t.Fatalf("%s: BatchGet of tenant A's keys under tenant B = %v, %v; want misses", n.ID(), found, err)
		}
		if v := metricValue(scrape(t, n.HTTPAddr()), `kvmesh_blocks_refused_total{reason="verify"}`); v < float64(len(payloads)) {
			t.Errorf("%s: kvmesh_blocks_refused_total = %v, want the %d blocks of another namespace refused", n.ID(), v, len(payloads))
		}
		// Tenant A still reads its own, byte for byte.
		found, got, err := batchGet(ctx, a.cache, &kvmeshv1.BatchGetRequest{Namespace: client.NamespaceProto(nsA), Tokens: tokens})
		if err != nil || len(found) != len(payloads) {
			t.Fatalf("%s: tenant A's BatchGet = %v, %v", n.ID(), found, err)
		}
		for i := range got {
			if !found[i] || !bytes.Equal(got[i], payloads[i]) {
				t.Fatalf("%s: tenant A's block %d found=%v, bytes differ", n.ID(), i, found[i])
			}
		}
	}
}

func slicesContains(s []bool, v bool) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}

// TestQuotas: the default quota of --quota-dram/--quota-nvme bounds every
// namespace on a node: a tenant writing far more than its quota keeps at
// most its quota in each tier, and never evicts another tenant's blocks.
// A quota set through AdminService.SetQuota that no block fits makes the
// tenant's next BatchPut fail with ResourceExhausted naming the quota, while
// the node keeps serving; it shows in Quotas and in the metrics, survives a
// restart, and ClearQuota lifts it. A node without quotas answers
// Unimplemented.
func TestQuotas(t *testing.T) {
	dir := t.TempDir()
	blk := int64(block.EncodedLen(clusterNS.BlockTokens, clusterNS.BlockBytes()))
	open := func() *clusterNode {
		return openClusterNode(t, dir, "q", nil, func(o *Options) { o.Tiers.QuotaDRAMBytes, o.Tiers.QuotaNVMeBytes = 8*blk, 16*blk })
	}
	n := open()
	ctx := context.Background()
	nsA, nsB := tenantNS("tenant-a"), tenantNS("tenant-b")
	tokB, payB := clusterPrompt(1, 6)
	if _, err := n.client.Put(ctx, nsB, client.Prompt{Tokens: tokB}, payB); err != nil {
		t.Fatal(err)
	}
	for p := range 8 {
		tok, pay := clusterPrompt(100+p, 12)
		if _, err := n.client.Put(ctx, nsA, client.Prompt{Tokens: tok}, pay); err != nil {
			t.Fatalf("tenant A's prompt %d: %v", p, err)
		}
	}
	a := rawAPI(t, n.GRPCAddr())
	row := func(ns prefixhash.Namespace) *kvmeshv1.NamespaceQuota {
		t.Helper()
		resp, err := a.admin.Quotas(ctx, &kvmeshv1.QuotasRequest{})
		if err != nil {
			t.Fatal(err)
		}
		if dq := resp.GetDefaultQuota(); dq.GetDramBytes() != uint64(8*blk) || dq.GetNvmeBytes() != uint64(16*blk) {
			t.Fatalf("default quota %v", dq)
		}
		for _, r := range resp.GetNamespaces() {
			if r.GetDigest() == ns.Digest() {
				return r
			}
		}
		t.Fatalf("Quotas lists no namespace %016x: %v", ns.Digest(), resp)
		return nil
	}
	ra := row(nsA)
	if ra.GetOwn() || ra.GetDramBytes() > uint64(8*blk) || ra.GetNvmeBytes() > uint64(16*blk) || ra.GetBlocks() == 0 {
		t.Fatalf("tenant A after writing 96 blocks: %v; want at most 8 blocks in DRAM and 16 in NVMe", ra)
	}
	got, err := n.client.Get(ctx, nsB, client.Prompt{Tokens: tokB})
	if err != nil || len(got) != len(payB) {
		t.Fatalf("tenant B after tenant A's writes: %d of %d blocks, %v", len(got), len(payB), err)
	}

	// A quota no block fits: tenant A's next write is refused.
	resp, err := a.admin.SetQuota(ctx, &kvmeshv1.SetQuotaRequest{Namespace: client.NamespaceProto(nsA),
		Quota: &kvmeshv1.Quota{DramBytes: uint64(blk / 2), NvmeBytes: uint64(blk / 2)}})
	if err != nil || !resp.GetNamespace().GetOwn() || resp.GetNamespace().GetQuota().GetDramBytes() != uint64(blk/2) {
		t.Fatalf("SetQuota = %v, %v", resp, err)
	}
	grpcOnly, err := client.Dial(n.GRPCAddr(), client.Options{Transport: client.TransportGRPC, MaxRetries: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer grpcOnly.Close()
	tok, pay := clusterPrompt(999, 2)
	_, err = grpcOnly.Put(ctx, nsA, client.Prompt{Tokens: tok}, pay)
	if st := status.Convert(errors.Unwrap(err)); st.Code() != codes.ResourceExhausted || !strings.Contains(st.Message(), "quota") {
		t.Fatalf("BatchPut over the quota = %v; want ResourceExhausted naming the quota", err)
	}
	if info, subject := wantRefusal(t, err, codes.ResourceExhausted, kvmeshv1.ErrorReason_ERROR_REASON_QUOTA_EXCEEDED); subject != "namespace:"+digestString(nsA.Digest()) ||
		info.GetMetadata()["namespace_digest"] != digestString(nsA.Digest()) {
		t.Errorf("quota refusal: subject %q, metadata %v; want namespace %s", subject, info.GetMetadata(), digestString(nsA.Digest()))
	}
	if got, err := n.client.Get(ctx, nsB, client.Prompt{Tokens: tokB}); err != nil || len(got) != len(payB) {
		t.Fatalf("tenant B after tenant A was refused: %d blocks, %v", len(got), err)
	}
	// Blocks go over the data plane, which names digests only: a lookup
	// over gRPC tells the node nsB's model, for the metrics' model label.
	if _, err := n.client.Lookup(ctx, nsB, client.Prompt{Tokens: tokB}); err != nil {
		t.Fatal(err)
	}
	body := scrape(t, n.HTTPAddr())
	if metricValue(body, "kvmesh_cache_quota_refused_total") < 1 {
		t.Errorf("quota refusals not counted:\n%s", grep(body, "kvmesh_cache"))
	}
	if series := fmt.Sprintf(`kvmesh_namespace_quota_bytes{model=%q,namespace="%016x",tier="dram"}`, nsB.Model, nsB.Digest()); metricValue(body, series) != float64(8*blk) {
		t.Errorf("%s = %v, want %d:\n%s", series, metricValue(body, series), 8*blk, grep(body, "kvmesh_namespace"))
	}

	// The quota survives a restart; ClearQuota lifts it.
	n.stop(t)
	n = open()
	a = rawAPI(t, n.GRPCAddr())
	if ra := row(nsA); !ra.GetOwn() || ra.GetQuota().GetNvmeBytes() != uint64(blk/2) {
		t.Fatalf("tenant A's quota after a restart: %v", ra)
	}
	if ra, err := n.client.ClearQuota(ctx, nsA); err != nil || ra.Own || ra.Quota.DRAMBytes != 8*blk {
		t.Fatalf("ClearQuota = %v, %v; want the default quota in force", ra, err)
	}
	if _, err := n.client.Put(ctx, nsA, client.Prompt{Tokens: tok}, pay); err != nil {
		t.Fatalf("Put after ClearQuota: %v", err)
	}

	_, err = startNode(t, nil).admin.SetQuota(ctx, &kvmeshv1.SetQuotaRequest{Digest: 1, Quota: &kvmeshv1.Quota{}})
	if status.Code(err) != codes.Unimplemented {
		t.Fatalf("SetQuota on a node without quotas: %v, want Unimplemented", err)
	}
}
