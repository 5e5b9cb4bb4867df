package node

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"path/filepath"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

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

// bigNS has blocks of 4 MiB.
var bigNS = prefixhash.Namespace{Model: "test/big", DType: prefixhash.Float16, BlockTokens: 16,
	Layers: 64, KVHeads: 8, HeadDim: 128}

func heapInuse() int64 {
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return int64(ms.HeapInuse)
}

// bigHeader is the first message of a BatchPut stream of one bigNS block,
// with the first n bytes of its payload.
func bigHeader(n int) *kvmeshv1.BatchPutRequest {
	return &kvmeshv1.BatchPutRequest{Namespace: client.NamespaceProto(bigNS), Data: make([]byte, n),
		Block: &kvmeshv1.BlockHeader{Tokens: make([]uint32, bigNS.BlockTokens), PayloadLen: uint64(bigNS.BlockBytes())}}
}

// TestBatchPutBudget: BatchPut streams that sent only a block header hold
// no block buffer, and those that sent part of a block hold one each, up to
// MaxInFlightBytes; a stream with no room is refused with ResourceExhausted
// saying why, while other calls, and puts of blocks that fit, are served.
// Before, every header allocated a whole block at once: 300 streams of 100
// bytes each took the heap to 4.8 GB.
func TestBatchPutBudget(t *testing.T) {
	if s := bigNS.BlockBytes(); s != 4*MiB {
		t.Fatalf("bigNS blocks are %d bytes", s)
	}
	tn := startNode(t, func(o *Options) { o.Limits.MaxInFlightBytes, o.Limits.ReceiveTimeout = 64*MiB, time.Hour })
	tn.cache.capacity = 1 << 30
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	before := heapInuse()

	const idle, holders = 40, 20
	open := func(msg *kvmeshv1.BatchPutRequest) kvmeshv1.CacheService_BatchPutClient {
		stream, err := tn.raw.BatchPut(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := stream.Send(msg); err != nil {
			t.Fatal(err)
		}
		return stream
	}
	for range idle {
		open(bigHeader(0))
	}
	var refused atomic.Int64
	errs := make(chan error, holders)
	for range holders {
		stream := open(bigHeader(1))
		go func() {
			// Without closing the stream: the block stays incomplete.
			err := stream.RecvMsg(new(kvmeshv1.BatchPutResponse))
			if status.Code(err) == codes.ResourceExhausted {
				refused.Add(1)
			}
			errs <- err
		}()
	}
	size := int64(4*MiB) + int64(block.HeaderLen(bigNS.BlockTokens))
	fit := (64 * MiB) / size // 15
	testkit.WaitFor(t, "the budget full and the streams past it refused", func() bool {
		return tn.putBudget.inUse() == fit*size && refused.Load() == holders-fit
	})
	grown := heapInuse() - before
	t.Logf("heap grew %d MiB with %d header-only streams and %d streams holding part of a 4 MiB block (%d within the budget)",
		grown>>20, idle, holders, fit)
	if bound := (fit + 5) * size; grown > bound {
		t.Fatalf("heap grew %d MiB, over %d MiB: %d blocks of %d streams", grown>>20, bound>>20, grown/size, idle+holders)
	}
	err := <-errs
	if status.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), "max_inflight_bytes") {
		t.Fatalf("stream past the budget: %v, want ResourceExhausted naming max_inflight_bytes", err)
	}
	if _, subject := wantRefusal(t, err, codes.ResourceExhausted, kvmeshv1.ErrorReason_ERROR_REASON_NODE_BUSY); subject != "node:max_inflight_bytes" {
		t.Errorf("QuotaFailure subject %q", subject)
	}

	// Other calls, and blocks that fit in what is left, are served.
	if _, err := tn.raw.Stats(context.Background(), &kvmeshv1.StatsRequest{}); err != nil {
		t.Fatalf("Stats with the budget full: %v", err)
	}
	tokens, payloads := prompt(3, 2*testNS.BlockTokens)
	if _, err := tn.client.Put(context.Background(), testNS, client.Prompt{Tokens: tokens}, payloads); err != nil {
		t.Fatalf("small put with the budget nearly full: %v", err)
	}
	cancel()
	testkit.WaitFor(t, "the budget given back", func() bool { return tn.putBudget.inUse() == 0 })
}

// TestBatchPutStalls: a tenant's BatchPut streams that send a block's first
// byte and then nothing (17 of them, more than the budget holds) take at
// most the tenant's share of MaxInFlightBytes, so another tenant's puts go
// through meanwhile; and each stalled stream is ended with
// DeadlineExceeded after ReceiveTimeout, which gives its buffer back.
// Before, 17 such streams blocked every other writer for RequestTimeout.
func TestBatchPutStalls(t *testing.T) {
	const recvTimeout = 2 * time.Second
	tn := startNode(t, func(o *Options) {
		o.Security.TokensFile, o.Limits.MaxInFlightBytes, o.Limits.ReceiveTimeout = tenantsFile(t), 64*MiB, recvTimeout
	})
	tn.cache.capacity = 1 << 30
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	acme := rawTenantAPI(t, tn.GRPCAddr(), "acme-rw")
	const stalls = 17
	errs := make(chan error, stalls)
	for range stalls {
		stream, err := acme.cache.BatchPut(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := stream.Send(bigHeader(1)); err != nil {
			t.Fatal(err)
		}
		go func() { errs <- stream.RecvMsg(new(kvmeshv1.BatchPutResponse)) }()
	}
	size := int64(4*MiB) + int64(block.HeaderLen(bigNS.BlockTokens))
	testkit.WaitFor(t, "acme's stalled streams to hold its share", func() bool { return tn.putBudget.inUse() >= (16*MiB/size)*size })
	if used := tn.putBudget.inUse(); used > 16*MiB+size {
		t.Fatalf("one tenant's streams hold %d bytes of a 64 MiB budget, over its share", used)
	}
	// Another tenant writes whole blocks meanwhile.
	beta, err := client.Dial(tn.GRPCAddr(), client.Options{Token: "beta-rw", Transport: client.TransportGRPC, MaxRetries: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer beta.Close()
	payload := make([]byte, bigNS.BlockBytes())
	for i := range 4 {
		toks := make([]uint32, bigNS.BlockTokens)
		toks[0] = uint32(i + 1)
		if _, err := beta.Put(context.Background(), bigNS, client.Prompt{Tokens: toks}, [][]byte{payload}); err != nil {
			t.Fatalf("beta's put %d beside acme's stalled streams: %v", i, err)
		}
	}
	for range stalls {
		if err := <-errs; status.Code(err) != codes.DeadlineExceeded && status.Code(err) != codes.ResourceExhausted {
			t.Errorf("a stalled stream ended with %v, want DeadlineExceeded (or ResourceExhausted past the share)", err)
		}
	}
	testkit.WaitFor(t, "the stalled streams' buffers given back", func() bool { return tn.putBudget.inUse() == 0 })
}

// TestStreamLimit: one connection's calls past MaxConcurrentStreams wait on
// the client; calls on other connections are served, and a waiting call
// starts once one ends.
func TestStreamLimit(t *testing.T) {
	tn := startNode(t, func(o *Options) { o.Limits.MaxConcurrentStreams = 4 })
	conn, err := grpc.NewClient(tn.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	raw := kvmeshv1.NewCacheServiceClient(conn)
	// A first call, so the client has the server's settings.
	if _, err := raw.Stats(context.Background(), &kvmeshv1.StatsRequest{}); err != nil {
		t.Fatal(err)
	}
	ns := &kvmeshv1.BatchPutRequest{Namespace: client.NamespaceProto(testNS)}
	var open []kvmeshv1.CacheService_BatchPutClient
	for range 4 {
		stream, err := raw.BatchPut(context.Background())
		if err == nil {
			err = stream.Send(ns)
		}
		if err != nil {
			t.Fatal(err)
		}
		open = append(open, stream)
	}
	// A fifth waits for a stream to end, here until its deadline.
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	stream, err := raw.BatchPut(ctx)
	if err == nil {
		if err = stream.Send(ns); err == nil {
			_, err = stream.CloseAndRecv()
		}
	}
	cancel()
	if status.Code(err) != codes.DeadlineExceeded {
		t.Fatalf("a fifth stream on a connection limited to 4: %v, want it to wait (DeadlineExceeded)", err)
	}
	if _, err := tn.raw.Stats(context.Background(), &kvmeshv1.StatsRequest{}); err != nil {
		t.Fatalf("another connection's call: %v", err)
	}
	if _, err := open[0].CloseAndRecv(); err != nil {
		t.Fatal(err)
	}
	stream, err = raw.BatchPut(context.Background())
	if err == nil {
		if err = stream.Send(ns); err == nil {
			_, err = stream.CloseAndRecv()
		}
	}
	if err != nil {
		t.Fatalf("a stream after one ended: %v", err)
	}
	for _, s := range open[1:] {
		s.CloseSend()
	}
}

// TestTokensNeedGossipKey: a cluster node with any credential (shared
// tokens, or a tenants file) refuses to start without a gossip key, saying
// what to do, and mutual TLS does not stand in for the key (it does not
// guard gossip); with InsecureGossip, or a gossip key, it starts.
func TestTokensNeedGossipKey(t *testing.T) {
	_, mtls, peer := tlsFiles(t, true)
	for _, tc := range []struct {
		name string
		mod  func(*Options)
	}{
		{"shared tokens", func(o *Options) { o.Security.Tokens = []string{"cluster-token"} }},
		{"tokens file", func(o *Options) { o.Security.TokensFile = tenantsFile(t) }},
		{"tokens file and mutual TLS", func(o *Options) {
			o.Security.TokensFile, o.Security.TLS, o.Security.PeerTLS = tenantsFile(t), mtls, peer
		}},
		{"shared tokens and mutual TLS", func(o *Options) {
			o.Security.Tokens, o.Security.TLS, o.Security.PeerTLS = []string{"cluster-token"}, mtls, peer
		}},
	} {
		opts := Options{
			NodeID:  "n",
			DataDir: t.TempDir(),
			Listen:  ListenOptions{GRPCAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0", DataAddr: "127.0.0.1:0", ShmRegionBytes: 16 * MiB},
			Cluster: ClusterOptions{GossipAddr: "127.0.0.1:0"},
			Tiers:   TierOptions{DRAMBytes: 32 * MiB, NVMeBytes: 128 * MiB},
			Limits:  LimitOptions{MaxBlockBytes: 1 * MiB},
			Logger:  slog.New(slog.DiscardHandler),
		}
		tc.mod(&opts)
		n, err := Open(opts)
		if err == nil {
			n.Close()
			t.Errorf("%s: a node with credentials and open gossip started", tc.name)
			continue
		}
		var oe *OptionError
		if !errors.As(err, &oe) || oe.Field != "Cluster.GossipKey" {
			t.Errorf("%s: error %v does not name GossipKey", tc.name, err)
		}
		for _, says := range []string{"needs a gossip key (--gossip-key-file", "mutual TLS does not protect gossip", "--insecure-gossip"} {
			if !strings.Contains(err.Error(), says) {
				t.Errorf("%s: error %q does not say %q", tc.name, err, says)
			}
		}
	}
	openClusterNode(t, t.TempDir(), "insecure", nil, func(o *Options) {
		o.Security.Tokens, o.Cluster.InsecureGossip = []string{"cluster-token"}, true
	})
	openClusterNode(t, t.TempDir(), "keyed", nil, func(o *Options) {
		o.Security.Tokens, o.Cluster.GossipKey = []string{"cluster-token"}, make([]byte, 32)
	})
	openClusterNode(t, t.TempDir(), "tenants-keyed", nil, func(o *Options) {
		o.Security.TokensFile, o.Cluster.GossipKey = tenantsFile(t), make([]byte, 32)
	})
}

// TestDataDirModes: what a node writes under its data dir is its user's
// alone: every directory 0700, every file 0600, the node id included.
// Pebble's files (the NVMe index, the prefill queue) keep pebble's 0644,
// in 0700 directories.
func TestDataDirModes(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "data")
	cn := openClusterNode(t, dir, "", nil, nil)
	ctx := context.Background()
	c, err := client.Dial(cn.GRPCAddr(), client.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	tokens, payloads := clusterPrompt(5, 4)
	if _, err := c.Put(ctx, clusterNS, client.Prompt{Tokens: tokens}, payloads); err != nil {
		t.Fatal(err)
	}
	if _, err := c.SetQuota(ctx, clusterNS, client.Quota{DRAMBytes: 1 * MiB}); err != nil {
		t.Fatal(err)
	}
	pebbleDirs := map[string]bool{filepath.Join(dir, "nvme", "index"): true, filepath.Join(dir, "prefill-queue"): true}
	files := 0
	err = filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		mode := info.Mode()
		switch {
		case mode.IsDir():
			if mode.Perm() != 0o700 {
				t.Errorf("directory %s has mode %v, want 0700", path, mode.Perm())
			}
		case pebbleDirs[filepath.Dir(path)]:
		default:
			files++
			if mode.Perm() != 0o600 {
				t.Errorf("%s has mode %v, want 0600", path, mode.Perm())
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if files < 3 { // node-id, quotas.json, a segment, the shm socket
		t.Fatalf("only %d files checked", files)
	}
}

// TestNamesFlood: a flood of made-up model names cannot push out the names
// of namespaces that hold blocks, and the table stays bounded.
func TestNamesFlood(t *testing.T) {
	var n names
	legit := prefixhash.Namespace{Model: "org/legit", DType: prefixhash.Float16, BlockTokens: 16, Layers: 1, KVHeads: 1, HeadDim: 8}
	n.note(legit)
	n.keep(legit)
	recent := legit
	recent.Model = "org/recent"
	n.note(recent)
	for i := range 3 * maxNames {
		fake := legit
		fake.Model = fmt.Sprintf("flood/%d", i)
		n.note(fake)
	}
	if got := n.model(legit.Digest()); got != "org/legit" {
		t.Fatalf("after the flood, the kept name is %q", got)
	}
	n.mu.Lock()
	seen := len(n.mu.seen)
	n.mu.Unlock()
	if seen > maxSeenNames || n.n.Load() != 1 {
		t.Fatalf("%d names seen (bound %d), %d kept (want 1)", seen, maxSeenNames, n.n.Load())
	}
	// A name seen, then found holding blocks, is kept.
	n.note(recent)
	n.keepSeen(recent.Digest())
	for i := range 2 * maxSeenNames {
		fake := legit
		fake.Model = fmt.Sprintf("flood2/%d", i)
		n.note(fake)
	}
	if got := n.model(recent.Digest()); got != "org/recent" {
		t.Fatalf("a name kept once its namespace held blocks: %q", got)
	}
}
