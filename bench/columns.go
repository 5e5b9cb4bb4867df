package bench

import "strings"

// What each table column means, printed once per report under the first
// table that shows it (WriteTable). A name means the same in every table
// that has it; TestColumnsExplained holds every column to an entry.
var columnHelp = map[string]string{
	// What a row is.
	"target":         "what was measured: kvmesh-tcp (the Go client over the node's TCP data plane), kvmesh-shm (over shared memory on the node's host), redis (the bench's own Redis client), redis-benchmark (Redis's own tool)",
	"op":             "get: each value copied into the caller's buffer; view: read in place in the node's shared memory, copied nowhere (kvmesh-shm only); set: a key never written before; put/get in ranks: Put/Get of a Rank's part",
	"path":           "the way the bytes or requests went (the table's title lists them)",
	"ucx_tls":        "the UCX transports the UCX rows ran over (UCX_TLS): tcp, or sm (shared memory); RDMA never ran here",
	"pattern":        "the I/O pattern measured",
	"backend":        "kvmesh (nodes started by the bench) or the in-process model of the same policy",
	"engine_backend": "the prefill engine's backend: cpu or cuda",
	"policy":         "the routing or eviction policy",
	"routing":        "how requests were spread over the nodes",
	"eviction":       "the nodes' eviction policy",
	"local_only":     "yes: each node keeps its own blocks and never asks the others",
	"case":           "the situation measured (the table's title says which)",
	"job":            "fio's job",
	"rw":             "fio's read/write pattern",
	"writers":        "who put the blocks: one_copy (one client, the reference), put_rank (every rank its own part), put_whole_each (every rank the whole blocks)",
	"node":           "the node the sample is from",

	// Sizes and counts.
	"value_bytes":              "bytes of each value (a block's payload)",
	"block_bytes":              "bytes of each block or I/O",
	"write_bytes":              "bytes of each write",
	"working_set_bytes":        "bytes copied round-robin: larger than the CPU caches, so from DRAM",
	"bytes":                    "bytes moved in all",
	"blocks":                   "blocks each run moves, or the trace's blocks",
	"block_tokens":             "tokens per block",
	"prompt_tokens":            "tokens in the prompt(s)",
	"prompt_blocks":            "full blocks in the prompt",
	"cached_tokens":            "tokens found cached",
	"cached_fraction":          "share of the prompt computed elsewhere before, hence cached",
	"concurrency":              "connections (or workers), each with one request in flight",
	"conns":                    "connections",
	"jobs":                     "concurrent jobs, each with one I/O in flight",
	"numjobs":                  "fio's concurrent jobs",
	"ioengine":                 "fio's I/O engine",
	"iodepth":                  "fio's I/Os in flight per job",
	"nodes":                    "kvmesh nodes",
	"ranks":                    "tensor-parallel ranks, one client each",
	"runs":                     "runs the row's medians are of",
	"requests":                 "requests made",
	"ops":                      "operations completed",
	"errors":                   "operations that failed (shown when any did)",
	"first_error":              "the first failure's error",
	"lookup_errors":            "lookups that failed",
	"put_errors":               "puts that failed",
	"queued_requests":          "requests in the queue's backlog",
	"sync_requests":            "synchronous requests measured",
	"queued_failed":            "queued requests that failed",
	"keys":                     "keys in the chain",
	"received_bytes":           "bytes the node received for the puts, headers included",
	"stored_blocks":            "blocks the node holds afterwards",
	"ranks_read_whole":         "ranks whose Get of their Rank returned every block whole",
	"bytes_verified":           "payload bytes compared with what was put",
	"sgemm_n":                  "the square matrices' size",
	"gflop":                    "10^9 floating-point operations the prefill did",
	"cold_gflop":               "10^9 floating-point operations of a cold prefill",
	"hit_blocks":               "blocks that hit",
	"full_blocks":              "the trace's full blocks (no partial tail)",
	"full_hit_blocks":          "full blocks that hit",
	"distinct_full_blocks":     "distinct full blocks in the trace",
	"capacity_blocks_per_node": "blocks each node may cache",
	"pooled_capacity_fraction": "the nodes' capacity together over the trace's distinct blocks",
	"prefills":                 "prefills run",
	"engine":                   "the engine measured on the model: kvmesh (the bundled CPU engine) or pytorch (Debian's python3-torch, the reference)",
	"threads":                  "CPU threads the engine used",
	"decode_tokens":            "tokens decoded after the prompt",
	"prefill_tok_s":            "prompt tokens prefilled per second (median of the runs)",
	"prefill_tok_s_min":        "the slowest run's prefill tokens per second",
	"prefill_tok_s_max":        "the fastest run's prefill tokens per second",
	"decode_tok_s":             "tokens decoded per second (median of the runs)",
	"decode_tok_s_min":         "the slowest run's decode tokens per second",
	"decode_tok_s_max":         "the fastest run's decode tokens per second",
	"prefill_vs_pytorch":       "prefill tokens per second over PyTorch's in the same run (>1: kvmesh faster)",
	"decode_vs_pytorch":        "decode tokens per second over PyTorch's in the same run (>1: kvmesh faster)",
	"get_misses":               "gets of blocks not found",
	"wrong_bytes":              "gets whose bytes differed from what was put",
	"goroutines":               "the node's goroutines",
	"goroutines_start":         "the node's goroutines after the warm-up",
	"goroutines_end":           "the node's goroutines at the end",
	"goroutines_max":           "the most goroutines a node had",
	"rss_bytes":                "the node's resident memory",
	"max_rss_bytes":            "the most resident memory a node had",
	"rss_limit_bytes":          "the resident memory allowed: DRAM tier and overhead",
	"rss_within_limit":         "yes: no node went past rss_limit_bytes",

	// Speeds.
	"whole_gbps":         "one client moving whole blocks, in 10^9 bytes a second",
	"ranks_gbps":         "the ranks together, from the first one's start to the last one's end, in 10^9 bytes a second",
	"hashing_gbps":       "token bytes turned into block keys, in 10^9 bytes a second",
	"sha256_gbps":        "one plain SHA-256 pass over the same bytes, in 10^9 bytes a second",
	"sgemm_gflops":       "gonum's (or cuBLAS's) Sgemm alone, in 10^9 floating-point operations a second",
	"gbps":               "10^9 bytes of values a second",
	"ops_per_s":          "operations a second",
	"iops":               "I/Os a second",
	"lookups_per_s":      "lookups a second, all clients together",
	"tokens_per_s":       "tokens generated a second, all sessions together",
	"drain_req_per_s":    "queued requests completed a second",
	"engine_gflops":      "10^9 floating-point operations a second in the engine's compute",
	"engine_gflops_cold": "the engine's cold prefill, in 10^9 floating-point operations a second",
	"direct_io":          "yes: O_DIRECT, past the page cache",

	// Times.
	"p50_ms":              "median latency, in milliseconds",
	"p99_ms":              "99th percentile latency, in milliseconds",
	"ttft_p50_ms":         "median time to first token, in milliseconds",
	"ttft_p99_ms":         "99th percentile time to first token, in milliseconds",
	"sync_ttft_p50_ms":    "median time to first token of the synchronous requests, in milliseconds",
	"sync_ttft_p99_ms":    "99th percentile time to first token of the synchronous requests, in milliseconds",
	"seconds":             "how long the measurement ran",
	"duration_s":          "how long the load ran, in seconds",
	"elapsed_s":           "seconds since the load started",
	"wall_s":              "seconds from the first request to the last answer",
	"drain_s":             "seconds until the backlog was done",
	"put_s":               "seconds the puts took",
	"ttft_ms":             "median time to first token, in milliseconds",
	"keys_ms":             "milliseconds to compute the prompt's whole chain of keys",
	"fetch_ms":            "milliseconds loading the cached blocks",
	"compute_ms":          "milliseconds computing the rest of the prompt",
	"prefill_node_p50_ms": "median milliseconds the prefill node took",
	"clat_p50_ms":         "fio's median completion latency, in milliseconds",
	"clat_p99_ms":         "fio's 99th percentile completion latency, in milliseconds",

	// Ratios and shares.
	"path_share":                  "share of the bytes that went over the row's transport (a client that fell back to another shows less)",
	"ratio_vs_fio":                "kvmesh_gbps over fio_gbps, adjacent runs paired, median",
	"ratio_vs_whole":              "ranks_gbps over whole_gbps, run by run, median",
	"ratio_min":                   "the least of the runs' ratios",
	"ratio_max":                   "the greatest of the runs' ratios",
	"ratio_vs_one_copy":           "received_bytes over the one_copy row's",
	"ratio_vs_mooncake_te_tcp":    "gbps over the Mooncake Transfer Engine's TCP figure recorded on this kind of machine (not measured in this run)",
	"ratio_vs_plain":              "what TLS leaves: the TLS row's gbps over the same path's without TLS",
	"ratio_vs_ideal":              "hit ratio over the trace's ideal",
	"ratio_vs_sha256":             "hashing_gbps over one plain SHA-256 pass over the same bytes",
	"ttft_vs_cold":                "TTFT over the cold prefill's (below 1: faster)",
	"cpu_vs_cold":                 "CPU time over the cold prefill's",
	"flop_floor":                  "the arithmetic over the cold prefill's: the least ttft_vs_cold any engine can reach",
	"engine_vs_sgemm":             "engine_gflops_cold over sgemm_gflops",
	"cached_vs_ideal":             "cached_tokens over ideal_cached_tokens",
	"policy_over_lru":             "policy_ratio_vs_ideal over lru_ratio_vs_ideal",
	"simulation_optimum_over_lru": "the offline optimum's hit ratio over LRU's, in the simulation",
	"requests_max_over_mean":      "the busiest node's requests over the mean (1: even)",
	"tokens_max_over_mean":        "the busiest node's prompt tokens over the mean (1: even)",
	"hit_ratio":                   "blocks that hit over blocks asked for",
	"block_hit_ratio":             "blocks that hit over blocks asked for, in the interval",
	"full_block_hit_ratio":        "the hit ratio over full blocks only",
	"ideal_hit_ratio":             "the hit ratio if every block seen before hit",
	"ideal_full_block_hit_ratio":  "ideal_hit_ratio over full blocks only",
	"ideal_cached_tokens":         "tokens that would be cached if every earlier prefix were",
}

// columnPatterns explain the columns named by a pattern: the suffix or
// prefix, and the explanation with %s for the rest of the name.
var columnPatterns = []struct{ prefix, suffix, text string }{
	{"ratio_vs_", "", "this row's figure over %s's, measured in the same run (above 1: faster)"},
	{"", "_gbps", "%s, in 10^9 bytes a second"},
	{"", "_p50_ms", "median %s latency, in milliseconds"},
	{"", "_p99_ms", "99th percentile %s latency, in milliseconds"},
	{"", "_ratio_vs_ideal", "%s's hit ratio over the trace's ideal"},
}

// ColumnHelp says what the table column name means.
func ColumnHelp(name string) string {
	if h, ok := columnHelp[name]; ok {
		return h
	}
	for _, p := range columnPatterns {
		if rest, ok := strings.CutPrefix(name, p.prefix); ok && strings.HasSuffix(rest, p.suffix) && len(rest) > len(p.suffix) {
			rest = strings.TrimSuffix(rest, p.suffix)
			return strings.Replace(p.text, "%s", strings.ReplaceAll(rest, "_", " "), 1)
		}
	}
	return ""
}
