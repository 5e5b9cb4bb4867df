// Package kvevents publishes a node's KV events in vLLM's format, so that
// the indexers and routers built for vLLM's engines (llm-d's KV-cache
// indexer, vLLM's own subscribers, kvmesh route) see what kvmesh's tiers
// hold as they see an engine's GPU: BlockStored when a block enters a tier
// (medium "GPU" for HBM, "CPU" for DRAM, "DISK" for NVMe), BlockRemoved
// when it leaves one (a demotion is a removal and a store), and
// AllBlocksCleared when a namespace is dropped.
//
// # Wire format
//
// As vLLM's kv_events.py: each batch is a ZMQ PUB multipart message
// [topic, sequence number as 8 bytes big-endian, payload], the payload a
// KVEventBatch in msgpack as msgspec writes an array_like tagged union
// with omit_defaults: [ts, [event...], data-parallel rank] (the rank nil:
// vLLM always sends it, and llm-d decodes exactly three fields), each
// event an array starting with its class name —
//
//	["BlockStored", block_hashes, parent_block_hash, token_ids, block_size,
//	 lora_id, medium, lora_name, extra_keys, group_idx, kv_cache_spec_kind,
//	 kv_cache_spec_sliding_window]
//	["BlockRemoved", block_hashes, medium, group_idx]
//	["AllBlocksCleared"]
//
// trailing fields at their default left out. The sequence number counts
// batches from 0 per publisher. A ROUTER socket (ReplayAddr) answers a
// request [identity, "", start sequence] with [identity, "", seq, payload]
// for each batch it still holds from start on, then [identity, "", -1, ""],
// as vLLM's replay socket does.
//
// A block's hash is its key under its namespace's scheme: for key scheme
// kvmesh the 16-byte key, for key scheme vllm vLLM's own 32-byte block
// hash (prefixhash.BlockLink), the one the engine publishes for the same
// tokens, so that an indexer matches kvmesh's copies and the engine's GPU
// blocks alike. parent_block_hash is left out for a block that starts its
// chain. The topic is "kv@<node>@<model>" by default, the form llm-d's
// subscriber parses; the model is the one the node has seen requests name
// for the namespace.
//
// # Never blocking the node
//
// The store calls the Publisher (it implements store.Events) under its
// index lock; the calls copy the block's header into a bounded queue, or
// drop the event and count it when the queue is full, and return. One
// goroutine turns the queue into batches (per topic, BatchEvents or
// BatchInterval, whichever first) and sends them. A subscriber that falls
// behind loses batches at the PUB socket's high-water mark, as with vLLM,
// and sees the gap in the sequence numbers; a replay recovers the batches
// the publisher still holds.
//
// # Libraries
//
// ZMQ is github.com/go-zeromq/zmq4, msgpack github.com/vmihailenco/msgpack/v5:
// both pure Go, so the node stays a cgo-free static binary (libzmq through
// cgo would not), and both are the ones llm-d's indexer uses to read
// vLLM's events, which makes that indexer and this publisher agree on the
// wire by construction. zmq4 implements ZMTP 3 and interoperates with
// libzmq (clients/python/tests/test_kv_events.py decodes with pyzmq and
// msgpack from vLLM's schema; test/llmd runs llm-d's own indexer on a
// node's events). What it lacks against libzmq:
// a PUB's high-water-mark drops are not counted (Stats counts the
// publisher's own queue drops), and zmq4's automatic reconnect races with
// Close, so Subscribe does without it: it returns when the connection
// ends, and callers (kvmesh route) subscribe again. Encode writes the array form directly (no struct
// tags), and Decode accepts every form vLLM has published: integer or bytes
// hashes, the fields of 2026 (medium, group_idx, kv_cache_spec_kind and
// _sliding_window) present or not.
package kvevents
