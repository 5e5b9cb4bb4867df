package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/kvmesh/kvmesh/node"
	"github.com/kvmesh/kvmesh/router"
	"github.com/kvmesh/kvmesh/transfer"
)

func routeCmd() *cobra.Command {
	var (
		opts                    router.Options
		gossipKeyFile, logLevel string
		nodeTLS                 struct{ ca, cert, key, server string }
	)
	c := &cobra.Command{
		Use:   "route --join HOST:PORT,...",
		Short: "Run the OpenAI-compatible router in front of a kvmesh cluster",
		Long: `Run the OpenAI-compatible API (/v1/models, /v1/completions,
/v1/chat/completions, streamed or not) in front of a cluster, until SIGTERM or
SIGINT. The router joins the cluster's gossip (--join: the --gossip-addr of any
member) as a member that stores nothing, and learns the nodes' HTTP addresses
and roles from it. Each request goes to the node with the fewest outstanding
uncached prompt tokens (it asks one node's lookup how much of the prompt the
cluster already holds), never by session: a cached prefix is a hit on every
node. With nodes served --role prefill and --role decode, a request is computed
on a prefill node, then decoded on the decode node with the fewest tokens to
generate. A node that fails before answering is retried on another.
--policy random or session are the baselines of kvmesh bench serve.
Prometheus metrics per node on /metrics.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := envLayer(cmd); err != nil {
				return err
			}
			var level slog.Level
			if err := level.UnmarshalText([]byte(logLevel)); err != nil {
				return fmt.Errorf("--log-level %q: want debug, info, warn or error", logLevel)
			}
			opts.Logger = slog.New(slog.NewTextHandler(cmd.ErrOrStderr(), &slog.HandlerOptions{Level: level}))
			if gossipKeyFile != "" {
				key, err := node.ReadGossipKey(gossipKeyFile)
				if err != nil {
					return fmt.Errorf("--gossip-key-file: %w", err)
				}
				opts.GossipKey = key
			}
			if nodeTLS.ca != "" || nodeTLS.cert != "" || nodeTLS.key != "" || nodeTLS.server != "" {
				if (nodeTLS.cert == "") != (nodeTLS.key == "") {
					return errors.New("--tls-cert and --tls-key go together: a client certificate and its key")
				}
				_, cfg, err := transfer.LoadTLS(transfer.TLSFiles{CA: nodeTLS.ca, Cert: nodeTLS.cert, Key: nodeTLS.key, ServerName: nodeTLS.server})
				if err != nil {
					return fmt.Errorf("TLS flags: %w", err)
				}
				opts.NodeTLS = cfg
			}
			for _, j := range opts.Join {
				if err := checkHostPort("--join", j); err != nil {
					return err
				}
			}
			r, err := router.New(opts)
			if err != nil {
				return fmt.Errorf("%w (see kvmesh route --help)", optionError(err, nil))
			}
			out := cmd.OutOrStdout()
			fmt.Fprintf(out, "kvmesh %s routing (policy %s)\n", version(), opts.Policy)
			fmt.Fprintf(out, "  openai   http://%s/v1\n", r.HTTPAddr())
			fmt.Fprintf(out, "  metrics  http://%s/metrics\n", r.HTTPAddr())
			fmt.Fprintf(out, "  gossip   %s   (joined %v)\n", r.GossipAddr(), opts.Join)
			ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
			defer stop()
			return r.Serve(ctx)
		},
	}
	fs := c.Flags()
	fs.SortFlags = false
	fs.StringVar(&opts.HTTPAddr, "http-addr", router.DefaultHTTPAddr, "host:port of the router's API and /metrics (port 0: any free port)")
	fs.StringSliceVar(&opts.Join, "join", nil, "gossip addresses HOST:PORT,... of cluster members (required)")
	fs.StringVar(&opts.GossipAddr, "gossip-addr", "127.0.0.1:0", "host:port of the router's own gossip")
	fs.StringVar(&gossipKeyFile, "gossip-key-file", "", "the cluster's gossip key file; without it the router forwards no request that carries a bearer token (any host could join its gossip as a node)")
	fs.BoolVar(&opts.InsecureGossip, "insecure-gossip", false, "forward requests with bearer tokens without a gossip key, on a network only the cluster's hosts reach")
	fs.StringVar(&opts.GossipProfile, "gossip-profile", "lan", "failure detection timings: lan, or local (one host)")
	fs.StringVar(&opts.Policy, "policy", router.PolicyTokens, "tokens (fewest outstanding uncached prompt tokens), random, or session (by x-session-affinity; a baseline)")
	fs.StringVar(&opts.NodeID, "node-id", "", "the router's member id (default router-<host>-<port>)")
	fs.StringVar(&nodeTLS.ca, "tls-ca", "", "reach the nodes' HTTP addresses over HTTPS (nodes with TLS serve it there), trusting this CA's PEM file; without it the router routes to no node with TLS")
	fs.StringVar(&nodeTLS.cert, "tls-cert", "", "client certificate (PEM) to present to the nodes over HTTPS")
	fs.StringVar(&nodeTLS.key, "tls-key", "", "the client certificate's private key (PEM)")
	fs.StringVar(&nodeTLS.server, "tls-server-name", "", "name verified in the nodes' certificates (default: the host of their address)")
	fs.StringVar(&logLevel, "log-level", "info", "debug, info, warn or error")
	return c
}

// routeFlagOf names the flag of each router.Options field New checks, as
// flagOf does the node's.
var routeFlagOf = map[string]string{"Join": "join", "Policy": "policy", "GossipProfile": "gossip-profile"}
