package node

import (
	"context"
	"encoding/binary"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kvmesh/kvmesh/block"
	"github.com/kvmesh/kvmesh/client"
	"github.com/kvmesh/kvmesh/prefixhash"
	kvmeshv1 "github.com/kvmesh/kvmesh/proto/kvmesh/v1"
)

// startChunkNode serves a fake cache with chunks of 2 blocks of testNS.
func startChunkNode(t *testing.T) *testNode {
	t.Helper()
	tn := startNode(t, func(o *Options) { o.Cluster.ChunkTokens = 2 * testNS.BlockTokens })
	tn.cache.chunkTokens = 2 * testNS.BlockTokens
	return tn
}

func (c *fakeCache) chunkKey(k prefixhash.Key) prefixhash.Key {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.mu.chunkOf[k]
}

// TestBatchPutChunkKeys: a stream from block 0 with empty parents gets the
// chunk keys of its positions; chunk keys given are used; a block from the
// middle of a prompt without one starts its chunk; the Go client gives them.
func TestBatchPutChunkKeys(t *testing.T) {
	tn := startChunkNode(t)
	ctx := context.Background()
	ns := client.NamespaceProto(testNS)
	put := func(msgs ...*kvmeshv1.BatchPutRequest) {
		t.Helper()
		stream, err := tn.raw.BatchPut(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range msgs {
			if err := stream.Send(m); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := stream.CloseAndRecv(); err != nil {
			t.Fatal(err)
		}
	}
	tokens, payloads := prompt(20, 5*testNS.BlockTokens)
	keys := prefixhash.Keys(testNS, tokens)
	block := func(i int) *kvmeshv1.BatchPutRequest {
		return &kvmeshv1.BatchPutRequest{Namespace: ns, Data: payloads[i],
			Block: &kvmeshv1.BlockHeader{Tokens: tokens[i*4 : i*4+4], PayloadLen: uint64(len(payloads[i]))}}
	}
	// A prompt from block 0, parents empty: derived.
	var msgs []*kvmeshv1.BatchPutRequest
	for i := range 5 {
		msgs = append(msgs, block(i))
	}
	put(msgs...)
	for i, want := range []int{0, 0, 2, 2, 4} {
		if got := tn.cache.chunkKey(keys[i]); got != keys[want] {
			t.Fatalf("block %d of a prompt streamed from 0: chunk key %s, want block %d's", i, got, want)
		}
	}

	// From the middle of a prompt: the given chunk key, or the block's own.
	other, otherPayloads := prompt(21, 4*testNS.BlockTokens)
	ok := prefixhash.Keys(testNS, other)
	m1 := &kvmeshv1.BatchPutRequest{Namespace: ns, Data: otherPayloads[1],
		Block: &kvmeshv1.BlockHeader{Parent: ok[0][:], Tokens: other[4:8], PayloadLen: uint64(len(otherPayloads[1])), ChunkKey: ok[0][:]}}
	m2 := &kvmeshv1.BatchPutRequest{Data: otherPayloads[3],
		Block: &kvmeshv1.BlockHeader{Parent: ok[2][:], Tokens: other[12:16], PayloadLen: uint64(len(otherPayloads[3]))}}
	put(m1, m2)
	if got := tn.cache.chunkKey(ok[1]); got != ok[0] {
		t.Fatalf("given chunk key not used: %s", got)
	}
	if got := tn.cache.chunkKey(ok[3]); got != ok[3] {
		t.Fatalf("block without chunk key or position: chunk key %s, want its own", got)
	}

	// The Go client skipping cached blocks still places each by its chunk.
	third, thirdPayloads := prompt(22, 5*testNS.BlockTokens)
	tk := prefixhash.Keys(testNS, third)
	thirdPayloads[0], thirdPayloads[2] = nil, nil
	if _, err := tn.client.Put(ctx, testNS, client.Prompt{Tokens: third}, thirdPayloads); err != nil {
		t.Fatal(err)
	}
	for i, want := range map[int]int{1: 0, 3: 2, 4: 4} {
		if got := tn.cache.chunkKey(tk[i]); got != tk[want] {
			t.Fatalf("client put, block %d: chunk key %s, want block %d's", i, got, want)
		}
	}
}

// TestChunkKeysRefused: chunk keys that do not pair with the keys, and a
// Publish without them, are refused naming the field.
func TestChunkKeysRefused(t *testing.T) {
	tn := startChunkNode(t)
	ctx := context.Background()
	tokens, payloads := prompt(23, 8)
	keys, err := tn.client.Put(ctx, testNS, client.Prompt{Tokens: tokens}, payloads)
	if err != nil {
		t.Fatal(err)
	}
	raw := func(ks []prefixhash.Key) [][]byte {
		out := make([][]byte, len(ks))
		for i := range ks {
			out[i] = ks[i][:]
		}
		return out
	}
	check := func(what string, err error, field string) {
		t.Helper()
		if st, _ := status.FromError(err); st.Code() != codes.InvalidArgument || !strings.HasPrefix(st.Message(), field) {
			t.Errorf("%s: %v; want InvalidArgument naming %s", what, err, field)
		}
		if _, got := wantRefusal(t, err, codes.InvalidArgument, kvmeshv1.ErrorReason_ERROR_REASON_INVALID_FIELD); got != field {
			t.Errorf("%s: BadRequest names %q, want %q", what, got, field)
		}
	}
	_, err = tn.raw.Exists(ctx, &kvmeshv1.ExistsRequest{Keys: raw(keys), ChunkKeys: raw(keys[:1])})
	check("Exists with one chunk key for two keys", err, "chunk_keys")
	_, err = tn.raw.Publish(ctx, &kvmeshv1.PublishRequest{Keys: raw(keys)})
	check("Publish without chunk keys", err, "chunk_keys")
	s, err := tn.raw.BatchGet(ctx, &kvmeshv1.BatchGetRequest{Namespace: client.NamespaceProto(testNS), Tokens: tokens, ChunkKeys: raw(keys)})
	if err == nil {
		_, err = s.Recv()
	}
	check("BatchGet by tokens with chunk keys", err, "chunk_keys")

	resp, err := tn.raw.Publish(ctx, &kvmeshv1.PublishRequest{Keys: raw(append(keys, prefixhash.Key{9})), ChunkKeys: raw(append(keys, prefixhash.Key{9}))})
	if err != nil || resp.GetQueued() != 2 {
		t.Fatalf("Publish of 2 held blocks and an unknown one: %v, %v; want 2 queued", resp, err)
	}
}

// TestPeerServiceLookup: the gRPC lookup other nodes (and tools) use counts
// leading keys per run, and refuses runs that do not add up.
func TestPeerServiceLookup(t *testing.T) {
	tn := startNode(t, nil)
	ctx := context.Background()
	tokens, payloads := prompt(24, 12)
	payloads[1] = nil
	if _, err := tn.client.Put(ctx, testNS, client.Prompt{Tokens: tokens}, payloads); err != nil {
		t.Fatal(err)
	}
	keys := prefixhash.Keys(testNS, tokens)
	var packed []byte
	for _, k := range keys {
		packed = append(packed, k[:]...)
	}
	peer := kvmeshv1.NewPeerServiceClient(tn.conn)
	resp, err := peer.Lookup(ctx, &kvmeshv1.PeerServiceLookupRequest{Keys: packed, Runs: []uint32{1, 0, 2}})
	if err != nil || len(resp.GetCounts()) != 3 || resp.GetCounts()[0] != 1 || resp.GetCounts()[1] != 0 || resp.GetCounts()[2] != 0 {
		t.Fatalf("PeerService.Lookup = %v, %v; want [1 0 0] (block 1 is missing)", resp, err)
	}
	for _, req := range []*kvmeshv1.PeerServiceLookupRequest{{Keys: packed, Runs: []uint32{1}}, {Keys: packed[:20], Runs: []uint32{1}}, {Keys: packed, Runs: []uint32{4294967295, 4}}} {
		if _, err := peer.Lookup(ctx, req); status.Code(err) != codes.InvalidArgument {
			t.Errorf("PeerService.Lookup(%d bytes, runs %v) = %v, want InvalidArgument", len(req.Keys), req.Runs, err)
		}
	}
}

// FuzzPeerLookup: PeerService.Lookup never panics on what a peer sends, and
// answers only requests whose runs add up to the keys, a count per run
// within the run.
func FuzzPeerLookup(f *testing.F) {
	cache := newFakeCache(1 << 20)
	tokens, payloads := prompt(25, 8)
	keys := prefixhash.Keys(testNS, tokens)
	for i, p := range payloads {
		parent := testNS.Root()
		if i > 0 {
			parent = keys[i-1]
		}
		b, _, err := block.Encode(nil, testNS, parent, tokens[i*4:i*4+4], p)
		if err != nil {
			f.Fatal(err)
		}
		if err := cache.Put(context.Background(), b, prefixhash.Key{}); err != nil {
			f.Fatal(err)
		}
	}
	s := &peerService{n: &Node{cache: cache}}
	f.Add(append(keys[0][:], keys[1][:]...), []byte{2, 0, 0, 0})
	f.Add(keys[0][:], []byte{0, 0, 0, 0, 1, 0, 0, 0})
	f.Fuzz(func(t *testing.T, raw, runBytes []byte) {
		runs := make([]uint32, len(runBytes)/4)
		for i := range runs {
			runs[i] = binary.LittleEndian.Uint32(runBytes[4*i:])
		}
		resp, err := s.Lookup(context.Background(), &kvmeshv1.PeerServiceLookupRequest{Keys: raw, Runs: runs})
		if err != nil {
			if status.Code(err) != codes.InvalidArgument {
				t.Fatalf("error %v is not InvalidArgument", err)
			}
			return
		}
		total := 0
		for i, r := range runs {
			total += int(r)
			if resp.GetCounts()[i] > r {
				t.Fatalf("count %d for a run of %d", resp.GetCounts()[i], r)
			}
		}
		if total*prefixhash.KeySize != len(raw) || len(resp.GetCounts()) != len(runs) {
			t.Fatalf("answered runs adding up to %d keys for %d bytes", total, len(raw))
		}
	})
}
