package node

import (
	"crypto/tls"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"
	"unicode"

	"github.com/kvmesh/kvmesh/auth"
	"github.com/kvmesh/kvmesh/block"
	"github.com/kvmesh/kvmesh/prefixhash"
	"github.com/kvmesh/kvmesh/store"
	"github.com/kvmesh/kvmesh/transfer"
)

func validEviction(s string) bool {
	_, err := store.ParseEviction(s)
	return err == nil
}

// Default addresses: one port each for gRPC, HTTP (metrics, health), the
// data plane and gossip, all on loopback so that a node started with no
// configuration is reachable from this host only.
const (
	DefaultGRPCAddr   = "127.0.0.1:7600"
	DefaultHTTPAddr   = "127.0.0.1:7601"
	DefaultDataAddr   = "127.0.0.1:7602"
	DefaultGossipAddr = "127.0.0.1:7603"
	DefaultDataDir    = "kvmesh-data"
)

// Sizes.
const (
	KiB = 1 << 10
	MiB = 1 << 20
	GiB = 1 << 30
)

// Options configure a node, grouped by concern as pebble groups its
// options: where it listens (Listen), how it joins its cluster and places
// blocks in it (Cluster), who may call it (Security), where blocks live
// (Tiers), what one request may make it hold (Limits), and the bundled
// engine (Prefill). The zero value of a field means its default;
// EnsureDefaults fills them in and Validate rejects what cannot work,
// naming the field as its path ("Tiers.DRAMBytes").
type Options struct {
	// NodeID names the node in the cluster and in every answer it gives. It
	// must be unique and stable across restarts: placement hashes it, so a
	// node that came back under another id would own other blocks than
	// those it kept on NVMe. Default: the id stored in DataDir/node-id, or,
	// on the first start, the host name and a random suffix, stored there.
	NodeID string
	// DataDir holds the node's persistent state (the NVMe tier's segments
	// and index, the node id). Created if missing. Default "kvmesh-data",
	// relative to the working directory.
	DataDir string
	// Listen is where the node serves: gRPC, HTTP, the data plane.
	Listen ListenOptions
	// Cluster is how the node joins its cluster and spreads blocks in it.
	Cluster ClusterOptions
	// Security is the TLS and the bearer tokens that guard the node.
	Security SecurityOptions
	// Tiers are where blocks live (DRAM, NVMe, HBM), their quotas and the
	// eviction policy.
	Tiers TierOptions
	// Limits bound what a client can make the node hold, and for how long.
	Limits LimitOptions
	// Events publishes the store's KV events (package kvevents).
	Events EventOptions
	// GPU is the CUDA device ordinal of the HBM tier and of the prefill
	// engine's cuda backend (Prefill.Backend). Default 0.
	GPU int
	// ShutdownTimeout is how long a stopping node lets requests in flight
	// finish before it cancels them. Default 8s.
	ShutdownTimeout time.Duration
	// Prefill configures the bundled prefill engine and its queue (its
	// zero value is the default engine; see PrefillOptions).
	Prefill PrefillOptions
	// ReadyFile, when set, is where the node writes, once it serves, a JSON
	// document of the addresses it bound (package ready: node_id, pid,
	// grpc_addr, http_addr, data_addr, gossip_addr, shm_socket), atomically
	// (a temporary file in the same directory, renamed); it is removed when
	// the node stops serving. With every address on port 0, that is how a
	// script or a test learns the node's ports. Its directory must exist.
	// Default none.
	ReadyFile string
	// Pprof serves the Go profiler (net/http/pprof) under /debug/pprof/ on
	// HTTPAddr, which has no authentication: turn it on where only
	// operators reach that address. Default off.
	Pprof bool
	// Version is the kvmesh version reported to Members. Default "(devel)".
	Version string
	// Logger receives the node's structured logs. Default slog.Default().
	Logger *slog.Logger
}

// ListenOptions say where a node serves (Options.Listen).
type ListenOptions struct {
	// GRPCAddr is the host:port of the gRPC API. Port 0 picks a free port
	// (see Node.GRPCAddr). Default 127.0.0.1:7600.
	GRPCAddr string
	// HTTPAddr is the host:port serving /metrics and /healthz. Port 0 picks
	// a free port. Default 127.0.0.1:7601.
	HTTPAddr string
	// DataAddr is the host:port of the data plane (package transfer): other
	// nodes read and push blocks here, and clients move block bytes. Port 0
	// picks a free port (see Node.DataAddr). Default 127.0.0.1:7602.
	DataAddr string
	// ShmSocket is the unix socket of the shared-memory data plane, which
	// clients on this host use to read blocks without a socket copy. Its
	// permissions decide who may read the cache. "off" turns it off.
	// Default DataDir/shm.sock (made absolute).
	ShmSocket string
	// ShmSocketMode is the socket's permission bits: 0600 admits the
	// node's user (and root), 0660 also ShmSocketGroup. Default 0600.
	ShmSocketMode os.FileMode
	// ShmSocketGroup, a group name or id, is given the socket and its
	// directory (search permission only): with ShmSocketMode 0660, the
	// processes of that group (inference workers running as other users)
	// may connect. The node's user must be a member. Give the socket a
	// directory of its own. Default "": the node user's group, untouched.
	ShmSocketGroup string
	// ShmRegionBytes is the shared region each shared-memory client gets,
	// in bytes (memory is committed as blocks are copied in). A multiple of
	// 4 KiB, at least MaxBlockBytes. Default 256 MiB.
	ShmRegionBytes int64
	// AdvertiseHost is the host (name or IP) other nodes and clients reach
	// this node at, used for every address above bound to an unspecified
	// host (0.0.0.0 or ::). Default: GossipAddr's host when it is
	// specified, else the host's private IPv4 address.
	AdvertiseHost string
}

// ClusterOptions say how a node joins its cluster, and how blocks are
// placed and moved between its members (Options.Cluster). Replicas and
// ChunkTokens must be the same on every member.
type ClusterOptions struct {
	// GossipAddr is where membership (memberlist, UDP and TCP) listens, and
	// what other nodes' Join names. Port 0 picks a free port. Default
	// 127.0.0.1:7603.
	GossipAddr string
	// Join lists the gossip addresses (host:port) of members to join.
	// Empty: start a new cluster, alone until others join. Seeds that
	// cannot be reached are retried in the background; so are members
	// that failed (a partition heals by itself).
	Join []string
	// GossipKey encrypts and authenticates gossip (AES-GCM); every member
	// must have the same 16, 24 or 32 bytes (see ReadGossipKey). Default
	// none: gossip in the clear, and any host that reaches GossipAddr may
	// join. A node with any credential (Security.Tokens or
	// Security.TokensFile) needs one, unless InsecureGossip is set: a host
	// that joins gossip owns blocks and is sent them with the node's
	// cluster credential. Mutual TLS does not replace it, since it guards
	// gRPC and the data plane, not gossip.
	GossipKey []byte
	// InsecureGossip lets a node with Security.Tokens or
	// Security.TokensFile start without a GossipKey, accepting that any
	// host that reaches GossipAddr may join the cluster, own blocks and
	// receive them with the node's cluster credential. For trusted networks
	// only. Default false.
	InsecureGossip bool
	// GossipProfile tunes failure detection: "lan" (memberlist's LAN
	// timings: a dead node is noticed in about 5-10s) or "local" (one
	// host, or tests: about 1-2s). Default "lan".
	GossipProfile string
	// Replicas is R, the number of nodes that own each placement chunk.
	// Every member must use the same value. Default 1.
	Replicas int
	// ChunkTokens is the size of a placement chunk in tokens: the blocks of
	// a chunk live on the same owners. Every member must use the same
	// value. Default 512.
	ChunkTokens int
	// LookupTimeout bounds the remote rounds of a lookup: an owner that has
	// not answered by then counts as a miss. Default 100ms.
	LookupTimeout time.Duration
	// LookupRoundPeers bounds the fan-out of a long lookup: a lookup whose
	// chunks have at most this many owners besides this node asks them
	// all at once; one with more asks the first chunk's owners first, then
	// up to this many more, then the rest, so that a prompt whose cached
	// prefix ends early is answered by a few peers instead of one per
	// chunk (store.ClusterOptions.LookupRoundPeers). Default 16
	// (store.DefaultLookupRoundPeers); negative: every owner at once,
	// whatever the fan-out.
	LookupRoundPeers int
	// GetTimeout bounds the remote part of a read (a BatchGet as a whole):
	// blocks that have not arrived from their owners by then are misses.
	// Default 2s.
	GetTimeout time.Duration
	// PeerBackoff is how long a peer whose call failed or timed out is
	// skipped (its blocks are misses at once) before it is tried again.
	// Default 1s.
	PeerBackoff time.Duration
	// PushYield is the longest a push of fresh blocks to their owners waits
	// for this node's serving work (reads, lookups, synchronous prefills)
	// to end before it goes anyway: pushes yield to serving but never
	// starve, and a push queue at least half full never waits. Default 0:
	// pushes do not wait (no gain shown on a 2-core machine yet; see
	// BENCHMARKS.md); negative is the same as 0.
	PushYield time.Duration
	// PushBytesPerSec bounds the rate of those pushes, all owners together.
	// Default 0: no bound.
	PushBytesPerSec int64
	// HandoffBytes bounds the DRAM-resident blocks a node stopping
	// gracefully pushes to the owners they get once it has left (within
	// ShutdownTimeout). Default 1 GiB; negative: none.
	HandoffBytes int64
	// Transport is how this node reads blocks from other nodes: "tcp", the
	// data plane; "ucx", one-sided reads of the peers' DRAM arenas through
	// UCX (gets of what is elsewhere, and every write, stay on TCP; a
	// build without UCX, or a host without its library, refuses to
	// start); "auto", UCX with every peer whose endpoint UCX would carry
	// over something better than plain TCP (shared memory, RDMA), TCP
	// otherwise and when UCX cannot start (a log line says why). UCX
	// moves bytes unencrypted: with TLS, "auto" is TCP and "ucx" is
	// refused. UCX_TLS, UCX_NET_DEVICES and UCX's other variables apply.
	// Default "auto".
	Transport string
	// RDMADevice is the RDMA device UCX uses, "mlx5_0" or "mlx5_0:1" with
	// its port (UCX_NET_DEVICES). Default: the device bound to the
	// interface of DataAddr's host (rdmamap), none when it has none;
	// UCX_NET_DEVICES in the environment overrides both.
	RDMADevice string
}

// SecurityOptions are the TLS configurations and bearer tokens that guard
// a node's gRPC API, data plane and HTTP address (Options.Security; see
// the package doc, Security).
type SecurityOptions struct {
	// TLS, when set, serves the gRPC API and the TCP data plane over TLS 1.3
	// with this server configuration (transfer.LoadTLS builds it from PEM
	// files; its ClientAuth makes it mutual TLS). It needs PeerTLS, since
	// every member serves TLS. Default nil: plain TCP.
	TLS *tls.Config
	// HTTPTLS serves the HTTP address (the OpenAI-compatible API, /metrics,
	// the health endpoints and the nodes' /internal/ calls) over TLS too,
	// with TLS's certificate; it needs TLS, and TLS implies it: a node with
	// TLS serves every listener over TLS, so bearer tokens, prompts and the
	// cluster credential never cross the network in the clear, and its
	// peers reach it over HTTPS verified against the cluster CA (PeerTLS).
	// A client certificate is verified when one is presented but not
	// required there, so probes and scrapers without one still work: the
	// API's bearer tokens guard it as they guard gRPC. Default: TLS != nil.
	HTTPTLS bool
	// PeerTLS is the client configuration this node reaches other nodes
	// with, gRPC and data plane alike (transfer.LoadTLS's client
	// configuration: the CA that signs the members' certificates, and this
	// node's certificate for mutual TLS). Set with TLS, and only with it.
	// Default nil.
	PeerTLS *tls.Config
	// Tokens are the bearer tokens the node accepts: every gRPC call
	// (but health checks) must carry one in its "authorization: Bearer
	// <token>" metadata, and every data-plane connection, TCP or shared
	// memory, must present one in its hello. The node presents the first
	// to its peers, so every member must accept it. Default none: no token
	// is asked for. Every token is a node-wide principal with every scope:
	// the single-tenant mode. See the package doc, Security.
	Tokens []string
	// TokensFile is the parsed tokens file (auth.ReadFile): the
	// multi-tenant mode, in which each token names a tenant and scopes and
	// the node presents the file's cluster token to its peers. Exclusive
	// with Tokens. Default nil.
	TokensFile *auth.File
}

// TierOptions size the tiers blocks live in, and say how they are shared
// out and evicted (Options.Tiers).
type TierOptions struct {
	// DRAMBytes is the hard limit of the DRAM tier, in bytes. Default 1 GiB.
	DRAMBytes int64
	// SpillOnStopBytes bounds the DRAM-resident blocks a node stopping
	// gracefully writes to its NVMe tier after the handoff
	// (Cluster.HandoffBytes), hottest first and those no other member took
	// before those it did (within ShutdownTimeout), so that a restart on
	// the same data dir serves them. Default DRAMBytes (all of it);
	// negative: none.
	SpillOnStopBytes int64
	// DRAMPopulate backs the whole DRAM tier with memory at start and
	// keeps it (tiers.DRAMOptions.Populate): no put waits for the kernel
	// to allocate pages, and the node's resident memory includes DRAMBytes
	// from the start. Without it, memory is taken as blocks arrive and
	// returned as slabs empty, less a few kept warm.
	DRAMPopulate bool
	// NVMeBytes is the hard limit of the NVMe tier under DataDir, in bytes.
	// Default 10 GiB.
	NVMeBytes int64
	// HBMBytes asks for an HBM tier of this many bytes of GPU memory on
	// CUDA device GPU, on top of DRAM: blocks are written and promoted
	// there, and HBM pressure demotes them into DRAM (store.Options.HBM).
	// Default 0: none. Open fails, naming the reason, in a build without
	// CUDA, on a host without the device, or without the CUDA plugin.
	HBMBytes int64
	// QuotaDRAMBytes and QuotaNVMeBytes are the default quota of every
	// namespace (a model layout and tenant salt, see prefixhash.Namespace)
	// on this node: the encoded block bytes it may hold in each tier. A
	// namespace's own quota (AdminService.SetQuota, kept in
	// DataDir/quotas.json) replaces it. A write that its namespace's
	// quota has no room for, even after making room among the namespace's
	// own blocks, is refused with ResourceExhausted. Default 0: unlimited.
	QuotaDRAMBytes, QuotaNVMeBytes int64
	// MaxBlocks bounds the blocks the node caches in DRAM and NVMe
	// together (store.Options.Tiers.MaxBlocks): past it, writes make room as
	// tier pressure does. Default 0: the store's default, the tiers'
	// capacities over 4 KiB.
	MaxBlocks int
	// Eviction is the store's eviction policy (store.Options.Tiers.Eviction):
	// "lru", the reference, or "dedup", which evicts first the copies a
	// node keeps of blocks other nodes own. Default "": the store's
	// default (store.DefaultEviction).
	Eviction string
	// NVMeAdmission is which DRAM victims are written to NVMe: "all"
	// (default, also ""), or "reused": only blocks asked for again since
	// they were put or last passed over, the others dropped
	// (store.Options.NVMeReusedOnly; needs Eviction "reuse").
	NVMeAdmission string
	// PartialTTL is how long the parts of a block that tensor- or
	// pipeline-parallel ranks put are kept while the block is incomplete
	// (store.Options.Tiers.PartialTTL). Default 0: the store's (30 s).
	PartialTTL time.Duration
	// ClaimTTL is how long a writer's claim on a part stands
	// (store.Options.Tiers.ClaimTTL). Default 0: the store's (10 s).
	ClaimTTL time.Duration
	// MaxRetentionTTL is the longest TTL of a lease or pin
	// (ObjectService.Retain, an object's retention). Default 0: the
	// store's (24 h).
	MaxRetentionTTL time.Duration
	// MaxPinnedFraction bounds the bytes under hard pins and leases on
	// this node, a fraction of its DRAM and NVMe together. Default 0: the
	// store's (0.5).
	MaxPinnedFraction float64
}

// EventOptions publish the node's store's KV events in vLLM's format
// (package kvevents): a block entering or leaving HBM, DRAM or NVMe as
// medium GPU, CPU or DISK (Options.Events). The sockets have no
// authentication: a node that requires tokens or TLS refuses them.
type EventOptions struct {
	// Addr, when set, is the ZMQ PUB endpoint the node publishes on,
	// tcp://HOST:PORT (port 0: any free one). Default none.
	Addr string
	// ReplayAddr, when set, is the ROUTER endpoint that replays recent
	// batches. Default none.
	ReplayAddr string
	// Topic is the batches' topic ("{model}" is replaced by the
	// namespace's model). Default "kv@<NodeID>@{model}".
	Topic string
}

// LimitOptions bound what one client or request can make a node hold, and
// how long a request may run (Options.Limits).
type LimitOptions struct {
	// MaxBlockBytes is the largest encoded block (header and payload) the
	// node accepts, in bytes; a namespace whose blocks are larger is refused
	// with InvalidArgument. At most 512 MiB. Default 16 MiB (a 16-token
	// block of a 70B-class model in fp16 is 5 MiB).
	MaxBlockBytes int
	// MaxBatchBlocks is the most blocks one request may name: keys of a
	// BatchGet or Exists, blocks of a BatchPut stream, full blocks of a
	// Lookup's prompt. Default 16384 (a 256k-token prompt in blocks of 16).
	MaxBatchBlocks int
	// MaxMessageBytes is the largest gRPC message the node sends or
	// receives, in bytes. Default 4 MiB (gRPC's own default, so that any
	// stock client can talk to the node).
	MaxMessageBytes int
	// MaxConcurrentStreams is the most gRPC calls (streams) one client
	// connection may have open at once; its further calls wait on the
	// client until one ends. Default 256.
	MaxConcurrentStreams int
	// MaxInFlightBytes bounds, in bytes, the request buffers each of the
	// node's servers holds at once: the block buffers of BatchPut streams
	// (a block is charged from its first payload bytes until it is stored;
	// a stream with no room within a second is refused with
	// ResourceExhausted; one tenant's streams hold at most a quarter), and
	// the requests and put values of each data
	// plane (transfer.ServerOptions.MaxInFlightBytes). At least 64 MiB and
	// MaxBlockBytes. Default 256 MiB.
	MaxInFlightBytes int64
	// ChunkBytes is the most payload bytes in one streamed message, in
	// bytes. At most MaxMessageBytes - 512 KiB (room for a block's tokens).
	// Default 1 MiB.
	ChunkBytes int
	// RequestTimeout bounds every request, streams included, whatever
	// deadline the client set (the earlier wins). Default 1m.
	RequestTimeout time.Duration
	// ReceiveTimeout bounds each wait for the next message of a client
	// stream (BatchPut): a stream that sends nothing for this long is ended
	// with DeadlineExceeded, and the block buffer it held released to
	// MaxInFlightBytes. Default 5s.
	ReceiveTimeout time.Duration
}

// EnsureDefaults fills every zero field with its default and returns o.
func (o *Options) EnsureDefaults() *Options {
	if o.DataDir == "" {
		o.DataDir = DefaultDataDir
	}
	if o.Version == "" {
		o.Version = "(devel)"
	}
	if o.ShutdownTimeout == 0 {
		o.ShutdownTimeout = 8 * time.Second
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	o.Listen.ensureDefaults(o.DataDir)
	o.Cluster.ensureDefaults()
	o.Tiers.ensureDefaults()
	o.Limits.ensureDefaults()
	o.Prefill.EnsureDefaults()
	return o
}

func (o *ListenOptions) ensureDefaults(dataDir string) {
	def(&o.GRPCAddr, DefaultGRPCAddr)
	def(&o.HTTPAddr, DefaultHTTPAddr)
	def(&o.DataAddr, DefaultDataAddr)
	def(&o.ShmSocket, filepath.Join(dataDir, "shm.sock"))
	def(&o.ShmSocketMode, 0o600)
	def(&o.ShmRegionBytes, 256*MiB)
}

func (o *ClusterOptions) ensureDefaults() {
	def(&o.GossipAddr, DefaultGossipAddr)
	def(&o.GossipProfile, "lan")
	def(&o.Replicas, 1)
	def(&o.ChunkTokens, prefixhash.DefaultChunkTokens)
	def(&o.LookupTimeout, 100*time.Millisecond)
	def(&o.LookupRoundPeers, store.DefaultLookupRoundPeers)
	def(&o.GetTimeout, 2*time.Second)
	def(&o.PeerBackoff, time.Second)
	def(&o.HandoffBytes, 1*GiB)
	def(&o.Transport, TransportAuto)
}

func (o *TierOptions) ensureDefaults() {
	def(&o.DRAMBytes, 1*GiB)
	def(&o.SpillOnStopBytes, o.DRAMBytes)
	def(&o.NVMeBytes, 10*GiB)
}

func (o *LimitOptions) ensureDefaults() {
	def(&o.MaxBlockBytes, 16*MiB)
	def(&o.MaxBatchBlocks, 16384)
	def(&o.MaxMessageBytes, 4*MiB)
	def(&o.MaxConcurrentStreams, 256)
	def(&o.MaxInFlightBytes, 256*MiB)
	def(&o.ChunkBytes, min(1*MiB, o.MaxMessageBytes-messageOverhead))
	def(&o.RequestTimeout, time.Minute)
	def(&o.ReceiveTimeout, 5*time.Second)
}

// def sets *field to v when it is zero.
func def[T comparable](field *T, v T) {
	var zero T
	if *field == zero {
		*field = v
	}
}

// messageOverhead is the room a streamed message needs beside its payload
// chunk: a whole block's tokens (at most 65536 varints of up to 5 bytes) and
// the other fields.
const messageOverhead = 512 * KiB

// ErrInvalidOptions is wrapped by every error Validate returns.
var ErrInvalidOptions = errors.New("node: invalid options")

// OptionError names the option that Validate rejected.
type OptionError struct {
	Field string // the Options field, for example "DRAMBytes"
	Msg   string
}

func (e *OptionError) Error() string { return fmt.Sprintf("node: option %s: %s", e.Field, e.Msg) }

// Unwrap makes every OptionError match ErrInvalidOptions.
func (e *OptionError) Unwrap() error { return ErrInvalidOptions }

// Validate reports the first option that cannot work. Call it after
// EnsureDefaults.
func (o *Options) Validate() error {
	switch {
	case len(o.NodeID) > 256 || strings.ContainsFunc(o.NodeID, unicode.IsSpace):
		return badOption("NodeID", "%q must be at most 256 bytes without spaces", o.NodeID)
	case o.DataDir == "":
		return badOption("DataDir", "must not be empty")
	case o.GPU < 0:
		return badOption("GPU", "device ordinal %d must not be negative", o.GPU)
	case o.ShutdownTimeout < 0:
		return badOption("ShutdownTimeout", "%v must not be negative", o.ShutdownTimeout)
	}
	switch t := o.Cluster.Transport; {
	case t != TransportAuto && t != TransportTCP && t != TransportUCX:
		return badOption("Cluster.Transport", "%q: want auto, tcp or ucx", t)
	case t == TransportUCX && o.Security.TLS != nil:
		return badOption("Cluster.Transport", "ucx moves block bytes unencrypted and this node has TLS: use auto or tcp (TLS on the data plane), or drop TLS on a trusted fabric")
	}
	maxBlock := o.Limits.MaxBlockBytes
	for _, err := range []error{o.Limits.validate(), o.Listen.validate(maxBlock), o.Cluster.validate(),
		o.Security.validate(), o.Tiers.validate(maxBlock), o.Events.validate(&o.Security)} {
		if err != nil {
			return err
		}
	}
	if o.ReadyFile != "" {
		if err := checkReadyFile(o.ReadyFile); err != nil {
			return badOption("ReadyFile", "%s", err)
		}
	}
	return o.Prefill.Validate(maxBlock)
}

// badOption is Validate's answer about the option at path (a field of
// Options, or of one of its groups: "Tiers.DRAMBytes").
func badOption(path, format string, args ...any) error {
	return &OptionError{Field: path, Msg: fmt.Sprintf(format, args...)}
}

// validateAddr refuses an address that is not host:port.
func validateAddr(path, addr string) error {
	if _, _, err := net.SplitHostPort(addr); err != nil {
		return badOption(path, "%q is not host:port", addr)
	}
	return nil
}

func (o *ListenOptions) validate(maxBlock int) error {
	for _, a := range []struct{ field, addr string }{{"GRPCAddr", o.GRPCAddr}, {"HTTPAddr", o.HTTPAddr}, {"DataAddr", o.DataAddr}} {
		if err := validateAddr("Listen."+a.field, a.addr); err != nil {
			return err
		}
	}
	switch {
	case o.GRPCAddr == o.HTTPAddr && !hasPortZero(o.GRPCAddr):
		return badOption("Listen.HTTPAddr", "%s is also GRPCAddr", o.HTTPAddr)
	case o.ShmSocket != ShmOff && len(o.ShmSocket) > maxSocketPath:
		return badOption("Listen.ShmSocket", "%q is longer than a unix socket path may be (%d bytes); choose a shorter path or \"off\"", o.ShmSocket, maxSocketPath)
	case o.ShmSocketMode&^os.ModePerm != 0 || o.ShmSocketMode&0o600 != 0o600:
		return badOption("Listen.ShmSocketMode", "%#o must be permission bits that let the node's user read and write (0600, 0660)", uint32(o.ShmSocketMode))
	case o.ShmSocketMode&0o007 != 0:
		return badOption("Listen.ShmSocketMode", "%#o lets every user of the host connect and read the cache; give the workers a group of their own and use 0660", uint32(o.ShmSocketMode))
	case o.ShmRegionBytes < int64(maxBlock) || o.ShmRegionBytes%(4*KiB) != 0:
		return badOption("Listen.ShmRegionBytes", "%d bytes must be a multiple of 4KiB and hold one block of MaxBlockBytes (%d)", o.ShmRegionBytes, maxBlock)
	}
	return nil
}

func (o *ClusterOptions) validate() error {
	if err := validateAddr("Cluster.GossipAddr", o.GossipAddr); err != nil {
		return err
	}
	for i, j := range o.Join {
		if strings.Contains(j, "://") {
			return badOption("Cluster.Join", "seed %d, %q, is a URL; give a member's gossip address as HOST:PORT, without a scheme", i+1, j)
		}
		if _, _, err := net.SplitHostPort(j); err != nil {
			return badOption("Cluster.Join", "seed %d, %q, is not host:port (a member's gossip address)", i+1, j)
		}
	}
	switch {
	case len(o.GossipKey) != 0 && len(o.GossipKey) != 16 && len(o.GossipKey) != 24 && len(o.GossipKey) != 32:
		return badOption("Cluster.GossipKey", "%d bytes; a gossip key is 16, 24 or 32 bytes", len(o.GossipKey))
	case o.GossipProfile != "lan" && o.GossipProfile != "local":
		return badOption("Cluster.GossipProfile", "%q: want lan or local", o.GossipProfile)
	case o.Replicas < 1 || o.Replicas > 8:
		return badOption("Cluster.Replicas", "%d is outside 1..8", o.Replicas)
	case o.ChunkTokens < 1:
		return badOption("Cluster.ChunkTokens", "%d must be at least 1", o.ChunkTokens)
	case o.PushBytesPerSec < 0:
		return badOption("Cluster.PushBytesPerSec", "%d must not be negative", o.PushBytesPerSec)
	case o.LookupTimeout < 0:
		return badOption("Cluster.LookupTimeout", "%v must not be negative", o.LookupTimeout)
	case o.GetTimeout < 0:
		return badOption("Cluster.GetTimeout", "%v must not be negative", o.GetTimeout)
	case o.PeerBackoff < 0:
		return badOption("Cluster.PeerBackoff", "%v must not be negative", o.PeerBackoff)
	}
	return nil
}

func (o *SecurityOptions) validate() error {
	switch {
	case o.TLS != nil && o.PeerTLS == nil:
		return badOption("Security.PeerTLS", "required with TLS: the other members serve TLS too, and this node must reach them")
	case o.TLS == nil && o.PeerTLS != nil:
		return badOption("Security.TLS", "required with PeerTLS: every member of a cluster serves TLS, or none does")
	case o.TLS != nil && o.TLS.MaxVersion != 0 && o.TLS.MaxVersion < tls.VersionTLS13:
		return badOption("Security.TLS", "MaxVersion %#x is below TLS 1.3, the only version the node speaks", o.TLS.MaxVersion)
	case o.TLS != nil && len(o.TLS.Certificates) == 0 && o.TLS.GetCertificate == nil && o.TLS.GetConfigForClient == nil:
		return badOption("Security.TLS", "has no certificate")
	case o.HTTPTLS && o.TLS == nil:
		return badOption("Security.HTTPTLS", "needs TLS (a certificate to serve the HTTP address with)")
	case len(o.Tokens) > 0 && o.TokensFile != nil:
		return badOption("Security.Tokens", "set Tokens (one tenant) or TokensFile (tenants), not both")
	}
	if _, err := tokenSet(o); err != nil {
		return err
	}
	return nil
}

func (o *TierOptions) validate(maxBlock int) error {
	switch {
	case o.DRAMBytes < int64(maxBlock):
		return badOption("Tiers.DRAMBytes", "%d bytes cannot hold one block of MaxBlockBytes (%d)", o.DRAMBytes, maxBlock)
	case o.NVMeBytes < int64(maxBlock):
		return badOption("Tiers.NVMeBytes", "%d bytes cannot hold one block of MaxBlockBytes (%d)", o.NVMeBytes, maxBlock)
	case o.HBMBytes < 0:
		return badOption("Tiers.HBMBytes", "%d bytes must not be negative (0 is no HBM tier)", o.HBMBytes)
	case o.QuotaDRAMBytes < 0:
		return badOption("Tiers.QuotaDRAMBytes", "%d bytes must not be negative (0 is unlimited)", o.QuotaDRAMBytes)
	case o.QuotaNVMeBytes < 0:
		return badOption("Tiers.QuotaNVMeBytes", "%d bytes must not be negative (0 is unlimited)", o.QuotaNVMeBytes)
	case o.MaxBlocks < 0 || o.MaxBlocks > 1<<27:
		return badOption("Tiers.MaxBlocks", "%d is outside 0..%d", o.MaxBlocks, 1<<27)
	case o.Eviction != "" && !validEviction(o.Eviction):
		return badOption("Tiers.Eviction", "%q is not a policy: want lru, dedup or reuse", o.Eviction)
	case o.NVMeAdmission != "" && o.NVMeAdmission != "all" && o.NVMeAdmission != "reused":
		return badOption("Tiers.NVMeAdmission", "%q: want all or reused", o.NVMeAdmission)
	case o.NVMeAdmission == "reused" && o.Eviction != string(store.EvictReuse):
		return badOption("Tiers.NVMeAdmission", "reused needs eviction %s (its reuse marks), not %q", store.EvictReuse, o.Eviction)
	case o.PartialTTL != 0 && (o.PartialTTL < time.Millisecond || o.PartialTTL > store.MaxPartialTTL):
		return badOption("Tiers.PartialTTL", "%v is outside 1ms..%v", o.PartialTTL, store.MaxPartialTTL)
	case o.ClaimTTL != 0 && (o.ClaimTTL < time.Millisecond || o.ClaimTTL > store.MaxClaimTTL):
		return badOption("Tiers.ClaimTTL", "%v is outside 1ms..%v", o.ClaimTTL, store.MaxClaimTTL)
	case o.MaxRetentionTTL != 0 && (o.MaxRetentionTTL < time.Millisecond || o.MaxRetentionTTL > block.MaxObjectTTL):
		return badOption("Tiers.MaxRetentionTTL", "%v is outside 1ms..%v", o.MaxRetentionTTL, block.MaxObjectTTL)
	case o.MaxPinnedFraction < 0 || o.MaxPinnedFraction > 1:
		return badOption("Tiers.MaxPinnedFraction", "%v is outside 0..1", o.MaxPinnedFraction)
	}
	return nil
}

func (o *EventOptions) validate(sec *SecurityOptions) error {
	switch {
	case o.Addr != "" && !strings.HasPrefix(o.Addr, "tcp://"):
		return badOption("Events.Addr", "%q: want tcp://HOST:PORT", o.Addr)
	case o.ReplayAddr != "" && (o.Addr == "" || !strings.HasPrefix(o.ReplayAddr, "tcp://")):
		return badOption("Events.ReplayAddr", "%q: want tcp://HOST:PORT, with Addr", o.ReplayAddr)
	case o.Topic != "" && o.Addr == "":
		return badOption("Events.Topic", "set without Addr")
	case o.Addr != "" && (len(sec.Tokens) > 0 || sec.TokensFile != nil || sec.TLS != nil):
		return badOption("Events.Addr", "KV events' ZMQ sockets have no authentication: a node that requires tokens or TLS does not publish them")
	}
	return nil
}

func (o *LimitOptions) validate() error {
	minBlock := block.EncodedLen(1, 1)
	switch {
	case o.MaxBlockBytes < minBlock || o.MaxBlockBytes > 512*MiB:
		return badOption("Limits.MaxBlockBytes", "%d bytes is outside %d..%d", o.MaxBlockBytes, minBlock, 512*MiB)
	case o.MaxBatchBlocks < 1:
		return badOption("Limits.MaxBatchBlocks", "%d must be at least 1", o.MaxBatchBlocks)
	case o.MaxBatchBlocks > 1<<24:
		return badOption("Limits.MaxBatchBlocks", "%d is over the limit of %d", o.MaxBatchBlocks, 1<<24)
	case o.MaxMessageBytes < messageOverhead+4*KiB:
		return badOption("Limits.MaxMessageBytes", "%d bytes is less than the minimum of %d", o.MaxMessageBytes, messageOverhead+4*KiB)
	case o.ChunkBytes < 1 || o.ChunkBytes > o.MaxMessageBytes-messageOverhead:
		return badOption("Limits.ChunkBytes", "%d must be in 1..MaxMessageBytes-%d (%d)", o.ChunkBytes, messageOverhead, o.MaxMessageBytes-messageOverhead)
	case o.RequestTimeout < 0:
		return badOption("Limits.RequestTimeout", "%v must not be negative", o.RequestTimeout)
	case o.ReceiveTimeout < 0:
		return badOption("Limits.ReceiveTimeout", "%v must not be negative", o.ReceiveTimeout)
	case o.MaxConcurrentStreams < 1 || o.MaxConcurrentStreams > 1<<20:
		return badOption("Limits.MaxConcurrentStreams", "%d is outside 1..%d", o.MaxConcurrentStreams, 1<<20)
	case o.MaxInFlightBytes < max(transfer.DefaultMaxBatchBytes, int64(o.MaxBlockBytes)+64):
		return badOption("Limits.MaxInFlightBytes", "%d bytes is below the minimum of %d (64 MiB, and one block of MaxBlockBytes)",
			o.MaxInFlightBytes, max(transfer.DefaultMaxBatchBytes, int64(o.MaxBlockBytes)+64))
	}
	return nil
}

// validateGossip refuses a cluster node (Open) that asks clients for any
// credential but lets anyone join its gossip: a member is sent the blocks it
// owns, with the node's cluster credential, so an open gossip port undoes
// the tokens. Mutual TLS does not count: it guards gRPC and the data plane,
// and memberlist's packets carry neither.
func (o *Options) validateGossip() error {
	credentialed := len(o.Security.Tokens) > 0 || o.Security.TokensFile != nil
	if !credentialed || len(o.Cluster.GossipKey) > 0 || o.Cluster.InsecureGossip {
		return nil
	}
	return &OptionError{Field: "Cluster.GossipKey", Msg: "a node with credentials (--auth-token-file or --tokens-file) needs a gossip key " +
		"(--gossip-key-file; make one with: head -c 32 /dev/urandom | base64): without it, any host that reaches the gossip " +
		"address can join the cluster as an owner and be sent blocks and this node's cluster credential (mutual TLS does not " +
		"protect gossip); set InsecureGossip (--insecure-gossip) to start anyway, on a network only your nodes reach"}
}

// ShmOff as Options.Listen.ShmSocket turns the shared-memory data plane off.
const ShmOff = "off"

// maxSocketPath is the longest unix socket path Linux accepts (sun_path is
// 108 bytes, NUL included).
const maxSocketPath = 107

func hasPortZero(addr string) bool {
	_, port, err := net.SplitHostPort(addr)
	return err == nil && port == "0"
}

// checkReadyFile says why the node could not write its ready file at path,
// before it binds anything: its directory must exist, and path must not be
// a directory.
func checkReadyFile(path string) error {
	if fi, err := os.Stat(path); err == nil && fi.IsDir() {
		return fmt.Errorf("%q is a directory; name a file in it", path)
	}
	dir := filepath.Dir(path)
	fi, err := os.Stat(dir)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return fmt.Errorf("directory %q does not exist; create it or name a file in an existing directory", dir)
	case err != nil:
		return fmt.Errorf("directory %q: %w", dir, err)
	case !fi.IsDir():
		return fmt.Errorf("%q is not a directory", dir)
	}
	return nil
}
