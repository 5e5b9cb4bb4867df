// Package bench holds kvmesh's benchmark suites: workloads, trace replay,
// side-by-side peers (Redis, a raw TCP stream, memcpy, fio), reports and
// plots. The `kvmesh bench` command parses flags and calls Suites, Select,
// Run and Write; everything else lives here.
//
// # Suites and reports
//
// A Suite has a name, its own Options (with documented defaults for a full
// run and for --quick) and Run(ctx, env) → *Result. Suites returns them in
// the order `all` runs them:
//
//	transfer  the data plane (transfer.Client, transfer.ShmClient) against a
//	          raw TCP stream and copy() of the same bytes, interleaved, with
//	          the transfer package's own measurement loops (transfertest.Testbed)
//	store     GET/SET of whole blocks through the Go client, network and
//	          shared-memory paths, against Redis by the same load loop and
//	          by redis-benchmark (the faster is the peer; > 15% apart flagged)
//	ranks     N tensor-parallel ranks (goroutines, a client each) putting
//	          and getting their slices of the same blocks at once
//	          (client.Put, Get with a Prompt.Rank) against one client's whole blocks,
//	          over TCP and shared memory; an MLA instance's ranks putting
//	          one prefix: bytes the node received against one copy
//	lookup    longest-prefix lookup of 1k..128k-token prompts on 1..4 nodes;
//	          the keys of a 128k-token prompt against one SHA-256 pass
//	nvme      the NVMe tier against fio on the same file system; end to
//	          end, a node's prompt hits from NVMe through the Go client
//	prefill   TTFT against the cached fraction of a prompt; engine GFLOP/s
//	          against gonum's Sgemm
//	trace     a Mooncake trace on kvmesh nodes and on the simulation
//	peers     the peers and limits alone (not in `all`)
//	soak      a bounded mixed load (lookups, gets with every byte checked,
//	          puts, prefills) on nodes with small tiers, sampling each node's
//	          RSS and goroutines over time; it fails on any error but a
//	          miss, on wrong bytes, or on RSS past the DRAM tier plus a fixed
//	          overhead (not in `all`)
//	speculate speculative decoding in the engine: each proposer's decode
//	          tokens/s and CPU time against plain decoding of the same
//	          prompts in the same run, and its acceptance (not in `all`)
//
// A Result holds tables whose rows are structs: their json tags name the
// columns of both the JSON (-o json) and the human table, so a figure is
// found under one name everywhere (gbps, ops_per_s, p50_ms, hit_ratio,
// ideal_hit_ratio, ratio_vs_raw_tcp, ratio_vs_redis, ratio_vs_fio, ...).
// Ratios against a peer that did not run are nil, left out of the JSON and
// shown as "-"; a column nil in every row is dropped. A missing peer (no
// redis-server, no fio, no direct I/O) or a missing capability of the build
// (nodes that cannot join a cluster, a client without a shared-memory path)
// is a Skip in the result, never a failure. Checks compare figures with
// DESIGN.md's targets and name the backend that produced them. Plots are
// PNG files (gonum.org/v1/plot) in Env.OutDir.
//
// # Nodes
//
// Suites that need kvmesh nodes start them as separate `kvmesh serve`
// processes (StartDaemons: Env.Binary, every address on port 0 of
// 127.0.0.1 and read back from the node's --ready-file, a data
// directory each under Env.WorkDir, joined into a cluster when asked) and
// drive them through the Go client, as an inference worker would; or they
// use the running cluster of Env.Addrs (`--addr`). Daemons.Close stops the
// processes (SIGTERM, then SIGKILL) and removes their directories; a
// process outlives the bench only if the bench is killed, and then the
// kernel stops it (Pdeathsig on Linux).
//
// # Peers and limits
//
// Memcpy, RawTCP, StartRedis with KVLoad (or MeasureRedis) and Fio each
// return figures measured now, on this machine, so that a kvmesh suite runs
// them in the same invocation and reports ratios rather than absolute
// numbers from elsewhere. KVLoad drives any KVTarget: the store suite runs
// the same loop against kvmesh (NodeKV) and against Redis.
//
// # Trace replay
//
// ParseTrace reads Mooncake-format traces; Trace.Ideal computes the best
// hit ratio any cache can reach on them; NewWorkload gives every hash id
// deterministic tokens (HashIDTokens) and keys every request with
// prefixhash, so shared prefixes stay shared in every process. Replay
// drives Nodes (the Node interface: LongestPrefix and Put of a Prompt) with
// a routing policy (random, round-robin, session-affinity, least-loaded)
// and reports hit ratios, cached tokens, latencies and load balance.
// KvmeshCluster runs the replay on kvmesh nodes; Sim is an in-process model
// of a cluster behind the same interface, for tests and for capacity
// sweeps; its figures carry backend "simulation" and are never reported as
// kvmesh measurements.
//
// # Concurrency
//
// Suites run one at a time. Every goroutine a function starts (TCP
// streams, load workers, replay requests, the Redis and node process
// waiters) is waited for before it returns, or by Close for Redis and
// Daemons. Progress bars and Latency are safe for concurrent use; a
// Workload is immutable after NewWorkload; a Sim is safe for concurrent
// use.
package bench
