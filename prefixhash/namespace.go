package prefixhash

import (
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
)

// DType is the element type of the cached K/V tensors.
type DType uint8

// The KV dtypes kvmesh knows. The numeric values are part of the canonical
// namespace encoding: never renumber them.
const (
	DTypeInvalid DType = iota
	Float32
	Float16
	BFloat16
	Float8E4M3
	Float8E5M2
	Int8
)

var dtypeNames = [...]string{"invalid", "float32", "float16", "bfloat16", "fp8_e4m3", "fp8_e5m2", "int8"}
var dtypeSizes = [...]int{0, 4, 2, 2, 1, 1, 1}

// String returns the dtype's canonical name ("float32", "bfloat16", ...).
func (t DType) String() string {
	if int(t) < len(dtypeNames) {
		return dtypeNames[t]
	}
	return fmt.Sprintf("dtype(%d)", uint8(t))
}

// Size returns the size of one element in bytes, or 0 for an unknown dtype.
func (t DType) Size() int {
	if int(t) < len(dtypeSizes) {
		return dtypeSizes[t]
	}
	return 0
}

// ParseDType parses a canonical dtype name as returned by String.
func ParseDType(s string) (DType, error) {
	for i, n := range dtypeNames {
		if i > 0 && strings.EqualFold(s, n) {
			return DType(i), nil
		}
	}
	return DTypeInvalid, fmt.Errorf("prefixhash: unknown dtype %q (want one of %s)", s, strings.Join(dtypeNames[1:], ", "))
}

// Limits on namespace fields. They bound the block sizes a namespace can
// describe and keep the canonical encoding small.
const (
	MaxModelLen    = 256
	MaxSaltLen     = 256
	MaxLoRALen     = 256
	MaxSeedLen     = 256
	MaxBlockTokens = 1 << 16
	MaxLayers      = 1 << 20
)

// KVLayout is how a model caches attention state per token, and so the shape
// of a block's payload. The numeric values are part of the canonical
// namespace encoding: never renumber them.
type KVLayout uint8

const (
	// SplitKV is a key and a value per KV head per layer (multi-head and
	// grouped-query attention): payload [layer][K|V][token][kv_head][head_dim].
	SplitKV KVLayout = iota
	// LatentKV is one latent vector per token per layer (multi-head latent
	// attention, DeepSeek-V2/V3, Kimi K2): payload [layer][token][latent_dim],
	// where latent_dim is the compressed KV width plus the shared rotary part
	// (512 + 64 = 576 for DeepSeek-V3). K and V are expanded from it at
	// attention time.
	LatentKV
	// StateKV is opaque recurrent state (linear attention, state-space
	// layers): per layer and head, Group.StateBytes bytes, whatever the
	// tokens. Only a state group has it (see Group).
	StateKV
	numLayouts
)

var layoutNames = [...]string{"split", "latent", "state"}

// String returns the layout's canonical name ("split", "latent").
func (l KVLayout) String() string {
	if l < numLayouts {
		return layoutNames[l]
	}
	return fmt.Sprintf("layout(%d)", uint8(l))
}

// ParseKVLayout parses a canonical layout name as returned by String.
func ParseKVLayout(s string) (KVLayout, error) {
	for i, n := range layoutNames {
		if strings.EqualFold(s, n) {
			return KVLayout(i), nil
		}
	}
	return 0, fmt.Errorf("prefixhash: unknown KV layout %q (want one of %s)", s, strings.Join(layoutNames[:], ", "))
}

// Scales says whether, and at which granularity, a quantised (fp8 or int8)
// payload carries its dequantisation scales. Scales are float32,
// little-endian, after the KV bytes of the payload: [layer][K|V] for
// ScalesPerBlock (one scale per layer and tensor of the block; [layer] for
// the latent layout) and [layer][K|V][kv_head] for ScalesPerHead. They are
// part of the payload, so the block checksum covers them and they move with
// it. The numeric values are part of the canonical namespace encoding.
type Scales uint8

const (
	NoScales Scales = iota
	ScalesPerBlock
	ScalesPerHead
	numScales
)

var scalesNames = [...]string{"none", "block", "head"}

// String returns the canonical name ("none", "block", "head").
func (s Scales) String() string {
	if s < numScales {
		return scalesNames[s]
	}
	return fmt.Sprintf("scales(%d)", uint8(s))
}

// ParseScales parses a canonical scales name as returned by String.
func ParseScales(s string) (Scales, error) {
	for i, n := range scalesNames {
		if strings.EqualFold(s, n) {
			return Scales(i), nil
		}
	}
	return 0, fmt.Errorf("prefixhash: unknown scales %q (want one of %s)", s, strings.Join(scalesNames[:], ", "))
}

// KeyScheme is how block keys are derived from a namespace, tokens and extra
// keys. The numeric values are part of the canonical namespace encoding.
type KeyScheme uint8

const (
	// SchemeKVMesh is kvmesh's own chain (KeyVersion 2): k_0 = trunc128(SHA-256(encoding)),
	// k_i = trunc128(SHA-256(k_{i-1} ‖ tokens ‖ extra keys)). The default.
	SchemeKVMesh KeyScheme = iota
	// SchemeVLLM is vLLM's block hash with its sha256_cbor function:
	// h_i = SHA-256(CBOR([h_{i-1}, [tokens...], extra keys or null])) over
	// 32-byte hashes, h_{-1} = SHA-256(CBOR(hash seed)) (vLLM's NONE_HASH,
	// from PYTHONHASHSEED). A block's key is the first 16 bytes of h_i, so
	// the hashes vLLM publishes in its KV events name kvmesh blocks. See
	// vllm.go.
	SchemeVLLM
	numSchemes
)

var schemeNames = [...]string{"kvmesh", "vllm"}

// String returns the canonical name ("kvmesh", "vllm").
func (s KeyScheme) String() string {
	if s < numSchemes {
		return schemeNames[s]
	}
	return fmt.Sprintf("scheme(%d)", uint8(s))
}

// ParseKeyScheme parses a canonical scheme name as returned by String.
func ParseKeyScheme(s string) (KeyScheme, error) {
	for i, n := range schemeNames {
		if strings.EqualFold(s, n) {
			return KeyScheme(i), nil
		}
	}
	return 0, fmt.Errorf("prefixhash: unknown key scheme %q (want one of %s)", s, strings.Join(schemeNames[:], ", "))
}

// Namespace identifies the producer of KV blocks: two blocks are
// interchangeable only when their namespaces are equal. The zero value is
// invalid; see Validate.
type Namespace struct {
	// Model is the model id, for example "meta-llama/Llama-3.1-8B". Required.
	Model string
	// DType is the element type of the cached K and V tensors. Required.
	DType DType
	// BlockTokens is B, the number of tokens per block. Required, 1..65536.
	BlockTokens int
	// Layers is the model's number of attention layers, all of them: a
	// block holds every layer of its tokens, whichever pipeline stages
	// wrote it (a stage's layers are a part of the block, named per call:
	// block.Part). Required, 1..MaxLayers.
	Layers int
	// KVHeads is the model's number of key/value heads, all of them: a
	// tensor-parallel rank's heads are a part of the block, named per call,
	// not a property of the namespace. Required with SplitKV, zero with
	// LatentKV.
	KVHeads int
	// HeadDim is the size of one head. Required with SplitKV, zero with
	// LatentKV.
	HeadDim int
	// Layout is the KV layout: SplitKV (the zero value) or LatentKV.
	Layout KVLayout
	// LatentDim is the width of one token's latent vector in one layer
	// (LatentKV only, where it is required; 576 for DeepSeek-V3).
	LatentDim int
	// Scales says whether a quantised payload carries scales (fp8 and int8
	// dtypes only). Default NoScales.
	Scales Scales
	// TenantSalt, when set, separates tenants: two tenants with different
	// salts never share a key, so neither can probe the other's prefixes.
	TenantSalt string
	// LoRA is the LoRA adapter id, empty for the base model: blocks of
	// different adapters never share a key. At most 256 bytes.
	LoRA string
	// Scheme is the key scheme. Default SchemeKVMesh.
	Scheme KeyScheme
	// HashSeed is vLLM's PYTHONHASHSEED for SchemeVLLM, where it is
	// required: it fixes vLLM's root hash (NONE_HASH), which a vLLM started
	// without PYTHONHASHSEED draws at random per process. Empty otherwise.
	HashSeed string
	// ExtraKeyBytes is the room every block of the namespace reserves for
	// the caller's extra keys, each costing 4 bytes plus its length; 0 (the
	// default) means its blocks carry none. A store keeps one encoded size
	// per namespace, so the room is the namespace's, not the block's. At
	// most MaxExtraRoom.
	ExtraKeyBytes int
	// Groups, when set, describe a hybrid model's cache as groups (full
	// attention, sliding window, recurrent state, indexer; see Group), each
	// with its layers and layout; the namespace's own KVHeads, HeadDim,
	// LatentDim, Layout and Scales are then unset. Block i of a prompt is
	// then one record per group, group g's under GroupKey(k_i, g). Zero
	// (the default): the namespace is one kind of block, as before groups.
	Groups Groups
}

// ErrInvalidNamespace is wrapped by every error Validate returns.
var ErrInvalidNamespace = errors.New("prefixhash: invalid namespace")

// Validate reports the first field that makes ns unusable.
func (ns Namespace) Validate() error {
	bad := func(field, format string, args ...any) error {
		return fmt.Errorf("%w: %s: %s", ErrInvalidNamespace, field, fmt.Sprintf(format, args...))
	}
	switch {
	case ns.Model == "":
		return bad("model", "must not be empty")
	case len(ns.Model) > MaxModelLen:
		return bad("model", "%d bytes, the limit is %d", len(ns.Model), MaxModelLen)
	case ns.DType == DTypeInvalid || ns.DType.Size() == 0:
		return bad("dtype", "unknown dtype %d", uint8(ns.DType))
	case ns.BlockTokens < 1 || ns.BlockTokens > MaxBlockTokens:
		return bad("block_tokens", "%d is outside 1..%d", ns.BlockTokens, MaxBlockTokens)
	case ns.Layers < 1 || ns.Layers > MaxLayers:
		return bad("layers", "%d is outside 1..%d", ns.Layers, MaxLayers)
	}
	if err := ns.validateGroups(bad); err != nil {
		return err
	}
	if ns.Groups.IsZero() {
		if err := ns.validateShape(bad, ""); err != nil {
			return err
		}
	}
	switch {
	case len(ns.TenantSalt) > MaxSaltLen:
		return bad("tenant_salt", "%d bytes, the limit is %d", len(ns.TenantSalt), MaxSaltLen)
	case len(ns.LoRA) > MaxLoRALen:
		return bad("lora", "%d bytes, the limit is %d", len(ns.LoRA), MaxLoRALen)
	case ns.Scheme >= numSchemes:
		return bad("key_scheme", "unknown key scheme %d (want kvmesh or vllm)", uint8(ns.Scheme))
	case ns.Scheme == SchemeVLLM && ns.HashSeed == "":
		return bad("hash_seed", "the vllm key scheme needs vLLM's PYTHONHASHSEED (without it vLLM's root hash is random)")
	case ns.Scheme != SchemeVLLM && ns.HashSeed != "":
		return bad("hash_seed", "set with the %s key scheme, which has no seed", ns.Scheme)
	case len(ns.HashSeed) > MaxSeedLen:
		return bad("hash_seed", "%d bytes, the limit is %d", len(ns.HashSeed), MaxSeedLen)
	case ns.ExtraKeyBytes < 0 || ns.ExtraKeyBytes > MaxExtraRoom:
		return bad("extra_key_bytes", "%d is outside 0..%d", ns.ExtraKeyBytes, MaxExtraRoom)
	}
	return nil
}

// validateShape checks the KV shape fields (layout, heads, dims, scales) of
// ns, or of a group seen as a namespace, naming fields after prefix.
func (ns Namespace) validateShape(bad func(field, format string, args ...any) error, prefix string) error {
	switch {
	case ns.Layout >= StateKV:
		return bad(prefix+"kv_layout", "unknown layout %d (want split or latent; state is a state group's)", uint8(ns.Layout))
	case ns.Layout == SplitKV && ns.KVHeads < 1:
		return bad(prefix+"kv_heads", "%d must be at least 1", ns.KVHeads)
	case ns.Layout == SplitKV && ns.HeadDim < 1:
		return bad(prefix+"head_dim", "%d must be at least 1", ns.HeadDim)
	case ns.Layout == SplitKV && ns.LatentDim != 0:
		return bad(prefix+"latent_dim", "%d set with the split layout (the latent layout uses it)", ns.LatentDim)
	case ns.Layout == LatentKV && ns.LatentDim < 1:
		return bad(prefix+"latent_dim", "%d must be at least 1 with the latent layout", ns.LatentDim)
	case ns.Layout == LatentKV && (ns.KVHeads != 0 || ns.HeadDim != 0):
		return bad(prefix+"kv_heads", "kv_heads %d and head_dim %d must be 0 with the latent layout (latent_dim sizes it)", ns.KVHeads, ns.HeadDim)
	case ns.KVHeads < 0 || ns.HeadDim < 0 || ns.LatentDim < 0 || ns.KVHeads > 1<<20 || ns.HeadDim > 1<<20 || ns.LatentDim > 1<<20:
		return bad(prefix+"kv_heads", "kv_heads %d, head_dim %d, latent_dim %d out of range", ns.KVHeads, ns.HeadDim, ns.LatentDim)
	case ns.Scales >= numScales:
		return bad(prefix+"scales", "unknown scales %d (want none, block or head)", uint8(ns.Scales))
	case ns.Scales != NoScales && ns.DType.Size() != 1:
		return bad(prefix+"scales", "%s payloads carry no scales (only fp8 and int8 do)", ns.DType)
	case ns.Scales == ScalesPerHead && ns.Layout == LatentKV:
		return bad(prefix+"scales", "per-head scales with the latent layout, which has no heads")
	}
	return nil
}

// BlockBytes returns the size of one block's payload in bytes: its KV bytes
// (KVBytes) followed by its scales (ScaleCount float32s). A namespace with
// groups has no one block size: see GroupBytes.
func (ns Namespace) BlockBytes() int {
	return ns.KVBytes() + 4*ns.ScaleCount()
}

// GroupBytes returns the payload size of group g's record of one block
// (Group.RecordBytes).
func (ns Namespace) GroupBytes(g int) int {
	return ns.Groups.At(g).RecordBytes(ns.BlockTokens)
}

// KVBytes returns the size of one block's KV tensors in bytes:
// layers × {K,V} × BlockTokens × KVHeads × HeadDim × dtype size (SplitKV),
// or layers × BlockTokens × LatentDim × dtype size (LatentKV).
func (ns Namespace) KVBytes() int {
	if ns.Layout == LatentKV {
		return ns.Layers * ns.BlockTokens * ns.LatentDim * ns.DType.Size()
	}
	return ns.Layers * 2 * ns.BlockTokens * ns.KVHeads * ns.HeadDim * ns.DType.Size()
}

// ScaleCount returns the number of float32 scales after a block's KV bytes:
// 0 without scales; layers × 2 (SplitKV) or layers (LatentKV) per block;
// layers × 2 × KVHeads per head.
func (ns Namespace) ScaleCount() int {
	parts := 2
	if ns.Layout == LatentKV {
		parts = 1
	}
	switch ns.Scales {
	case ScalesPerBlock:
		return ns.Layers * parts
	case ScalesPerHead:
		return ns.Layers * parts * ns.KVHeads
	}
	return 0
}

// encodingMagic versions the canonical encoding. Changing the encoding
// changes every key; the golden test exists to make that loud. v2 came with
// KeyVersion 2 (SHA-256), so that no v1 root or digest can match a v2 one;
// v3 with KeyVersion 3, which took the parallel layout (tensor-parallel
// rank and size, a pipeline stage's layer range) out of the namespace.
const encodingMagic = "kvmesh/ns/v3"

// Tags of the optional fields that follow the base encoding, in this order,
// each only when it differs from its default: so a namespace that sets none
// of them encodes (and keys) exactly as before they existed.
const (
	tagLayout = 1 // u8 layout ‖ u32 latent_dim
	tagLoRA   = 2 // string(lora)
	tagScales = 3 // u8 scales
	tagScheme = 4 // u8 scheme ‖ string(hash_seed)
	tagExtra  = 5 // u32 extra_key_bytes
	tagGroups = 6 // u8 count ‖ each group's encoding (appendGroup)
)

// AppendEncoding appends the canonical encoding of ns to b. Strings are
// length-prefixed and integers fixed-width little-endian, so distinct
// namespaces never encode alike. Optional fields
// follow the base fields as tag ‖ value, in tag order, only when set; the
// base fields end with a length-prefixed string, so the extension is never
// ambiguous.
func (ns Namespace) AppendEncoding(b []byte) []byte {
	b = appendString(b, encodingMagic)
	b = appendString(b, ns.Model)
	b = append(b, byte(ns.DType))
	b = binary.LittleEndian.AppendUint32(b, uint32(ns.BlockTokens))
	b = binary.LittleEndian.AppendUint32(b, uint32(ns.Layers))
	b = binary.LittleEndian.AppendUint32(b, uint32(ns.KVHeads))
	b = binary.LittleEndian.AppendUint32(b, uint32(ns.HeadDim))
	b = appendString(b, ns.TenantSalt)
	if ns.Layout != SplitKV || ns.LatentDim != 0 {
		b = append(b, tagLayout, byte(ns.Layout))
		b = binary.LittleEndian.AppendUint32(b, uint32(ns.LatentDim))
	}
	if ns.LoRA != "" {
		b = append(b, tagLoRA)
		b = appendString(b, ns.LoRA)
	}
	if ns.Scales != NoScales {
		b = append(b, tagScales, byte(ns.Scales))
	}
	if ns.Scheme != SchemeKVMesh || ns.HashSeed != "" {
		b = append(b, tagScheme, byte(ns.Scheme))
		b = appendString(b, ns.HashSeed)
	}
	if ns.ExtraKeyBytes != 0 {
		b = append(b, tagExtra)
		b = binary.LittleEndian.AppendUint32(b, uint32(ns.ExtraKeyBytes))
	}
	if !ns.Groups.IsZero() {
		b = append(b, tagGroups)
		b = append(b, ns.Groups.enc...)
	}
	return b
}

func appendString(b []byte, s string) []byte {
	b = binary.LittleEndian.AppendUint32(b, uint32(len(s)))
	return append(b, s...)
}

// Digest returns the stable 64-bit digest of the namespace: the first 8
// bytes, little-endian, of SHA-256 of its canonical encoding. Block headers
// carry it so that a reader can reject a block from another namespace without
// knowing the namespace itself.
func (ns Namespace) Digest() uint64 {
	var buf [256]byte
	sum := sha256.Sum256(ns.AppendEncoding(buf[:0]))
	return binary.LittleEndian.Uint64(sum[:8])
}

// Root returns the key that seeds every chain of ns: k_0 =
// trunc128(SHA-256(canonical encoding)) under SchemeKVMesh, the first 16
// bytes of vLLM's NONE_HASH under SchemeVLLM (see RootLink).
func (ns Namespace) Root() Key {
	if ns.Scheme == SchemeVLLM {
		return ns.RootLink().Key()
	}
	var buf [256]byte
	return hashBytes(ns.AppendEncoding(buf[:0]))
}

// String is a short human form:
// model/dtype/B/layers/kv shape[/scales][/lora][/scheme][/salted].
func (ns Namespace) String() string {
	shape := fmt.Sprintf("kv%dx%d", ns.KVHeads, ns.HeadDim)
	if ns.Layout != SplitKV {
		shape = fmt.Sprintf("%s%d", ns.Layout, ns.LatentDim)
	}
	if !ns.Groups.IsZero() {
		shape = "groups[" + ns.Groups.String() + "]"
	}
	s := fmt.Sprintf("%s/%s/b%d/l%d/%s", ns.Model, ns.DType, ns.BlockTokens, ns.Layers, shape)
	if ns.Scales != NoScales {
		s += "/scales-" + ns.Scales.String()
	}
	if ns.LoRA != "" {
		s += "/lora-" + ns.LoRA
	}
	if ns.Scheme != SchemeKVMesh {
		s += "/" + ns.Scheme.String()
	}
	if ns.ExtraKeyBytes != 0 {
		s += fmt.Sprintf("/xk%d", ns.ExtraKeyBytes)
	}
	if ns.TenantSalt != "" {
		s += "/salted"
	}
	return s
}
