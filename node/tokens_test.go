package node

import (
	"context"
	"io"
	"testing"

	"github.com/kvmesh/kvmesh/block"
	"github.com/kvmesh/kvmesh/client"
	kvmeshv1 "github.com/kvmesh/kvmesh/proto/kvmesh/v1"
)

// TestBatchGetByTokensComparesTokens: a block planted under the key of a
// prompt's block, holding other tokens (a well-formed block of its own, put
// straight into the cache's map past every check), is a miss for a reader
// asking for the prompt's tokens, counted as refused for its tokens; the
// blocks around it are served.
func TestBatchGetByTokensComparesTokens(t *testing.T) {
	tn := startNode(t, nil)
	ctx := context.Background()
	tokens, payloads := prompt(31, 3*testNS.BlockTokens)
	keys, err := tn.client.Put(ctx, testNS, client.Prompt{Tokens: tokens}, payloads)
	if err != nil || len(keys) != 3 {
		t.Fatalf("Put: %v, %v", keys, err)
	}
	other := append([]uint32(nil), tokens[4:8]...)
	other[2] ^= 0xffffffff
	planted, _, err := block.Encode(nil, testNS, keys[0], other, payloads[1])
	if err != nil {
		t.Fatal(err)
	}
	tn.cache.mu.Lock()
	tn.cache.mu.blocks[keys[1]] = planted
	tn.cache.mu.Unlock()

	s, err := tn.raw.BatchGet(ctx, &kvmeshv1.BatchGetRequest{Namespace: client.NamespaceProto(testNS), Tokens: tokens})
	if err != nil {
		t.Fatal(err)
	}
	found := map[uint32]bool{}
	for {
		f, err := s.Recv()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if f.GetFound() {
			found[f.GetIndex()] = true
			if got := f.GetTokens(); f.GetIndex() == 1 || len(got) > 0 && got[0] != tokens[4*f.GetIndex()] {
				t.Fatalf("block %d served with tokens %v", f.GetIndex(), got)
			}
		}
	}
	if !found[0] || found[1] || !found[2] {
		t.Fatalf("found %v: want blocks 0 and 2, block 1 a miss", found)
	}
	if v := metricValue(scrape(t, tn.HTTPAddr()), `kvmesh_blocks_refused_total{reason="tokens"}`); v != 1 {
		t.Errorf(`kvmesh_blocks_refused_total{reason="tokens"} = %v, want 1`, v)
	}

	// The Go client's Get reads the prompt's longest prefix: block 0 only.
	blocks, err := tn.client.Get(ctx, testNS, client.Prompt{Tokens: tokens})
	if err != nil {
		t.Fatal(err)
	}
	if len(blocks) != 1 || blocks[0].Key != keys[0] {
		t.Fatalf("client Get: %d blocks, want block 0 only", len(blocks))
	}
}
