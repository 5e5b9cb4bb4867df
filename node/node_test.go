package node

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/kvmesh/kvmesh/client"
	"github.com/kvmesh/kvmesh/internal/testkit"
	"github.com/kvmesh/kvmesh/prefixhash"
	kvmeshv1 "github.com/kvmesh/kvmesh/proto/kvmesh/v1"
)

// testNS has blocks of 4 tokens and 1 KiB of payload.
var testNS = prefixhash.Namespace{Model: "test/tiny", DType: prefixhash.Float32, BlockTokens: 4,
	Layers: 2, KVHeads: 2, HeadDim: 8}

type testNode struct {
	*Node
	cache  *fakeCache
	client *client.Client
	raw    kvmeshv1.CacheServiceClient
	admin  kvmeshv1.AdminServiceClient
	conn   *grpc.ClientConn
	cancel context.CancelFunc
	done   chan error
}

// startNode serves a node over a fake cache on loopback ports and stops it
// when the test ends, checking that it shut down cleanly.
func startNode(t *testing.T, mod func(*Options)) *testNode {
	t.Helper()
	cache := newFakeCache(1 << 20)
	opts := Options{
		DataDir: t.TempDir(),
		Listen:  ListenOptions{GRPCAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0"},
		Tiers:   TierOptions{DRAMBytes: 64 * MiB, NVMeBytes: 64 * MiB},
		Logger:  slog.New(slog.DiscardHandler),
	}
	if mod != nil {
		mod(&opts)
	}
	n, err := New(opts, cache)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	tn := &testNode{Node: n, cache: cache, cancel: cancel, done: make(chan error, 1)}
	go func() { tn.done <- n.Serve(ctx) }()
	tn.client, err = client.Dial(n.GRPCAddr(), client.Options{MaxMessageBytes: opts.Limits.MaxMessageBytes})
	if err != nil {
		t.Fatal(err)
	}
	conn, err := grpc.NewClient(n.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	tn.conn = conn
	tn.raw = kvmeshv1.NewCacheServiceClient(conn)
	tn.admin = kvmeshv1.NewAdminServiceClient(conn)
	t.Cleanup(func() {
		tn.client.Close()
		conn.Close()
		tn.stop(t)
	})
	return tn
}

// stop shuts the node down (once) and checks that the cache was closed with
// no block left pinned.
func (tn *testNode) stop(t *testing.T) {
	t.Helper()
	tn.cancel()
	if err, ok := <-tn.done; ok {
		if err != nil {
			t.Errorf("Serve: %v", err)
		}
		close(tn.done)
	}
	if got := tn.cache.closed.Load(); got != 1 {
		t.Errorf("cache closed %d times, want 1", got)
	}
	if got := tn.cache.pins.Load(); got != 0 {
		t.Errorf("%d blocks still pinned after shutdown", got)
	}
}

// prompt returns n tokens and the payloads of its full blocks under testNS,
// derived from seed.
func prompt(seed uint32, n int) ([]uint32, [][]byte) {
	tokens := make([]uint32, n)
	for i := range tokens {
		tokens[i] = seed*1000 + uint32(i)
	}
	payloads := make([][]byte, n/testNS.BlockTokens)
	for i := range payloads {
		payloads[i] = bytes.Repeat([]byte{byte(seed), byte(i)}, testNS.BlockBytes()/2)
	}
	return tokens, payloads
}

func TestPutLookupGet(t *testing.T) {
	tn := startNode(t, nil)
	ctx := context.Background()
	tokens, payloads := prompt(1, 14) // 3 full blocks and a tail of 2
	keys, err := tn.client.Put(ctx, testNS, client.Prompt{Tokens: tokens}, payloads)
	if err != nil {
		t.Fatalf("Put: %v", err)
	}
	if want := prefixhash.Keys(testNS, tokens); len(keys) != 3 || keys[2] != want[2] {
		t.Fatalf("Put keys %v, want %v", keys, want)
	}

	l, err := tn.client.Lookup(ctx, testNS, client.Prompt{Tokens: tokens})
	if err != nil {
		t.Fatal(err)
	}
	if l.CachedTokens != 12 || l.CachedBlocks != 3 || l.PromptTokens != 14 || l.PromptBlocks != 3 {
		t.Fatalf("Lookup = %+v, want 12 of 14 tokens cached in 3 blocks", l)
	}
	if bl := l.Blocks(); bl[0].NodeID != tn.ID() || bl[0].Tier != "dram" || bl[2].Key != keys[2] {
		t.Fatalf("Lookup blocks = %+v", bl)
	}

	// A prompt that shares the first two blocks and then diverges.
	other := append(append([]uint32(nil), tokens[:8]...), 7, 7, 7, 7, 7)
	if l, err := tn.client.Lookup(ctx, testNS, client.Prompt{Tokens: other}); err != nil || l.CachedTokens != 8 || l.PromptBlocks != 3 {
		t.Fatalf("Lookup of a diverging prompt = %+v, %v; want 8 tokens cached", l, err)
	}
	// Another tenant never sees the prefix.
	salted := testNS
	salted.TenantSalt = "tenant-b"
	if l, err := tn.client.Lookup(ctx, salted, client.Prompt{Tokens: tokens}); err != nil || l.CachedTokens != 0 {
		t.Fatalf("Lookup under another tenant = %+v, %v; want nothing cached", l, err)
	}

	blocks, err := tn.client.Get(ctx, testNS, client.Prompt{Tokens: other})
	if err != nil {
		t.Fatal(err)
	}
	if len(blocks) != 2 {
		t.Fatalf("Get returned %d blocks, want the 2 cached", len(blocks))
	}
	for i, b := range blocks {
		if !bytes.Equal(b.Payload, payloads[i]) || b.Key != keys[i] || !equalTokens(b.Tokens, tokens[4*i:4*i+4]) {
			t.Fatalf("block %d differs from what was put", i)
		}
	}

	present, err := tn.client.Exists(ctx, []prefixhash.Key{keys[1], prefixhash.BlockKey(keys[1], []uint32{9, 9, 9, 9})})
	if err != nil || !present[0] || present[1] {
		t.Fatalf("Exists = %v, %v; want [true false]", present, err)
	}

	st, err := tn.client.Stats(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st.NodeID != tn.ID() || len(st.Tiers) != 1 || st.Tiers[0].Blocks != 3 || st.Hits != 2 {
		t.Fatalf("Stats = %+v", st)
	}

	info, err := tn.client.BlockInfo(ctx, keys[1])
	if err != nil {
		t.Fatal(err)
	}
	if info.Tier != "dram" || info.Parent != keys[0] || info.Key != keys[1] || info.PayloadLen != testNS.BlockBytes() ||
		info.NamespaceDigest != testNS.Digest() || !equalTokens(info.Tokens, tokens[4:8]) || info.DType != testNS.DType || info.KVHeads != testNS.KVHeads {
		t.Fatalf("BlockInfo = %+v", info)
	}
	_, err = tn.client.BlockInfo(ctx, prefixhash.Key{1})
	if status.Code(errors.Unwrap(err)) != codes.NotFound || !errors.Is(err, client.ErrNotFound) {
		t.Fatalf("BlockInfo of an unknown key: %v, want NotFound", err)
	}

	m, err := tn.client.Members(ctx)
	if err != nil || len(m.Members) != 1 || m.Members[0].GRPCAddr != tn.GRPCAddr() || m.SelfID != tn.ID() {
		t.Fatalf("Members = %+v, %v", m, err)
	}

	dropped, err := tn.client.DropNamespace(ctx, testNS)
	if err != nil || dropped != 3 {
		t.Fatalf("DropNamespace = %d, %v; want 3", dropped, err)
	}
	if l, _ := tn.client.Lookup(ctx, testNS, client.Prompt{Tokens: tokens}); l.CachedTokens != 0 {
		t.Fatalf("after DropNamespace, %d tokens still cached", l.CachedTokens)
	}
}

func equalTokens(a, b []uint32) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// TestChunking checks that a payload larger than ChunkBytes travels in
// several frames, none over the limit, and is reassembled intact.
func TestChunking(t *testing.T) {
	const chunk = 100
	tn := startNode(t, func(o *Options) { o.Limits.ChunkBytes = chunk })
	ctx := context.Background()
	tokens, payloads := prompt(2, 8)
	if _, err := tn.client.Put(ctx, testNS, client.Prompt{Tokens: tokens}, payloads); err != nil {
		t.Fatal(err)
	}
	stream, err := tn.raw.BatchGet(ctx, &kvmeshv1.BatchGetRequest{Namespace: client.NamespaceProto(testNS), Tokens: tokens})
	if err != nil {
		t.Fatal(err)
	}
	frames := 0
	for {
		f, err := stream.Recv()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		frames++
		if len(f.GetData()) > chunk {
			t.Fatalf("frame with %d payload bytes, limit %d", len(f.GetData()), chunk)
		}
	}
	if want := 2 * ((testNS.BlockBytes() + chunk - 1) / chunk); frames != want {
		t.Fatalf("%d frames, want %d", frames, want)
	}
	blocks, err := tn.client.Get(ctx, testNS, client.Prompt{Tokens: tokens})
	if err != nil || len(blocks) != 2 || !bytes.Equal(blocks[1].Payload, payloads[1]) {
		t.Fatalf("Get after chunked transfer: %d blocks, %v", len(blocks), err)
	}
}

// TestGetKeysMisses checks that GetKeys answers every key, misses in place.
func TestGetKeysMisses(t *testing.T) {
	tn := startNode(t, nil)
	ctx := context.Background()
	tokens, payloads := prompt(3, 12)
	payloads[1] = nil // block 1 is not stored
	if _, err := tn.client.Put(ctx, testNS, client.Prompt{Tokens: tokens}, payloads); err != nil {
		t.Fatal(err)
	}
	keys := prefixhash.Keys(testNS, tokens)
	var found []bool
	err := tn.client.GetKeys(ctx, testNS, keys, func(b client.Block) error {
		found = append(found, b.Found)
		if b.Found && !bytes.Equal(b.Payload, payloads[b.Index]) {
			t.Errorf("block %d differs", b.Index)
		}
		return nil
	})
	if err != nil || len(found) != 3 || !found[0] || found[1] || !found[2] {
		t.Fatalf("GetKeys found %v, %v; want [true false true]", found, err)
	}
	// By prompt, the prefix ends at the miss.
	if blocks, err := tn.client.Get(ctx, testNS, client.Prompt{Tokens: tokens}); err != nil || len(blocks) != 1 {
		t.Fatalf("Get = %d blocks, %v; want 1", len(blocks), err)
	}
}

func TestResourceExhausted(t *testing.T) {
	tn := startNode(t, nil)
	tn.cache.capacity = 3000 // two encoded blocks
	ctx := context.Background()
	tokens, payloads := prompt(4, 16)
	_, err := tn.client.Put(ctx, testNS, client.Prompt{Tokens: tokens}, payloads)
	if status.Code(errors.Unwrap(err)) != codes.ResourceExhausted {
		t.Fatalf("Put into a full cache: %v, want ResourceExhausted", err)
	}
	wantRefusal(t, err, codes.ResourceExhausted, kvmeshv1.ErrorReason_ERROR_REASON_CACHE_FULL)
	if l, err := tn.client.Lookup(ctx, testNS, client.Prompt{Tokens: tokens}); err != nil || l.CachedBlocks != 2 {
		t.Fatalf("after a refused put, Lookup = %+v, %v; want the 2 blocks that fit", l, err)
	}
}

// TestCancelReleasesPins cancels a stream after its first block and checks
// that the node stops and unpins.
func TestCancelReleasesPins(t *testing.T) {
	tn := startNode(t, func(o *Options) { o.Limits.ChunkBytes = 64 })
	tokens, payloads := prompt(5, 40)
	if _, err := tn.client.Put(context.Background(), testNS, client.Prompt{Tokens: tokens}, payloads); err != nil {
		t.Fatal(err)
	}
	// The second block's read waits until the request is cancelled.
	tn.cache.gate = func(ctx context.Context, n int64) error {
		if n == 2 {
			<-ctx.Done()
			return ctx.Err()
		}
		return nil
	}
	ctx, cancel := context.WithCancel(context.Background())
	err := tn.client.GetKeys(ctx, testNS, prefixhash.Keys(testNS, tokens), func(client.Block) error {
		cancel()
		return nil
	})
	if status.Code(errors.Unwrap(err)) != codes.Canceled {
		t.Fatalf("GetKeys after cancel: %v, want Canceled", err)
	}
	testkit.WaitFor(t, "pins released", func() bool { return tn.cache.pins.Load() == 0 })

	// An expired deadline is honoured before any work.
	ctx, cancel = context.WithDeadline(context.Background(), time.Now().Add(-time.Second))
	defer cancel()
	if _, err := tn.client.Lookup(ctx, testNS, client.Prompt{Tokens: tokens}); status.Code(errors.Unwrap(err)) != codes.DeadlineExceeded {
		t.Fatalf("Lookup past its deadline: %v, want DeadlineExceeded", err)
	}
}

func TestHealthz(t *testing.T) {
	tn := startNode(t, nil)
	resp, err := http.Get("http://" + tn.HTTPAddr() + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || strings.TrimSpace(string(body)) != "ok" {
		t.Fatalf("/healthz = %d %q", resp.StatusCode, body)
	}
}

//lint:file-ignore SA1019 the node's tests call the client's deprecated methods, kept one release (client/deprecated.go).
