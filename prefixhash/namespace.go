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
	MaxBlockTokens = 1 << 16
)

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
	// LayerStart and LayerEnd are the half-open range of layers a block
	// holds (pipeline-parallel stages cache different ranges). LayerEnd > LayerStart.
	LayerStart, LayerEnd int
	// KVHeads is the number of key/value heads this rank holds. Required.
	KVHeads int
	// HeadDim is the size of one head. Required.
	HeadDim int
	// TPRank and TPSize describe tensor parallelism: 0 <= TPRank < TPSize.
	// TPSize 0 is read as 1.
	TPRank, TPSize int
	// TenantSalt, when set, separates tenants: two tenants with different
	// salts never share a key, so neither can probe the other's prefixes.
	TenantSalt string
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
	case ns.LayerStart < 0 || ns.LayerEnd <= ns.LayerStart:
		return bad("layers", "range [%d,%d) is empty or negative", ns.LayerStart, ns.LayerEnd)
	case ns.KVHeads < 1:
		return bad("kv_heads", "%d must be at least 1", ns.KVHeads)
	case ns.HeadDim < 1:
		return bad("head_dim", "%d must be at least 1", ns.HeadDim)
	case ns.TPSize < 0 || ns.TPRank < 0 || ns.TPRank >= max(ns.TPSize, 1):
		return bad("tp", "rank %d of size %d", ns.TPRank, ns.TPSize)
	case len(ns.TenantSalt) > MaxSaltLen:
		return bad("tenant_salt", "%d bytes, the limit is %d", len(ns.TenantSalt), MaxSaltLen)
	}
	return nil
}

// Layers returns the number of layers a block holds.
func (ns Namespace) Layers() int { return ns.LayerEnd - ns.LayerStart }

// BlockBytes returns the size of one block's K/V payload in bytes:
// layers × {K,V} × BlockTokens × KVHeads × HeadDim × dtype size.
func (ns Namespace) BlockBytes() int {
	return ns.Layers() * 2 * ns.BlockTokens * ns.KVHeads * ns.HeadDim * ns.DType.Size()
}

// encodingMagic versions the canonical encoding. Changing the encoding
// changes every key; the golden test exists to make that loud. v2 came with
// KeyVersion 2 (SHA-256), so that no v1 root or digest can match a v2 one.
const encodingMagic = "kvmesh/ns/v2"

// AppendEncoding appends the canonical encoding of ns to b. Strings are
// length-prefixed and integers fixed-width little-endian, so distinct
// namespaces never encode alike. TPSize 0 encodes as 1.
func (ns Namespace) AppendEncoding(b []byte) []byte {
	b = appendString(b, encodingMagic)
	b = appendString(b, ns.Model)
	b = append(b, byte(ns.DType))
	b = binary.LittleEndian.AppendUint32(b, uint32(ns.BlockTokens))
	b = binary.LittleEndian.AppendUint32(b, uint32(ns.LayerStart))
	b = binary.LittleEndian.AppendUint32(b, uint32(ns.LayerEnd))
	b = binary.LittleEndian.AppendUint32(b, uint32(ns.KVHeads))
	b = binary.LittleEndian.AppendUint32(b, uint32(ns.HeadDim))
	b = binary.LittleEndian.AppendUint32(b, uint32(ns.TPRank))
	b = binary.LittleEndian.AppendUint32(b, uint32(max(ns.TPSize, 1)))
	b = appendString(b, ns.TenantSalt)
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
	var buf [128]byte
	sum := sha256.Sum256(ns.AppendEncoding(buf[:0]))
	return binary.LittleEndian.Uint64(sum[:8])
}

// Root returns k_0 = trunc128(SHA-256(canonical encoding)), the key that
// seeds every chain of ns.
func (ns Namespace) Root() Key {
	var buf [128]byte
	return hashBytes(ns.AppendEncoding(buf[:0]))
}

// String is a short human form: model/dtype/B/layers/tp[/salted].
func (ns Namespace) String() string {
	s := fmt.Sprintf("%s/%s/b%d/l%d-%d/kv%dx%d/tp%d-%d", ns.Model, ns.DType, ns.BlockTokens,
		ns.LayerStart, ns.LayerEnd, ns.KVHeads, ns.HeadDim, ns.TPRank, max(ns.TPSize, 1))
	if ns.TenantSalt != "" {
		s += "/salted"
	}
	return s
}
