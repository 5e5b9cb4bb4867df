package block

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math/bits"
	"unsafe"

	"github.com/cespare/xxhash/v2"

	"github.com/kvmesh/kvmesh/prefixhash"
)

// The encoded block: a header, then the payload. All integers are
// little-endian. The header is padded to a multiple of 64 bytes so that the
// payload of a block in an aligned buffer is itself aligned (a reader can view
// it as []float32 without copying).
//
//	off  size  field
//	  0     4  magic "KVMB"
//	  4     2  format version (2)
//	  6     1  key format version (prefixhash.KeyVersion)
//	  7     1  reserved, zero
//	  8     4  header length (fixed part + tokens + padding)
//	 12     4  token count n
//	 16     8  namespace digest
//	 24    16  key
//	 40    16  parent key
//	 56     1  KV dtype
//	 57     3  reserved, zero
//	 60     4  layer start
//	 64     4  layer end
//	 68     4  KV heads
//	 72     4  head dim
//	 76     4  reserved, zero
//	 80     8  payload length
//	 88     8  xxhash64 of the payload
//	 96     8  tenant tag (0: no tenant)
//	104     8  xxhash64 of bytes [0,104) and of the n tokens
//	112    4n  token ids
//	  …        zero padding to the header length
//
// Version 1 (a 104-byte fixed header, no key format, no tenant) was written
// under xxhash64 keys; its blocks, and blocks of any other key format, fail
// to decode: their keys mean nothing under this build's key format.
const (
	blockMagic = "KVMB"
	// Version is the block format version this build writes and reads.
	Version = 2
	// FixedHeaderLen is the length of the header's fixed part: no encoded
	// block is shorter.
	FixedHeaderLen = 112
	headerSumOff   = 104
	headerAlign    = 64
)

// Errors of the block format. Decoding errors wrap ErrCorrupt: the bytes are
// not a block kvmesh may serve, whatever the reason. ErrOtherFormat (which
// wraps ErrCorrupt) marks a block written under another block or key format
// version, such as one left on disk by an older kvmesh.
var (
	ErrCorrupt     = errors.New("block: corrupt block")
	ErrTooLarge    = errors.New("block: too large")
	ErrOtherFormat = fmt.Errorf("%w: another block or key format", ErrCorrupt)
	// ErrTokens (wrapping ErrCorrupt) marks a block whose stored tokens are
	// not the ones a reader by tokens asked for.
	ErrTokens = fmt.Errorf("%w: stored tokens differ from the tokens asked for", ErrCorrupt)
)

// Layout is the shape of a block's payload, [layer][K|V][token][kv_head][head_dim].
type Layout struct {
	DType                prefixhash.DType
	LayerStart, LayerEnd int
	KVHeads, HeadDim     int
}

// LayoutOf returns the payload layout of blocks of ns.
func LayoutOf(ns prefixhash.Namespace) Layout {
	return Layout{DType: ns.DType, LayerStart: ns.LayerStart, LayerEnd: ns.LayerEnd, KVHeads: ns.KVHeads, HeadDim: ns.HeadDim}
}

// PayloadLen returns the payload size of a block of tokens tokens, or -1 if
// the layout is not valid.
func (l Layout) PayloadLen(tokens int) int {
	if l.DType.Size() == 0 || l.LayerEnd <= l.LayerStart || l.LayerStart < 0 || l.KVHeads < 1 || l.HeadDim < 1 || tokens < 1 {
		return -1
	}
	n := uint64(1)
	for _, f := range []uint64{uint64(l.LayerEnd - l.LayerStart), 2, uint64(tokens), uint64(l.KVHeads), uint64(l.HeadDim), uint64(l.DType.Size())} {
		hi, lo := bits.Mul64(n, f)
		if hi != 0 || lo > 1<<40 {
			return -1 // absurd layouts must not wrap into plausible sizes
		}
		n = lo
	}
	return int(n)
}

// Header is a decoded block header.
type Header struct {
	Namespace   uint64 // digest of the producing namespace
	Key, Parent prefixhash.Key
	Layout      Layout
	// Tokens are the block's token ids. After Decode they may alias the
	// decoded buffer: same lifetime as it.
	Tokens     []uint32
	PayloadLen int
	Checksum   uint64 // xxhash64 of the payload
	// Tenant is the tag of the tenant that wrote the block (0: no tenant,
	// an open or single-tenant node). The format carries it; enforcing it
	// is the caller's business.
	Tenant uint64
}

// Block is a decoded, verified block. Payload (and possibly Tokens) alias the
// buffer it was decoded from and live as long as it.
type Block struct {
	Header
	Payload []byte
}

// HeaderLen returns the encoded header length of a block of n tokens.
func HeaderLen(n int) int {
	return (FixedHeaderLen + 4*n + headerAlign - 1) / headerAlign * headerAlign
}

// EncodedLen returns the size of an encoded block of n tokens and payloadLen
// payload bytes.
func EncodedLen(n, payloadLen int) int { return HeaderLen(n) + payloadLen }

// CheckNamespace reports whether h was produced under ns: digest, layout and
// block size must all agree.
func (h *Header) CheckNamespace(ns prefixhash.Namespace) error {
	switch {
	case h.Namespace != ns.Digest():
		return fmt.Errorf("%w: namespace digest %016x, want %016x (%s)", ErrCorrupt, h.Namespace, ns.Digest(), ns)
	case h.Layout != LayoutOf(ns):
		return fmt.Errorf("%w: layout %+v does not match namespace %s", ErrCorrupt, h.Layout, ns)
	case len(h.Tokens) != ns.BlockTokens:
		return fmt.Errorf("%w: %d tokens, namespace blocks hold %d", ErrCorrupt, len(h.Tokens), ns.BlockTokens)
	}
	return nil
}

// CheckTokens reports whether h is the block of tokens chained from parent:
// every read by tokens calls it, so that what it serves holds the tokens it
// was asked for, whatever the key says. The key already commits to both
// through a collision-resistant hash; this is the check that does not rest
// on it.
func (h *Header) CheckTokens(parent prefixhash.Key, tokens []uint32) error {
	if h.Parent != parent {
		return fmt.Errorf("%w: parent %s, want %s", ErrTokens, h.Parent, parent)
	}
	if len(h.Tokens) != len(tokens) {
		return fmt.Errorf("%w: %d tokens, want %d", ErrTokens, len(h.Tokens), len(tokens))
	}
	for i, t := range tokens {
		if h.Tokens[i] != t {
			return fmt.Errorf("%w: token %d is %d, want %d", ErrTokens, i, h.Tokens[i], t)
		}
	}
	return nil
}

// AppendHeader appends the header of the block of ns that holds tokens,
// chained from parent, with the given payload, and returns the extended
// buffer and the block's key. Encoding a block is AppendHeader followed by the
// payload bytes; callers that send the payload from elsewhere (a vectored
// write) use AppendHeader alone. ns must be valid, len(tokens) must be
// ns.BlockTokens and len(payload) must be ns.BlockBytes(). The header's
// tenant tag is 0; AppendHeaderTenant sets it.
func AppendHeader(dst []byte, ns prefixhash.Namespace, parent prefixhash.Key, tokens []uint32, payload []byte) ([]byte, prefixhash.Key, error) {
	return AppendHeaderTenant(dst, 0, ns, parent, tokens, payload)
}

// AppendHeaderTenant is AppendHeader with the tag of the tenant writing the
// block.
func AppendHeaderTenant(dst []byte, tenant uint64, ns prefixhash.Namespace, parent prefixhash.Key, tokens []uint32, payload []byte) ([]byte, prefixhash.Key, error) {
	if err := ns.Validate(); err != nil {
		return dst, prefixhash.Key{}, err
	}
	if len(tokens) != ns.BlockTokens {
		return dst, prefixhash.Key{}, fmt.Errorf("block: block has %d tokens, namespace blocks hold %d", len(tokens), ns.BlockTokens)
	}
	if len(payload) != ns.BlockBytes() {
		return dst, prefixhash.Key{}, fmt.Errorf("block: payload is %d bytes, namespace blocks hold %d", len(payload), ns.BlockBytes())
	}
	key := prefixhash.BlockKey(parent, tokens)
	hl := HeaderLen(len(tokens))
	start := len(dst)
	dst = append(dst, make([]byte, hl)...)
	h := dst[start:]
	copy(h[0:4], blockMagic)
	binary.LittleEndian.PutUint16(h[4:], Version)
	h[6] = prefixhash.KeyVersion
	binary.LittleEndian.PutUint32(h[8:], uint32(hl))
	binary.LittleEndian.PutUint32(h[12:], uint32(len(tokens)))
	binary.LittleEndian.PutUint64(h[16:], ns.Digest())
	copy(h[24:40], key[:])
	copy(h[40:56], parent[:])
	h[56] = byte(ns.DType)
	binary.LittleEndian.PutUint32(h[60:], uint32(ns.LayerStart))
	binary.LittleEndian.PutUint32(h[64:], uint32(ns.LayerEnd))
	binary.LittleEndian.PutUint32(h[68:], uint32(ns.KVHeads))
	binary.LittleEndian.PutUint32(h[72:], uint32(ns.HeadDim))
	binary.LittleEndian.PutUint64(h[80:], uint64(len(payload)))
	binary.LittleEndian.PutUint64(h[88:], xxhash.Sum64(payload))
	binary.LittleEndian.PutUint64(h[96:], tenant)
	for i, t := range tokens {
		binary.LittleEndian.PutUint32(h[FixedHeaderLen+4*i:], t)
	}
	binary.LittleEndian.PutUint64(h[headerSumOff:], headerSum(h, len(tokens)))
	return dst, key, nil
}

// Encode appends the whole encoded block (header and payload) to dst, with
// tenant tag 0.
func Encode(dst []byte, ns prefixhash.Namespace, parent prefixhash.Key, tokens []uint32, payload []byte) ([]byte, prefixhash.Key, error) {
	return EncodeTenant(dst, 0, ns, parent, tokens, payload)
}

// EncodeTenant is Encode with the tag of the tenant writing the block.
func EncodeTenant(dst []byte, tenant uint64, ns prefixhash.Namespace, parent prefixhash.Key, tokens []uint32, payload []byte) ([]byte, prefixhash.Key, error) {
	dst, key, err := AppendHeaderTenant(dst, tenant, ns, parent, tokens, payload)
	if err != nil {
		return dst, key, err
	}
	return append(dst, payload...), key, nil
}

func headerSum(h []byte, n int) uint64 {
	var d xxhash.Digest
	d.Reset()
	d.Write(h[:headerSumOff])
	d.Write(h[FixedHeaderLen : FixedHeaderLen+4*n])
	return d.Sum64()
}

func corrupt(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrCorrupt, fmt.Sprintf(format, args...))
}

// DecodeHeader parses and verifies the header at the start of b: magic,
// format and key format versions, lengths, layout, header checksum, and that
// the key is H(parent ‖ tokens). It does not read the payload. maxPayload
// bounds the payload length the caller accepts (ErrTooLarge beyond it).
func DecodeHeader(b []byte, maxPayload int) (Header, error) {
	var h Header
	// The version comes before the length check: a version-1 header is
	// shorter, and must be reported as one.
	if len(b) >= 8 && string(b[0:4]) == blockMagic {
		if err := checkVersions(binary.LittleEndian.Uint16(b[4:]), b[6]); err != nil {
			return h, err
		}
	}
	if len(b) < FixedHeaderLen {
		return h, corrupt("%d bytes, shorter than a header", len(b))
	}
	if string(b[0:4]) != blockMagic {
		return h, corrupt("bad magic %q", b[0:4])
	}
	hl := uint64(binary.LittleEndian.Uint32(b[8:]))
	n := uint64(binary.LittleEndian.Uint32(b[12:]))
	if n == 0 || n > prefixhash.MaxBlockTokens || hl != uint64(HeaderLen(int(n))) {
		return h, corrupt("header length %d for %d tokens", hl, n)
	}
	if uint64(len(b)) < hl {
		return h, corrupt("%d bytes, header needs %d", len(b), hl)
	}
	if got, want := binary.LittleEndian.Uint64(b[headerSumOff:]), headerSum(b, int(n)); got != want {
		return h, corrupt("header checksum %016x, computed %016x", got, want)
	}
	h.Namespace = binary.LittleEndian.Uint64(b[16:])
	copy(h.Key[:], b[24:40])
	copy(h.Parent[:], b[40:56])
	h.Layout = Layout{
		DType:      prefixhash.DType(b[56]),
		LayerStart: int(binary.LittleEndian.Uint32(b[60:])),
		LayerEnd:   int(binary.LittleEndian.Uint32(b[64:])),
		KVHeads:    int(binary.LittleEndian.Uint32(b[68:])),
		HeadDim:    int(binary.LittleEndian.Uint32(b[72:])),
	}
	pl := binary.LittleEndian.Uint64(b[80:])
	want := h.Layout.PayloadLen(int(n))
	if want < 0 || pl != uint64(want) {
		return h, corrupt("payload length %d does not match layout %+v of %d tokens", pl, h.Layout, n)
	}
	if maxPayload > 0 && pl > uint64(maxPayload) {
		return h, fmt.Errorf("%w: payload %d bytes, limit %d", ErrTooLarge, pl, maxPayload)
	}
	h.PayloadLen = int(pl)
	h.Checksum = binary.LittleEndian.Uint64(b[88:])
	h.Tenant = binary.LittleEndian.Uint64(b[96:])
	h.Tokens = viewTokens(b[FixedHeaderLen : FixedHeaderLen+4*n])
	if prefixhash.BlockKey(h.Parent, h.Tokens) != h.Key {
		return h, corrupt("key %s is not H(parent ‖ tokens)", h.Key)
	}
	return h, nil
}

// checkVersions accepts only this build's block and key formats. Version 1
// blocks predate key format versions: they were keyed by xxhash64.
func checkVersions(format uint16, keys byte) error {
	if format == Version && keys == prefixhash.KeyVersion {
		return nil
	}
	if format == 1 {
		keys = 1
	}
	age, what := "an older", "key format"
	if format > Version || (format == Version && keys > prefixhash.KeyVersion) {
		age = "a newer"
	}
	if keys == prefixhash.KeyVersion {
		what = "block format"
	}
	return fmt.Errorf("%w: format version %d, key format %d: written by %s kvmesh under a different %s (this build: format %d, key format %d)",
		ErrOtherFormat, format, keys, age, what, Version, prefixhash.KeyVersion)
}

// Decode parses and verifies a whole encoded block: the header as in
// DecodeHeader, the exact length, and the payload checksum. The returned
// block aliases b.
func Decode(b []byte, maxPayload int) (Block, error) {
	h, err := DecodeHeader(b, maxPayload)
	if err != nil {
		return Block{}, err
	}
	hl := HeaderLen(len(h.Tokens))
	if len(b) != hl+h.PayloadLen {
		return Block{}, corrupt("%d bytes, header says %d", len(b), hl+h.PayloadLen)
	}
	payload := b[hl:]
	if sum := xxhash.Sum64(payload); sum != h.Checksum {
		return Block{}, corrupt("payload checksum %016x, computed %016x", h.Checksum, sum)
	}
	return Block{Header: h, Payload: payload}, nil
}

// Tenant returns the tenant tag of the verified block b.
func Tenant(b []byte) uint64 { return binary.LittleEndian.Uint64(b[96:]) }

// viewTokens returns the little-endian uint32s in b, aliasing b when the
// machine is little-endian and b is 4-byte aligned, copying otherwise.
func viewTokens(b []byte) []uint32 {
	n := len(b) / 4
	if n == 0 {
		return nil
	}
	if littleEndian && uintptr(unsafe.Pointer(&b[0]))%4 == 0 {
		return unsafe.Slice((*uint32)(unsafe.Pointer(&b[0])), n)
	}
	t := make([]uint32, n)
	for i := range t {
		t[i] = binary.LittleEndian.Uint32(b[4*i:])
	}
	return t
}

var littleEndian = func() bool {
	x := uint16(1)
	return *(*byte)(unsafe.Pointer(&x)) == 1
}()
