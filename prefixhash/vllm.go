package prefixhash

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"unicode/utf8"
)

// SchemeVLLM: vLLM's prefix-cache block hash with its sha256_cbor function
// (vllm/v1/core/kv_cache_utils.py, hash_block_tokens), so that the hashes a
// vLLM instance computes and publishes in its KV events name kvmesh blocks:
//
//	NONE_HASH = SHA-256(CBOR(PYTHONHASHSEED as a text string))
//	h_i       = SHA-256(CBOR([h_{i-1}, [t_0, ..., t_{B-1}], extra]))
//
// with h_{-1} = NONE_HASH, h_{i-1} a 32-byte byte string, the tokens an
// array of unsigned integers, and extra CBOR null when the block has no
// extra keys, else an array of them. CBOR is canonical (RFC 8949 4.2.1:
// shortest-form heads, definite lengths), as cbor2.dumps(..., canonical=True)
// writes it. The kvmesh key of a block is the first 16 bytes of h_i; a
// router holding vLLM's 32-byte hashes truncates them. (vLLM's optional
// integer event hashes, VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES, keep only the
// last 8 bytes and cannot name a block.)
//
// vLLM's extra keys, in its order: the LoRA adapter name (text, every
// block; the namespace's LoRA), then per multimodal input in the block the
// array [identifier (text), offset in the block (integer)], then the cache
// salt (text, block 0 only; the namespace's tenant salt), then a prompt
// embeddings hash (bytes). kvmesh adds the first and the salt from the
// namespace; the caller passes the others, each as one canonical CBOR item
// (VLLMMultimodalKey builds the usual one).
//
// The root comes from vLLM's PYTHONHASHSEED: a vLLM started without it
// draws NONE_HASH at random, and no two processes agree. A namespace under
// this scheme therefore names the seed (HashSeed), and every vLLM instance
// that shares its blocks runs with PYTHONHASHSEED set to it. vLLM's hash
// covers neither the model nor the KV shape: give every vLLM-scheme
// namespace its own seed (a block of another namespace under the same key is
// refused by the namespace digest in its header, so it is a miss, never
// served, but the two namespaces then cannot both cache that prefix).

// vllmHash returns h = SHA-256(CBOR([parent, tokens, extra or null])).
func vllmHash(parent Link, tokens []uint32, extra ExtraKeys) Link {
	s := getHasher()
	defer putHasher(s)
	h := s.h
	h.Reset()
	var buf [256]byte
	b := append(buf[:0], 0x83) // array(3)
	b = appendCBORHead(b, 2, LinkSize)
	b = append(b, parent[:]...)
	b = appendCBORHead(b, 4, uint64(len(tokens)))
	for _, t := range tokens {
		if len(b) > len(buf)-5 {
			h.Write(b)
			b = buf[:0]
		}
		b = appendCBORHead(b, 0, uint64(t))
	}
	if len(extra) == 0 {
		b = append(b, 0xf6) // null
		h.Write(b)
	} else {
		b = appendCBORHead(b, 4, uint64(len(extra)))
		h.Write(b)
		for _, k := range extra {
			h.Write(k)
		}
	}
	var l Link
	h.Sum(l[:0])
	return l
}

// appendCBORHead appends a CBOR head of major type major and argument v in
// its shortest form.
func appendCBORHead(b []byte, major byte, v uint64) []byte {
	m := major << 5
	switch {
	case v < 24:
		return append(b, m|byte(v))
	case v <= math.MaxUint8:
		return append(b, m|24, byte(v))
	case v <= math.MaxUint16:
		return binary.BigEndian.AppendUint16(append(b, m|25), uint16(v))
	case v <= math.MaxUint32:
		return binary.BigEndian.AppendUint32(append(b, m|26), uint32(v))
	}
	return binary.BigEndian.AppendUint64(append(b, m|27), v)
}

func appendCBORText(b []byte, s string) []byte {
	return append(appendCBORHead(b, 3, uint64(len(s))), s...)
}

// VLLMText returns s as a CBOR text string: an extra key as vLLM writes a
// string (a LoRA name, a cache salt).
func VLLMText(s string) []byte { return appendCBORText(nil, s) }

// VLLMBytes returns b as a CBOR byte string (a prompt embeddings hash).
func VLLMBytes(b []byte) []byte { return append(appendCBORHead(nil, 2, uint64(len(b))), b...) }

// VLLMMultimodalKey returns vLLM's extra key for a multimodal input in a
// block: the array [identifier, offset], offset being where the input
// starts relative to the block's first token (negative when it started in
// an earlier block).
func VLLMMultimodalKey(identifier string, offset int) []byte {
	b := appendCBORHead(nil, 4, 2)
	b = appendCBORText(b, identifier)
	if offset < 0 {
		return appendCBORHead(b, 1, uint64(-1-offset))
	}
	return appendCBORHead(b, 0, uint64(offset))
}

var errCBOR = errors.New("not one canonical CBOR item")

// checkCBORItem reports whether b is exactly one well-formed CBOR data item
// in canonical form, built from integers, byte and text strings, arrays and
// null: what vLLM's extra keys are made of. Accepting nothing else keeps a
// caller from smuggling a second item (or a truncated one) into the array
// that the hash covers.
func checkCBORItem(b []byte) error {
	n, err := cborItem(b, 0)
	if err != nil {
		return err
	}
	if n != len(b) {
		return fmt.Errorf("%w: %d trailing bytes", errCBOR, len(b)-n)
	}
	return nil
}

const maxCBORDepth = 8

// cborItem returns the length of the item at the start of b.
func cborItem(b []byte, depth int) (int, error) {
	if depth > maxCBORDepth {
		return 0, fmt.Errorf("%w: nested deeper than %d", errCBOR, maxCBORDepth)
	}
	if len(b) == 0 {
		return 0, fmt.Errorf("%w: empty", errCBOR)
	}
	major, info := b[0]>>5, b[0]&31
	if major == 7 {
		if b[0] == 0xf6 {
			return 1, nil
		}
		return 0, fmt.Errorf("%w: simple value or float 0x%02x", errCBOR, b[0])
	}
	if major == 5 || major == 6 {
		return 0, fmt.Errorf("%w: maps and tags are not used", errCBOR)
	}
	var v uint64
	n := 1
	switch {
	case info < 24:
		v = uint64(info)
	case info <= 27:
		w := 1 << (info - 24)
		if len(b) < 1+w {
			return 0, fmt.Errorf("%w: truncated head", errCBOR)
		}
		for _, c := range b[1 : 1+w] {
			v = v<<8 | uint64(c)
		}
		n += w
		if short := appendCBORHead(nil, major, v); len(short) != n {
			return 0, fmt.Errorf("%w: head of %d bytes where %d suffice", errCBOR, n, len(short))
		}
	default:
		return 0, fmt.Errorf("%w: indefinite or reserved length", errCBOR)
	}
	switch major {
	case 0, 1:
		return n, nil
	case 2, 3:
		if v > uint64(len(b)-n) {
			return 0, fmt.Errorf("%w: string of %d bytes, %d left", errCBOR, v, len(b)-n)
		}
		if major == 3 && !utf8.Valid(b[n:n+int(v)]) {
			return 0, fmt.Errorf("%w: text string is not UTF-8", errCBOR)
		}
		return n + int(v), nil
	}
	// major 4: an array of v items.
	for range v {
		m, err := cborItem(b[n:], depth+1)
		if err != nil {
			return 0, err
		}
		n += m
	}
	return n, nil
}
