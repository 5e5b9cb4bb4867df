package block

import (
	"encoding/binary"
	"errors"
	"fmt"
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
//	  4     2  format version (4)
//	  6     1  key format version (prefixhash.KeyVersion)
//	  7     1  KV layout (0 split, 1 latent, 2 state; 0xFF marks an object record, object.go)
//	  8     4  header length (fixed part + tokens + extension + padding)
//	 12     4  token count n
//	 16     8  namespace digest
//	 24    16  key
//	 40    16  parent key
//	 56     1  KV dtype
//	 57     1  key scheme (0 kvmesh, 1 vllm)
//	 58     1  scales (0 none, 1 per block, 2 per head)
//	 59     1  group: 0 in a namespace without groups, else g+1 for
//	           group g's record of the block (see Group)
//	 60     4  layers (the model's)
//	 64     4  KV heads (the model's; 0 with the latent layout)
//	 68     4  head dim (0 with the latent layout)
//	 72     4  latent dim (0 with the split layout); with the state
//	           layout, the bytes of one head's state in one layer
//	 76     1  group kind + 1 (0 without a group)
//	 77     1  anchor group + 1 (0: none, or not a sliding or state record)
//	 78     2  window in blocks (sliding groups; else 0)
//	 80     8  payload length (of this record: a part's, for a part)
//	 88     8  xxhash64 of the payload
//	 96     8  tenant tag (0: no tenant)
//	104     4  part: first layer
//	108     4  part: layer end (excluded)
//	112     4  part: first head
//	116     4  part: head end (excluded; latent: the one "head" [0,1))
//	120     8  xxhash64 of bytes [0,120), of the n tokens and of the extension
//	128    4n  token ids
//	  …     4  extension length X, then X bytes: the parent's 32-byte link
//	           (key scheme vllm only), u32 extra key count m, m × (u32 length
//	           ‖ bytes): the extra keys the block's key covers, then zeros
//	           to X. X is the namespace's (Namespace.ExtensionRoom), so every
//	           block of a namespace has one encoded size, as the store needs.
//	  …        zero padding to the header length
//
// A namespace with groups (prefixhash.Groups, hybrid models) stores one
// record per group of each block: its header names the group, its kind,
// the group its record hangs from in a store (the namespace's anchor, for
// sliding and state records) and a sliding group's window; the key field
// holds the record's key prefixhash.GroupKey(k_i, g) (k_i = H(parent ‖
// tokens ‖ extra keys) as for any block, which is what Decode checks); the
// layout fields describe the group's payload, whose layers are the group's
// (in its order). A header without a group has zeros in bytes 59 and
// 76-79, as before groups, so blocks on disk stay valid. A state record's
// payload is [layer][head][state_bytes], whatever the tokens.
//
// The payload is the KV bytes, then the scales when the layout has them
// (float32, see prefixhash.Scales): the payload checksum covers both. The
// split layout's KV bytes are [layer][kv_head][K|V][token][head_dim], so
// that the heads of one tensor-parallel rank in one layer are one
// contiguous run; the latent layout's are [layer][token][latent_dim].
// Scales are [layer][K|V] per block ([layer] latent) and
// [layer][kv_head][K|V] per head.
//
// A record whose part range is less than the whole block is a part: the
// piece of the block one parallel rank holds (see Part). Its payload is the
// part's bytes only, and its checksum theirs; the store assembles parts
// into the whole block and seals it (Seal).
//
// Versions 1 to 3 were written under older key formats (v2 and v3 under
// key format 2, whose namespaces named a tensor-parallel rank and a layer
// range); their blocks fail to decode with ErrOtherFormat: their keys mean
// nothing under this build's key format.
const (
	blockMagic = "KVMB"
	// Version is the block format version this build writes and reads.
	Version = 4
	// FixedHeaderLen is the length of the header's fixed part: no encoded
	// block is shorter.
	FixedHeaderLen = 128
	headerSumOff   = 120
	headerAlign    = 64
	minExt         = 4 // an extension with no extra keys: the count alone
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

// Layout is the shape of a block's payload: [layer][kv_head][K|V][token][head_dim]
// (split) or [layer][token][latent_dim] (latent), then the scales, if any.
// It describes the whole block: every layer and KV head of the model.
type Layout struct {
	DType            prefixhash.DType
	Layers           int
	KVHeads, HeadDim int
	KV               prefixhash.KVLayout
	LatentDim        int
	Scales           prefixhash.Scales
	// StateBytes sizes one head's state in one layer (prefixhash.StateKV).
	StateBytes int
}

// LayoutOf returns the payload layout of blocks of ns, a namespace
// without groups (see GroupLayout).
func LayoutOf(ns prefixhash.Namespace) Layout {
	return Layout{DType: ns.DType, Layers: ns.Layers, KVHeads: ns.KVHeads, HeadDim: ns.HeadDim,
		KV: ns.Layout, LatentDim: ns.LatentDim, Scales: ns.Scales}
}

// valid reports whether l describes a payload at all (sizes in range, the
// fields of its KV layout set and the others zero).
func (l Layout) valid() bool {
	if l.DType.Size() == 0 || l.Layers < 1 || l.Layers > prefixhash.MaxLayers ||
		l.Scales > prefixhash.ScalesPerHead || (l.Scales != prefixhash.NoScales && l.DType.Size() != 1) {
		return false
	}
	switch l.KV {
	case prefixhash.SplitKV:
		return l.KVHeads >= 1 && l.HeadDim >= 1 && l.LatentDim == 0 && l.KVHeads <= 1<<20 && l.HeadDim <= 1<<20 && l.StateBytes == 0
	case prefixhash.LatentKV:
		return l.KVHeads == 0 && l.HeadDim == 0 && l.LatentDim >= 1 && l.LatentDim <= 1<<20 && l.Scales != prefixhash.ScalesPerHead && l.StateBytes == 0
	case prefixhash.StateKV:
		return l.KVHeads >= 1 && l.KVHeads <= 1<<20 && l.HeadDim == 0 && l.LatentDim == 0 && l.Scales == prefixhash.NoScales &&
			l.StateBytes >= 1 && l.StateBytes <= prefixhash.MaxStateBytes && l.StateBytes%l.DType.Size() == 0
	}
	return false
}

// PayloadLen returns the payload size of a whole block of tokens tokens,
// KV bytes and scales, or -1 if the layout is not valid.
func (l Layout) PayloadLen(tokens int) int {
	if !l.valid() {
		return -1
	}
	return l.PartLen(tokens, l.Whole())
}

// Header is a decoded block header.
type Header struct {
	Namespace uint64 // digest of the producing namespace
	// Key is the key the record is stored under: the block's chain key
	// (Chain), or for a group's record GroupKey(Chain, group).
	Key    prefixhash.Key
	Parent prefixhash.Key
	// Chain is the block's key in its prompt's chain, H(parent ‖ tokens ‖
	// extra keys): Key for a block of a namespace without groups.
	Chain prefixhash.Key
	// Group names the group whose record this is (Set false in a
	// namespace without groups).
	Group  GroupRef
	Layout Layout
	// Part is the range of the block this record holds: Layout.Whole() for
	// a block, less for a part (see Part).
	Part Part
	// Scheme is the key scheme the key was derived under.
	Scheme prefixhash.KeyScheme
	// ParentLink is what the key was chained from: the parent's whole
	// 32-byte hash under SchemeVLLM, KeyLink(Parent) otherwise.
	ParentLink prefixhash.Link
	// Extra are the extra keys the key covers (as Namespace.BlockExtra
	// makes them). After Decode they alias the decoded buffer.
	Extra prefixhash.ExtraKeys
	// Len is the encoded header's length.
	Len int
	// Tokens are the block's token ids. After Decode they may alias the
	// decoded buffer: same lifetime as it.
	Tokens []uint32
	// PayloadLen is the length of this record's payload: the whole
	// block's, or the part's.
	PayloadLen int
	Checksum   uint64 // xxhash64 of this record's payload
	// Tenant is the tag of the tenant that wrote the block (0: no tenant,
	// an open or single-tenant node). The format carries it; enforcing it
	// is the caller's business.
	Tenant uint64
	// Kind says whether the record is a block (or part) or an object's
	// piece (object.go). An object record has no tokens, layout or part:
	// Object describes it, and Parent is its namespace's root.
	Kind   Kind
	Object Object
}

// Whole reports whether the record is a whole block rather than a part.
func (h *Header) Whole() bool { return h.Kind == KindObject || h.Part == h.Layout.Whole() }

// Block is a decoded, verified block. Payload (and possibly Tokens) alias the
// buffer it was decoded from and live as long as it.
type Block struct {
	Header
	Payload []byte
}

// HeaderLen returns the encoded header length of a block of n tokens whose
// namespace reserves no room for extra keys (Namespace.ExtensionRoom 4).
func HeaderLen(n int) int { return HeaderLenExt(n, minExt) }

// HeaderLenExt returns the encoded header length of a block of n tokens
// whose extension is extLen bytes, its length field excluded.
func HeaderLenExt(n, extLen int) int {
	return (FixedHeaderLen + 4*n + 4 + extLen + headerAlign - 1) / headerAlign * headerAlign
}

// MaxHeaderLen bounds the header of any block of n tokens: the largest
// extension any namespace reserves (prefixhash.MaxExtensionRoom).
func MaxHeaderLen(n int) int {
	return HeaderLenExt(n, prefixhash.MaxExtensionRoom)
}

// NamespaceHeaderLen returns the header length of every block of ns.
func NamespaceHeaderLen(ns prefixhash.Namespace) int {
	return HeaderLenExt(ns.BlockTokens, ns.ExtensionRoom())
}

// EncodedLen returns the size of an encoded block of n tokens and payloadLen
// payload bytes whose namespace reserves no room for extra keys.
func EncodedLen(n, payloadLen int) int { return HeaderLen(n) + payloadLen }

// CheckNamespace reports whether h was produced under ns: digest, layout and
// block size must all agree.
func (h *Header) CheckNamespace(ns prefixhash.Namespace) error {
	switch {
	case h.Namespace != ns.Digest():
		return fmt.Errorf("%w: namespace digest %016x, want %016x (%s)", ErrCorrupt, h.Namespace, ns.Digest(), ns)
	case h.Group.Set != !ns.Groups.IsZero():
		return fmt.Errorf("%w: a record naming group %v in namespace %s", ErrCorrupt, h.Group.Set, ns)
	case h.Group.Set && h.Group.Index >= ns.Groups.Len():
		return fmt.Errorf("%w: group %d of namespace %s, which has %d", ErrCorrupt, h.Group.Index, ns, ns.Groups.Len())
	case h.Group.Set && (h.Group != GroupRefOf(ns, h.Group.Index) || h.Layout != GroupLayout(ns, h.Group.Index)):
		return fmt.Errorf("%w: group %+v, layout %+v do not match group %d of namespace %s", ErrCorrupt, h.Group, h.Layout, h.Group.Index, ns)
	case !h.Group.Set && h.Layout != LayoutOf(ns):
		return fmt.Errorf("%w: layout %+v does not match namespace %s", ErrCorrupt, h.Layout, ns)
	case h.Scheme != ns.Scheme:
		return fmt.Errorf("%w: key scheme %s, namespace %s has %s", ErrCorrupt, h.Scheme, ns, ns.Scheme)
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
// block. Under SchemeVLLM parent must be the namespace root (the key of a
// vLLM block is half of the hash its child chains from): use
// AppendHeaderExt with the parent's link.
func AppendHeaderTenant(dst []byte, tenant uint64, ns prefixhash.Namespace, parent prefixhash.Key, tokens []uint32, payload []byte) ([]byte, prefixhash.Key, error) {
	link := prefixhash.KeyLink(parent)
	if ns.Scheme == prefixhash.SchemeVLLM {
		if parent != ns.Root() {
			return dst, prefixhash.Key{}, fmt.Errorf("block: a %s block below the root needs its parent's link, not its key", ns.Scheme)
		}
		link = ns.RootLink()
	}
	dst, l, err := AppendHeaderExt(dst, tenant, ns, link, tokens, nil, payload)
	return dst, l.Key(), err
}

// AppendHeaderExt is AppendHeaderTenant for any block: parent is the link
// it is chained from (prefixhash.KeyLink of the parent key under
// SchemeKVMesh, the parent's 32-byte hash under SchemeVLLM, ns.RootLink for
// block 0) and extra its extra keys as the caller gives them (the
// namespace's are added: Namespace.BlockExtra). It returns the block's link,
// whose Key is its key.
func AppendHeaderExt(dst []byte, tenant uint64, ns prefixhash.Namespace, parent prefixhash.Link, tokens []uint32, extra prefixhash.ExtraKeys, payload []byte) ([]byte, prefixhash.Link, error) {
	return AppendPartHeaderExt(dst, tenant, ns, parent, tokens, extra, LayoutOf(ns).Whole(), payload)
}

// AppendPartHeaderExt is AppendHeaderExt for a record of part p of the
// block: payload is the part's bytes (Layout.PartLen of them, in the order
// Layout.ExtractPart gives). With p the whole block it is AppendHeaderExt.
// An invalid part is ErrBadPart.
func AppendPartHeaderExt(dst []byte, tenant uint64, ns prefixhash.Namespace, parent prefixhash.Link, tokens []uint32, extra prefixhash.ExtraKeys, p Part, payload []byte) ([]byte, prefixhash.Link, error) {
	if !ns.Groups.IsZero() {
		return dst, prefixhash.Link{}, fmt.Errorf("block: namespace %s has groups: encode a group's record (AppendGroupHeader)", ns)
	}
	return appendHeader(dst, tenant, ns, -1, parent, tokens, extra, p, payload)
}

// appendHeader encodes the header of part p of group g's record (g -1: a
// namespace without groups) of a block of ns.
func appendHeader(dst []byte, tenant uint64, ns prefixhash.Namespace, g int, parent prefixhash.Link, tokens []uint32, extra prefixhash.ExtraKeys, p Part, payload []byte) ([]byte, prefixhash.Link, error) {
	if err := ns.Validate(); err != nil {
		return dst, prefixhash.Link{}, err
	}
	lay := RecordLayout(ns, g)
	if err := lay.CheckPart(p); err != nil {
		return dst, prefixhash.Link{}, err
	}
	if len(tokens) != ns.BlockTokens {
		return dst, prefixhash.Link{}, fmt.Errorf("block: block has %d tokens, namespace blocks hold %d", len(tokens), ns.BlockTokens)
	}
	if want := lay.PartLen(len(tokens), p); len(payload) != want {
		switch {
		case g >= 0 && lay.KV == prefixhash.StateKV && p == lay.Whole():
			return dst, prefixhash.Link{}, fmt.Errorf("block: groups[%d].state_bytes: a state of %d bytes, the group's is %d (%d layers × %d heads × %d bytes)",
				g, len(payload), want, lay.Layers, lay.KVHeads, lay.StateBytes)
		case g >= 0 && p == lay.Whole():
			return dst, prefixhash.Link{}, fmt.Errorf("block: payload is %d bytes, group %d's records hold %d", len(payload), g, want)
		case p == lay.Whole():
			return dst, prefixhash.Link{}, fmt.Errorf("block: payload is %d bytes, namespace blocks hold %d", len(payload), want)
		}
		return dst, prefixhash.Link{}, fmt.Errorf("block: part %s payload is %d bytes, want %d", p, len(payload), want)
	}
	if err := ns.CheckExtra(extra); err != nil {
		return dst, prefixhash.Link{}, err
	}
	if ns.Scheme == prefixhash.SchemeKVMesh && parent != prefixhash.KeyLink(parent.Key()) {
		return dst, prefixhash.Link{}, fmt.Errorf("block: a %s parent link is a key (16 bytes)", ns.Scheme)
	}
	first := ns.Scheme == prefixhash.SchemeVLLM && parent == ns.RootLink()
	extra = ns.BlockExtra(first, extra)
	if err := extra.CheckBlock(ns.Scheme); err != nil {
		return dst, prefixhash.Link{}, err
	}
	link := prefixhash.BlockLink(ns.Scheme, parent, tokens, extra)
	key, parentKey := link.Key(), parent.Key()
	gref := GroupRef{}
	if g >= 0 {
		key = prefixhash.GroupKey(key, g)
		gref = GroupRefOf(ns, g)
	}
	ext := ns.ExtensionRoom()
	hl := HeaderLenExt(len(tokens), ext)
	start := len(dst)
	dst = append(dst, make([]byte, hl)...)
	h := dst[start:]
	copy(h[0:4], blockMagic)
	binary.LittleEndian.PutUint16(h[4:], Version)
	h[6] = prefixhash.KeyVersion
	h[7] = byte(lay.KV)
	binary.LittleEndian.PutUint32(h[8:], uint32(hl))
	binary.LittleEndian.PutUint32(h[12:], uint32(len(tokens)))
	binary.LittleEndian.PutUint64(h[16:], ns.Digest())
	copy(h[24:40], key[:])
	copy(h[40:56], parentKey[:])
	h[56] = byte(lay.DType)
	h[57] = byte(ns.Scheme)
	h[58] = byte(lay.Scales)
	binary.LittleEndian.PutUint32(h[60:], uint32(lay.Layers))
	binary.LittleEndian.PutUint32(h[64:], uint32(lay.KVHeads))
	binary.LittleEndian.PutUint32(h[68:], uint32(lay.HeadDim))
	binary.LittleEndian.PutUint32(h[72:], uint32(lay.LatentDim+lay.StateBytes)) // one of them is 0
	if gref.Set {
		h[59] = byte(gref.Index + 1)
		h[76] = byte(gref.Kind + 1)
		h[77] = byte(gref.Anchor + 1)
		binary.LittleEndian.PutUint16(h[78:], uint16(gref.WindowBlocks))
	}
	binary.LittleEndian.PutUint64(h[80:], uint64(len(payload)))
	binary.LittleEndian.PutUint64(h[88:], xxhash.Sum64(payload))
	binary.LittleEndian.PutUint64(h[96:], tenant)
	putPart(h, p)
	for i, t := range tokens {
		binary.LittleEndian.PutUint32(h[FixedHeaderLen+4*i:], t)
	}
	e := h[FixedHeaderLen+4*len(tokens):]
	binary.LittleEndian.PutUint32(e, uint32(ext))
	e = e[4:4]
	if ns.Scheme == prefixhash.SchemeVLLM {
		e = append(e, parent[:]...)
	}
	e = binary.LittleEndian.AppendUint32(e, uint32(len(extra)))
	for _, k := range extra {
		e = binary.LittleEndian.AppendUint32(e, uint32(len(k)))
		e = append(e, k...)
	}
	binary.LittleEndian.PutUint64(h[headerSumOff:], headerSum(h, len(tokens), ext))
	return dst, link, nil
}

func putPart(h []byte, p Part) {
	binary.LittleEndian.PutUint32(h[104:], uint32(p.L0))
	binary.LittleEndian.PutUint32(h[108:], uint32(p.L1))
	binary.LittleEndian.PutUint32(h[112:], uint32(p.H0))
	binary.LittleEndian.PutUint32(h[116:], uint32(p.H1))
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

// headerSum is the header checksum: bytes [0,120), the n tokens, the
// extension's length field and its ext bytes.
func headerSum(h []byte, n, ext int) uint64 {
	var d xxhash.Digest
	d.Reset()
	d.Write(h[:headerSumOff])
	d.Write(h[FixedHeaderLen : FixedHeaderLen+4*n+4+ext])
	return d.Sum64()
}

func allZero(b []byte) bool {
	for _, c := range b {
		if c != 0 {
			return false
		}
	}
	return true
}

func corrupt(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrCorrupt, fmt.Sprintf(format, args...))
}

// DecodeHeader parses and verifies the header at the start of b: magic,
// format and key format versions, lengths, layout, part range, header
// checksum, and that the key is H(parent ‖ tokens ‖ extra keys) under the
// block's key scheme. It does not read the payload. maxPayload bounds the
// payload length the caller accepts (ErrTooLarge beyond it). The record
// may be a part (see Header.Whole) or an object's piece (Header.Kind;
// object.go), whose key is checked against its name instead.
func DecodeHeader(b []byte, maxPayload int) (Header, error) {
	var h Header
	// The version comes before the length check: older headers are
	// shorter, and must be reported as what they are.
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
	if isObject(b) {
		return decodeObjectHeader(b, maxPayload)
	}
	hl := uint64(binary.LittleEndian.Uint32(b[8:]))
	n := uint64(binary.LittleEndian.Uint32(b[12:]))
	if n == 0 || n > prefixhash.MaxBlockTokens || hl < uint64(HeaderLen(int(n))) || hl > uint64(MaxHeaderLen(int(n))) {
		return h, corrupt("header length %d for %d tokens", hl, n)
	}
	if uint64(len(b)) < hl {
		return h, corrupt("%d bytes, header needs %d", len(b), hl)
	}
	x := uint64(binary.LittleEndian.Uint32(b[FixedHeaderLen+4*n:]))
	if x < minExt || uint64(HeaderLenExt(int(n), int(min(x, hl)))) != hl {
		return h, corrupt("extension of %d bytes in a header of %d", x, hl)
	}
	ext := int(x)
	if got, want := binary.LittleEndian.Uint64(b[headerSumOff:]), headerSum(b, int(n), ext); got != want {
		return h, corrupt("header checksum %016x, computed %016x", got, want)
	}
	// The padding that aligns the header is covered by neither checksum:
	// it must be zeros, as encoders write it, so that a block has one
	// encoding and no byte of it goes unchecked.
	if pad := b[FixedHeaderLen+4*n+4+uint64(ext) : hl]; !allZero(pad) {
		return h, corrupt("header padding of %d bytes is not zero", len(pad))
	}
	h.Namespace = binary.LittleEndian.Uint64(b[16:])
	copy(h.Key[:], b[24:40])
	copy(h.Parent[:], b[40:56])
	h.Layout = Layout{
		DType:     prefixhash.DType(b[56]),
		KV:        prefixhash.KVLayout(b[7]),
		Scales:    prefixhash.Scales(b[58]),
		Layers:    int(binary.LittleEndian.Uint32(b[60:])),
		KVHeads:   int(binary.LittleEndian.Uint32(b[64:])),
		HeadDim:   int(binary.LittleEndian.Uint32(b[68:])),
		LatentDim: int(binary.LittleEndian.Uint32(b[72:])),
	}
	if h.Layout.KV == prefixhash.StateKV {
		h.Layout.StateBytes, h.Layout.LatentDim = h.Layout.LatentDim, 0
	}
	h.Scheme = prefixhash.KeyScheme(b[57])
	h.Part = Part{
		L0: int(binary.LittleEndian.Uint32(b[104:])), L1: int(binary.LittleEndian.Uint32(b[108:])),
		H0: int(binary.LittleEndian.Uint32(b[112:])), H1: int(binary.LittleEndian.Uint32(b[116:])),
	}
	h.Len = int(hl)
	h.ParentLink = prefixhash.KeyLink(h.Parent)
	if err := h.decodeGroup(b); err != nil {
		return h, err
	}
	if !h.Layout.valid() {
		return h, corrupt("layout %+v is not valid", h.Layout)
	}
	if err := h.Layout.CheckPart(h.Part); err != nil {
		return h, corrupt("%v", err)
	}
	if err := h.decodeExt(b[FixedHeaderLen+4*n+4 : FixedHeaderLen+4*n+4+uint64(ext)]); err != nil {
		return h, err
	}
	pl := binary.LittleEndian.Uint64(b[80:])
	want := h.Layout.PartLen(int(n), h.Part)
	if want < 0 || pl != uint64(want) {
		return h, corrupt("payload length %d does not match part %s of layout %+v of %d tokens", pl, h.Part, h.Layout, n)
	}
	if maxPayload > 0 && pl > uint64(maxPayload) {
		return h, fmt.Errorf("%w: payload %d bytes, limit %d", ErrTooLarge, pl, maxPayload)
	}
	h.PayloadLen = int(pl)
	h.Checksum = binary.LittleEndian.Uint64(b[88:])
	h.Tenant = binary.LittleEndian.Uint64(b[96:])
	h.Tokens = viewTokens(b[FixedHeaderLen : FixedHeaderLen+4*n])
	h.Chain = prefixhash.BlockLink(h.Scheme, h.ParentLink, h.Tokens, h.Extra).Key()
	if want := h.Chain; h.Group.Set && prefixhash.GroupKey(want, h.Group.Index) != h.Key || !h.Group.Set && want != h.Key {
		return h, corrupt("key %s is not H(parent ‖ tokens ‖ extra keys) under the %s scheme (group %+v)", h.Key, h.Scheme, h.Group)
	}
	return h, nil
}

// decodeExt parses the extension: the parent link (vllm scheme)
// and the extra keys.
func (h *Header) decodeExt(e []byte) error {
	if h.Scheme > prefixhash.SchemeVLLM {
		return corrupt("unknown key scheme %d", h.Scheme)
	}
	if h.Scheme == prefixhash.SchemeVLLM {
		if len(e) < prefixhash.LinkSize {
			return corrupt("extension of %d bytes has no parent link", len(e))
		}
		h.ParentLink = prefixhash.Link(e[:prefixhash.LinkSize])
		e = e[prefixhash.LinkSize:]
		if h.ParentLink.Key() != h.Parent {
			return corrupt("parent link %s does not name parent %s", h.ParentLink, h.Parent)
		}
	}
	if len(e) < 4 {
		return corrupt("extension has no extra key count")
	}
	m := binary.LittleEndian.Uint32(e)
	e = e[4:]
	if m > prefixhash.MaxExtraKeys+2 {
		return corrupt("%d extra keys, the limit is %d", m, prefixhash.MaxExtraKeys+2)
	}
	if m > 0 {
		h.Extra = make(prefixhash.ExtraKeys, m)
	}
	for i := range h.Extra {
		if len(e) < 4 || uint64(binary.LittleEndian.Uint32(e)) > uint64(len(e)-4) {
			return corrupt("extra key %d overruns the extension", i)
		}
		k := int(binary.LittleEndian.Uint32(e))
		h.Extra[i] = e[4 : 4+k : 4+k]
		e = e[4+k:]
	}
	for _, c := range e {
		if c != 0 {
			return corrupt("extension padding is not zero")
		}
	}
	return h.Extra.CheckBlock(h.Scheme)
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
	blk, err := DecodeFramed(b, maxPayload)
	if err != nil {
		return Block{}, err
	}
	if sum := xxhash.Sum64(blk.Payload); sum != blk.Checksum {
		return Block{}, corrupt("payload checksum %016x, computed %016x", blk.Checksum, sum)
	}
	return blk, nil
}

// DecodeFramed is Decode without hashing the payload: the header is
// verified in full and the length checked against it. It is for bytes that
// a checksum of their own already covered whole (a record a tier verified
// as it read it, tiers.Checked), which Decode would hash a second time.
func DecodeFramed(b []byte, maxPayload int) (Block, error) {
	h, err := DecodeHeader(b, maxPayload)
	if err != nil {
		return Block{}, err
	}
	if len(b) != h.Len+h.PayloadLen {
		return Block{}, corrupt("%d bytes, header says %d", len(b), h.Len+h.PayloadLen)
	}
	return Block{Header: h, Payload: b[h.Len:]}, nil
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
