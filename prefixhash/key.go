package prefixhash

import (
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"unsafe"

	"github.com/cespare/xxhash/v2"
)

// Key is a 128-bit block key: two independently seeded xxhash64 digests,
// big-endian, high half first. 64 bits are not enough: at 10^8 blocks a 64-bit
// collision has a real probability, and a collision serves wrong KV silently.
type Key [16]byte

// The two seeds. They are part of the key format: changing either changes
// every key (the golden test fails).
const (
	seedHi uint64 = 0x6b766d6573682f68 // "kvmesh/h"
	seedLo uint64 = 0x6b766d6573682f6c // "kvmesh/l"
)

// KeySize is the encoded size of a Key in bytes.
const KeySize = 16

// Hi returns the high 64 bits of k.
func (k Key) Hi() uint64 { return binary.BigEndian.Uint64(k[:8]) }

// Lo returns the low 64 bits of k.
func (k Key) Lo() uint64 { return binary.BigEndian.Uint64(k[8:]) }

// IsZero reports whether k is the zero key, which no hash produces in practice
// and which kvmesh uses as "no key".
func (k Key) IsZero() bool { return k == Key{} }

// String returns k as 32 lowercase hex digits.
func (k Key) String() string { return hex.EncodeToString(k[:]) }

// ParseKey parses the 32-hex-digit form returned by String.
func ParseKey(s string) (Key, error) {
	var k Key
	if len(s) != 2*KeySize {
		return k, fmt.Errorf("prefixhash: key %q: want %d hex digits, got %d", s, 2*KeySize, len(s))
	}
	if _, err := hex.Decode(k[:], []byte(s)); err != nil {
		return k, fmt.Errorf("prefixhash: key %q: %w", s, err)
	}
	return k, nil
}

func makeKey(hi, lo uint64) Key {
	var k Key
	binary.BigEndian.PutUint64(k[:8], hi)
	binary.BigEndian.PutUint64(k[8:], lo)
	return k
}

func hashBytes(b []byte) Key {
	var d xxhash.Digest
	d.ResetWithSeed(seedHi)
	d.Write(b)
	hi := d.Sum64()
	d.ResetWithSeed(seedLo)
	d.Write(b)
	return makeKey(hi, d.Sum64())
}

// BlockKey returns H(parent ‖ tokens, little-endian uint32): the key of the
// block holding tokens whose predecessor in the chain has key parent (the
// namespace root for the first block).
func BlockKey(parent Key, tokens []uint32) Key {
	tb := tokenBytes(tokens)
	if len(tb) >= 16 {
		hi, lo := sum2(&parent, tb)
		return makeKey(hi, lo)
	}
	var d xxhash.Digest
	d.ResetWithSeed(seedHi)
	d.Write(parent[:])
	d.Write(tb)
	hi := d.Sum64()
	d.ResetWithSeed(seedLo)
	d.Write(parent[:])
	d.Write(tb)
	return makeKey(hi, d.Sum64())
}

var littleEndian = func() bool {
	x := uint16(1)
	return *(*byte)(unsafe.Pointer(&x)) == 1
}()

// tokenBytes returns the little-endian bytes of tokens. On little-endian
// machines it aliases tokens, so hashing copies nothing.
func tokenBytes(tokens []uint32) []byte {
	if len(tokens) == 0 {
		return nil
	}
	if littleEndian {
		return unsafe.Slice((*byte)(unsafe.Pointer(&tokens[0])), 4*len(tokens))
	}
	b := make([]byte, 4*len(tokens))
	for i, t := range tokens {
		binary.LittleEndian.PutUint32(b[4*i:], t)
	}
	return b
}
