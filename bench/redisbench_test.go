package bench

import (
	"context"
	"errors"
	"os/exec"
	"strings"
	"testing"
	"time"
)

func TestParseRedisBenchmarkCSV(t *testing.T) {
	out := []byte(`"test","rps","avg_latency_ms","min_latency_ms","p50_latency_ms","p95_latency_ms","p99_latency_ms","max_latency_ms"
"SET","7241.13","0.537","0.048","0.191","2.591","5.447","132.223"
`)
	rps, p50, p99, err := parseRedisBenchmarkCSV(out, "set")
	if err != nil || rps != 7241.13 || p50 != 0.191 || p99 != 5.447 {
		t.Fatalf("got %v %v %v %v", rps, p50, p99, err)
	}
	for name, bad := range map[string]string{
		"other op":   `"test","rps","p50_latency_ms","p99_latency_ms"` + "\n" + `"GET","1","2","3"`,
		"no header":  `"SET","1","2","3"`,
		"no column":  `"test","rps","p50_latency_ms"` + "\n" + `"SET","1","2"`,
		"not figure": `"test","rps","p50_latency_ms","p99_latency_ms"` + "\n" + `"SET","x","2","3"`,
		"zero rate":  `"test","rps","p50_latency_ms","p99_latency_ms"` + "\n" + `"SET","0","2","3"`,
		"not csv":    `"SET,1`,
	} {
		if _, _, _, err := parseRedisBenchmarkCSV([]byte(bad), "set"); err == nil {
			t.Errorf("%s: parsed %q", name, bad)
		}
	}
}

func TestRedisKeyNames(t *testing.T) {
	var c redisConn
	for k, want := range map[int]string{0: "key:000000000000", 42: "key:000000000042", 123456789012: "key:123456789012", 1234567890123: "key:1234567890123"} {
		if got := c.keyName(k); got != want {
			t.Errorf("key %d: %q, want %q", k, got, want)
		}
	}
}

func TestRedisPeerIsTheFaster(t *testing.T) {
	mine := KVResult{Target: "kvmesh-tcp", Op: "set", ValueBytes: 64 << 10, Concurrency: 4, GBps: 1}
	client := KVResult{Target: "redis", Op: "set", ValueBytes: 64 << 10, Concurrency: 4, GBps: 0.25}
	tool := KVResult{Target: RedisBenchmarkTarget, Op: "set", ValueBytes: 64 << 10, Concurrency: 4, GBps: 0.5}
	rows := []KVResult{mine, client, tool}
	storeRatios(rows, nil)
	if r := rows[0].RatioVsRedis; r == nil || *r != 2 {
		t.Fatalf("ratio vs redis %v, want 2 (against redis-benchmark, the faster)", r)
	}
	if d := redisClientsDisagree(rows); len(d) != 1 || !strings.Contains(d[0], "SET 64KiB × 4") {
		t.Errorf("flags %q", d)
	}
	rows[2].GBps = 0.27 // within 15%
	if d := redisClientsDisagree(rows); len(d) != 0 {
		t.Errorf("flags %q within the spread", d)
	}
	// Only the bench's client: it is the peer.
	rows = []KVResult{mine, client}
	storeRatios(rows, nil)
	if r := rows[0].RatioVsRedis; r == nil || *r != 4 {
		t.Fatalf("ratio vs redis %v, want 4", r)
	}
}

func TestRunRedisBenchmark(t *testing.T) {
	if _, err := exec.LookPath("redis-benchmark"); err != nil {
		if _, err := RunRedisBenchmark(context.Background(), "/nonexistent", RedisBenchmarkLoad{Op: "get", ValueBytes: 8, Concurrency: 1, Keys: 1, Requests: 1}); !errors.Is(err, ErrMissing) {
			t.Fatalf("without redis-benchmark: %v, want ErrMissing", err)
		}
		t.Skip("redis-benchmark is not installed")
	}
	ctx := context.Background()
	r, err := StartRedis(ctx, RedisOptions{Dir: t.TempDir()})
	if errors.Is(err, ErrMissing) {
		t.Skip(err)
	}
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	load := KVLoadOptions{ValueBytes: 4 << 10, Concurrency: 2, Keys: 16, Duration: 50 * time.Millisecond, MaxSetBytes: 1 << 20}
	set, get, err := KVLoad(ctx, r.Target(), load)
	if err != nil {
		t.Fatal(err)
	}
	gl, sl := redisBenchmarkLoads(load, get, set)
	if sl.Requests > 256 || gl.Requests < 200 {
		t.Fatalf("loads %+v %+v: SETs past MaxSetBytes or too few GETs", gl, sl)
	}
	rows, err := redisBenchmarkRows(ctx, r.Socket(), load, get, set)
	if err != nil {
		t.Fatal(err)
	}
	for _, row := range rows {
		if row.Target != RedisBenchmarkTarget || row.OpsPerS <= 0 || row.GBps <= 0 || row.P50MS < 0 {
			t.Errorf("row %+v", row)
		}
	}
	// redis-benchmark's GETs hit the fill: every key it can draw holds a
	// value of the load's size (a miss would be a fast nil reply).
	c, err := r.Target().Dial(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	for k := range load.Keys {
		if v, err := c.Get(ctx, k, nil); err != nil || len(v) != load.ValueBytes {
			t.Fatalf("key %d: %d bytes, %v", k, len(v), err)
		}
	}
	if _, err := RunRedisBenchmark(ctx, r.Socket(), RedisBenchmarkLoad{Op: "del", ValueBytes: 8, Concurrency: 1, Requests: 1}); err == nil {
		t.Error("op del accepted")
	}
	if _, err := RunRedisBenchmark(ctx, r.Socket(), RedisBenchmarkLoad{Op: "get", ValueBytes: 8, Concurrency: 1, Requests: 1}); err == nil {
		t.Error("GET without a fill accepted")
	}
}
