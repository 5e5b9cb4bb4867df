// Package bench holds kvmesh's benchmark suites: workloads, trace replay,
// side-by-side peers (Redis, a raw TCP stream, memcpy, fio), reports and
// plots. The `kvmesh bench` command parses flags and calls Select, Run and
// Write; everything else lives here.
//
// # Suites and reports
//
// A Suite has a name, its own Options (with documented defaults for a full
// run and for --quick) and Run(ctx, env) → *Result. A Result holds tables
// whose rows are structs: their json tags name the columns of both the JSON
// (-o json) and the human table, so a figure is found under one name
// everywhere (gbps, ops_per_s, p50_ms, hit_ratio, ideal_hit_ratio,
// ratio_vs_raw_tcp, ratio_vs_redis, ...). Ratios against a peer that did not
// run are nil, left out of the JSON and shown as "-"; a column nil in every
// row is dropped. A missing peer (no redis-server, no fio, no direct I/O)
// is a Skip in the result, never a failure. Checks compare figures with
// DESIGN.md's targets and name the backend that produced them. Plots are
// PNG files (gonum.org/v1/plot) in Env.OutDir.
//
// # Peers and limits
//
// Memcpy, RawTCP, StartRedis with KVLoad (or MeasureRedis) and Fio each
// return figures measured now, on this machine, so that a kvmesh suite runs
// them in the same invocation and reports ratios rather than absolute
// numbers from elsewhere. KVLoad drives any KVTarget: the store suite runs
// the same loop against kvmesh and against Redis.
//
// # Trace replay
//
// ParseTrace reads Mooncake-format traces; Trace.Ideal computes the best
// hit ratio any cache can reach on them; NewWorkload gives every hash id
// deterministic tokens (HashIDTokens) and keys every request with
// prefixhash, so shared prefixes stay shared in every process. Replay
// drives Nodes (the Node interface: LongestPrefix and Put) with a routing
// policy (random, round-robin, session-affinity, least-loaded) and reports
// hit ratios, cached tokens, latencies and load balance. Sim is an
// in-process model of a cluster behind the same interface, for tests and
// for capacity sweeps before real nodes exist; its figures carry backend
// "simulation" and are never reported as kvmesh measurements. A kvmesh
// cluster plugs in through TraceOptions.Cluster (a ClusterFactory).
//
// # Concurrency
//
// Suites run one at a time. Every goroutine a function starts (TCP
// streams, load workers, replay requests, the Redis process waiter) is
// waited for before it returns, or by Close for Redis. Progress bars and
// Latency are safe for concurrent use; a Workload is immutable after
// NewWorkload; a Sim is safe for concurrent use.
package bench
