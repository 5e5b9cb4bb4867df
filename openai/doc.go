// Package openai is kvmesh's OpenAI-compatible HTTP API over a node's
// prefill engine: /v1/models, /v1/completions and /v1/chat/completions
// (whole or streamed, usage with prompt_tokens_details.cached_tokens and,
// when the engine decodes speculatively, completion_tokens_details),
// kvmesh's lookup beside them (LookupPath, for routers), and the
// asynchronous API (POST /v1/queue: batches stored durably, run only while
// the engine is idle, pulled by idle peers, announced by signed callbacks).
// Its wire types (Usage, LookupResult, QueueList) and error object
// (WriteError) are what package router speaks too.
//
// The package knows nothing of the daemon. It declares what it needs of
// the node that serves it, Node (identity, authorization, stopping,
// foreground work, the flush of pushes to owners, the peers' ids and HTTP
// addresses), and takes the rest as Options: the engine, the tokenizer,
// the limits, the pebble database the batches live in (the node's prefill
// queue's, under keys of their own), the peers' credential. The node
// implements Node and mounts the API (Register; RegisterDisabled on a node
// without an engine), each route one http.ServeMux pattern.
//
// Bodies (body.go): each endpoint caps its body before reading it (413),
// charges it to Options.MaxInFlightBytes before its first byte (503 when
// there is no room), refuses JSON nested deeper than MaxJSONDepth, and a
// batch's requests are stored with the fields the API knows only.
//
// Files: api.go (Node, New and the lifecycle), options.go, routes.go (the
// routes, authorization, metrics per route), openai.go (completions),
// request.go (checking a completion request), wire.go (wire types and
// the error object), stream.go (server-sent events), batch_api.go (the
// asynchronous API's endpoints and workers), batch.go (the batches'
// store), owner.go (batch ids name the node that stores them, so a node
// asked for a peer's batch asks that peer alone), steal.go (work stealing
// between nodes), callback.go (signed
// callbacks), body.go (reading bodies within their caps and budget),
// server.go (the HTTP server both a node and a router serve it with: read,
// write and idle timeouts that do not cut a long generation).
//
// Errors speak the API's terms: OpenAI's error object with the parameter
// at fault, the shape a value should have in JSON's words (never a Go type
// name), 404 for any path no route serves (NotFound, which says the API is
// under /v1/ when the path is outside it), and tool calling refused with
// 400 unsupported_parameter rather than ignored.
//
// Invariants. A completion needs the write scope (it publishes the blocks
// it computes), a lookup or a list the read scope, a peer's lease call the
// cluster scope; a tenant's prompts run in its namespace (prefill.RunAs)
// and its batches are invisible to other tenants (404). No queued request
// completes twice: an answer is stored with the count that says so in one
// synced write, only from the worker or the peer that holds the batch's
// lease, and only for the next request. Every queue is bounded: requests
// waiting for the engine (Concurrency + MaxWaiting, then 429), queued
// requests per tenant and per node, finished batches kept, callbacks
// waiting for delivery.
//
// Concurrency. Handlers run on net/http's goroutines. Start starts the
// workers (BatchOptions.Share of the engine's slots), the reaper of expired
// batches and the callbacks' sender; Stop cancels them and waits for them;
// Close then makes every later operation on the batches fail, so the caller
// may close the database. The batches' in-memory index is guarded by one
// mutex, never held across a database write or a network call.
package openai
