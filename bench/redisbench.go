package bench

import (
	"bytes"
	"context"
	"encoding/csv"
	"fmt"
	"math"
	"os/exec"
	"strconv"
	"strings"
)

// Redis's own load generator, redis-benchmark, run beside the bench's RESP
// client so that the Redis figure kvmesh is compared with is not one the
// bench's client slowed down: the store suite reports both and takes the
// faster as the peer.

// RedisBenchmarkTarget names redis-benchmark's rows.
const RedisBenchmarkTarget = "redis-benchmark"

// redisBenchmarkSpace is the key space of a SET phase: redis-benchmark
// draws each key at random in it (its -r), which is large enough that the
// keys are new ones (a few collisions in a billion) and far above any fill.
const redisBenchmarkSpace = 1 << 30

// peerSpread is how far the two Redis clients may differ before a cell is
// flagged: past it, one of them bounds the figure, not the server.
const peerSpread = 0.15

// RedisBenchmarkLoad is one redis-benchmark run.
type RedisBenchmarkLoad struct {
	// Op is "get" (random keys of the fill, keys 0..Keys-1 under the key
	// names the bench's client writes) or "set" (new keys).
	Op          string
	ValueBytes  int
	Concurrency int
	// Keys is the size of the fill a GET reads from.
	Keys int
	// Requests is how many requests the run makes, spread over the clients.
	Requests int
}

// RunRedisBenchmark runs redis-benchmark against the server's unix socket.
// Without the binary (Debian's redis-tools) the error wraps ErrMissing.
func RunRedisBenchmark(ctx context.Context, socket string, l RedisBenchmarkLoad) (KVResult, error) {
	bin, err := exec.LookPath("redis-benchmark")
	if err != nil {
		return KVResult{}, fmt.Errorf("%w: redis-benchmark not found (install Debian's redis-tools): %w", ErrMissing, err)
	}
	if l.Requests < 1 || l.Concurrency < 1 || l.ValueBytes < 1 {
		return KVResult{}, fmt.Errorf("bench: redis-benchmark: requests %d, clients %d and value bytes %d must be positive", l.Requests, l.Concurrency, l.ValueBytes)
	}
	space := redisBenchmarkSpace
	switch l.Op {
	case "get":
		if l.Keys < 1 {
			return KVResult{}, fmt.Errorf("bench: redis-benchmark: a GET needs a fill, got %d keys", l.Keys)
		}
		space = l.Keys
	case "set":
	default:
		return KVResult{}, fmt.Errorf("bench: redis-benchmark: op %q is neither get nor set", l.Op)
	}
	args := []string{"-s", socket, "-t", l.Op, "-d", strconv.Itoa(l.ValueBytes), "-c", strconv.Itoa(l.Concurrency),
		"-n", strconv.Itoa(l.Requests), "-r", strconv.Itoa(space), "--csv"}
	var out, errOut bytes.Buffer
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Stdout, cmd.Stderr = &out, &errOut
	if err := cmd.Run(); err != nil {
		return KVResult{}, fmt.Errorf("bench: redis-benchmark %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(errOut.String()))
	}
	rps, p50, p99, err := parseRedisBenchmarkCSV(out.Bytes(), l.Op)
	if err != nil {
		return KVResult{}, err
	}
	return KVResult{Target: RedisBenchmarkTarget, Op: l.Op, ValueBytes: l.ValueBytes, Concurrency: l.Concurrency,
		Ops: int64(l.Requests), OpsPerS: rps, GBps: rps * float64(l.ValueBytes) / 1e9, P50MS: p50, P99MS: p99}, nil
}

// parseRedisBenchmarkCSV reads the row of op (its test name, upper case)
// from redis-benchmark's --csv output: requests per second and the p50
// and p99 latencies in milliseconds.
func parseRedisBenchmarkCSV(out []byte, op string) (rps, p50, p99 float64, err error) {
	recs, err := csv.NewReader(bytes.NewReader(out)).ReadAll()
	if err != nil {
		return 0, 0, 0, fmt.Errorf("bench: redis-benchmark: output is not CSV: %w", err)
	}
	if len(recs) < 2 {
		return 0, 0, 0, fmt.Errorf("bench: redis-benchmark: no result row in %q", out)
	}
	col := map[string]int{}
	for i, h := range recs[0] {
		col[h] = i
	}
	field := func(rec []string, name string) (float64, error) {
		i, ok := col[name]
		if !ok || i >= len(rec) {
			return 0, fmt.Errorf("bench: redis-benchmark: no %q column in %q", name, recs[0])
		}
		v, err := strconv.ParseFloat(rec[i], 64)
		if err != nil || v < 0 || math.IsInf(v, 0) {
			return 0, fmt.Errorf("bench: redis-benchmark: %s %q is not a figure", name, rec[i])
		}
		return v, nil
	}
	for _, rec := range recs[1:] {
		if len(rec) == 0 || !strings.EqualFold(rec[0], op) {
			continue
		}
		if rps, err = field(rec, "rps"); err != nil {
			return 0, 0, 0, err
		}
		if p50, err = field(rec, "p50_latency_ms"); err != nil {
			return 0, 0, 0, err
		}
		if p99, err = field(rec, "p99_latency_ms"); err != nil {
			return 0, 0, 0, err
		}
		if rps <= 0 {
			return 0, 0, 0, fmt.Errorf("bench: redis-benchmark: %s at %v requests per second", op, rps)
		}
		return rps, p50, p99, nil
	}
	return 0, 0, 0, fmt.Errorf("bench: redis-benchmark: no %s row in %q", op, out)
}

// redisBenchmarkLoads returns the GET and SET runs that mirror a KVLoad
// whose own client measured get and set: about the same duration at the
// client's rate, at least 200 requests, SETs within o.MaxSetBytes.
func redisBenchmarkLoads(o KVLoadOptions, get, set KVResult) (g, s RedisBenchmarkLoad) {
	o.EnsureDefaults()
	n := func(r KVResult) int {
		v := int64(r.OpsPerS * o.Duration.Seconds())
		return int(min(max(v, 200), o.MaxOps))
	}
	g = RedisBenchmarkLoad{Op: "get", ValueBytes: o.ValueBytes, Concurrency: o.Concurrency, Keys: o.Keys, Requests: n(get)}
	s = RedisBenchmarkLoad{Op: "set", ValueBytes: o.ValueBytes, Concurrency: o.Concurrency, Keys: o.Keys,
		Requests: int(min(int64(n(set)), max(1, o.MaxSetBytes/int64(o.ValueBytes))))}
	return g, s
}

// redisPeer returns the Redis figure kvmesh's row r is compared with: the
// faster of the bench's RESP client and redis-benchmark at the same op,
// size and concurrency.
func redisPeer(rows []KVResult, r KVResult) (KVResult, bool) {
	a, okA := findKVTarget(rows, "redis", r.Op, r.ValueBytes, r.Concurrency)
	b, okB := findKVTarget(rows, RedisBenchmarkTarget, r.Op, r.ValueBytes, r.Concurrency)
	switch {
	case okA && okB && b.GBps > a.GBps:
		return b, true
	case okA:
		return a, true
	default:
		return b, okB
	}
}

// redisClientsDisagree returns, for each cell where the bench's client and
// redis-benchmark differ by more than peerSpread, a line naming it.
func redisClientsDisagree(rows []KVResult) []string {
	var out []string
	for _, a := range rows {
		if a.Target != "redis" {
			continue
		}
		b, ok := findKVTarget(rows, RedisBenchmarkTarget, a.Op, a.ValueBytes, a.Concurrency)
		if !ok || a.GBps <= 0 || b.GBps <= 0 {
			continue
		}
		if r := a.GBps / b.GBps; r > 1+peerSpread || r < 1/(1+peerSpread) {
			out = append(out, fmt.Sprintf("%s %s × %d: the bench's Redis client %.3f GB/s, redis-benchmark %.3f GB/s (%.2f×)",
				strings.ToUpper(a.Op), formatBytes(float64(a.ValueBytes)), a.Concurrency, a.GBps, b.GBps, r))
		}
	}
	return out
}
