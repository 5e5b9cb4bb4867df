// Package prefixhash turns token sequences into the keys kvmesh caches KV
// blocks under.
//
// A Namespace names the producer of KV blocks (model, dtype, block size,
// the model's layer count, KV layout and whole KV shape, tenant salt, LoRA
// adapter, quantisation scales, key scheme). The KV layout is SplitKV (a K
// and a V per KV head and layer) or LatentKV (one latent vector of
// LatentDim per token and layer, multi-head latent attention); each has its
// payload rule (BlockBytes). Fields added after the first encoding are
// encoded only when set, so older namespaces keep their keys. Its canonical encoding E
// (magic "kvmesh/ns/v3", length-prefixed strings, little-endian integers) is
// hashed into the root key k_0 = trunc128(SHA-256(E)), so two namespaces never
// share a key and two tenants with different salts never see each other's
// prefixes. Its 64-bit Digest, carried in block headers, is the first 8 bytes
// of SHA-256(E) read little-endian.
//
// A prompt of n tokens has ⌊n/B⌋ full blocks of B tokens. Block i's key is
// k_i = trunc128(SHA-256(k_{i-1} ‖ tokens of block i as little-endian uint32)).
// A key therefore commits to the namespace and to every token before it:
// equal keys mean equal prefixes, and because SHA-256 is collision-resistant
// nobody can choose a second token block with the key of a given one (the
// xxhash64 keys of KeyVersion 1 allowed exactly that, in microseconds; the
// test that forges such a pair is forgery_test.go). Readers still compare a
// block's stored tokens with the ones they asked for.
//
// A block may also carry extra keys (ExtraKeys: opaque bytes such as a
// multimodal input's hash and offset); its key then covers them, so equal
// tokens with different extra keys never share a key (KeysExtra, BlockLink).
// A namespace whose blocks carry them reserves header room for them
// (ExtraKeyBytes), so that all its blocks encode to one size.
//
// A namespace chooses its key scheme: SchemeKVMesh (the above, the default)
// or SchemeVLLM, vLLM's own block hash (SHA-256 over canonical CBOR, rooted
// in its PYTHONHASHSEED; vllm.go), so that the hashes vLLM publishes name
// kvmesh blocks directly. testdata/vllm.json holds vectors computed by an
// independent script from vLLM's definition.
//
// A namespace describes the model's whole KV, not a rank's: a block key
// covers every layer and KV head of its tokens under every parallel layout.
// Which part of a block a tensor- or pipeline-parallel rank holds travels
// with each call (block.Part), so an instance at TP 8 and one at TP 4 share
// keys. Key format 2 put the rank into the namespace; its keys simply miss.
//
// KeyVersion names this key format (3). Formats that persist or move blocks
// under keys record it, so that blocks keyed by another version are dropped
// rather than served. Keys are identical across processes, machines,
// languages and restarts; testdata/golden.json pins them in a self-describing
// form for other clients, and any change of encoding fails that test.
//
// Cost: a 16-token block is an 80-byte message, two SHA-256 compressions;
// hashing reuses one pooled SHA-256 state and allocates nothing per block.
//
// # Groups (hybrid models)
//
// A namespace may describe a hybrid model's cache as groups (Group): full
// attention, a sliding window of W tokens, a fixed-size recurrent state
// (StateKV: opaque bytes of a declared size per layer and head), or an
// indexer (a per-token side cache every prefix needs), each with its
// layers, layout and dtype. The groups are part of the canonical encoding
// (tag 6, after every other optional field), so a namespace without them
// encodes and keys exactly as before, and Namespace stays comparable
// (Groups holds its encoding). The chain of block keys stays one per prompt;
// group g's record of block i is stored under GroupKey(k_i, g) = k_i XOR
// M_g, M_g a constant per group index, zero for group 0 (an XOR, so a
// 128k-token prompt's group keys cost nothing next to its chain; group 0,
// best the full-attention group, is under the chain keys themselves). A state group's record of
// block i is the state after the block's last token.
//
// Resume is the hit rule: the longest prefix P such that every full and
// indexer group holds blocks [0,P), every sliding group the blocks that
// cover the last W tokens before P, every state group its state at P; it
// also says what each group allows on its own. testdata/groups.json pins
// the encoding, group keys, record sizes and hit rule for other clients.
//
// For placement, a chain is cut into chunks of C consecutive blocks; every
// block of a chunk is placed by the key of the chunk's first block.
//
// The package imports nothing else of kvmesh.
//
// # Concurrency
//
// Its functions and a Namespace's methods are pure and safe for concurrent
// use: hashing takes a SHA-256 state from a sync.Pool and returns it, so
// goroutines never share one. A Chain is not safe for concurrent use: it
// extends one sequence's keys in place; give each goroutine its own, or guard
// it. Keys are values (16-byte arrays) and may be copied and compared freely.
package prefixhash
