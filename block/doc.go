// Package block is the encoded KV block: the format every kvmesh component
// writes, stores, moves and verifies. It is a leaf package (it depends on
// prefixhash and xxhash only), so a worker's client can encode and check
// blocks without linking the storage engine, the way pebble's sstable and
// record formats stand apart from its DB.
//
// # Format
//
// A block is a header (format version 2, key format version, namespace
// digest, key, parent key, token ids, KV layout, payload length, xxhash64 of
// the payload, tenant tag, xxhash64 of the header) followed by the payload,
// [layer][K|V][token][kv_head][head_dim]. Decode verifies all of it,
// including key == H(parent ‖ tokens) with H = prefixhash's SHA-256 keys,
// before any byte is served (the store drops a block that fails and counts a
// miss). A block of format version 1 or of another key format (one an older
// kvmesh left on disk, keyed by xxhash64) fails with ErrOtherFormat: its key
// means nothing under this build's keys. The xxhash64 checksums catch
// accidents (torn writes, bit flips), not adversaries: the key, a
// collision-resistant hash of the tokens, is what ties a block to its
// prefix, and a reader by tokens also compares the stored tokens with the
// ones it asked for. The tenant tag records who wrote the block; the format
// carries it and enforces nothing.
//
// The byte layout is documented beside the constants in block.go; the
// Python client (clients/python/kvmesh/block.py) reads and writes the same.
//
// # Ownership and concurrency
//
// The functions are pure: they may be called from any goroutine. Decode and
// DecodeHeader return values that alias the buffer they decoded (Payload,
// and Tokens where the machine allows): they are valid as long as it is.
// Encode and AppendHeader append to dst and retain nothing.
package block
