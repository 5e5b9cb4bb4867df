// Package block is the encoded KV block: the format every kvmesh component
// writes, stores, moves and verifies. It is a leaf package (it depends on
// prefixhash and xxhash only), so a worker's client can encode and check
// blocks without linking the storage engine, the way pebble's sstable and
// record formats stand apart from its DB.
//
// # Format
//
// A block is a header (format version 2 or 3, key format version, namespace
// digest, key, parent key, token ids, KV layout, payload length, xxhash64 of
// the payload, tenant tag, xxhash64 of the header) followed by the payload,
// [layer][K|V][token][kv_head][head_dim] or [layer][token][latent_dim], and
// its scales when the namespace has them. Format 3 (latent layouts, scales,
// the vllm key scheme, extra keys) adds the layout, scheme, scales and
// latent dim in bytes format 2 reserved, and an extension after the tokens:
// the parent's vLLM hash and the extra keys, zero-padded to the namespace's
// room so that all blocks of a namespace have one size. The header is
// zero-padded to 64 bytes. Decode verifies all of it, the padding's zeros
// included (no byte of a block goes unchecked, so a block has one
// encoding), and key == H(parent ‖ tokens ‖ extra keys) under the block's
// key scheme (prefixhash.BlockLink),
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
// A namespace with groups (hybrid models: full attention, sliding window,
// recurrent state, indexer; prefixhash.Group) stores one record per group
// of each block. Its header names the group (and its kind, its anchor and
// a sliding group's window in blocks) in bytes that are zero without
// groups, so blocks written before groups decode as before; its key field
// holds prefixhash.GroupKey(k_i, g), and Decode checks it against the
// block's chain key (Header.Chain); its layout is the group's (a state
// group's is prefixhash.StateKV: per layer and head, a declared number of
// bytes). Header.LinkParent names the record a store hangs it from. A
// group's record splits into parts as a block does (RankGroupPart).
// testdata/groups.json pins such records for other implementations.
//
// # Objects
//
// The same format carries objects (object.go): opaque bytes a caller stores
// under a name in a namespace, in pieces. An object record sets the KV
// layout byte to 0xFF and has no tokens, so a build that predates objects
// refuses one as corrupt; and its key is the piece's key
// under the object's name (prefixhash.ObjectKey, PieceKey), checked like a
// block's. It also carries the retention the writer asked for (a pin and a
// TTL), which the store applies as it stores the record.
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
