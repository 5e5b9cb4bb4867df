// Package blocktest builds encoded blocks for the tests of packages that
// check, store or move them. It is test support: production code does not
// import it.
package blocktest

import (
	"encoding/binary"
	"math/rand/v2"
	"testing"

	"github.com/cespare/xxhash/v2"

	"github.com/kvmesh/kvmesh/block"
	"github.com/kvmesh/kvmesh/prefixhash"
)

// headerSumOff is the offset of the header checksum (see the layout in
// package block).
const headerSumOff = 120

// NS returns a small valid namespace: blocks of 4 tokens, 2 layers, 2 KV
// heads of 8 float16s.
func NS() prefixhash.Namespace {
	return prefixhash.Namespace{Model: "kvmesh/block-test", DType: prefixhash.Float16, BlockTokens: 4,
		Layers: 2, KVHeads: 2, HeadDim: 8}
}

// Random encodes a block of ns chained from parent with random tokens and
// payload drawn from rng, and returns it with its key, tokens and payload.
func Random(t testing.TB, rng *rand.Rand, ns prefixhash.Namespace, parent prefixhash.Key) ([]byte, prefixhash.Key, []uint32, []byte) {
	tokens := make([]uint32, ns.BlockTokens)
	for i := range tokens {
		tokens[i] = rng.Uint32()
	}
	payload := make([]byte, ns.BlockBytes())
	for i := range payload {
		payload[i] = byte(rng.Uint32())
	}
	b, key, err := block.Encode(nil, ns, parent, tokens, payload)
	if err != nil {
		t.Fatal(err)
	}
	return b, key, tokens, payload
}

// Reseal recomputes the header checksum of the encoded block b after a test
// edited its header, so that only the checks behind the checksum can catch
// the edit. The extension (its length field as it reads now, bounded by b)
// is covered too.
func Reseal(b []byte) {
	n := int(binary.LittleEndian.Uint32(b[12:]))
	end := block.FixedHeaderLen + 4*n
	if len(b) >= end+4 {
		end = min(len(b), end+4+int(binary.LittleEndian.Uint32(b[end:])))
	}
	var d xxhash.Digest
	d.Reset()
	d.Write(b[:headerSumOff])
	d.Write(b[block.FixedHeaderLen:end])
	binary.LittleEndian.PutUint64(b[headerSumOff:], d.Sum64())
}
