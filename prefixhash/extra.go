package prefixhash

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
)

// ExtraKeys are a block's extra keys: opaque byte strings that, with the
// block's tokens, make its identity. An engine puts here what decides the
// KV besides the token ids, such as the hash of a multimodal input whose
// placeholder tokens fall in the block and its offset in it: two blocks with
// equal tokens and different extra keys never share a key. Order matters.
// Under SchemeVLLM each extra key is one canonical CBOR data item (see
// vllm.go); under SchemeKVMesh any bytes.
type ExtraKeys [][]byte

// Limits on a block's extra keys.
const (
	MaxExtraKeys  = 64
	MaxExtraBytes = 4096 // all of a block's extra keys together
	// MaxExtraRoom bounds Namespace.ExtraKeyBytes: the most keys and bytes,
	// with their 4-byte lengths.
	MaxExtraRoom = MaxExtraBytes + 4*MaxExtraKeys
	// MaxExtensionRoom bounds Namespace.ExtensionRoom: the count, the room,
	// a vLLM parent link, and the LoRA id and salt as CBOR text (a 3-byte
	// head for up to 256 bytes) with their lengths.
	MaxExtensionRoom = 4 + MaxExtraRoom + LinkSize + (4 + 3 + MaxLoRALen) + (4 + 3 + MaxSaltLen)
)

// Room returns the header room e takes: 4 bytes and its length per key.
func (e ExtraKeys) Room() int { return 4*len(e) + e.Bytes() }

// ExtensionRoom returns the size of the header extension every block of ns
// carries (block format 3, its length field excluded): the parent's link
// under SchemeVLLM, the extra key count, the room for the caller's extra
// keys (ExtraKeyBytes) and for those the namespace adds (BlockExtra).
func (ns Namespace) ExtensionRoom() int {
	n := 4 + ns.ExtraKeyBytes
	if ns.Scheme == SchemeVLLM {
		n += LinkSize
		if ns.LoRA != "" {
			n += 4 + len(appendCBORText(nil, ns.LoRA))
		}
		if ns.TenantSalt != "" {
			n += 4 + len(appendCBORText(nil, ns.TenantSalt))
		}
	}
	return n
}

// CheckExtra reports whether a block of ns may carry the caller's extra
// keys e: within the limits, within the namespace's room, and under
// SchemeVLLM canonical CBOR items.
func (ns Namespace) CheckExtra(e ExtraKeys) error {
	if len(e) == 0 {
		return nil
	}
	if err := e.Check(ns.Scheme); err != nil {
		return err
	}
	if r := e.Room(); r > ns.ExtraKeyBytes {
		return fmt.Errorf("%w: %d bytes of extra keys with their lengths; namespace %s reserves %d (extra_key_bytes)", ErrExtraKeys, r, ns, ns.ExtraKeyBytes)
	}
	return nil
}

// ErrExtraKeys is wrapped by every error about extra keys.
var ErrExtraKeys = errors.New("prefixhash: invalid extra keys")

// Bytes returns the total length of the extra keys.
func (e ExtraKeys) Bytes() int {
	n := 0
	for _, k := range e {
		n += len(k)
	}
	return n
}

// Check reports whether e, a caller's extra keys, is within the limits
// (and, under SchemeVLLM, made of canonical CBOR items).
func (e ExtraKeys) Check(scheme KeyScheme) error { return e.check(scheme, MaxExtraKeys, MaxExtraBytes) }

// CheckBlock is Check for the extra keys a block's header carries: the
// caller's and, under SchemeVLLM, the namespace's LoRA id and salt
// (Namespace.BlockExtra), so two keys and their bytes more.
func (e ExtraKeys) CheckBlock(scheme KeyScheme) error {
	return e.check(scheme, MaxExtraKeys+2, MaxExtraBytes+3+MaxLoRALen+3+MaxSaltLen)
}

func (e ExtraKeys) check(scheme KeyScheme, maxKeys, maxBytes int) error {
	if len(e) > maxKeys {
		return fmt.Errorf("%w: %d extra keys, the limit is %d", ErrExtraKeys, len(e), maxKeys)
	}
	if n := e.Bytes(); n > maxBytes {
		return fmt.Errorf("%w: %d bytes of extra keys, the limit is %d", ErrExtraKeys, n, maxBytes)
	}
	if scheme == SchemeVLLM {
		for i, k := range e {
			if err := checkCBORItem(k); err != nil {
				return fmt.Errorf("%w: extra key %d: %w", ErrExtraKeys, i, err)
			}
		}
	}
	return nil
}

// Link is what a block's children are chained from. Under SchemeKVMesh it
// is the block's key (the last 16 bytes zero); under SchemeVLLM it is vLLM's
// whole 32-byte block hash, whose first 16 bytes are the key. A block's key
// alone chains its children only under SchemeKVMesh.
type Link [32]byte

// LinkSize is the encoded size of a Link.
const LinkSize = 32

// Key returns the block key a link names: its first 16 bytes.
func (l Link) Key() Key { return Key(l[:KeySize]) }

// KeyLink returns the SchemeKVMesh link of key k.
func KeyLink(k Key) Link {
	var l Link
	copy(l[:], k[:])
	return l
}

// RootLink returns the link block 0 is chained from: KeyLink(Root()) under
// SchemeKVMesh, vLLM's NONE_HASH = SHA-256(CBOR(hash seed as a text string))
// under SchemeVLLM.
func (ns Namespace) RootLink() Link {
	if ns.Scheme == SchemeVLLM {
		var buf [MaxSeedLen + 9]byte
		return Link(sha256.Sum256(appendCBORText(buf[:0], ns.HashSeed)))
	}
	return KeyLink(ns.Root())
}

// BlockExtra returns the extra keys a block's key covers under ns: the
// caller's extra under SchemeKVMesh (the adapter and the salt are in the
// root); under SchemeVLLM, vLLM's order: the LoRA adapter id (every block),
// the caller's multimodal keys (arrays), the tenant salt as vLLM's cache
// salt (block 0 only), then the caller's prompt-embedding hashes (byte
// strings). The result may alias extra.
func (ns Namespace) BlockExtra(first bool, extra ExtraKeys) ExtraKeys {
	if ns.Scheme != SchemeVLLM || (ns.LoRA == "" && (!first || ns.TenantSalt == "")) {
		return extra
	}
	out := make(ExtraKeys, 0, len(extra)+2)
	if ns.LoRA != "" {
		out = append(out, appendCBORText(nil, ns.LoRA))
	}
	i := 0
	for i < len(extra) && (len(extra[i]) == 0 || extra[i][0]>>5 != 2) {
		i++
	}
	out = append(out, extra[:i]...)
	if first && ns.TenantSalt != "" {
		out = append(out, appendCBORText(nil, ns.TenantSalt))
	}
	return append(out, extra[i:]...)
}

// BlockLink returns the link (and so the key) of the block holding tokens,
// chained from parent, whose key covers extra (the extra keys as BlockExtra
// returns them: this is what a verifier that has no namespace, only a block
// header, computes). With no extra keys, SchemeKVMesh gives BlockKey's key.
func BlockLink(scheme KeyScheme, parent Link, tokens []uint32, extra ExtraKeys) Link {
	if scheme == SchemeVLLM {
		return vllmHash(parent, tokens, extra)
	}
	if len(extra) == 0 {
		return KeyLink(BlockKey(parent.Key(), tokens))
	}
	return KeyLink(blockKeyExtra(parent.Key(), tokens, extra))
}

// blockKeyExtra is trunc128(SHA-256(parent ‖ tokens ‖ u32 count ‖
// (u32 length ‖ bytes) per extra key)), integers little-endian. Within a
// namespace every block holds B tokens, so the message of a block with
// extra keys is longer than any without, and the length prefixes keep the
// keys' boundaries apart.
func blockKeyExtra(parent Key, tokens []uint32, extra ExtraKeys) Key {
	s := getHasher()
	defer putHasher(s)
	h := s.h
	h.Reset()
	h.Write(parent[:])
	var buf [256]byte
	for t := tokens; len(t) > 0; {
		c := min(len(t), len(buf)/4)
		putTokens(buf[:], t[:c])
		h.Write(buf[:4*c])
		t = t[c:]
	}
	b := binary.LittleEndian.AppendUint32(buf[:0], uint32(len(extra)))
	h.Write(b)
	for _, k := range extra {
		h.Write(binary.LittleEndian.AppendUint32(buf[:0], uint32(len(k))))
		h.Write(k)
	}
	return Key(h.Sum(s.out[:0])[:KeySize])
}

// KeysExtra returns the block keys of a prompt under ns whose blocks carry
// extra keys: extra[i] are block i's (the caller's, as BlockExtra takes
// them); extra may be shorter than the block count, and nil entries mean
// none. With no extra keys under SchemeKVMesh it is Keys.
func KeysExtra(ns Namespace, tokens []uint32, extra []ExtraKeys) ([]Key, error) {
	if err := checkExtra(ns, tokens, extra); err != nil {
		return nil, err
	}
	if ns.Scheme == SchemeKVMesh && noExtra(extra) {
		return Keys(ns, tokens), nil
	}
	links := appendLinksExtra(nil, ns, tokens, extra)
	keys := make([]Key, len(links))
	for i, l := range links {
		keys[i] = l.Key()
	}
	return keys, nil
}

// LinksExtra is KeysExtra returning each block's link: what its child is
// chained from (under SchemeVLLM its whole 32-byte hash).
func LinksExtra(ns Namespace, tokens []uint32, extra []ExtraKeys) ([]Link, error) {
	if err := checkExtra(ns, tokens, extra); err != nil {
		return nil, err
	}
	if ns.Scheme == SchemeKVMesh && noExtra(extra) {
		keys := Keys(ns, tokens)
		links := make([]Link, len(keys))
		for i, k := range keys {
			links[i] = KeyLink(k)
		}
		return links, nil
	}
	return appendLinksExtra(nil, ns, tokens, extra), nil
}

func noExtra(extra []ExtraKeys) bool {
	for _, e := range extra {
		if len(e) > 0 {
			return false
		}
	}
	return true
}

func checkExtra(ns Namespace, tokens []uint32, extra []ExtraKeys) error {
	if err := ns.Validate(); err != nil {
		return err
	}
	if len(extra) > len(tokens)/ns.BlockTokens {
		return fmt.Errorf("%w: %d blocks have extra keys, the prompt has %d full blocks", ErrExtraKeys, len(extra), len(tokens)/ns.BlockTokens)
	}
	for i, e := range extra {
		if err := ns.CheckExtra(e); err != nil {
			return fmt.Errorf("block %d: %w", i, err)
		}
	}
	return nil
}

func appendLinksExtra(dst []Link, ns Namespace, tokens []uint32, extra []ExtraKeys) []Link {
	b := ns.BlockTokens
	link := ns.RootLink()
	for i := 0; (i+1)*b <= len(tokens); i++ {
		var e ExtraKeys
		if i < len(extra) {
			e = extra[i]
		}
		link = BlockLink(ns.Scheme, link, tokens[i*b:(i+1)*b], ns.BlockExtra(i == 0, e))
		dst = append(dst, link)
	}
	return dst
}

// String returns l as 64 lowercase hex digits.
func (l Link) String() string { return hex.EncodeToString(l[:]) }
