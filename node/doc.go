// Package node is the kvmesh daemon: configuration (Options), the gRPC
// services of proto/kvmesh/v1, Prometheus metrics, health, and the process
// lifecycle. It is the only package that knows gRPC servers (and, for a
// cluster, memberlist); it wires the cache, the transfer engine and the
// prefill engine together.
//
// A Node serves kvmesh.v1.CacheService and kvmesh.v1.AdminService over a
// Cache, with gRPC health checking and server reflection on, and an HTTP
// server with /metrics (every metric named kvmesh_*) and /healthz. Open builds
// the production node: store.Local over a DRAM tier and an NVMe tier under
// Options.DataDir; New serves any Cache (tests use an in-memory one).
//
// # Requests
//
// Every request is checked before it reaches the cache: a missing or invalid
// namespace, a key that is not 16 bytes, a block whose tokens or payload do
// not match its namespace, a namespace whose blocks exceed MaxBlockBytes, or
// more than MaxBatchBlocks blocks in one request is answered InvalidArgument
// with a message that starts with the field at fault ("block.tokens: ...");
// the node keeps serving. A full cache answers ResourceExhausted. A miss in a
// BatchGet is a frame of the stream, not an error. A block that fails
// verification on its way out (checksum, key, namespace) is answered as a miss
// and counted in kvmesh_blocks_refused_total.
//
// BatchPut receives each block into one buffer per stream, computes its key
// as H(parent ‖ tokens) and its header with store.AppendHeader, and stores it
// as soon as its last byte arrives, so a stream of any length holds one block
// in memory. BatchGet pins one block at a time and cuts its payload into
// frames of at most ChunkBytes, so no message exceeds MaxMessageBytes.
//
// # Deadlines and shutdown
//
// Every request runs under the client's deadline and at most RequestTimeout;
// a cancelled request stops at the next block and releases its pin. Serve
// returns when its context ends: health turns NOT_SERVING, /healthz answers
// 503, requests in flight get ShutdownTimeout to finish, then are cancelled,
// and the cache is closed only after every handler has returned.
//
// # Concurrency
//
// Handlers run concurrently on gRPC's goroutines and share only the Cache
// (safe for concurrent use) and the metrics. Serve owns the two server
// goroutines and waits for them before it returns.
package node
