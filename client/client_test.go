package client

import (
	"context"
	"errors"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kvmesh/kvmesh/prefixhash"
	kvmeshv1 "github.com/kvmesh/kvmesh/proto/kvmesh/v1"
)

var testNS = prefixhash.Namespace{Model: "test/tiny", DType: prefixhash.Float32, BlockTokens: 4,
	Layers: 1, KVHeads: 1, HeadDim: 2}

// flaky is a CacheService that fails the first failures calls of each kind
// with code, then answers.
type flaky struct {
	kvmeshv1.UnimplementedCacheServiceServer
	kvmeshv1.UnimplementedAdminServiceServer
	code     codes.Code
	failures int64
	calls    atomic.Int64
}

func (f *flaky) fail() error {
	if f.calls.Add(1) <= f.failures {
		return status.Error(f.code, "injected")
	}
	return nil
}

func (f *flaky) Lookup(_ context.Context, req *kvmeshv1.LookupRequest) (*kvmeshv1.LookupResponse, error) {
	if err := f.fail(); err != nil {
		return nil, err
	}
	return &kvmeshv1.LookupResponse{CachedBlocks: 1, CachedTokens: 4, PromptBlocks: uint32(len(req.GetChain()) / prefixhash.KeySize),
		Runs: []*kvmeshv1.CachedRun{{Blocks: 1, Tier: "dram"}}, Nodes: []string{"fake"}}, nil
}

func (f *flaky) DropNamespace(context.Context, *kvmeshv1.DropNamespaceRequest) (*kvmeshv1.DropNamespaceResponse, error) {
	if err := f.fail(); err != nil {
		return nil, err
	}
	return &kvmeshv1.DropNamespaceResponse{DroppedBlocks: 1}, nil
}

// BatchGet answers key i as a miss, failing with the injected code after
// the first block on the first calls.
func (f *flaky) BatchGet(req *kvmeshv1.BatchGetRequest, s kvmeshv1.CacheService_BatchGetServer) error {
	for i, k := range req.GetKeys() {
		if err := s.Send(&kvmeshv1.BatchGetResponse{Index: uint32(i), Key: k, Last: true}); err != nil {
			return err
		}
		if err := f.fail(); err != nil {
			return err
		}
	}
	return nil
}

// fakeNode is what serve registers: a fake of the node's cache and admin
// services.
type fakeNode interface {
	kvmeshv1.CacheServiceServer
	kvmeshv1.AdminServiceServer
}

func serve(t *testing.T, f fakeNode) *Client {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := grpc.NewServer()
	kvmeshv1.RegisterCacheServiceServer(s, f)
	kvmeshv1.RegisterAdminServiceServer(s, f)
	go s.Serve(lis)
	c, err := Dial(lis.Addr().String(), Options{Backoff: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		c.Close()
		s.Stop()
	})
	return c
}

func TestRetryUnavailable(t *testing.T) {
	f := &flaky{code: codes.Unavailable, failures: 2}
	c := serve(t, f)
	l, err := c.Lookup(context.Background(), testNS, Prompt{Tokens: make([]uint32, 8)})
	if err != nil || l.CachedTokens != 4 {
		t.Fatalf("Lookup after 2 Unavailable = %+v, %v; want it retried to success", l, err)
	}
	if f.calls.Load() != 3 {
		t.Fatalf("%d calls, want 3", f.calls.Load())
	}
}

func TestRetryBounded(t *testing.T) {
	f := &flaky{code: codes.Unavailable, failures: 100}
	c := serve(t, f)
	_, err := c.Lookup(context.Background(), testNS, Prompt{})
	if status.Code(errors.Unwrap(err)) != codes.Unavailable || f.calls.Load() != 3 {
		t.Fatalf("Lookup = %v after %d calls; want Unavailable after 1 + MaxRetries=2", err, f.calls.Load())
	}
}

func TestNoRetry(t *testing.T) {
	// Other codes are final.
	f := &flaky{code: codes.InvalidArgument, failures: 1}
	c := serve(t, f)
	if _, err := c.Lookup(context.Background(), testNS, Prompt{}); status.Code(errors.Unwrap(err)) != codes.InvalidArgument || f.calls.Load() != 1 {
		t.Fatalf("Lookup = %v after %d calls; want InvalidArgument, not retried", err, f.calls.Load())
	}
	// DropNamespace is not retried even when Unavailable.
	f = &flaky{code: codes.Unavailable, failures: 1}
	c = serve(t, f)
	if _, err := c.DropNamespace(context.Background(), testNS); status.Code(errors.Unwrap(err)) != codes.Unavailable || f.calls.Load() != 1 {
		t.Fatalf("DropNamespace = %v after %d calls; want Unavailable, not retried", err, f.calls.Load())
	}
}

// TestGetResumes checks that a BatchGet cut off midway resumes after the
// last block delivered: every key is delivered exactly once, in order.
func TestGetResumes(t *testing.T) {
	f := &flaky{code: codes.Unavailable, failures: 2}
	c := serve(t, f)
	keys := prefixhash.Keys(testNS, make([]uint32, 5*4))
	blocks, err := c.Get(context.Background(), testNS, Prompt{Keys: keys})
	if err != nil || len(blocks) != 5 {
		t.Fatalf("Get delivered %d blocks, %v; want blocks 0..4 once each", len(blocks), err)
	}
	for i, b := range blocks {
		if b.Index != i || b.Key != keys[i] {
			t.Fatalf("Get delivered block %d (key %s) at %d, want block %d (key %s): 0..4 in order", b.Index, b.Key, i, i, keys[i])
		}
	}
}

func TestInvalidBeforeSending(t *testing.T) {
	f := &flaky{}
	c := serve(t, f)
	ctx := context.Background()
	if _, err := c.Lookup(ctx, prefixhash.Namespace{}, Prompt{}); !errors.Is(err, ErrInvalid) {
		t.Fatalf("Lookup with the zero namespace = %v, want ErrInvalid", err)
	}
	if _, err := c.Put(ctx, testNS, Prompt{Tokens: make([]uint32, 4)}, [][]byte{make([]byte, 3)}); !errors.Is(err, ErrInvalid) {
		t.Fatalf("Put of a short payload = %v, want ErrInvalid", err)
	}
	if _, err := c.Put(ctx, testNS, Prompt{Tokens: make([]uint32, 4)}, make([][]byte, 2)); !errors.Is(err, ErrInvalid) {
		t.Fatalf("Put of more payloads than blocks = %v, want ErrInvalid", err)
	}
	if f.calls.Load() != 0 {
		t.Fatal("invalid calls reached the node")
	}
}
