// Package client is the Go client of kvmesh, for inference workers and the
// CLI.
//
// A worker speaks in token sequences. There is one method per operation,
// each over a Prompt (which blocks: a prompt's tokens and its blocks' extra
// keys, the chain it continues, or blocks by key; which data of each: the
// whole block or a rank's part) and per-call options (CallOption): Lookup
// asks how much of a prompt is cached (it sends the prompt's chain, 16
// bytes a block, and gets counts and runs of blocks per node back), Get
// reads the cached prefix's blocks (into new buffers, the caller's with
// Into, or a callback with Each), View reads them in place until
// View.Release, Put publishes the
// blocks the worker computed. The client turns tokens into block keys
// itself with prefixhash (k_0 = H(namespace), k_i = H(k_{i-1} ‖ block i's
// tokens)), so a key never depends on which node or process computed it.
// The methods of one per combination that came before (PutRank, GetInto,
// GetKeys, ...) stay one release as deprecated wrappers (deprecated.go).
//
// Objects (Mooncake Store's) are values under names of the caller's,
// beside the blocks, same tiers and quotas (object.go): Put and Get take a
// Prompt's Names (Retention, Upsert, PieceBytes; Into, Each), Remove
// removes them from every node, Retain pins or leases them, or a prompt's
// prefix; a call about several objects reports per object (ItemErrors).
//
// A model instance spread over several GPUs puts and gets per rank
// (Prompt.Rank): Put stores a tensor- or pipeline-parallel rank's part of
// each block (its KV heads, its layers; block.RankPart) and Get reads a
// rank's part. The node assembles a block's parts and serves it, and
// Lookup counts it, only once all of them are there; the key names the
// whole model's KV, so a prompt written at one parallel size is read at
// any other (written at TP 2, read at TP 4 or by a single GPU). A part several ranks hold alike
// (the latent of an MLA model) is claimed before it is sent, so that it
// crosses once. Parts travel over the data plane (rank.go).
//
// Calls honour the context's deadline; a call without one gets
// Options.Timeout. Only calls that are safe to repeat are retried, and only
// when the node was Unavailable: reads, Exists, Stats, and Put (a block's key
// is a function of its contents, so storing it twice is harmless). A BatchGet
// stream cut off midway resumes after the last block it delivered. Retries are
// bounded by Options.MaxRetries with exponential backoff.
//
// Block bytes (Get and Put payloads) take the node's data plane (package
// transfer; dataplane.go) when it has one: on the node's host, its shared
// memory (blocks are read in place: in the node's DRAM arena, which a client
// with a node-wide token maps, under a lease the node holds until the
// window's result is released, else in a region the node copies them
// into; valid until View.Release; Get copies; puts are written straight
// into slots the node reserved in its arena and then committed); elsewhere
// its TCP data plane; and the gRPC streams when neither works, or with
// Options.Transport set to TransportGRPC. A transport that fails moves
// the call to the next one and is left alone for a while. The data plane
// serves the node's own tiers: what the node lacks is read through BatchGet,
// which reaches the rest of the cluster, and blocks put through it are
// published in the same request (each with its chunk key) so that the node
// pushes them to their owners. Where
// the data plane is, the node's host id and the cluster's chunk size come
// from Members, asked once a minute at most.
//
// Every block is verified before it is handed out: its header (checksum;
// key = H(parent ‖ tokens), the key asked for; the namespace and layout)
// always, its payload checksum when it crossed a socket (and through shared
// memory with Options.VerifySharedMemory).
//
// Reads of a prompt by tokens (Get, View) and Put send each block's chunk
// key (placement: see proto/kvmesh/v1/cache.proto), computed from the chain
// (Prompt.Parent's blocks first) with the cluster's chunk size; reads by
// key and Exists, given keys alone, do not, and the node then asks every
// member.
//
// Errors: a call the node refuses returns an *Error carrying its gRPC status
// code, the reason the node gave (a stable name, see
// proto/kvmesh/v1/errors.proto) and the field or limit at fault; it matches
// the sentinel of its class with errors.Is (ErrInvalid, ErrNotFound,
// ErrExhausted, ErrQuota, ErrPermission, ErrUnauthenticated,
// ErrUnavailable), and status.Code still reads its code.
//
// The API speaks Go types (Stats, Cluster, Quotas, BlockInfo); lists the
// node returns a page at a time are followed to their end.
//
// # Hybrid models
//
// A namespace with groups (prefixhash.Groups: full attention, sliding
// window, recurrent state, indexer) uses the same verbs (groups.go): Put
// writes the records of Prompt.Group (with Rank, a rank's part of them:
// block.RankGroupPart); Lookup answers the hit rule and says per group what
// it allows (Lookup.Groups); Get by Tokens reads exactly what resuming at
// that prefix needs, each Block naming its Group (gRPC, one stream); Get
// and View by Keys read any group's records (prefixhash.GroupKey).
//
// # Concurrency
//
// A Client is safe for concurrent use: calls from many goroutines share its
// gRPC connection and its data-plane connections (a pool of TCP connections
// or one shared-memory socket, both pipelined). The lock that guards those
// is held while the node's same-host unix socket is dialled (it answers at
// once or not at all), never across a TCP connect or a request. Close
// closes them; calls in flight then fail, and the Client must not be used
// again.
//
// Ownership: the Blocks Get returns, and their payloads, are the caller's.
// Get with Into copies the blocks into buffers the caller owns (and may
// reuse), writing them during the call only. Get with Each hands each block
// to a callback with Payload and Tokens valid only during that call. View
// hands blocks out with
// Payload and Tokens valid only until View.Release (they may alias a
// receive buffer or the node's shared memory); copy what must outlive it.
// Put reads the payloads it is given during the call only.
package client
