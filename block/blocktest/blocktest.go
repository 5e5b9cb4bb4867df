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

// Hybrid returns a small namespace with one group of each kind: full
// attention (layers 1 and 4), a sliding window of 6 tokens (layers 0, 2,
// 3, 5), a recurrent state (layer 6, 2 heads of 16 bytes) and an indexer
// (the full group's layers, a latent of 4); blocks of 4 tokens.
func Hybrid() prefixhash.Namespace {
	return prefixhash.Namespace{Model: "kvmesh/hybrid-test", DType: prefixhash.Float16, BlockTokens: 4, Layers: 7,
		Groups: prefixhash.MustGroups(
			prefixhash.Group{Kind: prefixhash.GroupFull, Layers: []int{1, 4}, Layout: prefixhash.SplitKV, DType: prefixhash.Float16, KVHeads: 2, HeadDim: 8},
			prefixhash.Group{Kind: prefixhash.GroupSliding, Window: 6, Layers: []int{0, 2, 3, 5}, Layout: prefixhash.SplitKV, DType: prefixhash.Float16, KVHeads: 2, HeadDim: 8},
			prefixhash.Group{Kind: prefixhash.GroupState, Layers: []int{6}, Layout: prefixhash.StateKV, DType: prefixhash.Float32, KVHeads: 2, StateBytes: 16},
			prefixhash.Group{Kind: prefixhash.GroupIndexer, Layers: []int{1, 4}, Layout: prefixhash.LatentKV, DType: prefixhash.Float16, LatentDim: 4},
		)}
}

// Record encodes group g's record of the block of tokens chained from
// parent (a link: prefixhash.KeyLink of the parent key, or ns.RootLink()),
// with a payload drawn from rng; it returns the record and the block's
// link (what the next block chains from).
func Record(t testing.TB, rng *rand.Rand, ns prefixhash.Namespace, g int, parent prefixhash.Link, tokens []uint32) ([]byte, prefixhash.Link) {
	payload := make([]byte, ns.GroupBytes(g))
	for i := range payload {
		payload[i] = byte(rng.Uint32())
	}
	b, link, err := block.EncodeGroup(nil, 0, ns, g, parent, tokens, nil, payload)
	if err != nil {
		t.Fatal(err)
	}
	return b, link
}
