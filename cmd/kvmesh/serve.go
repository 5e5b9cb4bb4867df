package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/kvmesh/kvmesh/node"
)

// serveFlags are kvmesh serve's flags; each maps to a node.Options field.
type serveFlags struct {
	config                                     string
	nodeID, dataDir                            string
	grpcAddr, httpAddr, dataAddr, gossipAddr   string
	shmSocket, advertiseHost                   string
	shmRegion                                  int64
	join                                       []string
	gossipKeyFile, gossipProfile               string
	replicas, chunkTokens                      int
	lookupTimeout, getTimeout, peerBackoff     time.Duration
	handoff                                    int64
	dram, nvme                                 int64
	maxBlockBytes, maxMessageBytes, chunkBytes int64
	maxBatchBlocks                             int
	requestTimeout, shutdownTimeout            time.Duration
	logLevel, logFormat                        string
	prefill                                    prefillServeFlags
}

// flagOf names the flag of each node.Options field, to turn Validate's
// errors into advice about the flag.
var flagOf = map[string]string{
	"NodeID": "node-id", "DataDir": "data-dir", "GRPCAddr": "grpc-addr", "HTTPAddr": "http-addr",
	"DataAddr": "data-addr", "GossipAddr": "gossip-addr", "Join": "join", "DRAMBytes": "dram", "NVMeBytes": "nvme",
	"ShmSocket": "shm-socket", "ShmRegionBytes": "shm-region", "AdvertiseHost": "advertise-host",
	"GossipKey": "gossip-key-file", "GossipProfile": "gossip-profile", "Replicas": "replicas", "ChunkTokens": "chunk-tokens",
	"LookupTimeout": "lookup-timeout", "GetTimeout": "get-timeout", "PeerBackoff": "peer-backoff", "HandoffBytes": "handoff",
	"MaxBlockBytes": "max-block-bytes", "MaxBatchBlocks": "max-batch-blocks", "MaxMessageBytes": "max-message-bytes",
	"ChunkBytes": "chunk-bytes", "RequestTimeout": "request-timeout", "ShutdownTimeout": "shutdown-timeout",
}

func serveCmd() *cobra.Command { return newServeCmd(serve) }

// newServeCmd returns the serve command, which runs run with the options
// it assembled (tests pass a run that only records them).
func newServeCmd(run func(*cobra.Command, node.Options, *slog.Logger) error) *cobra.Command {
	var f serveFlags
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
			return run(cmd, opts, logger)
		},
	}
	fs := c.Flags()
	fs.SortFlags = false
	fs.StringVar(&f.config, "config", "", "YAML config file whose keys are these flags' names")
	fs.StringVar(&f.dataDir, "data-dir", d.DataDir, "directory of the node's persistent state (the NVMe tier)")
	fs.StringVar(&f.grpcAddr, "grpc-addr", d.GRPCAddr, "host:port of the gRPC API (port 0: any free port)")
	fs.StringVar(&f.httpAddr, "http-addr", d.HTTPAddr, "host:port of /metrics and /healthz")
	fs.StringVar(&f.dataAddr, "data-addr", d.DataAddr, "host:port of the data plane: blocks between nodes, and to clients")
	fs.StringVar(&f.shmSocket, "shm-socket", "", `unix socket of the shared-memory data plane for clients on this host, or "off" (default <data-dir>/shm.sock)`)
	fs.Var(newSize(&f.shmRegion, d.ShmRegionBytes), "shm-region", "shared region of each shared-memory client")
	fs.StringVar(&f.gossipAddr, "gossip-addr", d.GossipAddr, "host:port of membership gossip (UDP and TCP): what other nodes --join")
	fs.StringSliceVar(&f.join, "join", nil, "gossip addresses HOST:PORT,... of running members to join (retried until one answers)")
	fs.StringVar(&f.advertiseHost, "advertise-host", "", "host other nodes and clients reach this node at, for addresses bound to 0.0.0.0 (default: the gossip host, else a private IP)")
	fs.StringVar(&f.gossipKeyFile, "gossip-key-file", "", "file holding the base64 of a 16, 24 or 32-byte key that encrypts gossip (the same on every member)")
	fs.StringVar(&f.gossipProfile, "gossip-profile", d.GossipProfile, "failure detection timings: lan, or local (one host, tests: a dead node noticed in about 2s)")
	fs.IntVar(&f.replicas, "replicas", d.Replicas, "nodes that own each placement chunk (the same on every member)")
	fs.IntVar(&f.chunkTokens, "chunk-tokens", d.ChunkTokens, "tokens per placement chunk (the same on every member)")
	fs.DurationVar(&f.lookupTimeout, "lookup-timeout", d.LookupTimeout, "how long a lookup waits for other nodes; a late node is a miss")
	fs.DurationVar(&f.getTimeout, "get-timeout", d.GetTimeout, "how long a read waits for blocks from other nodes; late blocks are misses")
	fs.DurationVar(&f.peerBackoff, "peer-backoff", d.PeerBackoff, "how long a node that failed a call is skipped (its blocks are misses)")
	fs.Var(newSize(&f.handoff, d.HandoffBytes), "handoff", "most DRAM bytes handed to their next owners on a graceful stop")
	fs.Var(newSize(&f.dram, d.DRAMBytes), "dram", "DRAM tier capacity")
	fs.Var(newSize(&f.nvme, d.NVMeBytes), "nvme", "NVMe tier capacity, under --data-dir")
	fs.StringVar(&f.nodeID, "node-id", "", "stable, unique node id (default: host name and gossip port)")
	fs.Var(newSize(&f.maxBlockBytes, int64(d.MaxBlockBytes)), "max-block-bytes", "largest encoded block accepted")
	fs.IntVar(&f.maxBatchBlocks, "max-batch-blocks", d.MaxBatchBlocks, "most blocks one request may name")
	fs.Var(newSize(&f.maxMessageBytes, int64(d.MaxMessageBytes)), "max-message-bytes", "largest gRPC message sent or received")
	fs.Var(newSize(&f.chunkBytes, int64(d.ChunkBytes)), "chunk-bytes", "most payload bytes in one streamed message")
	fs.DurationVar(&f.requestTimeout, "request-timeout", d.RequestTimeout, "upper bound of any request, streams included")
	fs.DurationVar(&f.shutdownTimeout, "shutdown-timeout", d.ShutdownTimeout, "how long requests in flight may run on after SIGTERM")
	fs.StringVar(&f.logLevel, "log-level", "info", "debug, info, warn or error")
	fs.StringVar(&f.logFormat, "log-format", "text", "text or json (logs go to stderr)")
	f.prefill.register(fs, d.Prefill)
	return c
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
	if err := layer(fs, os.LookupEnv, cfg, f.config); err != nil {
		return node.Options{}, nil, err
	}
	var level slog.Level
	if err := level.UnmarshalText([]byte(f.logLevel)); err != nil {
		return node.Options{}, nil, fmt.Errorf("--log-level %q: want debug, info, warn or error", f.logLevel)
	}
	hopts := &slog.HandlerOptions{Level: level}
	var logger *slog.Logger
	switch f.logFormat {
	case "text":
		logger = slog.New(slog.NewTextHandler(cmd.ErrOrStderr(), hopts))
	case "json":
		logger = slog.New(slog.NewJSONHandler(cmd.ErrOrStderr(), hopts))
	default:
		return node.Options{}, nil, fmt.Errorf("--log-format %q: want text or json", f.logFormat)
	}
	for _, s := range []struct {
		name string
		v    int64
	}{{"max-block-bytes", f.maxBlockBytes}, {"max-message-bytes", f.maxMessageBytes}, {"chunk-bytes", f.chunkBytes}} {
		if s.v > 1<<40 {
			return node.Options{}, nil, fmt.Errorf("--%s %s is too large", s.name, formatSize(s.v))
		}
	}
	var key []byte
	if f.gossipKeyFile != "" {
		var err error
		if key, err = node.ReadGossipKey(f.gossipKeyFile); err != nil {
			return node.Options{}, nil, fmt.Errorf("--gossip-key-file: %w (make one with: head -c 32 /dev/urandom | base64)", err)
		}
	}
	opts := node.Options{
		NodeID: f.nodeID, DataDir: f.dataDir,
		GRPCAddr: f.grpcAddr, HTTPAddr: f.httpAddr, DataAddr: f.dataAddr, GossipAddr: f.gossipAddr,
		ShmSocket: f.shmSocket, ShmRegionBytes: f.shmRegion, AdvertiseHost: f.advertiseHost,
		Join: f.join, GossipKey: key, GossipProfile: f.gossipProfile,
		Replicas: f.replicas, ChunkTokens: f.chunkTokens,
		LookupTimeout: f.lookupTimeout, GetTimeout: f.getTimeout, PeerBackoff: f.peerBackoff, HandoffBytes: f.handoff,
		DRAMBytes: f.dram, NVMeBytes: f.nvme,
		MaxBlockBytes: int(f.maxBlockBytes), MaxBatchBlocks: f.maxBatchBlocks,
		MaxMessageBytes: int(f.maxMessageBytes), ChunkBytes: int(f.chunkBytes),
		RequestTimeout: f.requestTimeout, ShutdownTimeout: f.shutdownTimeout,
		Version: version(), Logger: logger,
		Prefill: f.prefill.options(),
	}
	opts.EnsureDefaults()
	if err := opts.Validate(); err != nil {
		return opts, nil, optionError(err)
	}
	return opts, logger, nil
}

// optionError rewrites a node option error in terms of the flag.
func optionError(err error) error {
	var oe *node.OptionError
	if errors.As(err, &oe) {
		if name, ok := flagOf[oe.Field]; ok {
			return fmt.Errorf("--%s (or %s): %s", name, envName(name), oe.Msg)
		}
	}
	return err
}

// serve opens the node, prints where it listens, and serves until SIGTERM
// or SIGINT.
func serve(cmd *cobra.Command, opts node.Options, logger *slog.Logger) error {
	n, err := node.Open(opts)
	if err != nil {
		return fmt.Errorf("%w; check --data-dir and the addresses", optionError(err))
	}
	out := cmd.OutOrStdout()
	fmt.Fprintf(out, "kvmesh %s serving node %s\n", version(), n.ID())
	fmt.Fprintf(out, "  gRPC     %s\n", n.GRPCAddr())
	fmt.Fprintf(out, "  metrics  http://%s/metrics   health  http://%s/healthz\n", n.HTTPAddr(), n.HTTPAddr())
	shm := n.ShmSocket()
	if shm == "" {
		shm = "off"
	}
	fmt.Fprintf(out, "  data     %s   shm  %s\n", n.DataAddr(), shm)
	fmt.Fprintf(out, "  gossip   %s   (others join with --join %s)\n", n.GossipAddr(), n.GossipAddr())
	fmt.Fprintf(out, "  store    %s (DRAM %s, NVMe %s)\n", opts.DataDir, formatSize(opts.DRAMBytes), formatSize(opts.NVMeBytes))
	fmt.Fprintf(out, "  prefill  %s\n", engineLine(opts.Prefill))
	fmt.Fprintf(out, "try: kvmesh inspect --addr %s members   (stop with Ctrl-C)\n", n.GRPCAddr())

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	if err := n.Serve(ctx); err != nil {
		return err
	}
	return nil
}
