package node

import (
	"bytes"
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kvmesh/kvmesh/client"
	"github.com/kvmesh/kvmesh/prefixhash"
	kvmeshv1 "github.com/kvmesh/kvmesh/proto/kvmesh/v1"
)

func payloadsOf(ns prefixhash.Namespace, blocks int, seed byte) [][]byte {
	out := make([][]byte, blocks)
	for i := range out {
		out[i] = bytes.Repeat([]byte{seed, byte(i), 7}, ns.BlockBytes()/3+1)[:ns.BlockBytes()]
	}
	return out
}

// TestExtraKeysEndToEnd: two puts of the same tokens with different extra
// keys (two images behind the same placeholder tokens) are two blocks;
// each is read back only with its own extra keys, and a read without them
// misses.
func TestExtraKeysEndToEnd(t *testing.T) {
	tn := startNode(t, nil)
	ctx := context.Background()
	ns := testNS
	ns.ExtraKeyBytes = 64
	tokens, _ := prompt(3, 8)
	a := []prefixhash.ExtraKeys{nil, {[]byte("image-a"), {0, 0, 0, 1}}}
	b := []prefixhash.ExtraKeys{nil, {[]byte("image-b"), {0, 0, 0, 1}}}
	pa, pb := payloadsOf(ns, 2, 1), payloadsOf(ns, 2, 2)
	ka, err := tn.client.PutExtra(ctx, ns, tokens, a, pa)
	if err != nil {
		t.Fatal(err)
	}
	kb, err := tn.client.PutExtra(ctx, ns, tokens, b, pb)
	if err != nil {
		t.Fatal(err)
	}
	if ka[1] == kb[1] || len(kb) != 1 && kb[0] != ka[0] {
		t.Fatalf("equal tokens with different extra keys share a key: %s %s", ka, kb)
	}
	for _, tc := range []struct {
		extra []prefixhash.ExtraKeys
		want  [][]byte
	}{{a, pa}, {b, [][]byte{pa[0], pb[1]}}} {
		blocks, err := tn.client.GetExtra(ctx, ns, tokens, tc.extra)
		if err != nil || len(blocks) != 2 {
			t.Fatalf("GetExtra: %d blocks, %v", len(blocks), err)
		}
		for i, blk := range blocks {
			if !bytes.Equal(blk.Payload, tc.want[i]) {
				t.Errorf("block %d: another image's KV", i)
			}
		}
		if len(blocks[1].Extra) != 2 || !bytes.Equal(blocks[1].Extra[0], tc.extra[1][0]) {
			t.Errorf("block 1 carries extra keys %q", blocks[1].Extra)
		}
		l, err := tn.client.LookupExtra(ctx, ns, tokens, tc.extra)
		if err != nil || l.CachedBlocks != 2 {
			t.Errorf("LookupExtra: %d blocks, %v", l.CachedBlocks, err)
		}
		// The node hashes the same extra keys to the same chain.
		resp, err := tn.raw.Lookup(ctx, &kvmeshv1.LookupRequest{Namespace: client.NamespaceProto(ns), Tokens: tokens,
			ExtraKeys: []*kvmeshv1.BlockExtraKeys{{Block: 1, Keys: tc.extra[1]}}})
		if err != nil || resp.GetCachedBlocks() != 2 {
			t.Errorf("Lookup by tokens with extra keys: %d blocks, %v", resp.GetCachedBlocks(), err)
		}
	}
	blocks, err := tn.client.Get(ctx, ns, client.Prompt{Tokens: tokens})
	if err != nil || len(blocks) != 1 {
		t.Errorf("Get without the extra keys: %d blocks (want only block 0, which has none), %v", len(blocks), err)
	}
	if _, err := tn.client.PutExtra(ctx, ns, tokens, []prefixhash.ExtraKeys{{make([]byte, 61)}}, pa); !errors.Is(err, client.ErrInvalid) {
		t.Errorf("extra keys over the namespace's room: %v", err)
	}
	if _, err := tn.client.PutExtra(ctx, testNS, tokens, a, pa); !errors.Is(err, client.ErrInvalid) {
		t.Errorf("extra keys in a namespace without room: %v", err)
	}
	// A raw put with oversized extra keys is refused by the node, which keeps serving.
	stream, err := tn.raw.BatchPut(ctx)
	if err != nil {
		t.Fatal(err)
	}
	_ = stream.Send(&kvmeshv1.BatchPutRequest{Namespace: client.NamespaceProto(ns), Block: &kvmeshv1.BlockHeader{
		Tokens: tokens[:4], PayloadLen: uint64(ns.BlockBytes()), ExtraKeys: make([][]byte, 65)}, Data: pa[0]})
	if _, err := stream.CloseAndRecv(); status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "block.extra_keys") {
		t.Errorf("raw put with 65 extra keys: %v", err)
	}
	if l, err := tn.client.LookupExtra(ctx, ns, tokens, a); err != nil || l.CachedBlocks != 2 {
		t.Errorf("after a refused put: %d blocks, %v", l.CachedBlocks, err)
	}
}

// TestLatentAndScalesEndToEnd: blocks of a latent (MLA) namespace and of
// quantised namespaces with scales are stored and read back whole, scales
// included; a payload sized for the KV bytes alone is refused.
func TestLatentAndScalesEndToEnd(t *testing.T) {
	tn := startNode(t, nil)
	ctx := context.Background()
	kimi := prefixhash.Namespace{Model: "moonshotai/Kimi-K2.5-tiny", DType: prefixhash.BFloat16, BlockTokens: 4, Layers: 3,
		Layout: prefixhash.LatentKV, LatentDim: 576}
	kimiFP8 := kimi
	kimiFP8.DType, kimiFP8.Scales = prefixhash.Float8E4M3, prefixhash.ScalesPerBlock
	int8Head := testNS
	int8Head.DType, int8Head.Scales = prefixhash.Int8, prefixhash.ScalesPerHead
	for name, ns := range map[string]prefixhash.Namespace{"latent": kimi, "latent fp8 scales": kimiFP8, "int8 per-head scales": int8Head} {
		tokens, _ := prompt(5, 8)
		payloads := payloadsOf(ns, 2, 9)
		if _, err := tn.client.Put(ctx, ns, client.Prompt{Tokens: tokens}, payloads); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		blocks, err := tn.client.Get(ctx, ns, client.Prompt{Tokens: tokens})
		if err != nil || len(blocks) != 2 {
			t.Fatalf("%s: %d blocks, %v", name, len(blocks), err)
		}
		for i, b := range blocks {
			if !bytes.Equal(b.Payload, payloads[i]) {
				t.Errorf("%s: block %d differs", name, i)
			}
		}
		if ns.Scales != prefixhash.NoScales {
			short := [][]byte{payloads[0][:ns.KVBytes()]}
			if _, err := tn.client.Put(ctx, ns, client.Prompt{Tokens: tokens}, short); !errors.Is(err, client.ErrInvalid) {
				t.Errorf("%s: a payload without its scales: %v", name, err)
			}
		}
	}
}

// TestVLLMSchemeEndToEnd: blocks put under a vllm-scheme namespace are
// found by the chain of vLLM's own block hashes (from the vectors an
// independent script computed from vLLM's definition, truncated to 16
// bytes), LoRA, multimodal keys and cache salt included.
func TestVLLMSchemeEndToEnd(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join("..", "prefixhash", "testdata", "vllm.json"))
	if err != nil {
		t.Fatal(err)
	}
	var f struct {
		Vectors []struct {
			Name        string
			HashSeed    string `json:"hash_seed"`
			LoRA        string `json:"lora"`
			CacheSalt   string `json:"cache_salt"`
			BlockTokens int    `json:"block_tokens"`
			Tokens      []uint32
			MM          [][]any
			Hashes      []string
		}
	}
	if err := json.Unmarshal(raw, &f); err != nil {
		t.Fatal(err)
	}
	tn := startNode(t, nil)
	ctx := context.Background()
	tested := 0
	for _, v := range f.Vectors {
		if v.Name != "plain-b16" && v.Name != "mm-lora-salt-b16" {
			continue
		}
		tested++
		ns := prefixhash.Namespace{Model: "vllm/" + v.Name, DType: prefixhash.Float16, BlockTokens: v.BlockTokens, Layers: 1,
			KVHeads: 1, HeadDim: 8, Scheme: prefixhash.SchemeVLLM, HashSeed: "0", LoRA: v.LoRA, TenantSalt: v.CacheSalt,
			ExtraKeyBytes: 128}
		nb := len(v.Tokens) / v.BlockTokens
		extra := make([]prefixhash.ExtraKeys, nb)
		for i := range nb {
			for _, m := range v.MM {
				off, n := int(m[1].(float64)), int(m[2].(float64))
				if (i+1)*v.BlockTokens > off && i*v.BlockTokens < off+n {
					extra[i] = append(extra[i], prefixhash.VLLMMultimodalKey(m[0].(string), off-i*v.BlockTokens))
				}
			}
		}
		payloads := payloadsOf(ns, nb, 4)
		keys, err := tn.client.PutExtra(ctx, ns, v.Tokens, extra, payloads)
		if err != nil || len(keys) != nb {
			t.Fatalf("%s: %d keys, %v", v.Name, len(keys), err)
		}
		var chain []byte
		for i, h := range v.Hashes {
			b, _ := hex.DecodeString(h)
			chain = append(chain, b[:prefixhash.KeySize]...)
			if keys[i] != prefixhash.Key(b[:prefixhash.KeySize]) {
				t.Errorf("%s: block %d stored as %s, vLLM's hash is %s", v.Name, i, keys[i], h)
			}
		}
		resp, err := tn.raw.Lookup(ctx, &kvmeshv1.LookupRequest{Namespace: client.NamespaceProto(ns), Chain: chain})
		if err != nil || int(resp.GetCachedBlocks()) != nb {
			t.Errorf("%s: vLLM's hashes name %d cached blocks of %d, %v", v.Name, resp.GetCachedBlocks(), nb, err)
		}
		blocks, err := tn.client.GetExtra(ctx, ns, v.Tokens, extra)
		if err != nil || len(blocks) != nb {
			t.Fatalf("%s: %d blocks, %v", v.Name, len(blocks), err)
		}
		for i, b := range blocks {
			if !bytes.Equal(b.Payload, payloads[i]) {
				t.Errorf("%s: block %d differs", v.Name, i)
			}
		}
	}
	if tested != 2 {
		t.Fatalf("%d vLLM vectors found", tested)
	}
}

// TestModelFitTransports: format 3 blocks (a latent vllm-scheme namespace
// with scales, blocks with extra keys) travel every path a real node has
// (shared memory, the TCP data plane, gRPC) into its real store and back.
func TestModelFitTransports(t *testing.T) {
	nodes := startClusterNodes(t, 1, nil)
	a := nodes[0]
	ctx := context.Background()
	ns := prefixhash.Namespace{Model: "test/mla-vllm", DType: prefixhash.Float8E4M3, BlockTokens: 16, Layers: 2,
		Layout: prefixhash.LatentKV, LatentDim: 40, Scales: prefixhash.ScalesPerBlock,
		Scheme: prefixhash.SchemeVLLM, HashSeed: "0", LoRA: "l", ExtraKeyBytes: 64}
	for i, tr := range []string{client.TransportAuto, client.TransportTCP, client.TransportGRPC} {
		c, err := client.Dial(a.GRPCAddr(), client.Options{Transport: tr, VerifySharedMemory: true})
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		tokens, _ := clusterPrompt(40+i, 3)
		extra := []prefixhash.ExtraKeys{nil, {prefixhash.VLLMMultimodalKey("img", 2)}}
		payloads := payloadsOf(ns, 3, byte(i))
		if _, err := c.PutExtra(ctx, ns, tokens, extra, payloads); err != nil {
			t.Fatalf("%s: PutExtra: %v", tr, err)
		}
		got, err := c.GetExtra(ctx, ns, tokens, extra)
		if err != nil || len(got) != 3 {
			t.Fatalf("%s: GetExtra: %d blocks, %v", tr, len(got), err)
		}
		for j, b := range got {
			if !bytes.Equal(b.Payload, payloads[j]) {
				t.Fatalf("%s: block %d differs", tr, j)
			}
		}
		if got, _ := c.Get(ctx, ns, client.Prompt{Tokens: tokens}); len(got) != 1 {
			t.Errorf("%s: Get without the extra keys: %d blocks, want 1", tr, len(got))
		}
	}
}

//lint:file-ignore SA1019 the node's tests call the client's deprecated methods, kept one release (client/deprecated.go).
