package main

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"github.com/kvmesh/kvmesh/auth"
	"log/slog"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/kvmesh/kvmesh/node"
	"github.com/kvmesh/kvmesh/openai"
	"github.com/kvmesh/kvmesh/router"
	"github.com/kvmesh/kvmesh/store"
	"github.com/kvmesh/kvmesh/transfer"
)

// serveFlags are kvmesh serve's flags; each maps to a node.Options field.
type serveFlags struct {
	config                                     string
	nodeID, dataDir                            string
	grpcAddr, httpAddr, dataAddr, gossipAddr   string
	shmSocket, advertiseHost                   string
	shmSocketMode, shmSocketGroup              string
	transport, rdmaDevice                      string
	readyFile                                  string
	shmRegion                                  int64
	join                                       []string
	gossipKeyFile, gossipProfile               string
	insecureGossip, httpTLS                    bool
	maxConcurrentStreams                       int
	maxInFlightBytes                           int64
	replicas, chunkTokens, lookupRoundPeers    int
	lookupTimeout, getTimeout, peerBackoff     time.Duration
	pushYield                                  time.Duration
	pushRate                                   int64
	handoff                                    int64
	spillOnStop                                optionalSize
	dram, nvme, hbm                            int64
	dramPopulate                               bool
	gpu                                        int
	maxBlockBytes, maxMessageBytes, chunkBytes int64
	maxBatchBlocks, maxBlocks                  int
	requestTimeout, shutdownTimeout            time.Duration
	receiveTimeout                             time.Duration
	logLevel, logFormat                        string
	eviction                                   string
	nvmeAdmission                              string
	partialTTL, claimTTL                       time.Duration
	maxRetentionTTL                            time.Duration
	kvEventsAddr, kvEventsReplayAddr           string
	kvEventsTopic                              string
	maxPinned                                  float64
	prefill                                    prefillServeFlags
	tlsCert, tlsKey, tlsCA, tlsServerName      string
	tlsClientAuth                              bool
	tokenFile, tokensFile                      string
	quotaDRAM, quotaNVMe                       int64
	pprof                                      bool
	printConfig                                bool

	keyPair *transfer.KeyPair // the TLS certificate, reloaded on SIGHUP; nil without TLS

	from map[string]string // where layered flags came from (see source)
}

// flagOf names the flag of each node.Options field, by its path (the
// OptionError's Field: "Tiers.DRAMBytes"), to turn Validate's errors into
// advice about the flag.
var flagOf = map[string]string{
	"NodeID": "node-id", "DataDir": "data-dir", "Listen.GRPCAddr": "grpc-addr", "Listen.HTTPAddr": "http-addr",
	"Listen.DataAddr": "data-addr", "Cluster.GossipAddr": "gossip-addr", "Cluster.Join": "join", "Tiers.DRAMBytes": "dram", "Tiers.DRAMPopulate": "dram-populate", "Tiers.NVMeBytes": "nvme", "Tiers.HBMBytes": "hbm", "Tiers.MaxBlocks": "max-blocks", "Tiers.Eviction": "eviction", "Tiers.NVMeAdmission": "nvme-admission", "Tiers.PartialTTL": "partial-ttl", "Tiers.ClaimTTL": "claim-ttl", "GPU": "gpu",
	"Listen.ShmSocket": "shm-socket", "Listen.ShmSocketMode": "shm-socket-mode", "Listen.ShmSocketGroup": "shm-socket-group", "Listen.ShmRegionBytes": "shm-region", "Listen.AdvertiseHost": "advertise-host", "Cluster.Transport": "transport", "Cluster.RDMADevice": "rdma-device",
	"Cluster.GossipKey": "gossip-key-file", "Cluster.GossipProfile": "gossip-profile", "Cluster.Replicas": "replicas", "Cluster.ChunkTokens": "chunk-tokens",
	"Cluster.LookupTimeout": "lookup-timeout", "Cluster.LookupRoundPeers": "lookup-round-peers", "Cluster.GetTimeout": "get-timeout", "Cluster.PeerBackoff": "peer-backoff", "Cluster.HandoffBytes": "handoff", "Tiers.SpillOnStopBytes": "spill-on-stop",
	"Cluster.PushYield": "push-yield", "Cluster.PushBytesPerSec": "push-rate",
	"Limits.MaxBlockBytes": "max-block-bytes", "Limits.MaxBatchBlocks": "max-batch-blocks", "Limits.MaxMessageBytes": "max-message-bytes",
	"Limits.ChunkBytes": "chunk-bytes", "Limits.RequestTimeout": "request-timeout", "Limits.ReceiveTimeout": "receive-timeout", "ShutdownTimeout": "shutdown-timeout",
	"Security.TLS": "tls-cert", "Security.PeerTLS": "tls-ca", "Security.Tokens": "auth-token-file", "Tiers.QuotaDRAMBytes": "quota-dram", "Tiers.QuotaNVMeBytes": "quota-nvme",
	"ReadyFile":        "ready-file",
	"Security.HTTPTLS": "http-tls", "Cluster.InsecureGossip": "insecure-gossip", "Limits.MaxConcurrentStreams": "max-concurrent-streams", "Limits.MaxInFlightBytes": "max-inflight-bytes",
	"Tiers.MaxRetentionTTL": "max-retention-ttl", "Tiers.MaxPinnedFraction": "max-pinned",
	"Events.Addr": "kv-events-addr", "Events.ReplayAddr": "kv-events-replay-addr", "Events.Topic": "kv-events-topic",
}

func serveCmd() *cobra.Command {
	var f *serveFlags
	c, f := newServeCommand(func(cmd *cobra.Command, opts node.Options, logger *slog.Logger) error {
		return serve(cmd, opts, logger, f.keyPair)
	})
	return c
}

// newServeCmd returns the serve command, which runs run with the options
// it assembled (tests pass a run that only records them).
func newServeCmd(run func(*cobra.Command, node.Options, *slog.Logger) error) *cobra.Command {
	c, _ := newServeCommand(run)
	return c
}

// newServeCommand is newServeCmd, and the flags it fills.
func newServeCommand(run func(*cobra.Command, node.Options, *slog.Logger) error) (*cobra.Command, *serveFlags) {
	f := new(serveFlags)
	var d node.Options
	d.EnsureDefaults()
	c := &cobra.Command{
		Use:   "serve",
		Short: "Run a kvmesh node (with no flags: one node on 127.0.0.1, data in ./kvmesh-data)",
		Long: `Run a kvmesh node until SIGTERM or SIGINT, then stop gracefully: requests in
flight finish (up to --shutdown-timeout), the blocks in DRAM are handed to the
nodes that own them once this one is gone, the node leaves the cluster, the
NVMe tier is closed cleanly, and the exit status is 0.

A node started without --join is a cluster of one that others join: start the
next ones with --join HOST:PORT, the --gossip-addr of any running member.
Every member must use the same --replicas, --chunk-tokens and gossip key.

Every address accepts port 0 (any free port). The node logs what it bound,
and with --ready-file PATH writes it, once serving, to PATH as JSON (written
atomically, removed on stop), for scripts and tests:

  kvmesh serve --grpc-addr 127.0.0.1:0 --http-addr 127.0.0.1:0 \
    --data-addr 127.0.0.1:0 --gossip-addr 127.0.0.1:0 --ready-file /tmp/kvmesh.ready
  {"node_id": "...", "pid": 1234, "grpc_addr": "127.0.0.1:41234", "http_addr": "...",
   "data_addr": "...", "gossip_addr": "...", "shm_socket": "/.../shm.sock"}

--tls-cert and --tls-key serve gRPC and the data plane over TLS 1.3 (and
reach the other members with it: --tls-ca is the CA that signs their
certificates; --tls-client-auth makes it mutual TLS; SIGHUP reloads the
certificate and key, the CA needs a restart). --auth-token-file asks
every client for a bearer token of the file (one a line; the node presents
the first to its peers; SIGHUP re-reads the file). Health checks stay open.

Sizes are written like 64MiB, 1GiB or 4096 (bytes); durations like 500ms or 1m.
Every flag can also come from KVMESH_<FLAG> (KVMESH_DATA_DIR, KVMESH_DRAM, ...)
and from the YAML file named by --config (KVMESH_CONFIG), whose keys are the
flag names, for example:

  data-dir: /var/lib/kvmesh
  dram: 8GiB
  nvme: 200GiB
  grpc-addr: 0.0.0.0:7600`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			opts, logger, err := f.options(cmd)
			if err != nil {
				return err
			}
			if f.printConfig {
				return printConfig(cmd.OutOrStdout(), cmd.Flags(), f.from, f.config)
			}
			return run(cmd, opts, logger)
		},
	}
	fs := c.Flags()
	fs.SortFlags = false
	fs.StringVar(&f.config, "config", "", "YAML config file whose keys are these flags' names")
	fs.BoolVar(&f.printConfig, "print-config", false, "check the configuration, print it (as a config file, each value's source in a comment: flag, KVMESH_* variable, config file or default) and exit")
	fs.StringVar(&f.dataDir, "data-dir", d.DataDir, "directory of the node's persistent state (the NVMe tier)")
	fs.StringVar(&f.grpcAddr, "grpc-addr", d.Listen.GRPCAddr, "host:port of the gRPC API (port 0: any free port)")
	fs.StringVar(&f.httpAddr, "http-addr", d.Listen.HTTPAddr, "host:port of /metrics, /healthz, /livez and /readyz")
	fs.StringVar(&f.dataAddr, "data-addr", d.Listen.DataAddr, "host:port of the data plane: blocks between nodes, and to clients")
	fs.StringVar(&f.shmSocket, "shm-socket", "", `unix socket of the shared-memory data plane for clients on this host, or "off" (default <data-dir>/shm.sock)`)
	fs.StringVar(&f.shmSocketMode, "shm-socket-mode", "0600", "permissions of the shared-memory socket, in octal: 0600 admits the node's user, 0660 also --shm-socket-group")
	fs.StringVar(&f.shmSocketGroup, "shm-socket-group", "", "group (name or id) given the shared-memory socket and its directory, so that workers running as other users in that group may connect (with --shm-socket-mode 0660); the node's user must be a member")
	fs.Var(newSize(&f.shmRegion, d.Listen.ShmRegionBytes), "shm-region", "shared region of each shared-memory client")
	fs.StringVar(&f.transport, "transport", d.Cluster.Transport, "how this node reads other nodes' blocks: tcp (the data plane), ucx (one-sided reads of their DRAM through UCX, needs a build with -tags ucx and libucx0; refused with TLS), or auto (UCX where it reaches a peer over shared memory or RDMA, TCP otherwise); UCX_TLS and UCX_NET_DEVICES apply")
	fs.StringVar(&f.rdmaDevice, "rdma-device", "", `RDMA device (and port: "mlx5_0:1") UCX uses (default: the one bound to --data-addr's interface; UCX_NET_DEVICES overrides)`)
	fs.StringVar(&f.gossipAddr, "gossip-addr", d.Cluster.GossipAddr, "host:port of membership gossip (UDP and TCP): what other nodes --join")
	fs.StringSliceVar(&f.join, "join", nil, "gossip addresses HOST:PORT,... of running members to join (retried until one answers)")
	fs.StringVar(&f.readyFile, "ready-file", "", "once serving, write the addresses bound (port 0 resolved) to this file as JSON: node_id, pid, grpc_addr, http_addr, data_addr, gossip_addr, shm_socket")
	fs.StringVar(&f.advertiseHost, "advertise-host", "", "host other nodes and clients reach this node at, for addresses bound to 0.0.0.0 (default: the gossip host, else a private IP)")
	fs.StringVar(&f.gossipKeyFile, "gossip-key-file", "", "file holding the base64 of a 16, 24 or 32-byte key that encrypts gossip (the same on every member)")
	fs.BoolVar(&f.insecureGossip, "insecure-gossip", false, "let a node with --auth-token-file or --tokens-file start without --gossip-key-file (mutual TLS does not protect gossip): any host that reaches --gossip-addr may then join, own blocks and receive the node's cluster credential")
	fs.StringVar(&f.gossipProfile, "gossip-profile", d.Cluster.GossipProfile, "failure detection timings: lan, or local (one host, tests: a dead node noticed in about 2s)")
	fs.IntVar(&f.replicas, "replicas", d.Cluster.Replicas, "nodes that own each placement chunk (the same on every member)")
	fs.IntVar(&f.chunkTokens, "chunk-tokens", d.Cluster.ChunkTokens, "tokens per placement chunk (the same on every member)")
	fs.DurationVar(&f.lookupTimeout, "lookup-timeout", d.Cluster.LookupTimeout, "how long a lookup waits for other nodes; a late node is a miss")
	fs.IntVar(&f.lookupRoundPeers, "lookup-round-peers", d.Cluster.LookupRoundPeers, "most peers a long lookup asks before its first chunks prove cached: a lookup with more owners asks the first chunk's owners, then this many more, then the rest, stopping where the prefix ends (negative: every owner at once; raise it, or make it negative, to trade fan-out for latency on clusters of tens of nodes)")
	fs.DurationVar(&f.getTimeout, "get-timeout", d.Cluster.GetTimeout, "how long a read waits for blocks from other nodes; late blocks are misses")
	fs.DurationVar(&f.peerBackoff, "peer-backoff", d.Cluster.PeerBackoff, "how long a node that failed a call is skipped (its blocks are misses)")
	fs.DurationVar(&f.pushYield, "push-yield", d.Cluster.PushYield, "longest a push of fresh blocks to their owners waits for this node's reads, lookups and synchronous prefills to end (0, the default: pushes do not wait; 2s is a sane bound where serving competes with pushes for cores; a push queue at least half full never waits)")
	fs.Var(newSize(&f.pushRate, d.Cluster.PushBytesPerSec), "push-rate", "most bytes a second pushed to owners, all together (0: no bound)")
	fs.Var(newSize(&f.handoff, d.Cluster.HandoffBytes), "handoff", "most DRAM bytes handed to their next owners on a graceful stop")
	fs.Var(&f.spillOnStop, "spill-on-stop", "most DRAM bytes written to NVMe on a graceful stop, after the handoff, so that a restart on this data dir serves them (default: all of --dram; 0: none)")
	fs.Var(newSize(&f.dram, d.Tiers.DRAMBytes), "dram", "DRAM tier capacity")
	fs.BoolVar(&f.dramPopulate, "dram-populate", false, "back the whole DRAM tier with memory at start and keep it: puts never wait for page allocation, and resident memory includes --dram from the start (for hosts that give the cache its memory)")
	fs.Var(newSize(&f.nvme, d.Tiers.NVMeBytes), "nvme", "NVMe tier capacity, under --data-dir")
	fs.Var(newSize(&f.hbm, d.Tiers.HBMBytes), "hbm", "HBM (GPU memory) tier capacity on CUDA device --gpu, above DRAM: blocks land there, HBM pressure demotes them into DRAM, DRAM hits promote them back; needs a build with -tags cuda, kvmesh-cuda.so and a GPU, else serve refuses to start and says which is missing (0: none)")
	fs.IntVar(&f.gpu, "gpu", d.GPU, "CUDA device ordinal of the --hbm tier and of --backend cuda")
	fs.StringVar(&f.nodeID, "node-id", "", "stable, unique node id (default: host name and gossip port)")
	fs.Var(newSize(&f.maxBlockBytes, int64(d.Limits.MaxBlockBytes)), "max-block-bytes", "largest encoded block accepted")
	fs.IntVar(&f.maxBatchBlocks, "max-batch-blocks", d.Limits.MaxBatchBlocks, "most blocks one request may name")
	fs.IntVar(&f.maxBlocks, "max-blocks", d.Tiers.MaxBlocks, "most blocks cached in DRAM and NVMe together (0: the tiers' capacities over 4KiB)")
	fs.StringVar(&f.eviction, "eviction", string(store.DefaultEviction), "eviction policy: lru (the reference), dedup (a node's copies of blocks other nodes own go first), or reuse (dedup, and a block a lookup or read asked for again gets a second chance)")
	fs.StringVar(&f.nvmeAdmission, "nvme-admission", "all", "which blocks DRAM pressure writes to NVMe: all, or reused (only blocks a lookup or read asked for again since they were put; the others are dropped, saving the write; needs --eviction reuse)")
	fs.DurationVar(&f.partialTTL, "partial-ttl", store.DefaultPartialTTL, "how long the parts of a block put by tensor- or pipeline-parallel ranks are kept while the block is incomplete (1ms..1h)")
	fs.DurationVar(&f.claimTTL, "claim-ttl", store.DefaultClaimTTL, "how long a rank's claim to write a part holds back the other ranks writing the same part (1ms..10m)")
	fs.DurationVar(&f.maxRetentionTTL, "max-retention-ttl", store.DefaultMaxRetentionTTL, "the longest TTL of an object's or a prefix's lease or pin (1ms..49d)")
	fs.StringVar(&f.kvEventsAddr, "kv-events-addr", "", "publish the store's KV events in vLLM's format on this ZMQ PUB endpoint, tcp://HOST:PORT (blocks entering and leaving HBM, DRAM, NVMe as medium GPU, CPU, DISK; for llm-d's indexer and kvmesh route --engine-events). No authentication: refused with tokens or TLS")
	fs.StringVar(&f.kvEventsReplayAddr, "kv-events-replay-addr", "", "ZMQ ROUTER endpoint, tcp://HOST:PORT, that replays recent KV-event batches from a sequence number (vLLM's replay protocol)")
	fs.StringVar(&f.kvEventsTopic, "kv-events-topic", "", "topic of the KV-event batches; {model} is replaced by the namespace's model (default kv@<node-id>@{model}, as llm-d parses)")
	fs.Float64Var(&f.maxPinned, "max-pinned", store.DefaultPinnedFraction, "the most of the node's DRAM and NVMe together that hard pins and leases may hold, as a fraction (0..1]")
	fs.Var(newSize(&f.maxMessageBytes, int64(d.Limits.MaxMessageBytes)), "max-message-bytes", "largest gRPC message sent or received")
	fs.Var(newSize(&f.chunkBytes, int64(d.Limits.ChunkBytes)), "chunk-bytes", "most payload bytes in one streamed message")
	fs.IntVar(&f.maxConcurrentStreams, "max-concurrent-streams", d.Limits.MaxConcurrentStreams, "most gRPC calls open at once on one client connection (more wait on the client)")
	fs.Var(newSize(&f.maxInFlightBytes, d.Limits.MaxInFlightBytes), "max-inflight-bytes", "request buffers each server holds at once (BatchPut blocks; data-plane requests and puts); more wait, then are refused")
	fs.DurationVar(&f.requestTimeout, "request-timeout", d.Limits.RequestTimeout, "upper bound of any request, streams included")
	fs.DurationVar(&f.receiveTimeout, "receive-timeout", d.Limits.ReceiveTimeout, "longest wait for the next message of a client stream (BatchPut): a stream silent for longer is ended and its block buffer released")
	fs.DurationVar(&f.shutdownTimeout, "shutdown-timeout", d.ShutdownTimeout, "how long requests in flight may run on after SIGTERM")
	fs.StringVar(&f.tlsCert, "tls-cert", "", "PEM file of the node's certificate chain: serve gRPC and the data plane over TLS 1.3")
	fs.StringVar(&f.tlsKey, "tls-key", "", "PEM file of the certificate's private key")
	fs.StringVar(&f.tlsCA, "tls-ca", "", "PEM file of the CA that signs the members' (and, with --tls-client-auth, the clients') certificates (default: the system's roots)")
	fs.BoolVar(&f.tlsClientAuth, "tls-client-auth", false, "mutual TLS: refuse clients and peers without a certificate signed by --tls-ca")
	fs.BoolVar(&f.httpTLS, "http-tls", false, "serve the HTTP address (the OpenAI-compatible API, /metrics, health) over TLS too, with --tls-cert (a client certificate is checked when given, not required); implied by --tls-cert: every listener of a node with TLS serves TLS")
	fs.StringVar(&f.tlsServerName, "tls-server-name", "", "name verified in the other members' certificates (default: the host of their address)")
	fs.StringVar(&f.tokenFile, "auth-token-file", "", "file of shared bearer tokens, one a line, that clients and peers must present (the node presents the first); one tenant: every token may do everything")
	fs.StringVar(&f.tokensFile, "tokens-file", "", "tokens file (YAML) mapping each token, or its SHA-256, to a tenant and scopes (read, write, admin, cluster): tenants that cannot touch each other's blocks; see docs/SECURITY.md")
	fs.Var(newSize(&f.quotaDRAM, d.Tiers.QuotaDRAMBytes), "quota-dram", "default DRAM quota of each namespace (0: unlimited; AdminService.SetQuota sets one namespace's)")
	fs.Var(newSize(&f.quotaNVMe, d.Tiers.QuotaNVMeBytes), "quota-nvme", "default NVMe quota of each namespace (0: unlimited)")
	fs.BoolVar(&f.pprof, "pprof", false, "serve the Go profiler (net/http/pprof) under /debug/pprof/ on --http-addr, which has no authentication")
	fs.StringVar(&f.logLevel, "log-level", "info", "debug, info, warn or error")
	fs.StringVar(&f.logFormat, "log-format", "text", "text or json (logs go to stderr)")
	f.prefill.register(fs, d.Prefill)
	return c, f
}

// options layers the environment and the config file under the command
// line and returns the node's options.
func (f *serveFlags) options(cmd *cobra.Command) (node.Options, *slog.Logger, error) {
	fs := cmd.Flags()
	if !fs.Changed("config") {
		f.config = os.Getenv(envName("config"))
	}
	cfg, err := readConfig(f.config)
	if err != nil {
		return node.Options{}, nil, err
	}
	if f.from, err = layer(fs, os.LookupEnv, cfg, f.config); err != nil {
		return node.Options{}, nil, err
	}
	return f.build(cmd)
}

// build returns the node's options from the layered flags. Its errors name
// where the value at fault came from: the flag, the environment variable or
// the config file's key.
func (f *serveFlags) build(cmd *cobra.Command) (node.Options, *slog.Logger, error) {
	src := func(name string) string { return source(f.from, name) }
	var level slog.Level
	if err := level.UnmarshalText([]byte(f.logLevel)); err != nil {
		return node.Options{}, nil, fmt.Errorf("%s %q: want debug, info, warn or error", src("log-level"), f.logLevel)
	}
	hopts := &slog.HandlerOptions{Level: level}
	var logger *slog.Logger
	switch f.logFormat {
	case "text":
		logger = slog.New(slog.NewTextHandler(cmd.ErrOrStderr(), hopts))
	case "json":
		logger = slog.New(slog.NewJSONHandler(cmd.ErrOrStderr(), hopts))
	default:
		return node.Options{}, nil, fmt.Errorf("%s %q: want text or json", src("log-format"), f.logFormat)
	}
	for _, s := range []struct {
		name string
		v    int64
	}{{"max-block-bytes", f.maxBlockBytes}, {"max-message-bytes", f.maxMessageBytes}, {"chunk-bytes", f.chunkBytes}} {
		if s.v > 1<<40 {
			return node.Options{}, nil, fmt.Errorf("%s %s is too large", src(s.name), formatSize(s.v))
		}
	}
	var key []byte
	if f.gossipKeyFile != "" {
		var err error
		if key, err = node.ReadGossipKey(f.gossipKeyFile); err != nil {
			return node.Options{}, nil, fmt.Errorf("%s: %w (make one with: head -c 32 /dev/urandom | base64)", src("gossip-key-file"), err)
		}
	}
	serverTLS, peerTLS, err := f.tlsConfigs(src)
	if err != nil {
		return node.Options{}, nil, err
	}
	var tokens []string
	if f.tokenFile != "" {
		if tokens, err = auth.ReadTokenList(f.tokenFile); err != nil {
			return node.Options{}, nil, fmt.Errorf("%s: %w", src("auth-token-file"), err)
		}
	}
	shmMode, err := strconv.ParseUint(f.shmSocketMode, 8, 32)
	if err != nil {
		return node.Options{}, nil, fmt.Errorf("%s %q: want permission bits in octal, such as 0600 or 0660", src("shm-socket-mode"), f.shmSocketMode)
	}
	var tf *auth.File
	if f.tokensFile != "" {
		if f.tokenFile != "" {
			return node.Options{}, nil, fmt.Errorf("%s and %s: give one (shared tokens for one tenant, or a tokens file for tenants)", src("auth-token-file"), src("tokens-file"))
		}
		if tf, err = auth.ReadFile(f.tokensFile); err != nil {
			return node.Options{}, nil, fmt.Errorf("%s: %w", src("tokens-file"), err)
		}
	}
	opts := node.Options{
		NodeID:    f.nodeID,
		DataDir:   f.dataDir,
		Listen:    node.ListenOptions{GRPCAddr: f.grpcAddr, HTTPAddr: f.httpAddr, DataAddr: f.dataAddr, ShmSocket: f.shmSocket, ShmSocketMode: os.FileMode(shmMode), ShmSocketGroup: f.shmSocketGroup, ShmRegionBytes: f.shmRegion, AdvertiseHost: f.advertiseHost},
		Cluster:   node.ClusterOptions{GossipAddr: f.gossipAddr, Join: f.join, GossipKey: key, GossipProfile: f.gossipProfile, InsecureGossip: f.insecureGossip, Replicas: f.replicas, ChunkTokens: f.chunkTokens, LookupTimeout: f.lookupTimeout, LookupRoundPeers: f.lookupRoundPeers, GetTimeout: f.getTimeout, PeerBackoff: f.peerBackoff, HandoffBytes: f.handoff, PushYield: f.pushYield, PushBytesPerSec: f.pushRate, Transport: f.transport, RDMADevice: f.rdmaDevice},
		ReadyFile: f.readyFile,
		Security:  node.SecurityOptions{HTTPTLS: f.httpTLS, TLS: serverTLS, PeerTLS: peerTLS, Tokens: tokens, TokensFile: tf},
		Limits:    node.LimitOptions{MaxConcurrentStreams: f.maxConcurrentStreams, MaxInFlightBytes: f.maxInFlightBytes, MaxBlockBytes: int(f.maxBlockBytes), MaxBatchBlocks: f.maxBatchBlocks, MaxMessageBytes: int(f.maxMessageBytes), ChunkBytes: int(f.chunkBytes), RequestTimeout: f.requestTimeout, ReceiveTimeout: f.receiveTimeout},
		Pprof:     f.pprof,
		Tiers: node.TierOptions{QuotaDRAMBytes: f.quotaDRAM, QuotaNVMeBytes: f.quotaNVMe, DRAMBytes: f.dram, DRAMPopulate: f.dramPopulate, NVMeBytes: f.nvme, HBMBytes: f.hbm, MaxBlocks: f.maxBlocks, Eviction: f.eviction, NVMeAdmission: f.nvmeAdmission, PartialTTL: f.partialTTL, ClaimTTL: f.claimTTL, SpillOnStopBytes: f.spillOnStop.option(),
			MaxRetentionTTL: f.maxRetentionTTL, MaxPinnedFraction: f.maxPinned},
		Events:          node.EventOptions{Addr: f.kvEventsAddr, ReplayAddr: f.kvEventsReplayAddr, Topic: f.kvEventsTopic},
		GPU:             f.gpu,
		ShutdownTimeout: f.shutdownTimeout,
		Version:         version(),
		Logger:          logger,
		Prefill:         f.prefill.options(),
	}
	opts.EnsureDefaults()
	if err := opts.Validate(); err != nil {
		return opts, nil, optionError(err, f.from)
	}
	return opts, logger, nil
}

// tlsConfigs loads the TLS flags' files: nil, nil when TLS is off.
func (f *serveFlags) tlsConfigs(src func(string) string) (server, peer *tls.Config, err error) {
	switch {
	case f.tlsCert == "" && f.tlsKey == "" && f.tlsCA == "" && !f.tlsClientAuth && f.tlsServerName == "":
		return nil, nil, nil
	case f.tlsCert == "" || f.tlsKey == "":
		return nil, nil, fmt.Errorf("%s and %s: a node serving TLS needs both, its certificate and its key (the other --tls-* flags need them too)",
			src("tls-cert"), src("tls-key"))
	case f.tlsClientAuth && f.tlsCA == "":
		return nil, nil, fmt.Errorf("%s needs --tls-ca, the CA that signs the certificates of clients and peers", src("tls-client-auth"))
	}
	server, peer, f.keyPair, err = transfer.LoadReloadableTLS(transfer.TLSFiles{Cert: f.tlsCert, Key: f.tlsKey, CA: f.tlsCA, ClientAuth: f.tlsClientAuth, ServerName: f.tlsServerName})
	if err != nil {
		return nil, nil, fmt.Errorf("TLS flags: %w", err)
	}
	return server, peer, nil
}

// optionError rewrites a node's or a router's option error in terms of the
// flag, or of the environment variable or config key that set it (from, as
// layer returns).
func optionError(err error, from map[string]string) error {
	var (
		field, msg string
		flags      map[string]string
		oe         *node.OptionError
		re         *router.OptionError
	)
	switch {
	case errors.As(err, &oe):
		field, msg, flags = oe.Field, oe.Msg, flagOf
	case errors.As(err, &re):
		field, msg, flags = re.Field, re.Msg, routeFlagOf
	default:
		return err
	}
	if name, ok := flags[field]; ok {
		if s, ok := from[name]; ok {
			return fmt.Errorf("%s: %s", s, msg)
		}
		return fmt.Errorf("--%s (or %s): %s", name, envName(name), msg)
	}
	return err
}

// serve opens the node, prints where it listens, and serves until SIGTERM
// or SIGINT; SIGHUP reloads the token file and the TLS certificate (pair,
// nil without TLS).
func serve(cmd *cobra.Command, opts node.Options, logger *slog.Logger, pair *transfer.KeyPair) error {
	n, err := node.Open(opts)
	if err != nil {
		if errors.Is(err, node.ErrInvalidOptions) {
			return optionError(err, nil)
		}
		return fmt.Errorf("%w; check --data-dir and the addresses", optionError(err, nil))
	}
	out := cmd.OutOrStdout()
	fmt.Fprintf(out, "kvmesh %s serving node %s\n", version(), n.ID())
	fmt.Fprintf(out, "  gRPC     %s\n", n.GRPCAddr())
	web := "http"
	if opts.Security.TLS != nil { // every listener: HTTPTLS is implied
		web = "https"
	}
	fmt.Fprintf(out, "  metrics  %s://%s/metrics   health  %s://%s/healthz\n", web, n.HTTPAddr(), web, n.HTTPAddr())
	shm := n.ShmSocket()
	if shm == "" {
		shm = "off"
	}
	fmt.Fprintf(out, "  data     %s   shm  %s\n", n.DataAddr(), shm)
	fmt.Fprintf(out, "  gossip   %s   (others join with --join %s)\n", n.GossipAddr(), n.GossipAddr())
	fmt.Fprintf(out, "  store    %s (DRAM %s, NVMe %s)\n", opts.DataDir, formatSize(opts.Tiers.DRAMBytes), formatSize(opts.Tiers.NVMeBytes))
	fmt.Fprintf(out, "  prefill  %s\n", engineLine(opts.Prefill))
	if !opts.Prefill.Disabled {
		fmt.Fprintf(out, "  openai   %s://%s/v1   (model %q: /v1/models, /v1/completions, /v1/chat/completions)\n", web, n.HTTPAddr(), openai.ModelAlias)
	}
	fmt.Fprintf(out, "  security %s\n", security(opts))
	fmt.Fprintf(out, "try: kvmesh inspect --addr %s%s members   (stop with Ctrl-C)\n", n.GRPCAddr(), clientHint(cmd.Flags()))

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	tokens, tenants := flagValue(cmd.Flags(), "auth-token-file"), false
	if tokens == "" {
		tokens, tenants = flagValue(cmd.Flags(), "tokens-file"), true
	}
	if tokens != "" || pair != nil {
		done := reloadOnHUP(n, tokens, tenants, pair, logger)
		defer done()
	}
	if err := n.Serve(ctx); err != nil {
		return err
	}
	return nil
}

// security describes how the node guards its doors, for people.
func security(o node.Options) string {
	var parts []string
	switch {
	case o.Security.TLS == nil:
		parts = append(parts, "plain TCP")
	case o.Security.TLS.ClientAuth == tls.RequireAndVerifyClientCert:
		parts = append(parts, "mutual TLS 1.3")
	default:
		parts = append(parts, "TLS 1.3")
	}
	switch {
	case o.Security.TokensFile != nil:
		parts = append(parts, fmt.Sprintf("tenants (%d tokens, %d tenants)", len(o.Security.TokensFile.Credentials), len(o.Security.TokensFile.Tenants)))
	case len(o.Security.Tokens) > 0:
		parts = append(parts, fmt.Sprintf("shared bearer tokens, one tenant (%d accepted)", len(o.Security.Tokens)))
	default:
		parts = append(parts, "no token")
	}
	if len(o.Cluster.GossipKey) > 0 {
		parts = append(parts, "encrypted gossip")
	}
	return strings.Join(parts, ", ")
}

// reloadOnHUP, on every SIGHUP, re-reads the token file at path (if any)
// into the node's accepted set and the TLS certificate and key (pair, if
// any), until the returned stop is called (it waits for the goroutine). A
// file that fails to load leaves what the node had in force.
func reloadOnHUP(n *node.Node, path string, tenants bool, pair *transfer.KeyPair, log *slog.Logger) (stop func()) {
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	quit, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-quit:
				return
			case <-hup:
			}
			if pair != nil {
				if err := pair.Reload(); err != nil {
					log.Error("SIGHUP: TLS certificate not reloaded; the node keeps the one it had", "err", err)
				} else {
					log.Info("SIGHUP: TLS certificate reloaded", "not_after", pair.Certificate().Leaf.NotAfter)
				}
			}
			if path == "" {
				continue
			}
			accepted, err := reload(n, path, tenants)
			if err != nil {
				log.Error("SIGHUP: tokens not reloaded; the node keeps the ones it had", "file", path, "err", err)
				continue
			}
			log.Info("SIGHUP: tokens reloaded", "file", path, "accepted", accepted)
		}
	}()
	return func() {
		signal.Stop(hup)
		close(quit)
		<-done
	}
}

// reload reads the token file at path again into n: a tokens file when
// tenants, else shared tokens. It returns how many tokens n now accepts.
func reload(n *node.Node, path string, tenants bool) (int, error) {
	if tenants {
		f, err := auth.ReadFile(path)
		if err != nil {
			return 0, err
		}
		return len(f.Credentials), n.SetTokensFile(f)
	}
	tokens, err := auth.ReadTokenList(path)
	if err != nil {
		return 0, err
	}
	return len(tokens), n.SetTokens(tokens)
}

// clientHint returns the flags a client needs to reach a node served with
// the serve flags fs, to print beside its address.
func clientHint(fs *pflag.FlagSet) string {
	var b strings.Builder
	if flagValue(fs, "tls-cert") != "" {
		if ca := flagValue(fs, "tls-ca"); ca != "" {
			fmt.Fprintf(&b, " --tls-ca %s", ca)
		} else {
			b.WriteString(" --tls")
		}
		if flagValue(fs, "tls-client-auth") == "true" {
			b.WriteString(" --tls-cert CERT --tls-key KEY")
		}
		if name := flagValue(fs, "tls-server-name"); name != "" {
			fmt.Fprintf(&b, " --tls-server-name %s", name)
		}
	}
	if flagValue(fs, "auth-token-file") != "" {
		b.WriteString(" --auth-token-file FILE")
	}
	return b.String()
}

// flagValue returns the value of fs's flag name (after layering), "" when
// there is no such flag.
func flagValue(fs *pflag.FlagSet, name string) string {
	if f := fs.Lookup(name); f != nil {
		return f.Value.String()
	}
	return ""
}
