package node

//lint:file-ignore SA1019 the deprecated key format 2 namespace fields are set on purpose: the node must refuse or translate them

import (
	"context"
	"io"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kvmesh/kvmesh/client"
	kvmeshv1 "github.com/kvmesh/kvmesh/proto/kvmesh/v1"
)

// TestInvalidArgument sends every kind of malformed request and checks that
// each is refused with InvalidArgument naming the field, and that the node
// keeps serving.
func TestInvalidArgument(t *testing.T) {
	tn := startNode(t, func(o *Options) { o.Limits.MaxBatchBlocks = 4; o.Limits.MaxBlockBytes = 64 * KiB })
	ctx := context.Background()
	ns := client.NamespaceProto(testNS)
	bad := func(mod func(*kvmeshv1.Namespace)) *kvmeshv1.Namespace {
		c := client.NamespaceProto(testNS)
		mod(c)
		return c
	}
	tokens, payloads := prompt(6, 8)
	block := func(tokens []uint32, n int) *kvmeshv1.BlockHeader {
		return &kvmeshv1.BlockHeader{Tokens: tokens, PayloadLen: uint64(n)}
	}
	put := func(msgs ...*kvmeshv1.BatchPutRequest) error {
		stream, err := tn.raw.BatchPut(ctx)
		if err != nil {
			return err
		}
		for _, m := range msgs {
			if err := stream.Send(m); err != nil {
				break // the node ended the stream; CloseAndRecv has why
			}
		}
		_, err = stream.CloseAndRecv()
		return err
	}
	get := func(req *kvmeshv1.BatchGetRequest) error {
		stream, err := tn.raw.BatchGet(ctx, req)
		if err != nil {
			return err
		}
		for {
			if _, err := stream.Recv(); err != nil {
				if err == io.EOF {
					return nil
				}
				return err
			}
		}
	}
	key := func(n int) [][]byte {
		keys := make([][]byte, n)
		for i := range keys {
			keys[i] = make([]byte, 16)
		}
		return keys
	}
	size := uint64(testNS.BlockBytes())

	for _, tc := range []struct {
		name, want string
		call       func() error
	}{
		{"lookup without namespace", "namespace: required", func() error {
			_, err := tn.raw.Lookup(ctx, &kvmeshv1.LookupRequest{Tokens: tokens})
			return err
		}},
		{"namespace without model", "model", func() error {
			_, err := tn.raw.Lookup(ctx, &kvmeshv1.LookupRequest{Namespace: bad(func(n *kvmeshv1.Namespace) { n.Model = "" })})
			return err
		}},
		{"namespace with zero block_tokens", "block_tokens", func() error {
			_, err := tn.raw.Lookup(ctx, &kvmeshv1.LookupRequest{Namespace: bad(func(n *kvmeshv1.Namespace) { n.BlockTokens = 0 })})
			return err
		}},
		{"namespace with unknown dtype", "dtype", func() error {
			_, err := tn.raw.Lookup(ctx, &kvmeshv1.LookupRequest{Namespace: bad(func(n *kvmeshv1.Namespace) { n.Dtype = 99 })})
			return err
		}},
		{"namespace with a key format 2 tensor-parallel rank", "names the whole model since key format 3", func() error {
			_, err := tn.raw.Lookup(ctx, &kvmeshv1.LookupRequest{Namespace: bad(func(n *kvmeshv1.Namespace) { n.TpRank, n.TpSize = 1, 2 })})
			return err
		}},
		{"namespace with a key format 2 pipeline stage", "names the whole model since key format 3", func() error {
			_, err := tn.raw.Lookup(ctx, &kvmeshv1.LookupRequest{Namespace: bad(func(n *kvmeshv1.Namespace) { n.Layers, n.LayerStart, n.LayerEnd = 0, 1, 2 })})
			return err
		}},
		{"namespace with no layers", "layers", func() error {
			_, err := tn.raw.Lookup(ctx, &kvmeshv1.LookupRequest{Namespace: bad(func(n *kvmeshv1.Namespace) { n.Layers = 0 })})
			return err
		}},
		{"namespace with oversized blocks", "max_block_bytes", func() error {
			_, err := tn.raw.Lookup(ctx, &kvmeshv1.LookupRequest{Namespace: bad(func(n *kvmeshv1.Namespace) { n.HeadDim = 1 << 20 })})
			return err
		}},
		{"namespace with overflowing block size", "max_block_bytes", func() error {
			_, err := tn.raw.Lookup(ctx, &kvmeshv1.LookupRequest{Namespace: bad(func(n *kvmeshv1.Namespace) {
				n.Layers, n.KvHeads, n.HeadDim = 1<<20, 1<<20, 1<<20 // the largest shape Validate allows
			})})
			return err
		}},
		{"lookup over the batch limit", "max_batch_blocks", func() error {
			_, err := tn.raw.Lookup(ctx, &kvmeshv1.LookupRequest{Namespace: ns, Tokens: make([]uint32, 5*4)})
			return err
		}},
		{"lookup with a chain over the batch limit", "chain: 5 blocks", func() error {
			_, err := tn.raw.Lookup(ctx, &kvmeshv1.LookupRequest{Namespace: ns, Chain: make([]byte, 5*16)})
			return err
		}},
		{"lookup with a chain of a short key", "chain: 40 bytes", func() error {
			_, err := tn.raw.Lookup(ctx, &kvmeshv1.LookupRequest{Namespace: ns, Chain: make([]byte, 40)})
			return err
		}},
		{"lookup with tokens and a chain", "chain: set tokens or chain", func() error {
			_, err := tn.raw.Lookup(ctx, &kvmeshv1.LookupRequest{Namespace: ns, Tokens: tokens[:4], Chain: make([]byte, 16)})
			return err
		}},
		{"lookup with a chain longer than its prompt", "prompt_tokens", func() error {
			_, err := tn.raw.Lookup(ctx, &kvmeshv1.LookupRequest{Namespace: ns, Chain: make([]byte, 2*16), PromptTokens: 7})
			return err
		}},
		{"lookup with a chain shorter than its prompt", "prompt_tokens", func() error {
			_, err := tn.raw.Lookup(ctx, &kvmeshv1.LookupRequest{Namespace: ns, Chain: make([]byte, 2*16), PromptTokens: 12})
			return err
		}},
		{"get with a short key", "keys[1]", func() error {
			return get(&kvmeshv1.BatchGetRequest{Namespace: ns, Keys: [][]byte{make([]byte, 16), {1, 2, 3}}})
		}},
		{"get over the batch limit", "max_batch_blocks", func() error {
			return get(&kvmeshv1.BatchGetRequest{Namespace: ns, Keys: key(5)})
		}},
		{"get with keys and tokens", "keys", func() error {
			return get(&kvmeshv1.BatchGetRequest{Namespace: ns, Keys: key(1), Tokens: tokens})
		}},
		{"get without namespace", "namespace", func() error {
			return get(&kvmeshv1.BatchGetRequest{Keys: key(1)})
		}},
		{"exists with a long key", "keys[0]", func() error {
			_, err := tn.raw.Exists(ctx, &kvmeshv1.ExistsRequest{Keys: [][]byte{make([]byte, 17)}})
			return err
		}},
		{"put without namespace", "namespace", func() error {
			return put(&kvmeshv1.BatchPutRequest{Block: block(tokens[:4], int(size)), Data: payloads[0]})
		}},
		{"put with an invalid namespace", "namespace", func() error {
			return put(&kvmeshv1.BatchPutRequest{Namespace: bad(func(n *kvmeshv1.Namespace) { n.KvHeads = 0 }), Block: block(tokens[:4], int(size))})
		}},
		{"put with too few tokens", "block.tokens", func() error {
			return put(&kvmeshv1.BatchPutRequest{Namespace: ns, Block: block(tokens[:3], int(size))})
		}},
		{"put with too many tokens", "block.tokens", func() error {
			return put(&kvmeshv1.BatchPutRequest{Namespace: ns, Block: block(tokens[:5], int(size))})
		}},
		{"put with a wrong payload_len", "block.payload_len", func() error {
			return put(&kvmeshv1.BatchPutRequest{Namespace: ns, Block: block(tokens[:4], int(size)+1)})
		}},
		{"put with more data than payload_len", "data", func() error {
			return put(&kvmeshv1.BatchPutRequest{Namespace: ns, Block: block(tokens[:4], int(size)), Data: make([]byte, size+1)})
		}},
		{"put with data before a header", "data", func() error {
			return put(&kvmeshv1.BatchPutRequest{Namespace: ns, Data: payloads[0]})
		}},
		{"put ending inside a block", "data", func() error {
			return put(&kvmeshv1.BatchPutRequest{Namespace: ns, Block: block(tokens[:4], int(size)), Data: payloads[0][:10]})
		}},
		{"put with a short parent", "block.parent", func() error {
			h := block(tokens[:4], int(size))
			h.Parent = []byte{1}
			return put(&kvmeshv1.BatchPutRequest{Namespace: ns, Block: h, Data: payloads[0]})
		}},
		{"put with a wrong checksum", "block.payload_checksum", func() error {
			h := block(tokens[:4], int(size))
			h.PayloadChecksum = 12345
			return put(&kvmeshv1.BatchPutRequest{Namespace: ns, Block: h, Data: payloads[0]})
		}},
		{"put changing namespace", "namespace", func() error {
			return put(&kvmeshv1.BatchPutRequest{Namespace: ns, Block: block(tokens[:4], int(size)), Data: payloads[0]},
				&kvmeshv1.BatchPutRequest{Namespace: bad(func(n *kvmeshv1.Namespace) { n.Model = "other" })})
		}},
		{"put over the batch limit", "max_batch_blocks", func() error {
			var msgs []*kvmeshv1.BatchPutRequest
			for i := range 5 {
				msgs = append(msgs, &kvmeshv1.BatchPutRequest{Namespace: ns, Block: block([]uint32{uint32(i), 1, 2, 3}, int(size)), Data: payloads[0]})
			}
			return put(msgs...)
		}},
		{"namespace with an unknown kv_layout", "kv_layout", func() error {
			_, err := tn.raw.Lookup(ctx, &kvmeshv1.LookupRequest{Namespace: bad(func(n *kvmeshv1.Namespace) { n.KvLayout = 7 })})
			return err
		}},
		{"namespace with a huge kv_layout", "kv_layout", func() error {
			_, err := tn.raw.Lookup(ctx, &kvmeshv1.LookupRequest{Namespace: bad(func(n *kvmeshv1.Namespace) { n.KvLayout = 1 << 20 })})
			return err
		}},
		{"latent namespace without latent_dim", "latent_dim", func() error {
			_, err := tn.raw.Lookup(ctx, &kvmeshv1.LookupRequest{Namespace: bad(func(n *kvmeshv1.Namespace) {
				n.KvLayout, n.KvHeads, n.HeadDim = kvmeshv1.KVLayout_KV_LAYOUT_LATENT, 0, 0
			})})
			return err
		}},
		{"namespace with oversized latent blocks", "max_block_bytes", func() error {
			_, err := tn.raw.Lookup(ctx, &kvmeshv1.LookupRequest{Namespace: bad(func(n *kvmeshv1.Namespace) {
				n.KvLayout, n.KvHeads, n.HeadDim, n.LatentDim = kvmeshv1.KVLayout_KV_LAYOUT_LATENT, 0, 0, 1<<20
			})})
			return err
		}},
		{"namespace with scales on float32", "scales", func() error {
			_, err := tn.raw.Lookup(ctx, &kvmeshv1.LookupRequest{Namespace: bad(func(n *kvmeshv1.Namespace) { n.Scales = kvmeshv1.Scales_SCALES_PER_BLOCK })})
			return err
		}},
		{"namespace with an unknown key_scheme", "key_scheme", func() error {
			_, err := tn.raw.Lookup(ctx, &kvmeshv1.LookupRequest{Namespace: bad(func(n *kvmeshv1.Namespace) { n.KeyScheme = 9 })})
			return err
		}},
		{"vllm namespace without hash_seed", "hash_seed", func() error {
			_, err := tn.raw.Lookup(ctx, &kvmeshv1.LookupRequest{Namespace: bad(func(n *kvmeshv1.Namespace) { n.KeyScheme = kvmeshv1.KeyScheme_KEY_SCHEME_VLLM })})
			return err
		}},
		{"lookup with extra keys past the prompt", "extra_keys", func() error {
			_, err := tn.raw.Lookup(ctx, &kvmeshv1.LookupRequest{Namespace: ns, Tokens: tokens[:8],
				ExtraKeys: []*kvmeshv1.BlockExtraKeys{{Block: 2, Keys: [][]byte{{1}}}}})
			return err
		}},
		{"lookup with extra keys out of order", "extra_keys", func() error {
			_, err := tn.raw.Lookup(ctx, &kvmeshv1.LookupRequest{Namespace: ns, Tokens: tokens[:8],
				ExtraKeys: []*kvmeshv1.BlockExtraKeys{{Block: 1, Keys: [][]byte{{1}}}, {Block: 0, Keys: [][]byte{{1}}}}})
			return err
		}},
		{"namespace with too much extra key room", "extra_key_bytes", func() error {
			_, err := tn.raw.Lookup(ctx, &kvmeshv1.LookupRequest{Namespace: bad(func(n *kvmeshv1.Namespace) { n.ExtraKeyBytes = 1 << 31 })})
			return err
		}},
		{"lookup with extra keys in a namespace without room", "extra_key_bytes", func() error {
			_, err := tn.raw.Lookup(ctx, &kvmeshv1.LookupRequest{Namespace: ns, Tokens: tokens[:8],
				ExtraKeys: []*kvmeshv1.BlockExtraKeys{{Block: 0, Keys: [][]byte{{1}}}}})
			return err
		}},
		{"lookup with too many extra bytes", "extra_keys", func() error {
			_, err := tn.raw.Lookup(ctx, &kvmeshv1.LookupRequest{Namespace: ns, Tokens: tokens[:8],
				ExtraKeys: []*kvmeshv1.BlockExtraKeys{{Block: 0, Keys: [][]byte{make([]byte, 5000)}}}})
			return err
		}},
		{"lookup with a chain and extra keys", "extra_keys", func() error {
			_, err := tn.raw.Lookup(ctx, &kvmeshv1.LookupRequest{Namespace: ns, Chain: make([]byte, 16),
				ExtraKeys: []*kvmeshv1.BlockExtraKeys{{Block: 0, Keys: [][]byte{{1}}}}})
			return err
		}},
		{"vllm lookup with an extra key that is not CBOR", "extra_keys", func() error {
			_, err := tn.raw.Lookup(ctx, &kvmeshv1.LookupRequest{Namespace: bad(func(n *kvmeshv1.Namespace) {
				n.KeyScheme, n.HashSeed = kvmeshv1.KeyScheme_KEY_SCHEME_VLLM, "0"
			}), Tokens: tokens[:8], ExtraKeys: []*kvmeshv1.BlockExtraKeys{{Block: 0, Keys: [][]byte{[]byte("raw")}}}})
			return err
		}},
		{"get by keys with extra keys", "extra_keys", func() error {
			return get(&kvmeshv1.BatchGetRequest{Namespace: ns, Keys: key(1), ExtraKeys: []*kvmeshv1.BlockExtraKeys{{Block: 0}}})
		}},
		{"block info with a short key", "key", func() error {
			_, err := tn.admin.BlockInfo(ctx, &kvmeshv1.BlockInfoRequest{Key: []byte{1}})
			return err
		}},
		{"drop without a namespace", "namespace", func() error {
			_, err := tn.admin.DropNamespace(ctx, &kvmeshv1.DropNamespaceRequest{})
			return err
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.call()
			st, _ := status.FromError(err)
			if st.Code() != codes.InvalidArgument || !strings.Contains(st.Message(), tc.want) {
				t.Fatalf("got %v, want InvalidArgument naming %q", err, tc.want)
			}
			reason := kvmeshv1.ErrorReason_ERROR_REASON_UNSPECIFIED // any
			if tc.want == "max_batch_blocks" {
				reason = kvmeshv1.ErrorReason_ERROR_REASON_TOO_MANY_BLOCKS
			}
			wantRefusal(t, err, codes.InvalidArgument, reason)
		})
	}

	// Still serving. Of the refused puts, only whole valid blocks that came
	// before the fault were stored: the 4 under the batch limit and the
	// prompt's first block (before the namespace changed).
	if _, err := tn.client.Put(ctx, testNS, client.Prompt{Tokens: tokens}, payloads); err != nil {
		t.Fatalf("Put after refused requests: %v", err)
	}
	if l, err := tn.client.Lookup(ctx, testNS, client.Prompt{Tokens: tokens}); err != nil || l.CachedTokens != 8 {
		t.Fatalf("Lookup after refused requests = %+v, %v", l, err)
	}
	if st := tn.cache.Stats(); st.Tiers[0].Blocks != 2+4 {
		t.Fatalf("%d blocks cached, want the prompt's 2 and the 4 within the batch limit", st.Tiers[0].Blocks)
	}
}

// TestKeyFormat2Namespace: a client of key format 2 that names the whole
// model (layer_start 0, layer_end L, tp_size 1) and not layers is read as
// layers L: its lookups see the blocks a key format 3 client stored.
func TestKeyFormat2Namespace(t *testing.T) {
	tn := startNode(t, nil)
	ctx := context.Background()
	tokens, payloads := prompt(7, 2*testNS.BlockTokens)
	if _, err := tn.client.Put(ctx, testNS, client.Prompt{Tokens: tokens}, payloads); err != nil {
		t.Fatal(err)
	}
	old := client.NamespaceProto(testNS)
	old.Layers, old.LayerEnd, old.TpSize = 0, uint32(testNS.Layers), 1
	resp, err := tn.raw.Lookup(ctx, &kvmeshv1.LookupRequest{Namespace: old, Tokens: tokens})
	if err != nil {
		t.Fatal(err)
	}
	if resp.GetCachedTokens() != uint64(len(tokens)) {
		t.Fatalf("a key format 2 namespace of the whole model sees %d cached tokens, want %d", resp.GetCachedTokens(), len(tokens))
	}
}
