package client

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kvmesh/kvmesh/block"
	"github.com/kvmesh/kvmesh/prefixhash"
	kvmeshv1 "github.com/kvmesh/kvmesh/proto/kvmesh/v1"
	"github.com/kvmesh/kvmesh/transfer"
)

// rankNS has 4 KV heads and 3 layers: TP 1, 2, 4 and any PP up to 3.
var rankNS = prefixhash.Namespace{Model: "test/ranks", DType: prefixhash.Float16, BlockTokens: 4, Layers: 3, KVHeads: 4, HeadDim: 4}

// latentNS is an MLA namespace.
var latentNS = prefixhash.Namespace{Model: "test/mla", DType: prefixhash.Float16, BlockTokens: 4, Layers: 2,
	Layout: prefixhash.LatentKV, LatentDim: 8}

// countingNode answers Exists with present (one answer per key asked, in
// turn) and every other call Unimplemented, counting the calls.
type countingNode struct {
	calls   atomic.Int64
	present []bool
}

func (n *countingNode) Invoke(_ context.Context, method string, _, reply any, _ ...grpc.CallOption) error {
	n.calls.Add(1)
	if method == kvmeshv1.CacheService_Exists_FullMethodName {
		reply.(*kvmeshv1.ExistsResponse).Present = n.present
		return nil
	}
	return status.Error(codes.Unimplemented, "no node")
}

func (n *countingNode) NewStream(context.Context, *grpc.StreamDesc, string, ...grpc.CallOption) (grpc.ClientStream, error) {
	n.calls.Add(1)
	return nil, status.Error(codes.Unimplemented, "no node")
}

// recordingBulk records the items put.
type recordingBulk struct {
	lyingBulk
	items []putItem
}

func (r *recordingBulk) put(_ context.Context, _ prefixhash.Namespace, items []putItem) ([]prefixhash.Key, error) {
	r.items = append(r.items, items...)
	keys := make([]prefixhash.Key, len(items))
	for i, it := range items {
		keys[i] = it.key
	}
	return keys, nil
}

// TestRankPart: the zero Rank is the whole block; ranks map to their parts
// as block.RankPart says; a rank the model cannot be split into is
// ErrInvalid wrapping block.ErrBadPart, with what is valid named.
func TestRankPart(t *testing.T) {
	for _, c := range []struct {
		r    Rank
		want block.Part
	}{
		{Rank{}, block.Part{L0: 0, L1: 3, H0: 0, H1: 4}},
		{Rank{TPRank: 1, TPSize: 2}, block.Part{L0: 0, L1: 3, H0: 2, H1: 4}},
		{Rank{TPRank: 3, TPSize: 4, PPRank: 1, PPSize: 2}, block.Part{L0: 2, L1: 3, H0: 3, H1: 4}}, // the extra layer goes to stage 0
		{Rank{TPRank: 5, TPSize: 8}, block.Part{L0: 0, L1: 3, H0: 2, H1: 3}},                       // replicated heads
	} {
		if got, err := c.r.Part(rankNS); err != nil || got != c.want {
			t.Errorf("%s: %v, %v; want %v", c.r, got, err, c.want)
		}
	}
	for _, c := range []struct {
		r    Rank
		want string
	}{
		{Rank{TPRank: 0, TPSize: 3}, "it must divide the heads"},
		{Rank{TPRank: 2, TPSize: 2}, "want 0 <= rank < size"},
		{Rank{TPSize: -1}, "want 0 <= rank < size"},
		{Rank{PPSize: 4}, "a stage holds at least one layer"},
		{Rank{PPRank: -1, PPSize: 2}, "want 0 <= rank < size"},
	} {
		_, err := c.r.Part(rankNS)
		if !errors.Is(err, ErrInvalid) || !errors.Is(err, block.ErrBadPart) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v; want ErrInvalid and ErrBadPart naming %q", c.r, err, c.want)
		}
	}
	if p, err := (Rank{TPRank: 7, TPSize: 8}).Part(latentNS); err != nil || p != block.WholePart(latentNS) {
		t.Errorf("latent TP rank 7 of 8: %v, %v; want the whole latent", p, err)
	}
}

// TestBadRankNoIO: PutRank, GetRank and GetRankInto refuse a bad rank, or
// a bad namespace, before they ask the node anything.
func TestBadRankNoIO(t *testing.T) {
	node := &countingNode{}
	c, err := newClient(node, Options{Transport: TransportGRPC})
	if err != nil {
		t.Fatal(err)
	}
	tokens := make([]uint32, 8)
	ctx := context.Background()
	bad := Rank{TPRank: 0, TPSize: 3}
	if _, err := c.Put(ctx, rankNS, Prompt{Tokens: tokens, Rank: bad}, [][]byte{make([]byte, 8)}); !errors.Is(err, ErrInvalid) {
		t.Errorf("PutRank of TP 3 of 4 heads: %v", err)
	}
	if _, err := c.Get(ctx, rankNS, Prompt{Tokens: tokens, Rank: bad}); !errors.Is(err, ErrInvalid) {
		t.Errorf("GetRank of TP 3 of 4 heads: %v", err)
	}
	if _, err := c.Get(ctx, rankNS, Prompt{Tokens: tokens, Rank: Rank{PPSize: 9}}, Into(nil)); !errors.Is(err, ErrInvalid) {
		t.Errorf("Get into buffers of 9 stages of 3 layers: %v", err)
	}
	if _, err := c.Get(ctx, prefixhash.Namespace{}, Prompt{Tokens: tokens}); !errors.Is(err, ErrInvalid) {
		t.Errorf("GetRank of an empty namespace: %v", err)
	}
	if n := node.calls.Load(); n != 0 {
		t.Errorf("%d calls to the node for refused arguments", n)
	}
}

// TestGetRank: GetRank hands out each block's part of the rank, cut from
// what the transport read, and ends the prefix where Get does (a block with
// other tokens); GetRankInto fills buffers of the part's length and refuses
// others.
func TestGetRank(t *testing.T) {
	c, err := newClient(noNode{}, Options{Transport: TransportGRPC})
	if err != nil {
		t.Fatal(err)
	}
	ns := rankNS
	tokens := make([]uint32, 4*ns.BlockTokens)
	for i := range tokens {
		tokens[i] = uint32(100 + i)
	}
	c.bulk = lyingBulk{tokens: tokens, bad: 2}
	l := block.LayoutOf(ns)
	r := Rank{TPRank: 1, TPSize: 2, PPRank: 1, PPSize: 2}
	p, _ := r.Part(ns)
	blocks, err := c.Get(context.Background(), ns, Prompt{Tokens: tokens, Rank: r})
	if err != nil || len(blocks) != 2 {
		t.Fatalf("GetRank: %d blocks, %v; want the 2 before the lying one", len(blocks), err)
	}
	for i, b := range blocks {
		whole := bytes.Repeat([]byte{byte(i + 1)}, ns.BlockBytes())
		if want := l.ExtractPart(nil, whole, ns.BlockTokens, p); !bytes.Equal(b.Payload, want) {
			t.Errorf("block %d: %d bytes, want its %s (%d bytes)", i, len(b.Payload), p, len(want))
		}
	}
	dst := [][]byte{make([]byte, l.PartLen(ns.BlockTokens, p)), make([]byte, l.PartLen(ns.BlockTokens, p))}
	if got, err := c.Get(context.Background(), ns, Prompt{Tokens: tokens, Rank: r}, Into(dst)); len(got) != 2 || err != nil || !bytes.Equal(dst[1], blocks[1].Payload) {
		t.Errorf("Get of a rank into buffers = %d blocks, %v; want 2 parts as Get read them", len(got), err)
	}
	dst[1] = dst[1][1:]
	if _, err := c.Get(context.Background(), ns, Prompt{Tokens: tokens, Rank: r}, Into(dst)); !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), p.String()) {
		t.Errorf("Get of a rank into a short buffer: %v; want ErrInvalid naming the part", err)
	}
}

// TestPutRankParts: PutRank sends each block's part with its range, refuses
// payloads of another length before sending, and a part of a block that no
// data plane takes is an error saying so, not a silent whole-block put.
func TestPutRankParts(t *testing.T) {
	c, err := newClient(noNode{}, Options{Transport: TransportGRPC})
	if err != nil {
		t.Fatal(err)
	}
	ns := rankNS
	tokens := make([]uint32, 2*ns.BlockTokens+1)
	r := Rank{TPRank: 1, TPSize: 4}
	p, _ := r.Part(ns)
	n := block.LayoutOf(ns).PartLen(ns.BlockTokens, p)
	payloads := [][]byte{make([]byte, n), nil}
	ctx := context.Background()
	if _, err := c.Put(ctx, ns, Prompt{Tokens: tokens, Rank: r}, payloads); !errors.Is(err, errPartsNeedDataPlane) {
		t.Errorf("PutRank of a part over gRPC alone: %v; want errPartsNeedDataPlane", err)
	}
	rb := &recordingBulk{}
	c.bulk = rb
	keys, err := c.Put(ctx, ns, Prompt{Tokens: tokens, Rank: r}, payloads)
	if err != nil || len(keys) != 1 || len(rb.items) != 1 || rb.items[0].part != p || rb.items[0].key != keys[0] {
		t.Fatalf("PutRank: %v, %v; sent %+v; want block 0's %s", keys, err, rb.items, p)
	}
	if _, err := c.Put(ctx, ns, Prompt{Tokens: tokens, Rank: r}, [][]byte{make([]byte, n+1)}); !errors.Is(err, ErrInvalid) {
		t.Errorf("PutRank of a payload longer than the part: %v", err)
	}
	if _, err := c.Put(ctx, ns, Prompt{Tokens: tokens, Rank: r}, [][]byte{nil, nil, make([]byte, n)}); !errors.Is(err, ErrInvalid) {
		t.Errorf("PutRank of 3 payloads for 2 blocks: %v", err)
	}
	if len(rb.items) != 1 {
		t.Errorf("refused puts sent %d items", len(rb.items)-1)
	}
	// The whole block (a single-GPU rank) is a plain put.
	rb.items = nil
	if _, err := c.Put(ctx, ns, Prompt{Tokens: tokens}, [][]byte{make([]byte, ns.BlockBytes())}); err != nil || len(rb.items) != 1 || rb.items[0].part != (block.Part{}) {
		t.Errorf("PutRank of the whole block: %v, sent %+v", err, rb.items)
	}
}

// TestPutRankSharedAsksFirst: a part several ranks hold (the latent at
// TP > 1, replicated heads) is sent only for the blocks the node still
// lacks; without a data plane to claim through, the node is asked which
// blocks it holds.
func TestPutRankSharedAsksFirst(t *testing.T) {
	for _, c := range []struct {
		ns prefixhash.Namespace
		r  Rank
	}{
		{latentNS, Rank{TPRank: 3, TPSize: 8}},
		{rankNS, Rank{TPRank: 3, TPSize: 8}},
	} {
		node := &countingNode{present: []bool{true, false}}
		cl, err := newClient(node, Options{Transport: TransportGRPC})
		if err != nil {
			t.Fatal(err)
		}
		rb := &recordingBulk{}
		cl.bulk = rb
		p, _ := c.r.Part(c.ns)
		n := block.LayoutOf(c.ns).PartLen(c.ns.BlockTokens, p)
		tokens := make([]uint32, 2*c.ns.BlockTokens)
		keys, err := cl.Put(context.Background(), c.ns, Prompt{Tokens: tokens, Rank: c.r}, [][]byte{make([]byte, n), make([]byte, n)})
		if err != nil || len(keys) != 2 {
			t.Fatalf("%s %s: %v, %v", c.ns.Model, c.r, keys, err)
		}
		if len(rb.items) != 1 || rb.items[0].key != keys[1] {
			t.Errorf("%s %s: sent %d items; want block 1 alone (block 0 is stored)", c.ns.Model, c.r, len(rb.items))
		}
	}
}

// scriptedNode is a data plane whose puts answer status (by the record's
// part range) and whose claims answer claims, recording the records put.
type scriptedNode struct {
	status func(p block.Part) transfer.Status
	claims []block.ClaimStatus
	mu     sync.Mutex
	puts   []block.Header
}

func (*scriptedNode) Acquire(_ context.Context, keys []prefixhash.Key, _ [][]byte, st []transfer.Status) func() {
	return nil // every key misses
}

func (s *scriptedNode) Put(ctx context.Context, keys []prefixhash.Key, vals [][]byte, st []transfer.Status) {
	s.PutPublish(ctx, keys, keys, vals, st)
}

func (s *scriptedNode) PutPublish(_ context.Context, _, _ []prefixhash.Key, vals [][]byte, st []transfer.Status) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for i, v := range vals {
		h, err := block.DecodeHeader(v, 0)
		if err != nil {
			st[i] = transfer.StatusError
			continue
		}
		s.puts = append(s.puts, h)
		st[i] = s.status(h.Part)
	}
}

func (s *scriptedNode) Claim(_ context.Context, keys []prefixhash.Key, _ []block.Part, st []block.ClaimStatus) {
	copy(st, s.claims)
}

// scriptedClient returns a client whose node's data plane (TCP) is sn.
func scriptedClient(t *testing.T, sn *scriptedNode) *Client {
	t.Helper()
	srv, err := transfer.NewServer(sn, sn, nil, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	addr, err := srv.Listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close() })
	c, err := newClient(noNode{}, Options{Transport: TransportTCP, MaxRetries: -1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	c.info.node, c.info.fetched = &nodeInfo{dataAddr: addr.String()}, time.Now()
	return c
}

// TestPutRankStatuses: what the node answers a part put becomes the error
// PutRank returns: a conflict the typed error naming the block and the
// part, a dropped part ErrExhausted, a refused one an error; a shared part
// is sent only for the blocks its claim answered write.
func TestPutRankStatuses(t *testing.T) {
	ctx := context.Background()
	ns := rankNS
	tokens := make([]uint32, 3*ns.BlockTokens)
	keys := prefixhash.Keys(ns, tokens)
	r := Rank{TPRank: 1, TPSize: 2}
	p, _ := r.Part(ns)
	n := block.LayoutOf(ns).PartLen(ns.BlockTokens, p)
	payloads := [][]byte{make([]byte, n), make([]byte, n), make([]byte, n)}
	for _, c := range []struct {
		st   transfer.Status
		want error
	}{
		{transfer.StatusConflict, ErrPartConflict},
		{transfer.StatusMiss, ErrExhausted},
		{transfer.StatusError, nil},
	} {
		sn := &scriptedNode{status: func(got block.Part) transfer.Status {
			if got != p {
				return transfer.StatusOK
			}
			return c.st
		}}
		cl := scriptedClient(t, sn)
		_, err := cl.Put(ctx, ns, Prompt{Tokens: tokens, Rank: r}, payloads)
		switch {
		case err == nil:
			t.Errorf("status %s: no error", c.st)
		case c.want != nil && !errors.Is(err, c.want):
			t.Errorf("status %s: %v; want %v", c.st, err, c.want)
		case !strings.Contains(err.Error(), keys[0].String()) || !strings.Contains(err.Error(), p.String()):
			t.Errorf("status %s: %v; want the block and the part named", c.st, err)
		}
		var pc *PartConflictError
		if c.st == transfer.StatusConflict && (!errors.As(err, &pc) || pc.Key != keys[0] || pc.Part != p || !errors.Is(err, ErrInvalid)) {
			t.Errorf("conflict: %v; want a *PartConflictError of block 0's %s, matching ErrInvalid", err, p)
		}
	}

	// The latent at TP 8: claims say which blocks this rank sends.
	sn := &scriptedNode{status: func(block.Part) transfer.Status { return transfer.StatusOK },
		claims: []block.ClaimStatus{block.ClaimComplete, block.ClaimWrite, block.ClaimClaimed}}
	cl := scriptedClient(t, sn)
	lt := make([]uint32, 3*latentNS.BlockTokens)
	lp := [][]byte{make([]byte, latentNS.BlockBytes()), make([]byte, latentNS.BlockBytes()), make([]byte, latentNS.BlockBytes())}
	got, err := cl.Put(ctx, latentNS, Prompt{Tokens: lt, Rank: Rank{TPRank: 5, TPSize: 8}}, lp)
	if err != nil || len(got) != 3 {
		t.Fatalf("latent PutRank: %v, %v", got, err)
	}
	if lk := prefixhash.Keys(latentNS, lt); len(sn.puts) != 1 || sn.puts[0].Key != lk[1] || !sn.puts[0].Whole() {
		t.Errorf("latent PutRank sent %d records; want block 1 alone, whole", len(sn.puts))
	}
}
