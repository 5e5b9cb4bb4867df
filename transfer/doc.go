// Package transfer is kvmesh's data plane: it moves batches of opaque
// (key, bytes) pairs between processes, separately from the gRPC control
// plane. It knows nothing of blocks, except to serve parts of them (below). The store plugs in through two small
// interfaces declared here: a Source, which serves values (pinned until the
// server has sent them), and a Sink, which receives pushed values.
//
// # Transports
//
// TCP (Server, Client): a framed protocol (frame.go) over a pool of
// connections per peer, one request per connection at a time. A get request
// carries up to Limits.MaxItems keys; its response carries a status per key
// (found, miss, error) and the found values. A lookup request (lookup.go)
// carries runs of keys of prefix chains and is answered with, per run, how
// many leading keys the peer holds, when its Source is a Looker: the
// cluster's one-round prefix lookup, without gRPC's costs. The server writes the response
// header, the item table and the values straight from the Source's memory in
// one vectored write (net.Buffers, writev): no value byte is copied into a
// frame. The client reads values into pooled, 64-byte-aligned receive
// buffers. Puts are the mirror image.
//
// Shared memory (ShmServer, ShmClient; Linux): for an inference worker on
// the node's host. The node listens on a unix socket and gives each client a
// memfd region that the client maps read-only; values are copied once, from
// the Source into the region, and the client reads them in place. Requests,
// (offset, length) answers and releases travel over the socket; value bytes
// never do (puts without a writable arena excepted: they travel inline).
// With ShmServerOptions.Arena, a node-wide client allowed to write whose
// hello asks for it (ShmClient and the Python client do) also maps the node's DRAM
// arena: gets are answered with arena offsets under a lease (no copy at
// all), and puts reserve slots there, are written by the client and
// committed by the server (Reserver); see ShmServer.
//
// Parts (parts.go; issue 23): a tensor- or pipeline-parallel rank reads its
// slice of blocks with PartPeer.GetParts (Client and ShmClient): a get-part
// request names a head and layer range per key, and the server answers
// with part records it builds from the whole blocks its Source holds
// (block.AppendPartRecord: the block's header rewritten for the part, the
// part's payload, its own checksum), releasing the blocks once built. Over
// TCP the records are built in one pooled buffer charged to the in-flight
// budget; over shared memory, straight into the client's region (never
// read in place from the arena). A range that is not a part of its block is
// StatusError for that item. PartPeer.Claim asks the Sink (a Claimer)
// whether a part still needs sending, for ranks that write identical parts
// (the latent layout); a put of a part whose bytes differ from what is
// stored is answered StatusConflict.
//
// One-sided reads (RMA, RMAClient; issue 36): a Server with a Window (the
// node's DRAM arena registered once with a Fabric) gives node-wide clients
// that ask the window's descriptor (a fabric request: the fabric's own
// descriptor, an epoch, the size) and grants leases on the values its
// Source holds in it (a lease request, answered with an offset and length
// per key; the values stay pinned). The RMAClient reads the granted spans
// through the Fabric into a registered landing region shared by the
// transport's peers, then ends the lease, and the server answers whether it
// still held it: a value read under a lease that had ended (a slot the
// owner may have reused) is discarded and asked for again with a TCP get.
// Values outside the window (NVMe), peers without one, failed fabrics,
// part reads, claims, lookups and writes stay on TCP, so no request fails
// for the fabric's sake. The wire is in lease.go and fabric.go.
//
// The Fabric is UCX (NewUCX) in a build with the ucx tag (cgo; libucp is
// loaded at run time, so the binary starts without it and NewUCX says which
// library is missing): one worker per process, driven by one goroutine
// locked to its thread; gets are ucp_get_nbx; endpoints use peer error
// handling where the transport has it (tcp, verbs), so a dead owner fails
// the gets in flight. UCX's shared-memory transports have none: a get from
// a dead owner over them never completes, the caller's deadline ends the
// Get, and the landing space stays the fabric's (RMA.LandingUse's lost
// bytes). UCX aborts on a worker address it cannot parse, so a reader hands
// it only what an owner of the same UCX version packed, inside a
// checksummed descriptor. fabrictest is an in-process Fabric that runs the
// protocol and the conformance suite in the default build. UCXNetDevice
// maps the data plane's interface to its RDMA device and port (rdmamap);
// RDMADevices lists the host's (an empty list, not an error, when there
// are none).
//
// # Integrity
//
// A frame's header checksum covers the header and, through the table
// checksum it holds, the item table: a corrupt or truncated header or table
// is detected, answered with an error frame where possible, and the
// connection is dropped (the peer serves its other connections on). Value
// bytes are not checksummed here: they are encoded blocks that the store
// verifies on arrival (block.Decode checks the header checksum, the key and
// the payload checksum), and hashing them twice would halve throughput for
// nothing.
//
// Every length a frame declares is checked against Limits (items per frame,
// value size, bytes per frame, keys per lookup frame) before anything is
// allocated for it, so a hostile frame cannot make a receiver allocate
// without bound.
//
// # Memory a client can make a server hold
//
// A Server charges what a request makes it allocate to one budget of
// MaxInFlightBytes (default 256 MiB), before allocating it: the item table
// as it arrives, 64 KiB at a time once each piece's first byte is there,
// then the scratch and the answer's table (about 100 bytes per key or
// item). So a sender that stops holds what it sent, not what it declared.
// A put's values are charged as they arrive, a segment (putSegment, 4 MiB,
// or one larger value) at a time: a segment is reserved once its first
// byte is there, read, handed to the Sink and given back, so a put holds
// at most one segment and a silent put none. A request that finds no room
// waits until its deadline, then is refused with ErrLimit ("server busy").
// A request that stops sending for ReadTimeout (default 5s) is dropped and
// what it reserved given back. A connection keeps no request-sized buffer
// between requests (scratch for at most 128 items and 16 KiB of tables;
// larger ones go to a pool shared by all connections, which the GC empties
// when unused), so an idle connection costs its 64 KiB read buffer; there
// are at most MaxConns (1024) connections, idle for at most IdleTimeout
// (5m). The shared-memory server reads puts the same way (its
// RequestTimeout bounds each wait).
//
// # Security
//
// TLS (ServerOptions.TLS, ClientOptions.TLS): TLS 1.3 only, over the same
// framed protocol. LoadTLS builds both configurations from PEM files
// (TLSFiles: certificate, key, CA, ClientAuth for mutual TLS between nodes,
// ServerName); they suit a gRPC server and client as well. The handshake
// runs when a pooled connection opens, within the client's DialTimeout and
// the server's HandshakeTimeout, so it is paid once per connection, not per
// request. A TLS write cannot be vectored: crypto/tls seals each piece of a
// response into 16 KiB records and writes each record with its own write,
// so a response's header, table and values go out as a sequence of record
// writes instead of one writev; BenchmarkTLS measured that this costs
// nothing beyond crypto/tls itself (the data plane runs at crypto/tls's own
// stream speed), and that TLS itself, AES-GCM and one copy on each side,
// costs most of the throughput of these cores (see BENCHMARKS.md).
//
// Bearer tokens (ServerOptions.Tokens, ClientOptions.Token): every
// connection opens with a hello frame that carries the client's token (none
// when it has none), and the client sends nothing else until the server
// answered: an ack, or an error frame of the authentication class followed
// by closing the connection. So no request is read, let alone served, on an
// unauthenticated connection, and the client's error says why (ErrAuth).
// The server compares the token's SHA-256 with every accepted token's in
// constant time (auth.Tokens). Tokens.Set rotates the set without a
// restart; CloseRevoked then closes the connections whose token was dropped
// or now names another principal (the server keeps each connection's token
// digest, never the token). Over plain TCP the token travels in the clear:
// use TLS wherever the network is not trusted.
//
// Slots (listeners.go): a connection is pending until its hello is accepted
// (HandshakeTimeout, 2s, bounds that), then authenticated. MaxConns (shared
// memory: MaxClients) bounds the authenticated ones and MaxConnsPerTenant
// (MaxClientsPerTenant) one tenant's share of them; pending connections
// have slots of their own, and when those are full the oldest is evicted.
// So sockets that never say hello cannot keep credentialed clients out,
// and one tenant cannot take every slot, nor, on shared memory, pin more
// than its share of regions.
//
// The token authenticates a principal (auth.Principal), kept for the
// connection. Every request is checked against its scopes (a get, get-part
// or lookup needs read, a put, publish or claim write; else ErrAuth and the connection is
// dropped) and runs with the principal and an access in its context
// (auth.WithPrincipal, auth.AccessFrom) that the Source and Sink enforce per
// block: a tenant's connection is confined to its own tenant's blocks
// whatever its frames say; a node-wide principal without the cluster scope
// to node-wide blocks (tag 0) whatever its frames say; a node's (the
// cluster scope) request is confined when its frame is scoped (a node
// reading or writing for a tenant: the client scopes a request when its
// context carries a scoped access), and touches any block otherwise.
// Without tokens every connection is auth.Open, which holds every scope.
//
// Mismatched ends fail at once with ErrAuth, never with a hang or a
// deadline: a plain client of a TLS server is answered with a plain error
// frame saying TLS is required; a TLS client of a plain server recognizes
// the plain frame it gets back; refused certificates fail the handshake.
// Server.Stats counts refused connections (Unauthorized).
//
// Shared memory is local: no TLS. Who may connect is who may open the unix
// socket (ShmServerOptions.SocketMode, default 0600: the server's user and
// root), narrowed, when set, to processes of given user ids (PeerUIDs,
// checked with SO_PEERCRED) and to clients presenting a token (Tokens, in
// the same hello as TCP's). A refused client gets no region. Each client's
// region is its own memfd, sealed and mapped read-only by the client, so a
// client sees only the values it asked for. The DRAM arena is shared only
// with node-wide principals allowed to write (never a tenant's client or a
// node-wide reader, which keep the region): a memfd's inode is mode 0777,
// so any descriptor of it, even one opened O_RDONLY, can be reopened
// through /proc/self/fd writable, and the arena holds every tenant's
// blocks. Writers could write any slot: reservations are verified at
// commit, not afterwards. A client's region is sealed F_SEAL_FUTURE_WRITE
// (Linux 5.1+), so a reopened descriptor of it cannot be written either;
// were it, the client would only spoil its own copies.
//
// # Deadlines and failure
//
// Every Get and Put runs under the caller's context bounded by the client's
// RequestTimeout; the remaining time travels in the request so the server
// stops work (and unpins) when the client has given up. Deadline and
// cancellation interrupt blocked socket I/O at once. A dead, slow or
// partitioned peer therefore turns into an error within the deadline, never
// a hang; callers (store.Cluster) count it as misses. A TCP connection whose
// request failed or was abandoned is closed, never reused, so the next
// request cannot read a stale answer. A shared-memory request that is
// abandoned has its answer released by the client's reader when it arrives.
// A ShmClient whose socket broke (the node restarted) fails every later
// request: dial a new one; results already held stay readable.
//
// # Ownership
//
// Result.Values alias memory the Result owns (pooled receive buffers, the
// client's shared region, or, read in place, the node's DRAM arena under a
// lease that ends at ShmServerOptions.LeaseTimeout if the client has not
// released it by then) and are valid until Result.Release, which must be
// called exactly once; it returns the memory and the client's in-flight byte
// budget (MaxInFlightBytes: requests wait, with their context, for room).
// Values passed to Put are only read during the call. Values handed to a
// Sink alias a receive buffer reused after Sink.Put returns. Values a Source
// returns must stay valid until the release it returns is called.
//
// # Concurrency
//
// Client, ShmClient, Server and ShmServer are safe for concurrent use. Each
// server owns its goroutines (an accept loop per listener, one goroutine per
// TCP connection, two per shared-memory client) and Close stops them and
// waits for them; Close also cancels the contexts given to the Source and
// Sink. Clients own no goroutine but the ShmClient's socket reader, which
// Close stops. All queues are bounded: connections per client (MaxConns),
// in-flight bytes, requests per shared-memory client (MaxPending).
package transfer
