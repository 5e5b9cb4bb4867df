package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/kvmesh/kvmesh/bench"
	"github.com/kvmesh/kvmesh/gpu"
	"github.com/kvmesh/kvmesh/store"
)

// benchFlags are kvmesh bench's flags.
type benchFlags struct {
	quick                      bool
	output                     string
	out                        string
	workDir                    string
	addr                       []string
	trace                      string
	requests                   int
	nodes                      int
	routing                    string
	capacity                   int
	eviction                   string
	dramFraction               float64
	nodeSweep                  []float64
	speedup                    float64
	duration                   time.Duration
	conc                       int
	logLevel                   string
	backend                    string
	gpu                        int
	modelDir                   string
	promptTokens, decodeTokens int
	backlog                    int
	transport                  string
	phases                     []string
	dilation                   float64
}

func benchCmd() *cobra.Command {
	f := &benchFlags{}
	c := &cobra.Command{
		Use:   "bench SUITE... [--quick] [-o table|wide|json] [--out DIR]",
		Short: "Measure kvmesh next to its peers (Redis, raw TCP, memcpy, fio) and the machine's limits",
		Long: `Measure kvmesh on this machine, next to the peer a user would pick instead and the
physical limit, both measured in the same run; figures are reported as ratios.

Suites:
  transfer   data plane: transfer client vs raw TCP stream, shared memory vs copy();
             --transport ucx: one-sided reads through UCX vs ucx_perftest -t ucp_get and
             kvmesh's TCP path, over UCX_TLS tcp and sm (needs a build with -tags ucx)
  store      GET/SET of 64KiB, 1MiB, 4MiB blocks at concurrency 4 and 16, vs Redis;
             over shared memory, reads copied out (get) and in place (view) apart
  ranks      2, 4, 8 tensor-parallel ranks putting then getting their slices of the
             same blocks at once (Put/Get with a Rank) vs one client's whole blocks, TCP
             and shared memory; 8 MLA ranks putting one prefix: bytes received vs one copy
  lookup     longest-prefix lookup of 1k..128k-token prompts on 1..4 nodes; hashing
  nvme       the NVMe tier vs fio (sequential direct write, random direct read);
             end to end: Go client Get of 64-block prompts mostly on a node's NVMe;
             warm restart: a node's DRAM written to NVMe on SIGTERM, found after
  prefill    time to first token vs cached fraction of an 8k prompt; GFLOP/s vs Sgemm
             (--backend cuda: the engine on CUDA device --gpu, in process, vs cuBLAS
             Sgemm alone; needs a build with -tags cuda, kvmesh-cuda.so and a GPU)
  trace      a Mooncake trace replayed on N nodes: hit ratio vs the trace's ideal
  peers      the peers and limits alone (memcpy, raw TCP, Redis, fio)
  serve      agentic multi-turn sessions through kvmesh route over 3 nodes (the
             OpenAI-compatible API, streamed): cached tokens vs the ideal, TTFT
             p50/p99 and tokens/s for token-aware, random and session routing;
             what the router adds; with --backlog N instead: the sessions alone
             and beside N queued requests (POST /v1/queue) on the same nodes,
             TTFT p50 ratio and the backlog's drain rate vs queued work alone
  soak       a mixed load (lookups, gets, puts, prefills) for --duration on 2 nodes
             with small tiers: RSS, goroutines, errors and latencies over time;
             fails on any error but a miss, on wrong bytes, or RSS past DRAM + overhead
  scale      N nodes simulated in this process (--nodes N, default 16, 64, 256 and 1024):
             kvmesh's gossip, placement, lookups, pushes and handoffs on a simulated
             network (--phases membership,placement,lookup): what grows with N
  all        every suite but peers, serve, soak and scale

Suites that need nodes start them as separate 'kvmesh serve' processes on
127.0.0.1 (free ports, a temporary data dir each), unless --addr names a
running cluster. A missing peer (no redis-server, no fio) is reported and
skipped. --quick runs every suite in a few minutes. PNG plots go to --out.

  kvmesh bench all --quick -o json --out bench-out
  kvmesh bench trace --trace conversation_trace.jsonl --nodes 4 --routing random
  kvmesh bench soak --duration 10m --concurrency 64 --out bench-out`,
		Args: func(_ *cobra.Command, args []string) error {
			if len(args) == 0 {
				return errors.New("name a suite (transfer, store, ranks, lookup, nvme, prefill, trace, peers, serve, soak, scale) or all; see 'kvmesh bench --help'")
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error { return f.run(cmd, args) },
	}
	fs := c.Flags()
	fs.SortFlags = false
	fs.BoolVar(&f.quick, "quick", false, "small variant of every suite (CI)")
	fs.StringVarP(&f.output, "output", "o", "table", "table (the columns a reader needs, each explained once), wide (every column) or json")
	fs.StringVar(&f.out, "out", "", "directory for PNG plots (none without it)")
	fs.StringSliceVar(&f.addr, "addr", nil, "gRPC addresses HOST:PORT,... of a running cluster to measure instead of starting nodes")
	fs.StringVar(&f.trace, "trace", "", "trace suite: Mooncake-format trace (JSONL, .gz ok; agentic or agentic:SEED generates agent sessions; default: the bundled conversation trace)")
	fs.IntVar(&f.requests, "requests", 0, "trace suite: replay only the first N requests (default: all; --quick: fewer)")
	fs.IntVar(&f.nodes, "nodes", 0, "trace suite: cluster size (default 4); scale suite: the one size simulated")
	fs.StringSliceVar(&f.phases, "phases", nil, "scale suite: what to measure, of placement, lookup, membership, gossip (membership's steady cost alone), backlog (gossip while every node's work-stealing backlog changes each second) (default placement, lookup, membership)")
	fs.Float64Var(&f.dilation, "dilation", 0, "scale suite: how many times slower the membership simulation's clock runs (default 4, 8 from 1024 nodes)")
	fs.StringVar(&f.routing, "routing", "random", "trace suite: routing policy measured beside session-affinity (random, round-robin, session-affinity, least-loaded)")
	fs.IntVar(&f.capacity, "capacity-blocks", 0, "trace suite: each node's capacity in blocks (default: every distinct block of the trace fits)")
	fs.StringVar(&f.eviction, "eviction", "", "trace suite: eviction policy of the nodes it starts, lru, dedup or reuse (default: kvmesh serve's); the sweep on nodes replays lru beside it")
	fs.Float64SliceVar(&f.nodeSweep, "node-sweep", nil, "trace suite: pooled capacities (fractions of the trace's distinct blocks) of the sweeps on kvmesh nodes (default 0.01,0.02,0.05,0.1,0.2,0.3; --quick 0.1)")
	fs.Float64Var(&f.dramFraction, "dram-fraction", 0, "trace suite: also sweep NVMe admission on nodes whose DRAM holds this share of their capacity and NVMe the rest (reuse policy, --nvme-admission all and reused; default 0: no such sweep)")
	fs.Float64Var(&f.speedup, "speedup", 0, "trace suite: honour the trace's timestamps, replayed this many times faster (default 0: as fast as possible)")
	fs.DurationVar(&f.duration, "duration", 0, "soak: how long the load runs (default 10m; --quick: 30s)")
	fs.IntVar(&f.conc, "concurrency", 0, "soak: workers, one call in flight each (default 64)")
	fs.StringVar(&f.transport, "transport", "tcp", "transfer suite: tcp, or ucx (the one-sided path beside ucx_perftest, over UCX_TLS tcp and sm)")
	fs.IntVar(&f.backlog, "backlog", 0, "serve: measure N queued requests beside the sessions instead of the routing policies (the queue's target is stated for 200 or more)")
	fs.StringVar(&f.workDir, "work-dir", "", "scratch directory, on the disk the nvme suite measures (default: a temporary directory)")
	fs.StringVar(&f.backend, "backend", "cpu", "prefill suite: the engine's backend, cpu or cuda (cuBLAS on CUDA device --gpu, in the bench's process)")
	fs.IntVar(&f.gpu, "gpu", 0, "prefill suite: CUDA device ordinal of --backend cuda")
	fs.StringVar(&f.modelDir, "model-dir", "", "prefill suite: a Hugging Face model directory to measure instead (prefill and decode tokens/s beside PyTorch's forward of the same checkpoint)")
	fs.IntVar(&f.promptTokens, "prompt-tokens", 0, "prefill suite: the prompt's length (default 8192; with --model-dir 512; --quick less)")
	fs.IntVar(&f.decodeTokens, "decode-tokens", 0, "prefill suite with --model-dir: tokens decoded after the prompt (default 32)")
	fs.StringVar(&f.logLevel, "log-level", "warn", "debug, info, warn or error (logs go to stderr)")
	return c
}

func (f *benchFlags) run(cmd *cobra.Command, names []string) error {
	if err := envLayer(cmd); err != nil {
		return err
	}
	for _, a := range f.addr {
		if err := checkHostPort("--addr", a); err != nil {
			return err
		}
	}
	format, err := bench.ParseFormat(f.output)
	if err != nil {
		return fmt.Errorf("-o %q: want table, wide or json", f.output)
	}
	routing, err := bench.ParsePolicy(f.routing)
	if err != nil {
		return fmt.Errorf("--routing: %w", err)
	}
	if f.eviction != "" {
		if _, err := store.ParseEviction(f.eviction); err != nil {
			return fmt.Errorf("--eviction: %w", err)
		}
	}
	if f.dramFraction < 0 || f.dramFraction > 1 {
		return fmt.Errorf("--dram-fraction %v: want 0..1", f.dramFraction)
	}
	if f.nodes < 0 || f.requests < 0 || f.capacity < 0 || f.speedup < 0 || f.duration < 0 || f.conc < 0 || f.backlog < 0 {
		return errors.New("--nodes, --requests, --capacity-blocks, --speedup, --duration, --concurrency and --backlog must not be negative")
	}
	var level slog.Level
	if err := level.UnmarshalText([]byte(f.logLevel)); err != nil {
		return fmt.Errorf("--log-level %q: want debug, info, warn or error", f.logLevel)
	}
	sf := bench.SuiteFlags{TracePath: f.trace, Requests: f.requests,
		Nodes: f.nodes, Routing: routing, CapacityBlocks: f.capacity, Eviction: f.eviction, DRAMFraction: f.dramFraction, NodeSweep: f.nodeSweep, Speedup: f.speedup,
		SoakDuration: f.duration, SoakConcurrency: f.conc, Backlog: f.backlog, Transport: f.transport,
		PrefillModelDir: f.modelDir, PrefillPromptTokens: f.promptTokens, PrefillDecodeTokens: f.decodeTokens, ScalePhases: f.phases, ScaleDilation: f.dilation}
	switch f.backend {
	case "cpu":
	case "cuda":
		dev, err := gpu.OpenBLAS(f.gpu, gpu.Options{})
		if err != nil {
			return fmt.Errorf("--backend cuda: %w", err)
		}
		defer dev.Close()
		sf.PrefillDevice = dev
	default:
		return fmt.Errorf("--backend %q: want cpu or cuda", f.backend)
	}
	suites, err := bench.Select(bench.Suites(sf), names)
	if err != nil {
		return fmt.Errorf("%w; see 'kvmesh bench --help'", err)
	}
	binary, err := os.Executable()
	if err != nil {
		return fmt.Errorf("cannot find the kvmesh binary to start nodes with (%w); pass --addr HOST:PORT of a running cluster", err)
	}
	ctx, stop := signal.NotifyContext(cmd.Context(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	rep, err := bench.Run(ctx, suites, bench.Env{
		Quick: f.quick, OutDir: f.out, WorkDir: f.workDir, Binary: binary, Addrs: f.addr,
		Progress: bench.ProgressFor(os.Stderr, format),
		Log:      slog.New(slog.NewTextHandler(cmd.ErrOrStderr(), &slog.HandlerOptions{Level: level})),
	})
	if rep != nil {
		if werr := bench.Write(cmd.OutOrStdout(), rep, format); werr != nil && err == nil {
			err = werr
		}
	}
	if errors.Is(err, context.Canceled) {
		return errors.New("interrupted; the figures above are what completed")
	}
	if err != nil {
		return err
	}
	if failed := rep.Failed(); len(failed) > 0 {
		return fmt.Errorf("suite %s failed (see its error above)", strings.Join(failed, ", "))
	}
	return nil
}
