package node

import (
	"context"
	"fmt"
	"unsafe"

	"github.com/kvmesh/kvmesh/auth"
	"github.com/kvmesh/kvmesh/block"
	"github.com/kvmesh/kvmesh/prefixhash"
	kvmeshv1 "github.com/kvmesh/kvmesh/proto/kvmesh/v1"
)

// namespace converts and validates a request's namespace, salts it for the
// caller's tenant (auth.Principal.Namespace: a tenant can name only its own
// namespaces), and checks that its blocks fit the node's limits.
func (n *Node) namespace(ctx context.Context, pb *kvmeshv1.Namespace) (prefixhash.Namespace, error) {
	if pb == nil {
		return prefixhash.Namespace{}, invalid("namespace", "required")
	}
	ns := prefixhash.Namespace{
		Model:       pb.GetModel(),
		DType:       prefixhash.DType(pb.GetDtype()),
		BlockTokens: int(pb.GetBlockTokens()),
		Layers:      int(min(pb.GetLayers(), 1<<30)),
		KVHeads:     int(pb.GetKvHeads()),
		HeadDim:     int(pb.GetHeadDim()),
		TenantSalt:  pb.GetTenantSalt(),
		Layout:      prefixhash.KVLayout(pb.GetKvLayout()),
		LatentDim:   int(pb.GetLatentDim()),
		Scales:      prefixhash.Scales(pb.GetScales()),
		LoRA:        pb.GetLora(),
		Scheme:      prefixhash.KeyScheme(pb.GetKeyScheme()),
		HashSeed:    pb.GetHashSeed(),
		// Bounded by Validate; the cap keeps a huge value huge on 32-bit ints.
		ExtraKeyBytes: int(min(pb.GetExtraKeyBytes(), 1<<30)),
	}
	//lint:ignore SA1019 the deprecated key format 2 fields are read to refuse or translate them
	start, end, tpRank, tpSize := pb.GetLayerStart(), pb.GetLayerEnd(), pb.GetTpRank(), pb.GetTpSize()
	switch {
	case start == 0 && end == 0 && tpRank == 0 && tpSize <= 1:
	case pb.GetLayers() == 0 && start == 0 && tpRank == 0 && tpSize <= 1:
		ns.Layers = int(min(end, 1<<30)) // a key format 2 client naming the whole model
	default:
		return ns, invalid("namespace", "layer_start %d, layer_end %d, tp_rank %d, tp_size %d: a namespace names the whole model since key format 3 "+
			"(set layers to the model's layer count and kv_heads to all its KV heads); a rank's part of a block goes with each put and get",
			start, end, tpRank, tpSize)
	}
	if pb.GetKvLayout() < 0 || pb.GetKvLayout() > 255 || pb.GetScales() < 0 || pb.GetScales() > 255 || pb.GetKeyScheme() < 0 || pb.GetKeyScheme() > 255 {
		return ns, invalid("namespace", "kv_layout %d, scales %d or key_scheme %d is not a known value", pb.GetKvLayout(), pb.GetScales(), pb.GetKeyScheme())
	}
	ns, err := auth.PrincipalFrom(ctx).Namespace(ns)
	if err != nil {
		return ns, invalid("namespace", "%v", err)
	}
	if err := ns.Validate(); err != nil {
		return ns, invalid("namespace", "%v", err)
	}
	// Multiply with a ceiling so that absurd head counts cannot overflow.
	limit := uint64(n.opts.Limits.MaxBlockBytes)
	size := uint64(ns.DType.Size())
	factors := []int{ns.Layers, 2, ns.BlockTokens, ns.KVHeads, ns.HeadDim}
	if ns.Layout == prefixhash.LatentKV {
		factors = []int{ns.Layers, ns.BlockTokens, ns.LatentDim}
	}
	for _, f := range factors {
		if size > limit/uint64(f) {
			return ns, invalidFor(kvmeshv1.ErrorReason_ERROR_REASON_BLOCK_TOO_LARGE, limitMeta(n.opts.Limits.MaxBlockBytes), "namespace", "blocks of %s are larger than the node's limit, max_block_bytes=%d", ns, limit)
		}
		size *= uint64(f)
	}
	size += 4 * uint64(ns.ScaleCount()) // at most layers x 2 x kv_heads, bounded with the above
	if enc := uint64(block.NamespaceHeaderLen(ns)) + size; enc > limit {
		return ns, invalidFor(kvmeshv1.ErrorReason_ERROR_REASON_BLOCK_TOO_LARGE, limitMeta(n.opts.Limits.MaxBlockBytes), "namespace", "blocks of %s are %d bytes encoded; the node's limit is max_block_bytes=%d", ns, enc, limit)
	}
	n.names.note(ns)
	return ns, nil
}

// namespaceDigest returns the digest a request names, as a namespace or as
// its digest (exactly one). A tenant may name by digest only a namespace
// of its own that this node holds blocks of; any other digest is
// PermissionDenied, whether or not the node holds it.
func (n *Node) namespaceDigest(ctx context.Context, pb *kvmeshv1.Namespace, digest uint64) (uint64, error) {
	switch {
	case pb != nil && digest != 0:
		return 0, invalid("namespace", "set namespace or digest, not both")
	case pb != nil:
		ns, err := n.namespace(ctx, pb)
		if err != nil {
			return 0, err
		}
		return ns.Digest(), nil
	case digest != 0:
		if !n.mayNameDigest(ctx, digest) {
			return 0, denied(kvmeshv1.ErrorReason_ERROR_REASON_NAMESPACE_FORBIDDEN, map[string]string{"namespace_digest": digestString(digest)}, "namespace digest %016x is not one of this tenant's on this node; name the namespace itself", digest)
		}
		return digest, nil
	}
	return 0, invalid("namespace", "set namespace or digest")
}

// viewOf is what the caller of an admin or inspection call (stats, quotas,
// block info, partials) may see: a tenant its own namespaces and blocks, a
// node-wide principal all of them. It differs from the access its reads
// of block data run with (auth.Principal.Access), which confines a
// node-wide principal without the cluster scope to node-wide blocks.
func viewOf(ctx context.Context) auth.Access {
	a := auth.AccessFrom(ctx)
	if a == auth.NodeWide && !auth.PrincipalFrom(ctx).Scoped() {
		return auth.Access{}
	}
	return a
}

// mayNameDigest reports whether the caller may act on the namespace with
// the given digest: a node-wide principal on any, a tenant on those whose
// blocks here carry its tag.
func (n *Node) mayNameDigest(ctx context.Context, digest uint64) bool {
	a := viewOf(ctx)
	if !a.Scoped {
		return true
	}
	for _, x := range n.cache.Stats().Namespaces {
		if x.Digest == digest {
			return x.Tenant == a.Tag
		}
	}
	return false
}

// blockLimit refuses requests naming more than MaxBatchBlocks blocks.
func (n *Node) blockLimit(field string, blocks int) error {
	if blocks > n.opts.Limits.MaxBatchBlocks {
		return invalidFor(kvmeshv1.ErrorReason_ERROR_REASON_TOO_MANY_BLOCKS, limitMeta(n.opts.Limits.MaxBatchBlocks), field, "%d blocks in one request; the limit is max_batch_blocks=%d", blocks, n.opts.Limits.MaxBatchBlocks)
	}
	return nil
}

// promptKeys returns the keys of the full blocks of tokens, whose blocks
// carry the extra keys given (BlockExtraKeys, in block order), within
// limits.
func (n *Node) promptKeys(ns prefixhash.Namespace, tokens []uint32, extra []*kvmeshv1.BlockExtraKeys) ([]prefixhash.Key, error) {
	blocks := len(tokens) / ns.BlockTokens
	if err := n.blockLimit("tokens", blocks); err != nil {
		return nil, err
	}
	if len(extra) == 0 {
		return prefixhash.Keys(ns, tokens), nil
	}
	per, err := blockExtraKeys(extra, blocks)
	if err != nil {
		return nil, err
	}
	keys, err := prefixhash.KeysExtra(ns, tokens, per)
	if err != nil {
		return nil, invalid("extra_keys", "%v", err)
	}
	return keys, nil
}

// blockExtraKeys spreads a request's extra keys over its blocks: one entry
// per block up to the last that has any.
func blockExtraKeys(extra []*kvmeshv1.BlockExtraKeys, blocks int) ([]prefixhash.ExtraKeys, error) {
	var per []prefixhash.ExtraKeys
	last := -1
	for _, e := range extra {
		b := int(e.GetBlock())
		switch {
		case b <= last:
			return nil, invalid("extra_keys", "block %d after block %d: give blocks in increasing order, each once", b, last)
		case b >= blocks:
			return nil, invalid("extra_keys", "block %d, the prompt has %d full blocks", b, blocks)
		}
		last = b
		per = append(per, make([]prefixhash.ExtraKeys, b+1-len(per))...)
		per[b] = e.GetKeys()
	}
	return per, nil
}

// lookupChain returns the chain a Lookup asks about, from its tokens or
// its keys, within limits, and the prompt's length in tokens.
func (n *Node) lookupChain(ns prefixhash.Namespace, req *kvmeshv1.LookupRequest) ([]prefixhash.Key, int, error) {
	tokens, raw := req.GetTokens(), req.GetChain()
	if len(raw) == 0 && len(tokens) == 0 && req.GetPromptTokens() > 0 {
		// A prompt shorter than one block has no key, so its chain is
		// empty; prompt_tokens still says how long it is.
		if p := req.GetPromptTokens(); p >= uint64(ns.BlockTokens) {
			return nil, 0, invalid("prompt_tokens", "%d tokens make full blocks of %d tokens, and the chain is empty", p, ns.BlockTokens)
		}
		return nil, int(req.GetPromptTokens()), nil
	}
	if len(raw) == 0 {
		keys, err := n.promptKeys(ns, tokens, req.GetExtraKeys())
		return keys, len(tokens), err
	}
	if len(tokens) > 0 {
		return nil, 0, invalid("chain", "set tokens or chain, not both")
	}
	if len(req.GetExtraKeys()) > 0 {
		return nil, 0, invalid("extra_keys", "only with tokens: a chain's keys already cover their blocks' extra keys")
	}
	if len(raw)%prefixhash.KeySize != 0 {
		return nil, 0, invalid("chain", "%d bytes; keys are %d bytes each, concatenated", len(raw), prefixhash.KeySize)
	}
	blocks := len(raw) / prefixhash.KeySize
	if err := n.blockLimit("chain", blocks); err != nil {
		return nil, 0, err
	}
	full := blocks * ns.BlockTokens
	prompt := req.GetPromptTokens()
	switch {
	case prompt == 0:
		prompt = uint64(full)
	case prompt < uint64(full) || prompt >= uint64(full+ns.BlockTokens):
		return nil, 0, invalid("prompt_tokens", "%d tokens do not make the chain's %d full blocks of %d tokens", prompt, blocks, ns.BlockTokens)
	}
	// A Key is a [16]byte: the request's bytes are the keys, read in
	// place (the request outlives the handler's use of them).
	return unsafe.Slice((*prefixhash.Key)(unsafe.Pointer(unsafe.SliceData(raw))), blocks), int(prompt), nil
}

// parseKeys converts request keys, within limits.
func (n *Node) parseKeys(field string, raw [][]byte) ([]prefixhash.Key, error) {
	if err := n.blockLimit(field, len(raw)); err != nil {
		return nil, err
	}
	keys := make([]prefixhash.Key, len(raw))
	for i, b := range raw {
		k, err := parseKey(fmt.Sprintf("%s[%d]", field, i), b)
		if err != nil {
			return nil, err
		}
		keys[i] = k
	}
	return keys, nil
}

// parseChunkKeys converts a request's optional chunk keys: none, or one per
// key.
func (n *Node) parseChunkKeys(raw [][]byte, keys int) ([]prefixhash.Key, error) {
	if len(raw) == 0 {
		return nil, nil
	}
	if len(raw) != keys {
		return nil, invalid("chunk_keys", "%d chunk keys for %d keys; give one per key or none", len(raw), keys)
	}
	return n.parseKeys("chunk_keys", raw)
}

func parseKey(field string, b []byte) (prefixhash.Key, error) {
	var k prefixhash.Key
	if len(b) != prefixhash.KeySize {
		return k, invalid(field, "%d bytes; a key is %d", len(b), prefixhash.KeySize)
	}
	copy(k[:], b)
	return k, nil
}

func keyBytes(k prefixhash.Key) []byte { return append([]byte(nil), k[:]...) }
