// Package pattern makes the keys and values that the transfer tests and the
// measurement harness (transfertest) move: distinct keys, and values that
// are cheap to make yet differ from batch to batch. It is test support, a
// leaf so that the transfer package's own tests can import it.
package pattern

import (
	"encoding/binary"
	"math/rand/v2"

	"github.com/kvmesh/kvmesh/prefixhash"
)

// Key returns a distinct key for every i.
func Key(i int) prefixhash.Key {
	var k prefixhash.Key
	binary.BigEndian.PutUint64(k[8:], uint64(i)+1)
	k[0] = 0xa5
	return k
}

// Value returns n bytes that depend on i and n: a pseudo-random pattern of a
// prime length, repeated (cheap to make, even under the race detector, and
// no two batches alike).
func Value(i, n int) []byte {
	r := rand.New(rand.NewPCG(uint64(i), uint64(n)))
	b := make([]byte, n)
	pat := b[:min(n, 4099)]
	for j := range pat {
		pat[j] = byte(r.Uint32())
	}
	for j := len(pat); j < n; j += len(pat) {
		copy(b[j:], pat)
	}
	return b
}
