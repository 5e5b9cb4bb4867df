package client

import (
	"bytes"
	"context"
	"errors"
	"slices"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kvmesh/kvmesh/block"
	"github.com/kvmesh/kvmesh/prefixhash"
)

// lyingBulk answers every key with a block, the block at index bad holding
// other tokens than the prompt's.
type lyingBulk struct {
	tokens []uint32
	bad    int
}

func (l lyingBulk) get(_ context.Context, ns prefixhash.Namespace, part block.Part, keys, _ []prefixhash.Key, _, _ bool, fn func(Block) error) error {
	parent := ns.Root()
	for i, k := range keys {
		toks := append([]uint32(nil), l.tokens[i*ns.BlockTokens:(i+1)*ns.BlockTokens]...)
		if i == l.bad {
			toks[0]++
		}
		payload := bytes.Repeat([]byte{byte(i + 1)}, ns.BlockBytes())
		if part != (block.Part{}) {
			payload = block.LayoutOf(ns).ExtractPart(nil, payload, ns.BlockTokens, part)
		}
		if err := fn(Block{Index: i, Key: k, Found: true, Parent: parent, Tokens: toks, Payload: payload}); err != nil {
			return err
		}
		parent = k
	}
	return nil
}

func (lyingBulk) put(context.Context, prefixhash.Namespace, []putItem) ([]prefixhash.Key, error) {
	return nil, nil
}

// noNode answers every call Unimplemented: the client does without node info.
type noNode struct{}

func (noNode) Invoke(context.Context, string, any, any, ...grpc.CallOption) error {
	return status.Error(codes.Unimplemented, "no node")
}

func (noNode) NewStream(context.Context, *grpc.StreamDesc, string, ...grpc.CallOption) (grpc.ClientStream, error) {
	return nil, status.Error(codes.Unimplemented, "no node")
}

// TestGetComparesTokens: Get keeps the blocks that hold the prompt's tokens
// and ends the prefix at one that does not, counting it.
// lyingClient returns a client that reads through lyingBulk (set c.bulk),
// a namespace and a prompt of 4 blocks.
func lyingClient(t *testing.T) (*Client, prefixhash.Namespace, []uint32) {
	t.Helper()
	ns := prefixhash.Namespace{Model: "test/client", DType: prefixhash.Float16, BlockTokens: 4, Layers: 1, KVHeads: 1, HeadDim: 4}
	tokens := []uint32{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16}
	c, err := newClient(noNode{}, Options{Transport: TransportGRPC})
	if err != nil {
		t.Fatal(err)
	}
	return c, ns, tokens
}

func TestGetComparesTokens(t *testing.T) {
	c, ns, tokens := lyingClient(t)
	c.bulk = lyingBulk{tokens: tokens, bad: 2}
	blocks, err := c.Get(context.Background(), ns, Prompt{Tokens: tokens})
	if err != nil {
		t.Fatal(err)
	}
	if len(blocks) != 2 || c.RefusedBlocks() != 1 {
		t.Fatalf("Get: %d blocks, %d refused; want blocks 0 and 1, block 2 refused", len(blocks), c.RefusedBlocks())
	}
	c.bulk = lyingBulk{tokens: tokens, bad: -1}
	if blocks, err = c.Get(context.Background(), ns, Prompt{Tokens: tokens}); err != nil || len(blocks) != 4 {
		t.Fatalf("honest Get: %d blocks, %v", len(blocks), err)
	}
}

// TestGetInto: Get with Into fills the caller's buffers with the cached
// prefix, at most len(dst) blocks, stops where Get stops, returns blocks
// whose payloads are the buffers, and refuses buffers of the wrong size
// before asking anything.
func TestGetInto(t *testing.T) {
	c, ns, tokens := lyingClient(t)
	c.bulk = lyingBulk{tokens: tokens, bad: 2}
	dst := make([][]byte, 4)
	for i := range dst {
		dst[i] = make([]byte, ns.BlockBytes())
	}
	got, err := c.Get(context.Background(), ns, Prompt{Tokens: tokens}, Into(dst))
	if err != nil || len(got) != 2 {
		t.Fatalf("Get into = %d blocks, %v; want the 2 blocks before the refused one", len(got), err)
	}
	for i, b := range got {
		if dst[i][0] != byte(i+1) || dst[i][len(dst[i])-1] != byte(i+1) {
			t.Errorf("dst[%d] = %v, want block %d's payload", i, dst[i][:4], i)
		}
		if &b.Payload[0] != &dst[i][0] || !slices.Equal(b.Tokens, tokens[i*ns.BlockTokens:(i+1)*ns.BlockTokens]) {
			t.Errorf("block %d: payload not in dst[%d], or tokens %v", i, i, b.Tokens)
		}
	}
	c.bulk = lyingBulk{tokens: tokens, bad: -1}
	if got, err := c.Get(context.Background(), ns, Prompt{Tokens: tokens}, Into(dst[:3])); err != nil || len(got) != 3 || dst[2][0] != 3 || dst[3][0] != 0 {
		t.Fatalf("Get into 3 buffers = %d blocks, %v; want blocks 0..2, the 4th buffer untouched", len(got), err)
	}
	short := [][]byte{make([]byte, ns.BlockBytes()-1)}
	if got, err := c.Get(context.Background(), ns, Prompt{Tokens: tokens}, Into(short)); !errors.Is(err, ErrInvalid) || got != nil {
		t.Fatalf("Get into a short buffer = %v, %v; want ErrInvalid", got, err)
	}
}
