// Package prefixhash turns token sequences into the keys kvmesh caches KV
// blocks under.
//
// A Namespace names the producer of KV blocks (model, dtype, block size,
// layers, heads, tensor parallelism, tenant salt). Its canonical encoding is
// hashed into the root key k_0, so two namespaces never share a key and two
// tenants with different salts never see each other's prefixes.
//
// A prompt of n tokens has ⌊n/B⌋ full blocks of B tokens. Block i's key is
// k_i = H(k_{i-1} ‖ tokens of block i as little-endian uint32), where H is two
// xxhash64 digests with fixed, distinct seeds, concatenated into 128 bits.
// A key therefore commits to the namespace and to every token before it: equal
// keys mean equal prefixes. Keys are identical across processes, machines and
// restarts; testdata/golden.json pins them, and any change of encoding fails
// that test.
//
// For placement, a chain is cut into chunks of C consecutive blocks; every
// block of a chunk is placed by the key of the chunk's first block.
//
// The package imports nothing else of kvmesh. Its functions are pure and safe
// for concurrent use; a Chain is not.
package prefixhash
