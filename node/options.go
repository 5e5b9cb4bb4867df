package node

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"time"

	"github.com/kvmesh/kvmesh/store"
)

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

// Options configure a node. The zero value of a field means its default;
// EnsureDefaults fills them in and Validate rejects what cannot work, naming
// the field.
type Options struct {
	// NodeID names the node in the cluster and in every answer it gives. It
	// must be unique and stable across restarts (placement hashes it).
	// Default: the host name, ":" and the port of GossipAddr.
	NodeID string
	// DataDir holds the node's persistent state (the NVMe tier's segments
	// and index). Created if missing. Default "kvmesh-data", relative to the
	// working directory.
	DataDir string
	// GRPCAddr is the host:port of the gRPC API. Port 0 picks a free port
	// (see Node.GRPCAddr). Default 127.0.0.1:7600.
	GRPCAddr string
	// HTTPAddr is the host:port serving /metrics and /healthz. Port 0 picks
	// a free port. Default 127.0.0.1:7601.
	HTTPAddr string
	// DataAddr is where the data plane (package transfer) will listen. Not
	// served yet: a single node has no peers. Default 127.0.0.1:7602.
	DataAddr string
	// GossipAddr is where membership (memberlist) will listen, and what
	// other nodes' Join names. Not served yet. Default 127.0.0.1:7603.
	GossipAddr string
	// Join lists the gossip addresses of members to join. This build serves
	// one node: Join must be empty.
	Join []string
	// DRAMBytes is the hard limit of the DRAM tier, in bytes. Default 1 GiB.
	DRAMBytes int64
	// NVMeBytes is the hard limit of the NVMe tier under DataDir, in bytes.
	// Default 10 GiB.
	NVMeBytes int64
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
	// ChunkBytes is the most payload bytes in one streamed message, in
	// bytes. At most MaxMessageBytes - 512 KiB (room for a block's tokens).
	// Default 1 MiB.
	ChunkBytes int
	// RequestTimeout bounds every request, streams included, whatever
	// deadline the client set (the earlier wins). Default 1m.
	RequestTimeout time.Duration
	// ShutdownTimeout is how long a stopping node lets requests in flight
	// finish before it cancels them. Default 8s.
	ShutdownTimeout time.Duration
	// Prefill configures the bundled prefill engine and its queue (its
	// zero value is the default engine; see PrefillOptions).
	Prefill PrefillOptions
	// Version is the kvmesh version reported to Members. Default "(devel)".
	Version string
	// Logger receives the node's structured logs. Default slog.Default().
	Logger *slog.Logger
}

// EnsureDefaults fills every zero field with its default and returns o.
func (o *Options) EnsureDefaults() *Options {
	def := func(s *string, v string) {
		if *s == "" {
			*s = v
		}
	}
	def(&o.DataDir, DefaultDataDir)
	def(&o.GRPCAddr, DefaultGRPCAddr)
	def(&o.HTTPAddr, DefaultHTTPAddr)
	def(&o.DataAddr, DefaultDataAddr)
	def(&o.GossipAddr, DefaultGossipAddr)
	def(&o.Version, "(devel)")
	if o.NodeID == "" {
		host, err := os.Hostname()
		if err != nil || host == "" {
			host = "localhost"
		}
		_, port, err := net.SplitHostPort(o.GossipAddr)
		if err != nil {
			port = "0"
		}
		o.NodeID = net.JoinHostPort(host, port)
	}
	if o.DRAMBytes == 0 {
		o.DRAMBytes = 1 * GiB
	}
	if o.NVMeBytes == 0 {
		o.NVMeBytes = 10 * GiB
	}
	if o.MaxBlockBytes == 0 {
		o.MaxBlockBytes = 16 * MiB
	}
	if o.MaxBatchBlocks == 0 {
		o.MaxBatchBlocks = 16384
	}
	if o.MaxMessageBytes == 0 {
		o.MaxMessageBytes = 4 * MiB
	}
	if o.ChunkBytes == 0 {
		o.ChunkBytes = min(1*MiB, o.MaxMessageBytes-messageOverhead)
	}
	if o.RequestTimeout == 0 {
		o.RequestTimeout = time.Minute
	}
	if o.ShutdownTimeout == 0 {
		o.ShutdownTimeout = 8 * time.Second
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	o.Prefill.EnsureDefaults()
	return o
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
	bad := func(field, format string, args ...any) error {
		return &OptionError{Field: field, Msg: fmt.Sprintf(format, args...)}
	}
	for _, a := range []struct{ field, addr string }{
		{"GRPCAddr", o.GRPCAddr}, {"HTTPAddr", o.HTTPAddr}, {"DataAddr", o.DataAddr}, {"GossipAddr", o.GossipAddr},
	} {
		if _, _, err := net.SplitHostPort(a.addr); err != nil {
			return bad(a.field, "%q is not host:port", a.addr)
		}
	}
	minBlock := store.EncodedLen(1, 1)
	switch {
	case o.NodeID == "":
		return bad("NodeID", "must not be empty")
	case o.DataDir == "":
		return bad("DataDir", "must not be empty")
	case o.GRPCAddr == o.HTTPAddr && !hasPortZero(o.GRPCAddr):
		return bad("HTTPAddr", "%s is also GRPCAddr", o.HTTPAddr)
	case len(o.Join) > 0:
		return bad("Join", "this build serves a single node; clustering is not wired in yet")
	case o.MaxBlockBytes < minBlock || o.MaxBlockBytes > 512*MiB:
		return bad("MaxBlockBytes", "%d bytes is outside %d..%d", o.MaxBlockBytes, minBlock, 512*MiB)
	case o.DRAMBytes < int64(o.MaxBlockBytes):
		return bad("DRAMBytes", "%d bytes cannot hold one block of MaxBlockBytes (%d)", o.DRAMBytes, o.MaxBlockBytes)
	case o.NVMeBytes < int64(o.MaxBlockBytes):
		return bad("NVMeBytes", "%d bytes cannot hold one block of MaxBlockBytes (%d)", o.NVMeBytes, o.MaxBlockBytes)
	case o.MaxBatchBlocks < 1:
		return bad("MaxBatchBlocks", "%d must be at least 1", o.MaxBatchBlocks)
	case o.MaxMessageBytes < messageOverhead+4*KiB:
		return bad("MaxMessageBytes", "%d bytes is less than the minimum of %d", o.MaxMessageBytes, messageOverhead+4*KiB)
	case o.ChunkBytes < 1 || o.ChunkBytes > o.MaxMessageBytes-messageOverhead:
		return bad("ChunkBytes", "%d must be in 1..MaxMessageBytes-%d (%d)", o.ChunkBytes, messageOverhead, o.MaxMessageBytes-messageOverhead)
	case o.RequestTimeout < 0:
		return bad("RequestTimeout", "%v must not be negative", o.RequestTimeout)
	case o.ShutdownTimeout < 0:
		return bad("ShutdownTimeout", "%v must not be negative", o.ShutdownTimeout)
	case o.MaxBatchBlocks > 1<<24:
		return bad("MaxBatchBlocks", "%d is over the limit of %d", o.MaxBatchBlocks, 1<<24)
	}
	return o.Prefill.Validate(o.MaxBlockBytes)
}

func hasPortZero(addr string) bool {
	_, port, err := net.SplitHostPort(addr)
	return err == nil && port == "0"
}
