// Package store is the cache as its callers see it: Local, one node's blocks
// over its tiers, and Cluster, placement and peers on top of Local. It owns
// the block format (block.go) and the caching policy.
//
// # Block format
//
// A block is a header (format version, namespace digest, key, parent key,
// token ids, KV layout, payload length, xxhash64 of the payload, xxhash64 of
// the header) followed by the payload, [layer][K|V][token][kv_head][head_dim].
// Decode verifies all of it, including key == H(parent ‖ tokens), before any
// byte is served; a block that fails is dropped and counted as a miss.
package store
