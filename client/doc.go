// Package client is the Go client of kvmesh, for inference workers and the
// CLI.
//
// A worker speaks in token sequences: Lookup asks how much of a prompt is
// cached, Get reads the cached prefix's blocks, Put publishes the blocks it
// computed. The client turns tokens into block keys itself with prefixhash
// (k_0 = H(namespace), k_i = H(k_{i-1} ‖ block i's tokens)), so a key never
// depends on which node or process computed it.
//
// Calls honour the context's deadline; a call without one gets
// Options.Timeout. Only calls that are safe to repeat are retried, and only
// when the node was Unavailable: reads, Exists, Stats, and Put (a block's key
// is a function of its contents, so storing it twice is harmless). A BatchGet
// stream cut off midway resumes after the last block it delivered. Retries are
// bounded by Options.MaxRetries with exponential backoff.
//
// Bulk bytes (Get and Put payloads) go through a small internal seam, so that
// a data-plane fast path (package transfer: TCP framing, same-host shared
// memory) can take them without changing this API.
//
// A Client is safe for concurrent use.
package client
