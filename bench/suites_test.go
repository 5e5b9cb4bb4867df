package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/gpu/gputest"
	"github.com/kvmesh/kvmesh/node"
	"github.com/kvmesh/kvmesh/prefill"
	"github.com/kvmesh/kvmesh/prefixhash"
)

// The kvmesh suites, run small. Suites that need a node get one served in
// this process (node.Open over the real tiers) through Env.Addrs, the path
// `--addr` takes; starting `kvmesh serve` processes is tested by
// cmd/kvmesh, which has the binary.

// inProcessNode serves a node on loopback ports until the test ends and
// returns its gRPC address.
func inProcessNode(t *testing.T) string {
	t.Helper()
	n, err := node.Open(node.Options{
		NodeID:  "bench-test",
		DataDir: t.TempDir(),
		Listen:  node.ListenOptions{GRPCAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0", DataAddr: "127.0.0.1:0"},
		Cluster: node.ClusterOptions{GossipAddr: "127.0.0.1:0"},
		Tiers:   node.TierOptions{DRAMBytes: 256 << 20, NVMeBytes: 64 << 20},
		Logger:  slog.New(slog.DiscardHandler),
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- n.Serve(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("node: %v", err)
		}
	})
	return n.GRPCAddr()
}

// runSuite runs s and fails the test on an error; the result must carry
// the suite's tables by name.
func runSuite(t *testing.T, s Suite, env *Env, tables ...string) *Result {
	t.Helper()
	if env.WorkDir == "" {
		env.WorkDir = t.TempDir()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	res, err := s.Run(ctx, env)
	if err != nil {
		t.Fatalf("%s: %v", s.Name(), err)
	}
	var names []string
	for _, tb := range res.Tables {
		names = append(names, tb.Name)
	}
	if strings.Join(names, ",") != strings.Join(tables, ",") {
		t.Fatalf("%s: tables %v, want %v", s.Name(), names, tables)
	}
	// Every table serializes under its JSON names.
	if _, err := json.Marshal(res); err != nil {
		t.Fatal(err)
	}
	return res
}

func table[T any](t *testing.T, res *Result, name string) []T {
	t.Helper()
	for _, tb := range res.Tables {
		if tb.Name == name {
			return tb.Rows.([]T)
		}
	}
	t.Fatalf("no table %q", name)
	return nil
}

func check(t *testing.T, res *Result, figure string) Check {
	t.Helper()
	for _, c := range res.Checks {
		if c.Figure == figure {
			return c
		}
	}
	t.Fatalf("no check of %q in %+v", figure, res.Checks)
	return Check{}
}

func TestTransferSuite(t *testing.T) {
	env := &Env{OutDir: t.TempDir()}
	s := &TransferSuite{Options: TransferOptions{BlockSizes: []int{64 << 10, 1 << 20}, Conns: []int{1, 2}, Batches: 2,
		BatchBytes: 2 << 20, SourceBytes: 4 << 20}}
	res := runSuite(t, s, env, "transfer")
	rows := table[transferRow](t, res, "transfer")
	paths := map[int][]string{}
	for _, r := range rows {
		paths[r.BlockBytes] = append(paths[r.BlockBytes], r.Path)
		if r.GBps <= 0 {
			t.Errorf("row %+v", r)
		}
	}
	// TLS runs at 1 MiB only (the default TLS sizes, 1 and 4 MiB, that
	// this run measures).
	if got := strings.Join(paths[64<<10], ","); got != "raw-tcp,kvmesh-tcp,kvmesh-tcp,kvmesh-shm,memcpy" {
		t.Fatalf("paths at 64 KiB %v", got)
	}
	if got := strings.Join(paths[1<<20], ","); got != "raw-tcp,kvmesh-tcp,kvmesh-tcp,kvmesh-shm,memcpy,raw-tls,kvmesh-tls" {
		t.Fatalf("paths at 1 MiB %v", got)
	}
	for _, r := range rows {
		switch {
		case r.Path == "kvmesh-tcp" && r.RatioVsRawTCP == nil,
			r.Path == "kvmesh-shm" && r.RatioVsMemcpy == nil,
			r.Path == "kvmesh-tcp" && (r.BlockBytes == 1<<20) != (r.RatioVsMooncakeTETCP != nil),
			r.Path == "kvmesh-tls" && (r.RatioVsPlain == nil || r.RatioVsRawTLS == nil || *r.RatioVsPlain <= 0),
			r.Path == "raw-tls" && r.RatioVsPlain == nil:
			t.Errorf("ratios of %+v", r)
		}
	}
	if !slices.ContainsFunc(res.Notes, func(n string) bool { return strings.HasPrefix(n, "TLS at 1MiB") }) {
		t.Errorf("no note on TLS's cost: %q", res.Notes)
	}
	if c := check(t, res, "ratio_vs_raw_tcp"); c.Target != 0.85 || c.Backend != BackendKvmesh {
		t.Errorf("check %+v", c)
	}
	check(t, res, "ratio_vs_mooncake_te_tcp")
	checkPNG(t, res.Plots, 1)
}

func TestNVMeSuite(t *testing.T) {
	s := &NVMeSuite{Options: NVMeOptions{DataBytes: 16 << 20, ReadTime: 50 * time.Millisecond, Rounds: 1, Readers: 2}}
	res := runSuite(t, s, &Env{Progress: barsRun(t)}, "nvme")
	rows := table[nvmeRow](t, res, "nvme")
	// No binary to start a node with: the end-to-end row is skipped
	// (TestNVMeEndToEnd runs its load against an in-process node).
	if len(rows) != 2 || rows[0].BlockBytes != 1<<20 || rows[1].BlockBytes != 256<<10 || rows[1].Jobs != 2 {
		t.Fatalf("rows %+v", rows)
	}
	for _, r := range rows {
		if r.KvmeshGBps <= 0 {
			t.Errorf("%s: %v GB/s", r.Pattern, r.KvmeshGBps)
		}
	}
	if _, err := exec.LookPath("fio"); err != nil || !rows[0].DirectIO {
		if len(res.Skipped) == 0 {
			t.Fatal("no fio (or no direct I/O) and nothing skipped")
		}
		return
	}
	for _, r := range rows {
		if r.RatioVsFio == nil || r.FioGBps <= 0 {
			t.Errorf("%s: no ratio to fio: %+v (skipped %v)", r.Pattern, r, res.Skipped)
		}
	}
	check(t, res, "ratio_vs_fio")
}

func TestPrefillSuite(t *testing.T) {
	env := &Env{OutDir: t.TempDir()}
	cfg := prefill.Config{Layers: 1, Dim: 64, Heads: 2, KVHeads: 1, HeadDim: 16, FFNDim: 128, BlockTokens: 16, MaxContext: 1024}
	s := &PrefillSuite{Options: PrefillOptions{PromptTokens: 256, Runs: 2, SgemmSize: 64, Config: cfg}}
	res := runSuite(t, s, env, "prefill", "sgemm")
	rows := table[prefillRow](t, res, "prefill")
	// Fractions round down to whole blocks of 16: 128 and 224 tokens.
	if len(rows) != 3 || rows[0].CachedTokens != 0 || rows[1].CachedTokens != 128 || rows[2].CachedTokens != 224 {
		t.Fatalf("rows %+v", rows)
	}
	if rows[0].TTFTVsCold != 1 || rows[2].TTFTMS <= 0 || rows[2].FLOPFloor >= rows[1].FLOPFloor || rows[2].Runs != 2 {
		t.Fatalf("rows %+v", rows)
	}
	if sg := table[sgemmRow](t, res, "sgemm"); sg[0].SgemmGFLOPS <= 0 {
		t.Fatalf("sgemm %+v", sg)
	}
	check(t, res, "ttft_vs_cold")
	checkPNG(t, res.Plots, 1)
}

// TestPrefillSuiteOnDevice: with a device (a fake GPU here; --backend cuda
// on a real one) the engines run on it in process, even with a binary to
// start nodes with, and the ceiling is the device's Sgemm; what was put on
// the device is freed.
func TestPrefillSuiteOnDevice(t *testing.T) {
	dev := gputest.New()
	env := &Env{OutDir: t.TempDir(), Binary: "/nonexistent/kvmesh"}
	cfg := prefill.Config{Layers: 2, Dim: 64, Heads: 2, KVHeads: 1, HeadDim: 16, FFNDim: 128, BlockTokens: 16, MaxContext: 1024}
	s := &PrefillSuite{Options: PrefillOptions{PromptTokens: 128, Runs: 1, SgemmSize: 64, SgemmRuns: 2, Config: cfg, Device: dev}}
	res := runSuite(t, s, env, "prefill", "sgemm")
	rows := table[prefillRow](t, res, "prefill")
	sg := table[sgemmRow](t, res, "sgemm")
	if len(rows) != 3 || rows[0].Backend != backendInProcess || sg[0].SgemmGFLOPS <= 0 {
		t.Fatalf("rows %+v, sgemm %+v", rows, sg)
	}
	for _, tb := range res.Tables {
		if want := map[string]string{"prefill": "gpu/blas on gputest", "sgemm": "cuBLAS"}[tb.Name]; !strings.Contains(tb.Title, want) {
			t.Errorf("table %s: title %q does not name %q", tb.Name, tb.Title, want)
		}
	}
	if dev.Products() == 0 {
		t.Fatal("nothing ran on the device")
	}
	if err := dev.Close(); err != nil {
		t.Fatalf("the suite left memory on the device: %v", err)
	}
}

func TestStoreSuite(t *testing.T) {
	env := &Env{OutDir: t.TempDir(), Addrs: []string{inProcessNode(t)}}
	s := &StoreSuite{Options: StoreOptions{BlockSizes: []int{64 << 10}, Concurrency: []int{2}, Duration: 100 * time.Millisecond,
		DataSetBytes: 1 << 20, MaxSetBytes: 1 << 20, NodeDRAMBytes: 64 << 20}}
	env.Progress = barsRun(t)
	res := runSuite(t, s, env, "limits", "store")
	rows := table[KVResult](t, res, "store")
	_, redisErr := exec.LookPath("redis-server")
	want := 5 // kvmesh-tcp GET and SET; kvmesh-shm GET, VIEW and SET
	if redisErr == nil {
		want = 7
		if _, err := exec.LookPath("redis-benchmark"); err == nil {
			want = 9
		}
	}
	if len(rows) != want {
		t.Fatalf("%d rows, want %d: %+v", len(rows), want, rows)
	}
	for _, r := range rows {
		if r.Ops < 1 || r.Errors != 0 || r.GBps <= 0 {
			t.Errorf("%s %s: %+v", r.Target, r.Op, r)
		}
		if r.Target == "redis" || r.Target == RedisBenchmarkTarget {
			continue
		}
		// A view copies nothing: no ratio to memcpy.
		if (redisErr == nil) != (r.RatioVsRedis != nil) || (r.Target == "kvmesh-tcp") != (r.RatioVsRawTCP != nil) ||
			(r.Target == "kvmesh-shm" && r.Op != "view") != (r.RatioVsMemcpy != nil) {
			t.Errorf("%s %s: ratios %+v", r.Target, r.Op, r)
		}
		if (r.Op == "view") != (r.Target == "kvmesh-shm" && r.Op != "get" && r.Op != "set") {
			t.Errorf("%s %s: only kvmesh-shm reads in place", r.Target, r.Op)
		}
		// The node's data plane carried the load over the row's transport.
		if r.PathShare == nil || *r.PathShare < 0.9 {
			t.Errorf("%s %s: path_share %v", r.Target, r.Op, r.PathShare)
		}
	}
	// SETs write new keys, at most MaxSetBytes of them.
	if set := rows[1]; set.Op != "set" || set.Ops > 16 {
		t.Errorf("set row %+v: more than 1 MiB of 64 KiB values", set)
	}
	if redisErr == nil {
		check(t, res, "min ratio_vs_redis")
	}
	checkPNG(t, res.Plots, 2)
}

// TestStoreSuiteWithoutRedis: with no redis-server, the store suite skips
// Redis, saying so, and its progress bar counts only what ran.
func TestStoreSuiteWithoutRedis(t *testing.T) {
	env := &Env{Addrs: []string{inProcessNode(t)}, Progress: barsRun(t)}
	s := &StoreSuite{Options: StoreOptions{BlockSizes: []int{64 << 10}, Concurrency: []int{1}, Duration: 50 * time.Millisecond,
		DataSetBytes: 256 << 10, MaxSetBytes: 256 << 10, NodeDRAMBytes: 64 << 20, Redis: RedisOptions{Binary: "/nonexistent/redis-server"}}}
	res := runSuite(t, s, env, "limits", "store")
	if len(res.Skipped) == 0 || res.Skipped[0].What != "redis" {
		t.Fatalf("skipped %+v; want redis", res.Skipped)
	}
}

// barsRun returns a Progress whose bars, when they finish, must have had
// their whole total added: a bar that counts a step that never ran stops
// short, as users saw when a peer was skipped.
func barsRun(t *testing.T) *Progress {
	return &Progress{finished: func(desc string, total, added int64) {
		if added != total {
			t.Errorf("progress bar %q: %d of %d steps added", desc, added, total)
		}
	}}
}

func TestLookupSuite(t *testing.T) {
	env := &Env{Addrs: []string{inProcessNode(t)}}
	s := &LookupSuite{Options: LookupOptions{PromptTokens: []int{64, 1024}, Lookups: 5, HashRuns: 1, Nodes: []int{1, 4}}}
	res := runSuite(t, s, env, "hashing", "lookup")
	rows := table[lookupRow](t, res, "lookup")
	if len(rows) != 4 { // --addr: that cluster only, whatever Nodes says; two paths per length
		t.Fatalf("rows %+v", rows)
	}
	for i, r := range rows {
		if r.Nodes != 1 || r.Path != []string{"chain", "tokens"}[i%2] || r.CachedTokens != r.PromptTokens || r.Errors != 0 || r.P50MS <= 0 || r.P99MS < r.P50MS {
			t.Errorf("row %+v", r)
		}
	}
	h := table[hashRow](t, res, "hashing")
	if len(h) != 2 || h[0].BlockTokens != 16 || h[1].BlockTokens != 512 || h[0].PromptTokens != 128<<10 || h[0].KeysMS <= 0 ||
		h[1].HashingGBps <= 0 || h[1].SHA256GBps <= 0 || h[1].RatioVsSHA256 <= 0 {
		t.Fatalf("hashing %+v", h)
	}
	check(t, res, "keys_ms")
}

func TestTraceSuiteOnKvmesh(t *testing.T) {
	env := &Env{OutDir: t.TempDir(), Addrs: []string{inProcessNode(t)}}
	s := &TraceSuite{Options: TraceOptions{TracePath: "testdata/small_trace.jsonl", Sweep: []float64{1}}}
	res := runSuite(t, s, env, "ideal", "replay", "simulation", "capacity_sweep")
	rows := table[ReplayStats](t, res, "replay")
	// Local-only needs separate nodes, which --addr cannot give, and the
	// eviction sweep nodes it starts: skipped.
	if len(rows) != 2 || len(res.Skipped) != 3 {
		t.Fatalf("%d rows, skipped %v", len(rows), res.Skipped)
	}
	for _, r := range rows {
		// One node holds everything: the hand-worked 6 hits of the small
		// trace, as the simulation finds.
		if r.Backend != BackendKvmesh || r.LocalOnly || r.HitBlocks != 6 || r.LookupErrors+r.PutErrors != 0 || r.Nodes != 1 {
			t.Errorf("row %+v", r)
		}
	}
	if c := check(t, res, "hit_ratio / ideal_hit_ratio"); c.Backend != BackendKvmesh {
		t.Errorf("check %+v", c)
	}
	if sim := table[ReplayStats](t, res, "simulation"); len(sim) != 8 || sim[0].Backend != BackendSimulation {
		t.Fatalf("simulation rows %+v", sim)
	}
}

func TestStartDaemonsFailsFast(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// A binary that exits at once: the error says so, long before the
	// start timeout.
	start := time.Now()
	_, err := StartDaemons(ctx, DaemonOptions{Binary: "false", Dir: t.TempDir(), Nodes: 2})
	if err == nil || !strings.Contains(err.Error(), "exited at start") || time.Since(start) > 20*time.Second {
		t.Fatalf("err = %v after %v", err, time.Since(start))
	}
	if _, err := StartDaemons(ctx, DaemonOptions{Dir: t.TempDir()}); !errors.Is(err, ErrNoBinary) {
		t.Fatalf("no binary: %v", err)
	}
	// A suite that needs nodes, with neither a binary nor --addr, says what
	// to do.
	_, err = (&StoreSuite{}).Run(ctx, &Env{WorkDir: t.TempDir(), Quick: true})
	if !errors.Is(err, ErrNoBinary) || !strings.Contains(err.Error(), "--addr") {
		t.Fatalf("store suite without nodes: %v", err)
	}
}

func TestTransferBytes(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprint(w, `# HELP kvmesh_transfer_bytes_total Value bytes the data plane sent (op=get) or received (op=put).
# TYPE kvmesh_transfer_bytes_total counter
kvmesh_transfer_bytes_total{op="get",transport="shm"} 1.5e+06
kvmesh_transfer_bytes_total{op="put",transport="shm"} 500000
kvmesh_transfer_bytes_total{op="get",transport="tcp"} 42
kvmesh_transfer_values_total{op="get",transport="tcp"} 7
`)
	}))
	defer srv.Close()
	got, err := transferBytes(context.Background(), strings.TrimPrefix(srv.URL, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got["shm"] != 2e6 || got["tcp"] != 42 {
		t.Fatalf("transferBytes = %v", got)
	}
}

func TestPidCPU(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("CPU time of other processes is read from /proc")
	}
	if pidCPU(0) != 0 || pidCPU(-1) != 0 {
		t.Fatal("CPU time of no process")
	}
	// This process has run the tests before this one: it has used CPU.
	deadline := time.Now().Add(10 * time.Second)
	x := 0
	for pidCPU(os.Getpid()) == 0 && time.Now().Before(deadline) {
		for i := range 1 << 20 {
			x ^= i * i
		}
	}
	if got := pidCPU(os.Getpid()); got <= 0 || got > processCPU()+time.Second {
		t.Fatalf("pidCPU(self) = %v, processCPU %v (%d)", got, processCPU(), x)
	}
}

func TestPrefillSuiteOnNode(t *testing.T) {
	env := &Env{Addrs: []string{inProcessNode(t)}}
	s := &PrefillSuite{Options: PrefillOptions{PromptTokens: 256, Runs: 1, SgemmSize: 64}}
	res := runSuite(t, s, env, "prefill", "sgemm")
	rows := table[prefillRow](t, res, "prefill")
	// The node's engine has 64-token blocks: 50% is 128 tokens, 90% 192.
	if len(rows) != 3 || rows[1].CachedTokens != 128 || rows[2].CachedTokens != 192 {
		t.Fatalf("rows %+v", rows)
	}
	for _, r := range rows {
		if r.Backend != BackendKvmesh || r.TTFTMS <= 0 || r.GFLOP <= 0 {
			t.Errorf("row %+v", r)
		}
	}
	check(t, res, "ttft_vs_cold")
}

func TestSoakSuite(t *testing.T) {
	env := &Env{OutDir: t.TempDir(), Addrs: []string{inProcessNode(t)}}
	// In process, the node's RSS is this test's (race detector included):
	// the limit is not what this test checks, the mechanics are.
	s := &SoakSuite{Options: SoakOptions{Duration: 2 * time.Second, Concurrency: 8, Interval: 500 * time.Millisecond,
		OverheadBytes: 64 << 30, PrefillEvery: -1}}
	res := runSuite(t, s, env, "soak", "soak_series")
	sum := table[soakSummary](t, res, "soak")[0]
	if sum.Ops == 0 || sum.Errors != 0 || sum.WrongBytes != 0 || sum.MaxRSSBytes <= 0 || !sum.RSSWithinLimit ||
		sum.GoroutinesEnd <= 0 || sum.LookupP99MS <= 0 || sum.PutP99MS <= 0 {
		t.Fatalf("summary %+v", sum)
	}
	series := table[soakSample](t, res, "soak_series")
	if len(series) < 3 {
		t.Fatalf("%d samples in 2s at 500ms", len(series))
	}
	var ops int64
	for _, x := range series {
		ops += x.Ops
		if x.RSSBytes <= 0 || x.Goroutines <= 0 || x.Node != "node1" {
			t.Errorf("sample %+v", x)
		}
	}
	if ops != sum.Ops {
		t.Errorf("samples count %d ops, the summary %d", ops, sum.Ops)
	}
	if c := check(t, res, "errors"); !c.Met {
		t.Errorf("check %+v", c)
	}
	checkPNG(t, res.Plots, 1)
}

// TestSoakPayload: a block's payload follows from its key alone, so a
// reader can check any block it gets; different keys, different bytes.
func TestSoakPayload(t *testing.T) {
	ns := soakNamespace()
	if err := ns.Validate(); err != nil {
		t.Fatal(err)
	}
	keys := prefixhash.Keys(ns, make([]uint32, 2*ns.BlockTokens))
	a, b, c := make([]byte, ns.BlockBytes()), make([]byte, ns.BlockBytes()), make([]byte, ns.BlockBytes())
	soakPayload(a, keys[0])
	soakPayload(b, keys[0])
	soakPayload(c, keys[1])
	if !bytes.Equal(a, b) || bytes.Equal(a, c) {
		t.Fatal("payloads are not a function of the key")
	}
}
