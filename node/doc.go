// Package node is the kvmesh daemon: configuration (Options), the gRPC
// services of proto/kvmesh/v1, Prometheus metrics, health, and the process
// lifecycle. It is the only package that knows gRPC servers; it wires the
// cache, the transfer engine, the cluster's membership (package gossip),
// the prefill engine and its durable queue, and the OpenAI-compatible API
// (package openai) together. It accumulates no surface of its own: a
// surface is a package that declares what it needs of the node (as
// openai.Node), and node implements it and mounts it.
//
// A Node serves kvmesh.v1.CacheService, AdminService, PeerService and
// PrefillService over a Cache, with gRPC health checking and server reflection on, and an HTTP
// server with /metrics (every metric named kvmesh_*, but the gRPC server's
// standard grpc_server_* and the Go runtime's), /healthz, /livez, /readyz
// (ready once Serve runs and membership has joined) and, with
// Options.Pprof, /debug/pprof/. Open builds the production node; New
// serves any Cache alone (tests use an in-memory one).
//
// Every address may have port 0. What was bound is logged in one line when
// the node serves and, with Options.ReadyFile, written as JSON once it
// serves (package node/ready), so that nothing needs a port found free
// beforehand. Others see the bound ports, with an unspecified host (0.0.0.0,
// ::) replaced by the advertised one: in the gossiped MemberMeta, the
// gossip advertise address and the ready file.
//
// # The cluster
//
// Open wires store.Cluster over store.Local (a DRAM tier and an NVMe tier
// under Options.DataDir) and everything that reaches the other nodes:
//
//   - Membership (cluster.go, package gossip): memberlist on GossipAddr,
//     joined through the Join seeds, gossiping gossip.MemberMeta (gRPC,
//     HTTP and data addresses, tier capacities, RDMA devices, role). Seeds
//     that do not answer and members that failed are asked again every
//     ReconnectInterval, so a node may start before its seeds and a
//     partition heals. The node id is kept in DataDir/node-id. The live
//     members, weighted by capacity, are store.Cluster's placement
//     (placementView builds it from gossip's snapshot, once per change).
//   - The data plane (dataplane.go): a transfer.Server on DataAddr and a
//     transfer.ShmServer on ShmSocket, serving this node's own tiers (never
//     the cluster: an owner that fanned out again could loop). Gets pin
//     blocks with Local.GetMany until they are written; pushed blocks must
//     be the block their key names and pass Local.Put's verification;
//     lookup frames count leading keys of runs.
//   - Peers (peers.go), store.Peers: per member, a transfer.Client made on
//     first use from its gossiped address and closed when it leaves. A peer
//     whose call failed is skipped for PeerBackoff, so a dead or
//     partitioned node costs one deadline per backoff, not one per request.
//   - The fabric (fabric.go; Options.Cluster.Transport, issue 36): on auto or ucx,
//     UCX with the DRAM arena registered as the data plane's window, and
//     each peer's client a transfer.RMAClient that reads what the peer
//     holds in DRAM one-sidedly. It stops after the data plane and the
//     peers, before the store unmaps the arena. MemberMeta.Fabric says
//     what each node runs.
//
// The services go through the cluster: Lookup locates each block of the
// prefix (one lookup request per owner), BatchGet reads local blocks and
// fetches the rest from their owners in windows of at most 64 MiB whose
// remote part is bounded by GetTimeout as a whole, BatchPut stores each block
// and queues it for its owners (chunk keys: see cache.proto), Exists and
// Publish likewise. Misses from dead, slow or partitioned peers are misses,
// never errors.
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
// and counted in kvmesh_blocks_refused_total{reason="verify"}; in a BatchGet
// by tokens, a block whose stored parent and tokens are not the prompt's is
// answered as a miss too, counted under reason="tokens".
//
// Every InvalidArgument, ResourceExhausted and PermissionDenied carries
// details (status.go): a google.rpc.ErrorInfo with a stable reason of
// kvmeshv1.ErrorReason (domain kvmesh.dev) and a BadRequest naming the
// fields or a QuotaFailure naming what ran out; no other file builds a
// status of those codes. Stats' namespaces, Quotas and Members come a page
// at a time (page.go): at most 1000 entries, and a next_page_token that is a
// cursor, the sort key of the page's last entry.
//
// BatchPut receives each block into a pooled buffer taken when the block's
// first payload bytes arrive, computes its key as H(parent ‖ tokens) and its
// header with block.AppendHeader, stores it as soon as its last byte
// arrives and gives the buffer back, so a stream holds at most one block in
// memory, and none while it sends only headers or sits between blocks.
// BatchGet pins one block at a time and cuts its payload into frames of at
// most ChunkBytes, so no message exceeds MaxMessageBytes.
//
// # Limits
//
// What a client can make the node hold is bounded (Options.Limits), with or
// without a token:
//
//   - MaxConcurrentStreams (default 256) calls at once per client
//     connection; further calls wait on the client.
//   - MaxInFlightBytes (default 256 MiB) of BatchPut block buffers,
//     node-wide: a block is charged from its first payload bytes until it
//     is stored; a stream that finds no room within a second (or its
//     deadline) is refused with ResourceExhausted naming
//     max_inflight_bytes. One tenant's streams hold at most a quarter of
//     it, and a stream that sends no message for ReceiveTimeout (5s) is
//     ended with DeadlineExceeded, its buffer given back: stalled streams
//     cannot keep other writers out. Each data plane has a budget of the same size for
//     its requests' tables and scratch and its puts' values
//     (transfer.ServerOptions.MaxInFlightBytes: a request waits for room
//     until its deadline, then is refused; a put's values are reserved a
//     4 MiB segment at a time as they arrive, and a put that stops sending
//     for ReadTimeout, 5s, is dropped).
//   - Lookups of at most transfer.Limits.MaxLookupKeys (8192) keys per
//     data-plane frame; peers split longer chains. A connection keeps no
//     request-sized buffer once its request is done.
//   - MaxBatchBlocks blocks per request, MaxMessageBytes per message,
//     MaxBlockBytes per block, RequestTimeout per request.
//   - Data-plane connections (transfer.ServerOptions.MaxConns, 1024;
//     shared memory 64 clients) count once their hello is accepted, a
//     tenant's at most a quarter; sockets still in their 2 s handshake have
//     slots of their own, the oldest evicted when those are full.
//   - The HTTP address (openai.NewServer): headers within 10s, the request
//     within 1m, each write of a response within 1m, 2m idle between
//     requests.
//   - The model names shown by Stats: at most 4096 of namespaces that hold
//     blocks, and the 1024 names requests named most recently, so made-up
//     names cannot push out real ones.
//
// # Prefill
//
// Unless Options.Prefill.Disabled, the node also serves
// kvmesh.v1.PrefillService with the bundled engine (package prefill) over
// its own Cache, through an adapter (engineCache): the engine's lookups and
// publications reach whatever the node's cache reaches. A synchronous
// Prefill runs at once (Options.Prefill.Concurrency at a time). A queued one
// (queue=true) is stored in a pebble database under DataDir/prefill-queue
// and answered with a request id; one worker runs queued requests in order
// with Engine.PrefillBackground. The rule: queued work computes only while
// no synchronous request is being handled (from the handler's start to its
// answer, then a 5ms grace), in chunks whose computation a synchronous
// request cancels at the forward pass's next check (products are cut to
// about 32 MFLOP); the chunk is redone afterwards from the K/V kept in
// memory, and every finished chunk's blocks are published at once. A stopping node interrupts the queued
// request first; it is still recorded as running and runs again (from its
// published blocks) when the node reopens the data dir. The queue holds at
// most QueueSize requests not yet done (ResourceExhausted beyond); results
// are kept ResultTTL (and at most MaxResults). The session field or the
// x-session-affinity header is echoed, logged and counted
// (kvmesh_prefill_session_hints_total) as a routing hint; lookups never use
// it. An empty prompt, a token outside the vocabulary or a prompt longer
// than the model's context is InvalidArgument naming "tokens".
//
// # The OpenAI-compatible API
//
// The same engine answers OpenAI's /v1/models, /v1/completions and
// /v1/chat/completions and the asynchronous API (POST /v1/queue) on the
// HTTP address: package openai, over the engine and the prefill queue's
// pebble database (its batches live there under keys of their own). The
// node implements openai.Node (openai_node.go: its id, the gRPC API's
// tokens and scopes, stopping, foreground work, the flush of pushes to
// owners, the peers' HTTP addresses from gossip), mounts the API on its
// HTTP mux, and starts and stops its workers with the prefill queue's. A
// node without an engine answers /v1/ with 503. kvmesh route (package
// router) is that API in front of a cluster, another process. With
// Options.Security.TLS the HTTP address speaks TLS too (HTTPTLS is
// implied) with the node's certificate (a client certificate checked when
// given, not required), peers reach it over HTTPS verified against the
// cluster CA (PeerTLS), and it gossips MemberMeta.TLS so routers without the CA leave
// it alone; without TLS the address is plain HTTP, for a network where
// bearer tokens may travel. A peer is never sent a caller's bearer token:
// it is asked with the cluster credential and the node's vouch for the
// caller (openai.VouchHeader, auth.File.Vouch).
//
// # Security
//
// With Options.Security.TLS the gRPC API and the TCP data plane speak TLS 1.3 only,
// from one configuration (transfer.LoadTLS); its ClientAuth makes both
// mutual TLS. The node reaches its peers (data plane and PeerService) with
// Options.Security.PeerTLS, so with mutual TLS a cluster admits only nodes holding a
// certificate of its CA. Failed handshakes are counted
// (kvmesh_grpc_tls_handshake_failures_total, and per data-plane transport
// kvmesh_transfer_unauthorized_connections_total).
//
// With Options.Security.Tokens (shared tokens: one tenant) or Options.Security.TokensFile
// (tenants, package auth) every gRPC call must carry "authorization: Bearer
// <token>" metadata with an accepted token (an interceptor on unary and
// streaming calls alike, reflection included, before any handler runs),
// and every data-plane connection, TCP or shared memory, must present one
// in its hello; a refusal is Unauthenticated (gRPC) or ErrAuth (data plane)
// with a message saying why, and is counted
// (kvmesh_grpc_refused_requests_total by reason). The token authenticates a
// principal (auth.Principal) whose scopes the method must need no more than
// (methodScope: writes need write, quotas and drops admin, PeerService
// cluster; else PermissionDenied), and which travels in the request's
// context (auth.WithPrincipal). Health checking (grpc.health.v1.Health)
// stays open: load balancers and Kubernetes probes carry no credentials,
// and it tells a caller only that the node is up. Tokens are compared as
// SHA-256 digests in constant time; SetTokens and SetTokensFile rotate the
// accepted set at run time. The node presents the first shared token, or
// the file's cluster token, to its peers. Membership gossip is guarded
// separately, by Options.Cluster.GossipKey: since members are sent the
// blocks they own, with the node's cluster credential, Open refuses a node
// with any credential (Security.Tokens or Security.TokensFile) but no
// GossipKey unless Options.Cluster.InsecureGossip (--insecure-gossip) says
// the network is trusted.
// Mutual TLS does not replace the key: it guards gRPC and the data plane,
// and memberlist's packets carry neither.
//
// The data dir is the node's user's alone: kvmesh creates its directories
// 0700 and its files 0600 (node-id, written durably: synced, renamed,
// directory synced; quotas.json; callback-secret; NVMe segments), pebble's
// included (the NVMe index, the prefill queue: internal/privatefs), and
// the shared-memory socket Listen.ShmSocketMode (0600; with
// Listen.ShmSocketGroup, 0660 and the socket's own directory 0710, both in
// that group, for workers running as other users). A data dir made by an older
// version keeps its modes: chmod -R go-rwx it.
//
// Tenants. A tenant's namespaces are salted by the node (namespace: the
// principal's salt goes before the caller's own), so a tenant can neither
// name nor compute another's namespaces or keys. Its blocks carry its tag
// in their header (BatchPut stamps it; a tenant's data-plane puts must
// carry it; the engine stamps what it publishes for the tenant), and the
// request's access (auth.Access, in its context) is checked per block
// wherever a block is served, stored or described: store.Local's reads,
// writes, Contains, LongestPrefix and Info, hence BatchGet, Exists,
// Lookup, BlockInfo, the data plane over TCP and shared memory, and the
// requests this node makes to its peers for the tenant (scoped frames). A
// block of another tenant is a miss, even by its exact key. Node-wide
// namespaces are not salted, so a tenant can compute their keys and write
// blocks under them with its own tag; a node-wide principal without the
// cluster scope therefore reads node-wide blocks only (auth.NodeWide; its
// admin views, viewOf, still see every namespace), the engine runs a
// node-wide request the same way, and a node-wide write takes back keys
// and digests a tenant wrote under first (store.Local.Put), after which
// the tenant's writes there are refused. Stats and
// Quotas list a tenant's own namespaces only; /metrics labels namespaces
// with a keyed hash of their digest (namespaceLabel) when the node has
// tenants; a tenant names a namespace by digest only when its blocks here
// are its own (mayNameDigest). A queued prefill records its owner and runs,
// and is readable, as that tenant's. Per-namespace quotas (store.Local's:
// Options' QuotaDRAMBytes and QuotaNVMeBytes as the default,
// AdminService.SetQuota per namespace, kept in DataDir/quotas.json) bound
// what a tenant holds in each tier; a write its quota has no room for is
// answered ResourceExhausted. A quota is set only on a namespace that holds
// the caller's blocks here (or, for a node-wide caller naming the
// namespace, will hold node-wide ones), and binds only blocks of that tag
// (store.Quota.Bound): a tenant's quota on a digest it wrote under first
// never limits the node-wide blocks that take it back.
//
// # Deadlines and shutdown
//
// Every request runs under the client's deadline and at most RequestTimeout;
// a cancelled request stops at the next block and releases its pin. Serve
// returns when its context ends: health turns NOT_SERVING, /healthz answers
// 503, requests in flight get ShutdownTimeout to finish, then are cancelled;
// a node of a cluster then pushes what is queued, hands its DRAM blocks to
// the owners they get without it (up to HandoffBytes) and leaves the
// membership, within ShutdownTimeout; then it writes what only DRAM holds
// to NVMe (store.Local.Spill, up to Tiers.SpillOnStopBytes, those no member took
// first), within ShutdownTimeout again, logging its progress, so that a
// restart on the data dir serves them; last the data plane, the peers and
// gossip stop and the cache is closed, after every handler has returned.
//
// # Concurrency
//
// Handlers run concurrently on gRPC's goroutines and share only the Cache
// (safe for concurrent use) and the metrics. Serve owns the two server
// goroutines and waits for them before it returns. The cluster's goroutines
// (transfer servers, memberlist and its refresher and reconnector, the peers'
// pruner, store.Cluster's pushers) belong to the Cache, whose Close stops
// and waits for them. memberlist's callbacks run under its lock: they copy
// what they need and never call back into memberlist.
package node
