package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"
)

type fakeSuite struct {
	name string
	err  error
}

func (s fakeSuite) Name() string { return s.name }
func (s fakeSuite) Run(ctx context.Context, env *Env) (*Result, error) {
	res := &Result{}
	res.AddTable("t", "a table", []MemcpyResult{{BlockBytes: 1, GBps: 2}})
	return res, s.err
}

func TestSelect(t *testing.T) {
	all := []Suite{fakeSuite{name: "a"}, fakeSuite{name: "b"}, fakeSuite{name: "c"}}
	got, err := Select(all, []string{"c", "all", "a"})
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, s := range got {
		names = append(names, s.Name())
	}
	if strings.Join(names, ",") != "c,a,b" {
		t.Fatalf("Select = %v, want c,a,b", names)
	}
	_, err = Select(all, []string{"a", "nope"})
	if !errors.Is(err, ErrUnknownSuite) || !strings.Contains(err.Error(), `"nope"`) || !strings.Contains(err.Error(), "a, b, c") {
		t.Fatalf("unknown suite: %v", err)
	}
	if _, err := Select(all, nil); !errors.Is(err, ErrUnknownSuite) {
		t.Fatalf("no suite: %v", err)
	}
	// The built-in suites are found by name.
	if _, err := Select(Suites(SuiteFlags{}), []string{"peers", "trace", "transfer", "store", "ranks", "lookup", "nvme", "prefill", "speculate"}); err != nil {
		t.Fatal(err)
	}
	// "all" is every suite but peers, which every suite measures itself.
	got, err = Select(Suites(SuiteFlags{}), []string{"all"})
	if err != nil {
		t.Fatal(err)
	}
	names = names[:0]
	for _, s := range got {
		names = append(names, s.Name())
	}
	if strings.Join(names, ",") != "transfer,store,ranks,lookup,nvme,prefill,trace" {
		t.Fatalf("all = %v", names)
	}
	// --routing puts the policy beside session-affinity in the trace suite.
	tr := Suites(SuiteFlags{Routing: RoutingRoundRobin, Nodes: 3})[6].(*TraceSuite)
	if fmt.Sprint(tr.Options.Routing) != "[round-robin session-affinity]" || tr.Options.Nodes != 3 {
		t.Fatalf("trace options %+v", tr.Options)
	}
}

func TestRunRecordsFailures(t *testing.T) {
	out := filepath.Join(t.TempDir(), "plots")
	rep, err := Run(context.Background(), []Suite{fakeSuite{name: "ok"}, fakeSuite{name: "bad", err: errors.New("boom")}},
		Env{OutDir: out})
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Results) != 2 || rep.Results[1].Error != "boom" || rep.Results[0].Error != "" {
		t.Fatalf("results %+v", rep.Results)
	}
	if f := rep.Failed(); len(f) != 1 || f[0] != "bad" {
		t.Fatalf("Failed() = %v", f)
	}
	if _, err := os.Stat(out); err != nil {
		t.Fatalf("output directory not created: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := Run(ctx, []Suite{fakeSuite{name: "ok"}}, Env{}); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled run: %v", err)
	}
}

func sampleReport() *Report {
	redis := KVResult{Target: "redis", Op: "get", ValueBytes: 1 << 20, Concurrency: 4, GBps: 2, P50MS: 0.5, P99MS: 1}
	redis.RatioVsRawTCP = Ratio(2, 3)
	mine := KVResult{Target: "kvmesh-tcp", Op: "get", ValueBytes: 1 << 20, Concurrency: 4, GBps: 2.5}
	mine.RatioVsRedis = Ratio(mine.GBps, redis.GBps)
	res := &Result{Suite: "store"}
	res.AddTable("kv", "get/set", []KVResult{redis, mine})
	res.AddTable("replay", "replay", []ReplayStats{{Backend: BackendSimulation, Routing: RoutingRandom, HitRatio: 0.36,
		IdealHitRatio: 0.366, RequestsPerNode: []int{1, 2}, Blocks: 99}})
	res.Skip("fio", errors.New("fio not found"))
	res.Checks = append(res.Checks, NewCheck("c", "x", 1, ">=", 0.98, BackendKvmesh))
	return &Report{Results: []*Result{res}}
}

func TestJSONFieldNames(t *testing.T) {
	var buf bytes.Buffer
	if err := WriteJSON(&buf, sampleReport()); err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Suites []struct {
			Suite  string `json:"suite"`
			Tables []struct {
				Name string           `json:"name"`
				Rows []map[string]any `json:"rows"`
			} `json:"tables"`
			Skipped []map[string]string `json:"skipped"`
			Checks  []map[string]any    `json:"checks"`
		} `json:"suites"`
	}
	if err := json.Unmarshal(buf.Bytes(), &doc); err != nil {
		t.Fatal(err)
	}
	s := doc.Suites[0]
	kv := s.Tables[0].Rows
	for _, f := range []string{"target", "op", "value_bytes", "concurrency", "ops_per_s", "gbps", "p50_ms", "p99_ms", "ratio_vs_raw_tcp"} {
		if _, ok := kv[0][f]; !ok {
			t.Errorf("redis row has no %q: %v", f, kv[0])
		}
	}
	if _, ok := kv[0]["ratio_vs_redis"]; ok {
		t.Error("the redis row compares itself with redis")
	}
	if r, ok := kv[1]["ratio_vs_redis"].(float64); !ok || r != 1.25 {
		t.Errorf("kvmesh row ratio_vs_redis = %v, want 1.25", kv[1]["ratio_vs_redis"])
	}
	rp := s.Tables[1].Rows[0]
	for _, f := range []string{"backend", "routing", "hit_ratio", "ideal_hit_ratio", "ratio_vs_ideal", "full_block_hit_ratio",
		"cached_tokens", "lookup_p50_ms", "lookup_p99_ms", "put_p99_ms", "requests_per_node", "tokens_max_over_mean", "blocks"} {
		if _, ok := rp[f]; !ok {
			t.Errorf("replay row has no %q", f)
		}
	}
	if rp["backend"] != "simulation" {
		t.Errorf("backend = %v", rp["backend"])
	}
	if s.Skipped[0]["what"] != "fio" || s.Checks[0]["met"] != true || s.Checks[0]["backend"] != "kvmesh" {
		t.Errorf("skipped %v, checks %v", s.Skipped, s.Checks)
	}
}

func TestWriteTable(t *testing.T) {
	var buf bytes.Buffer
	if err := WriteTable(&buf, sampleReport()); err != nil {
		t.Fatal(err)
	}
	out := buf.String()
	for _, want := range []string{"== store", "gbps", "ratio_vs_raw_tcp", "ratio_vs_redis", "hit_ratio",
		"skipped:", "fio: fio not found", "[MET] c: x = 1 (target >= 0.98) [kvmesh]", "0.6667", "1.25"} {
		if !strings.Contains(out, want) {
			t.Errorf("table output lacks %q:\n%s", want, out)
		}
	}
	// table:"-" columns are in the JSON only.
	for _, line := range strings.Split(out, "\n") {
		if strings.HasPrefix(line, "  backend ") && (strings.Contains(line, "requests_per_node") || strings.Contains(line, " blocks ")) {
			t.Errorf("hidden columns shown:\n%s", out)
		}
	}
	if got := formatValue(reflect.ValueOf([]int64{1, 2})); got != "1/2" {
		t.Errorf("a slice prints as %q, want 1/2", got)
	}
	// A ratio nil in every row is no column at all.
	buf.Reset()
	rep := &Report{Results: []*Result{{Suite: "s", Tables: []Table{{Title: "t", Rows: []KVResult{{Op: "get"}}}}}}}
	if err := WriteTable(&buf, rep); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(buf.String(), "ratio_vs") {
		t.Errorf("nil columns shown:\n%s", buf.String())
	}
	if err := WriteTable(&buf, &Report{Results: []*Result{{Tables: []Table{{Rows: 3}}}}}); err == nil {
		t.Error("rows that are not a slice of structs accepted")
	}
}

func TestParseFormat(t *testing.T) {
	if f, err := ParseFormat("JSON"); err != nil || f != FormatJSON {
		t.Fatalf("ParseFormat(JSON) = %q, %v", f, err)
	}
	if _, err := ParseFormat("yaml"); err == nil {
		t.Fatal("yaml accepted")
	}
}

func TestPlots(t *testing.T) {
	dir := t.TempDir()
	env := &Env{OutDir: dir}
	res := &Result{}
	kib := func(k ...float64) []float64 {
		for i := range k {
			k[i] *= 1024
		}
		return k
	}
	plots := map[string]LinePlot{
		"throughput": ThroughputPlot("throughput", Series{Name: "kvmesh", X: kib(64, 1024, 4096), Y: []float64{1, 2, 2.5}},
			Series{Name: "redis", X: kib(64, 1024, 4096), Y: []float64{0.5, 2, 2.1}, Dashed: true}),
		"hit_ratio": HitRatioPlot("hit ratio", 0.366, Series{Name: "random pooled", X: []float64{0.1, 0.5, 1}, Y: []float64{0.2, 0.35, 0.366}}),
		"ttft":      TTFTPlot("ttft", Series{Name: "prefill", X: []float64{0, 0.5, 0.9}, Y: []float64{900, 500, 140}}),
	}
	for _, name := range []string{"throughput", "hit_ratio", "ttft"} {
		if err := SavePlot(env, res, name, plots[name]); err != nil {
			t.Fatal(err)
		}
	}
	checkPNG(t, res.Plots, 3)
	if err := (LinePlot{Title: "empty"}).Save(filepath.Join(dir, "e.png")); !errors.Is(err, ErrEmptyPlot) {
		t.Errorf("empty plot: %v", err)
	}
	if err := ThroughputPlot("bad", Series{X: []float64{0}, Y: []float64{1}}).Save(filepath.Join(dir, "b.png")); err == nil {
		t.Error("x = 0 on a log axis accepted")
	}
	if err := TTFTPlot("bad", Series{X: []float64{1, 2}, Y: []float64{1}}).Save(filepath.Join(dir, "c.png")); err == nil {
		t.Error("series of unequal lengths accepted")
	}
	// No OutDir: no plot, no error.
	if err := SavePlot(&Env{}, res, "x", plots["ttft"]); err != nil || len(res.Plots) != 3 {
		t.Errorf("SavePlot without OutDir: %v, %d plots", err, len(res.Plots))
	}
}

func TestLatencyQuantiles(t *testing.T) {
	var l Latency
	if l.Quantile(0.5) != 0 {
		t.Fatal("quantile of nothing")
	}
	for i := 1; i <= 1000; i++ {
		l.Record(time.Duration(i) * time.Microsecond)
	}
	l.Record(-time.Second) // counts as 0
	for _, q := range []struct{ q, ms float64 }{{0.5, 0.5}, {0.99, 0.99}, {0.999, 0.999}} {
		if got := l.Quantile(q.q); math.Abs(got-q.ms)/q.ms > 0.04 {
			t.Errorf("p%v = %.4f ms, want %.4f ± 4%%", q.q*100, got, q.ms)
		}
	}
	if l.Quantile(1) != 1 || l.Count() != 1001 {
		t.Errorf("max %v, count %d", l.Quantile(1), l.Count())
	}
	for _, v := range []uint64{0, 1, 63, 64, 65, 1000, 1 << 40, 1<<63 - 1} {
		b := latencyBucket(v)
		if b < 0 || b >= latencyBuckets {
			t.Fatalf("value %d in bucket %d of %d", v, b, latencyBuckets)
		}
		if mid := latencyValue(b); math.Abs(mid-float64(v)) > float64(v)/30+1 {
			t.Errorf("value %d: bucket middle %v", v, mid)
		}
	}
}

func TestProgress(t *testing.T) {
	var buf bytes.Buffer
	b := NewProgress(&buf, true).Bar(10, "work")
	b.Add(3)
	b.Describe("done")
	b.Finish()
	if !strings.Contains(buf.String(), "work") {
		t.Errorf("bar drew %q", buf.String())
	}
	// Disabled, nil or not a terminal: no bars, no panics.
	var none *Progress
	none.Bar(5, "x").Add(1)
	if NewProgress(&buf, false) != nil {
		t.Error("disabled progress is not nil")
	}
	f, err := os.CreateTemp(t.TempDir(), "stderr")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if ProgressFor(f, FormatTable) != nil {
		t.Error("progress bars on a file that is not a terminal")
	}
}

func TestTraceSuite(t *testing.T) {
	env := &Env{OutDir: t.TempDir(), Quick: true}
	s := &TraceSuite{Options: TraceOptions{TracePath: "testdata/small_trace.jsonl", Nodes: 2, Sweep: []float64{0.5, 1}}}
	res, err := s.Run(context.Background(), env)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, tb := range res.Tables {
		names = append(names, tb.Name)
	}
	if strings.Join(names, ",") != "ideal,replay,capacity_sweep" {
		t.Fatalf("tables %v", names)
	}
	if rows := res.Tables[1].Rows.([]ReplayStats); len(rows) != 8 || !strings.HasPrefix(res.Tables[1].Title, "SIMULATION") {
		t.Fatalf("%d replay rows, title %q", len(rows), res.Tables[1].Title)
	}
	// 2 capacities × 2 policies × 2 modes, and pooled random with the
	// offline optimum (which does no worse than LRU on this trace) and with
	// the depth-penalized LRU.
	rows := res.Tables[2].Rows.([]traceSweepRow)
	if len(rows) != 2*2*2+2*2 {
		t.Fatalf("%d sweep rows", len(rows))
	}
	for _, r := range rows {
		if r.Eviction == EvictLRU {
			continue
		}
		i := slices.IndexFunc(rows, func(l traceSweepRow) bool {
			return l.Eviction == EvictLRU && l.Routing == r.Routing && !l.LocalOnly && l.CapacityBlocksPerNode == r.CapacityBlocksPerNode
		})
		if r.Routing != RoutingRandom || r.LocalOnly || i < 0 || (r.Eviction == EvictOptimum && r.HitRatio < rows[i].HitRatio) {
			t.Fatalf("optimum row %+v, lru %d in %+v", r, i, rows)
		}
	}
	if len(res.Checks) != 2 || res.Checks[0].Backend != BackendSimulation {
		t.Fatalf("checks %+v", res.Checks)
	}
	checkPNG(t, res.Plots, 1)

	bad := &TraceSuite{Options: TraceOptions{Routing: []Policy{"sticky"}}}
	if _, err := bad.Run(context.Background(), env); err == nil {
		t.Fatal("unknown routing policy accepted")
	}
}
