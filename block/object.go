package block

import (
	"encoding/binary"
	"fmt"
	"time"
	"unicode/utf8"

	"github.com/cespare/xxhash/v2"

	"github.com/kvmesh/kvmesh/prefixhash"
)

// An object record holds one piece of an object: opaque bytes a caller
// stores under a name (prefixhash.ObjectKey), beside the prefix-chained
// blocks. It is the block format with the KV layout byte (7) set to 0xFF
// and no tokens (a block has at least one; older builds refuse either as a
// corrupt block), and the object's fields in bytes that a block gives its
// layout and part. Bytes 59 and 76-79, which the blocks of KV-cache groups
// use, stay zero:
//
//	off  size  field
//	  0     4  magic "KVMB"
//	  4     2  format version (4)
//	  6     1  key format version (prefixhash.KeyVersion)
//	  7     1  0xFF: an object record
//	  8     4  header length: 128 + name length, rounded up to 64
//	 12     4  zero (no tokens)
//	 16     8  namespace digest
//	 24    16  key: prefixhash.PieceKey(ObjectKey(root, name), piece)
//	 40    16  the namespace's root key (prefixhash.Namespace.Root)
//	 56     1  zero
//	 57     1  the namespace's key scheme
//	 58     1  pin the writer asks for (0 none, 1 soft, 2 hard; Pin)
//	 59     1  zero
//	 60     4  piece index j
//	 64     4  piece count m (at least 1, j < m)
//	 68     4  lease TTL the writer asks for, in milliseconds (0: none)
//	 72     4  name length (1..prefixhash.MaxObjectName)
//	 76     4  zero
//	 80     8  payload length (this piece's)
//	 88     8  xxhash64 of the payload
//	 96     8  tenant tag
//	104     8  the object's whole size (every piece's payload)
//	112     8  generation: the writer's nonce, the same in every piece of
//	           one put, so a reader never joins pieces of two puts
//	120     8  xxhash64 of bytes [0,120) and of the name
//	128     n  the name, UTF-8
//	  …        zero padding to the header length
//
// A reader verifies an object record as it does a block: header checksum,
// padding, key == PieceKey(ObjectKey(parent, name), j), payload checksum.
// The retention the writer asked for (pin, TTL) applies when the record is
// stored; it is not the record's state afterwards (Retain changes that).
const (
	kindOff    = 7 // a block's KV layout byte
	kindObject = 0xFF
)

// Kind says what a record holds.
type Kind uint8

// Record kinds.
const (
	KindBlock  Kind = iota // a KV block (or a part of one)
	KindObject             // a piece of an object
)

// Pin is how firmly a stored value is kept.
type Pin uint8

// Pins. The numeric values are part of the object record.
const (
	PinNone Pin = iota // evicted by policy
	PinSoft            // evicted only when nothing unpinned is left
	PinHard            // never evicted; counted against the namespace's quota
	numPins
)

var pinNames = [...]string{"none", "soft", "hard"}

// String returns "none", "soft" or "hard".
func (p Pin) String() string {
	if p < numPins {
		return pinNames[p]
	}
	return fmt.Sprintf("pin(%d)", uint8(p))
}

// ParsePin parses a name String returns.
func ParsePin(s string) (Pin, error) {
	for i, n := range pinNames {
		if s == n {
			return Pin(i), nil
		}
	}
	return 0, fmt.Errorf("block: unknown pin %q (want none, soft or hard)", s)
}

// Retention is what keeps a value from eviction: a pin, and a TTL, which
// is a lease for an unpinned value (not evicted before it lapses) and the
// lifetime of a pin (0: until unpinned).
type Retention struct {
	Pin Pin
	TTL time.Duration
}

// MaxObjectTTL is the longest TTL an object record can carry (the field
// counts milliseconds in 32 bits).
const MaxObjectTTL = time.Duration(1<<32-1) * time.Millisecond

// Object is what an object record says of its object.
type Object struct {
	Name       string
	Piece      int    // this record's piece, 0..Pieces-1
	Pieces     int    // how many pieces the object has
	Size       uint64 // the whole object's bytes
	Generation uint64 // the writer's nonce, shared by the pieces of one put
	// Retention is what the writer asked for when it stored the record.
	Retention Retention
}

// ObjectHeaderLen returns the header length of an object record whose name
// is n bytes long.
func ObjectHeaderLen(n int) int {
	return (FixedHeaderLen + n + headerAlign - 1) / headerAlign * headerAlign
}

// AppendObjectHeader appends the header of piece o.Piece of the object
// o.Name in ns, holding payload, and returns the extended buffer and the
// record's key. The payload follows the header (EncodeObject appends both).
func AppendObjectHeader(dst []byte, tenant uint64, ns prefixhash.Namespace, o Object, payload []byte) ([]byte, prefixhash.Key, error) {
	if err := ns.Validate(); err != nil {
		return dst, prefixhash.Key{}, err
	}
	if err := prefixhash.CheckObjectName(o.Name); err != nil {
		return dst, prefixhash.Key{}, err
	}
	switch {
	case o.Pieces < 1 || o.Piece < 0 || o.Piece >= o.Pieces || o.Pieces > MaxPieces:
		return dst, prefixhash.Key{}, fmt.Errorf("block: object piece %d of %d (at most %d pieces)", o.Piece, o.Pieces, MaxPieces)
	case uint64(len(payload)) > o.Size:
		return dst, prefixhash.Key{}, fmt.Errorf("block: object piece of %d bytes in an object of %d", len(payload), o.Size)
	case o.Retention.Pin >= numPins:
		return dst, prefixhash.Key{}, fmt.Errorf("block: unknown pin %d", o.Retention.Pin)
	case o.Retention.TTL < 0 || o.Retention.TTL > MaxObjectTTL:
		return dst, prefixhash.Key{}, fmt.Errorf("block: TTL %s is outside 0..%s", o.Retention.TTL, MaxObjectTTL)
	}
	root := ns.Root()
	key := prefixhash.PieceKey(prefixhash.ObjectKey(root, o.Name), o.Piece)
	hl := ObjectHeaderLen(len(o.Name))
	start := len(dst)
	dst = append(dst, make([]byte, hl)...)
	h := dst[start:]
	copy(h[0:4], blockMagic)
	binary.LittleEndian.PutUint16(h[4:], Version)
	h[6] = prefixhash.KeyVersion
	binary.LittleEndian.PutUint32(h[8:], uint32(hl))
	binary.LittleEndian.PutUint64(h[16:], ns.Digest())
	copy(h[24:40], key[:])
	copy(h[40:56], root[:])
	h[57] = byte(ns.Scheme)
	h[58] = byte(o.Retention.Pin)
	h[kindOff] = kindObject
	binary.LittleEndian.PutUint32(h[60:], uint32(o.Piece))
	binary.LittleEndian.PutUint32(h[64:], uint32(o.Pieces))
	binary.LittleEndian.PutUint32(h[68:], uint32(o.Retention.TTL/time.Millisecond))
	binary.LittleEndian.PutUint32(h[72:], uint32(len(o.Name)))
	binary.LittleEndian.PutUint64(h[80:], uint64(len(payload)))
	binary.LittleEndian.PutUint64(h[88:], xxhash.Sum64(payload))
	binary.LittleEndian.PutUint64(h[96:], tenant)
	binary.LittleEndian.PutUint64(h[104:], o.Size)
	binary.LittleEndian.PutUint64(h[112:], o.Generation)
	copy(h[FixedHeaderLen:], o.Name)
	binary.LittleEndian.PutUint64(h[headerSumOff:], objectHeaderSum(h, len(o.Name)))
	return dst, key, nil
}

// EncodeObject appends the whole object record (header and payload) to dst.
func EncodeObject(dst []byte, tenant uint64, ns prefixhash.Namespace, o Object, payload []byte) ([]byte, prefixhash.Key, error) {
	dst, key, err := AppendObjectHeader(dst, tenant, ns, o, payload)
	if err != nil {
		return dst, key, err
	}
	return append(dst, payload...), key, nil
}

// MaxPieces bounds an object's piece count.
const MaxPieces = 1 << 20

func objectHeaderSum(h []byte, n int) uint64 {
	var d xxhash.Digest
	d.Reset()
	d.Write(h[:headerSumOff])
	d.Write(h[FixedHeaderLen : FixedHeaderLen+n])
	return d.Sum64()
}

// isObject reports whether the header at the start of b (at least
// FixedHeaderLen bytes) names an object record.
func isObject(b []byte) bool { return b[kindOff] == kindObject }

// decodeObjectHeader is DecodeHeader for an object record; b holds at
// least FixedHeaderLen bytes, and its magic and versions are checked.
func decodeObjectHeader(b []byte, maxPayload int) (Header, error) {
	var h Header
	hl := uint64(binary.LittleEndian.Uint32(b[8:]))
	n := uint64(binary.LittleEndian.Uint32(b[72:]))
	if n == 0 || n > prefixhash.MaxObjectName || hl != uint64(ObjectHeaderLen(int(n))) {
		return h, corrupt("object header length %d for a name of %d bytes", hl, n)
	}
	if uint64(len(b)) < hl {
		return h, corrupt("%d bytes, header needs %d", len(b), hl)
	}
	if got, want := binary.LittleEndian.Uint64(b[headerSumOff:]), objectHeaderSum(b, int(n)); got != want {
		return h, corrupt("header checksum %016x, computed %016x", got, want)
	}
	if !allZero(b[FixedHeaderLen+n : hl]) {
		return h, corrupt("object header padding is not zero")
	}
	if binary.LittleEndian.Uint32(b[12:]) != 0 || b[56] != 0 || b[59] != 0 || binary.LittleEndian.Uint32(b[76:]) != 0 {
		return h, corrupt("object header: bytes a block gives its layout are not zero")
	}
	name := b[FixedHeaderLen : FixedHeaderLen+n]
	if !utf8.Valid(name) {
		return h, corrupt("object name is not valid UTF-8")
	}
	h.Kind = KindObject
	h.Namespace = binary.LittleEndian.Uint64(b[16:])
	copy(h.Key[:], b[24:40])
	copy(h.Parent[:], b[40:56])
	h.ParentLink = prefixhash.KeyLink(h.Parent)
	h.Scheme = prefixhash.KeyScheme(b[57])
	h.Len = int(hl)
	o := &h.Object
	o.Retention.Pin = Pin(b[58])
	o.Piece = int(binary.LittleEndian.Uint32(b[60:]))
	o.Pieces = int(binary.LittleEndian.Uint32(b[64:]))
	o.Retention.TTL = time.Duration(binary.LittleEndian.Uint32(b[68:])) * time.Millisecond
	o.Size = binary.LittleEndian.Uint64(b[104:])
	o.Generation = binary.LittleEndian.Uint64(b[112:])
	pl := binary.LittleEndian.Uint64(b[80:])
	switch {
	case h.Scheme > prefixhash.SchemeVLLM:
		return h, corrupt("unknown key scheme %d", h.Scheme)
	case o.Retention.Pin >= numPins:
		return h, corrupt("unknown pin %d", o.Retention.Pin)
	case o.Pieces < 1 || o.Pieces > MaxPieces || o.Piece >= o.Pieces:
		return h, corrupt("object piece %d of %d", o.Piece, o.Pieces)
	case pl > o.Size:
		return h, corrupt("object piece of %d bytes in an object of %d", pl, o.Size)
	}
	if maxPayload > 0 && pl > uint64(maxPayload) {
		return h, fmt.Errorf("%w: payload %d bytes, limit %d", ErrTooLarge, pl, maxPayload)
	}
	o.Name = string(name)
	h.PayloadLen = int(pl)
	h.Checksum = binary.LittleEndian.Uint64(b[88:])
	h.Tenant = binary.LittleEndian.Uint64(b[96:])
	if want := prefixhash.PieceKey(prefixhash.ObjectKey(h.Parent, o.Name), o.Piece); want != h.Key {
		return h, corrupt("key %s is not the key of piece %d of object %q", h.Key, o.Piece, o.Name)
	}
	return h, nil
}

// CheckObject reports whether h is piece piece of the object name in ns:
// what a reader by name checks, beside the record's own verification.
func (h *Header) CheckObject(ns prefixhash.Namespace, name string, piece int) error {
	switch {
	case h.Kind != KindObject:
		return fmt.Errorf("%w: a block, not an object record", ErrCorrupt)
	case h.Namespace != ns.Digest() || h.Parent != ns.Root():
		return fmt.Errorf("%w: object of namespace %016x, want %016x (%s)", ErrCorrupt, h.Namespace, ns.Digest(), ns)
	case h.Object.Name != name || h.Object.Piece != piece:
		return fmt.Errorf("%w: piece %d of object %q, want piece %d of %q", ErrCorrupt, h.Object.Piece, h.Object.Name, piece, name)
	}
	return nil
}
