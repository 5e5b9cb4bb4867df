package prefixhash

import (
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"unicode/utf8"
)

// Objects are opaque bytes a caller stores under a name of its own in a
// namespace, beside the namespace's prefix-chained blocks (Mooncake Store's
// objects). Their keys live in the same key space as blocks:
//
//	object key  o   = trunc128(SHA-256(k_0 ‖ "object" ‖ name as UTF-8))
//	piece j ≥ 1 key = trunc128(SHA-256(o ‖ "piece" ‖ j as little-endian uint32))
//
// where k_0 is the namespace's root (Namespace.Root), so two namespaces (two
// tenants) never share an object key, as they never share a block key. An
// object larger than one record is stored in pieces; piece 0 is stored under
// the object key itself, so that one probe answers whether the object exists
// and how large it is. testdata/objects.json pins the keys for other
// implementations.

// MaxObjectName is the longest object name in bytes.
const MaxObjectName = 1024

// ErrObjectName is wrapped by every error CheckObjectName returns.
var ErrObjectName = errors.New("prefixhash: invalid object name")

// CheckObjectName reports why name cannot name an object: empty, longer
// than MaxObjectName bytes, or not valid UTF-8.
func CheckObjectName(name string) error {
	switch {
	case name == "":
		return fmt.Errorf("%w: empty", ErrObjectName)
	case len(name) > MaxObjectName:
		return fmt.Errorf("%w: %d bytes, the limit is %d", ErrObjectName, len(name), MaxObjectName)
	case !utf8.ValidString(name):
		return fmt.Errorf("%w: %q is not valid UTF-8", ErrObjectName, name)
	}
	return nil
}

// ObjectKey returns the key of the object name in the namespace whose root
// is root (piece 0's key). It does not check name (CheckObjectName).
func ObjectKey(root Key, name string) Key {
	h := sha256.New()
	h.Write(root[:])
	h.Write([]byte("object"))
	h.Write([]byte(name))
	var sum [sha256.Size]byte
	return Key(h.Sum(sum[:0])[:KeySize])
}

// PieceKey returns the key of piece j of the object whose key is obj: obj
// itself for piece 0.
func PieceKey(obj Key, j int) Key {
	if j == 0 {
		return obj
	}
	var msg [KeySize + len("piece") + 4]byte
	copy(msg[:], obj[:])
	copy(msg[KeySize:], "piece")
	binary.LittleEndian.PutUint32(msg[KeySize+len("piece"):], uint32(j))
	return hashBytes(msg[:])
}
