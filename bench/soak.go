package bench

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kvmesh/kvmesh/client"
	"github.com/kvmesh/kvmesh/prefixhash"
)

// SoakOptions configures the soak. Zero fields take the defaults documented
// on each, for a full run or for --quick.
type SoakOptions struct {
	// Duration is how long the load runs. Default 10m; quick 30s.
	Duration time.Duration
	// Concurrency is the number of workers, each one call at a time.
	// Default 64.
	Concurrency int
	// Interval is the time between samples. Default Duration/20, within
	// 1s..30s.
	Interval time.Duration
	// Nodes is the cluster size. Default 2: lookups and gets cross nodes.
	Nodes int
	// DRAMBytes and NVMeBytes are each node's tiers: small, so that the
	// load fills them within seconds and the rest of the run is demotion,
	// eviction and segment reclaim. Default 256 MiB and 1 GiB.
	DRAMBytes, NVMeBytes int64
	// OverheadBytes is what a node may hold in memory beyond its DRAM tier:
	// the Go runtime and heap (index, buffers, gRPC), pebble's memtables
	// and block cache, the NVMe tier's aligned I/O buffers and the page
	// cache pages of its segments that the process maps. Default 384 MiB
	// (a node under this load measured 150–250 MiB above its DRAM tier).
	OverheadBytes int64
	// CallTimeout bounds every call. Default 10s.
	CallTimeout time.Duration
	// PrefillEvery is the pause between prefills of the one worker that
	// prefills (short prompts through PrefillService; the engine is CPU
	// bound, so it runs at a low rate). Default 1s; 0 keeps the default,
	// negative disables prefills.
	PrefillEvery time.Duration
	// Seed seeds the workers. Default 1.
	Seed uint64
}

// EnsureDefaults fills zero fields for a full run, or for --quick.
func (o *SoakOptions) EnsureDefaults(quick bool) {
	if o.Duration == 0 {
		o.Duration = pick(quick, 10*time.Minute, 30*time.Second)
	}
	if o.Concurrency == 0 {
		o.Concurrency = 64
	}
	if o.Interval == 0 {
		o.Interval = min(max(o.Duration/20, time.Second), 30*time.Second)
	}
	if o.Nodes == 0 {
		o.Nodes = 2
	}
	if o.DRAMBytes == 0 {
		o.DRAMBytes = 256 << 20
	}
	if o.NVMeBytes == 0 {
		o.NVMeBytes = 1 << 30
	}
	if o.OverheadBytes == 0 {
		o.OverheadBytes = 384 << 20
	}
	if o.CallTimeout == 0 {
		o.CallTimeout = 10 * time.Second
	}
	if o.PrefillEvery == 0 {
		o.PrefillEvery = time.Second
	}
	if o.Seed == 0 {
		o.Seed = 1
	}
}

// Validate names the first field that is out of range.
func (o *SoakOptions) Validate() error {
	switch {
	case o.Duration <= 0 || o.Duration > 24*time.Hour:
		return fmt.Errorf("bench: soak: duration %v is outside (0, 24h]", o.Duration)
	case o.Concurrency < 1 || o.Concurrency > 4096:
		return fmt.Errorf("bench: soak: concurrency %d is outside 1..4096", o.Concurrency)
	case o.Interval <= 0:
		return fmt.Errorf("bench: soak: interval %v must be positive", o.Interval)
	case o.Nodes < 1 || o.Nodes > 16:
		return fmt.Errorf("bench: soak: nodes %d is outside 1..16", o.Nodes)
	case o.DRAMBytes < 64<<20 || o.NVMeBytes < 64<<20:
		return fmt.Errorf("bench: soak: dram %d and nvme %d bytes must be at least 64 MiB", o.DRAMBytes, o.NVMeBytes)
	case o.OverheadBytes < 0:
		return fmt.Errorf("bench: soak: overhead %d bytes is negative", o.OverheadBytes)
	case o.CallTimeout <= 0:
		return fmt.Errorf("bench: soak: call timeout %v must be positive", o.CallTimeout)
	}
	return nil
}

// SoakSuite runs a bounded mixed load (lookups, gets, puts of growing
// conversations that share system prompts, and a trickle of prefills) on a
// cluster of `kvmesh serve` processes with small tiers, and samples every
// node's resident memory and goroutines and the load's errors and latencies
// over time. It fails when a node's RSS goes past its DRAM tier plus
// OverheadBytes, when any call fails with something other than a miss, or
// when a get serves other bytes than were put. `all` leaves it out: CI and
// operators run it on its own (`kvmesh bench soak --duration D`).
type SoakSuite struct {
	Options SoakOptions
}

// Name returns "soak".
func (s *SoakSuite) Name() string { return "soak" }

func (*SoakSuite) notInAll() {}

// soakOps are the operations of the load, in the order of the counters.
var soakOps = [...]string{"lookup", "get", "put", "prefill"}

const (
	opLookup = iota
	opGet
	opPut
	opPrefill
	soakOpCount
)

// soakSample is one row of the time series.
type soakSample struct {
	ElapsedS float64 `json:"elapsed_s"`
	Node     string  `json:"node"`
	RSSBytes int64   `json:"rss_bytes"`
	// Goroutines is the node's go_goroutines.
	Goroutines int64 `json:"goroutines"`
	// Ops and Errors count the whole load's calls (every node) in the
	// interval that ended at ElapsedS; repeated on each node's row.
	Ops       int64   `json:"ops"`
	Errors    int64   `json:"errors"`
	LookupP99 float64 `json:"lookup_p99_ms"`
	GetP99    float64 `json:"get_p99_ms"`
	PutP99    float64 `json:"put_p99_ms"`
	HitRatio  float64 `json:"block_hit_ratio"`
}

// soakSummary is the soak's outcome.
type soakSummary struct {
	Nodes          int     `json:"nodes"`
	Concurrency    int     `json:"concurrency"`
	DurationS      float64 `json:"duration_s"`
	Ops            int64   `json:"ops"`
	OpsPerS        float64 `json:"ops_per_s"`
	Errors         int64   `json:"errors"`
	WrongBytes     int64   `json:"wrong_bytes"`
	Misses         int64   `json:"get_misses"`
	Prefills       int64   `json:"prefills" table:"wide"`
	MaxRSSBytes    int64   `json:"max_rss_bytes"`
	RSSLimitBytes  int64   `json:"rss_limit_bytes"`
	RSSWithinLimit bool    `json:"rss_within_limit"`
	// Goroutines are the largest node's at the first sample after the
	// warm-up interval, at the end, and at most.
	GoroutinesStart int64   `json:"goroutines_start" table:"wide"`
	GoroutinesEnd   int64   `json:"goroutines_end" table:"wide"`
	GoroutinesMax   int64   `json:"goroutines_max"`
	LookupP50MS     float64 `json:"lookup_p50_ms" table:"wide"`
	LookupP99MS     float64 `json:"lookup_p99_ms"`
	GetP99MS        float64 `json:"get_p99_ms"`
	PutP99MS        float64 `json:"put_p99_ms"`
	PrefillP99MS    float64 `json:"prefill_p99_ms"`
	FirstError      string  `json:"first_error,omitempty" table:"-"`
}

// soakNamespace keys the soak's blocks: 64-token blocks of 64 KiB.
func soakNamespace() prefixhash.Namespace {
	return prefixhash.Namespace{Model: "kvmesh/soak", DType: prefixhash.Float16, BlockTokens: 64,
		Layers: 2, KVHeads: 2, HeadDim: 64}
}

// soakLoad is the load's shared state: counters, latencies of the current
// interval and of the whole run, the first error.
type soakLoad struct {
	ns       prefixhash.Namespace
	opts     SoakOptions
	clients  []*client.Client
	ops      [soakOpCount]atomic.Int64
	errs     atomic.Int64
	wrong    atomic.Int64
	misses   atomic.Int64
	hit, all atomic.Int64 // blocks found by lookups, blocks looked up
	firstErr atomic.Pointer[error]

	mu       sync.Mutex
	interval [soakOpCount]*Latency
	total    [soakOpCount]Latency
}

// record counts one call of op that took d and ended with err.
func (l *soakLoad) record(op int, d time.Duration, err error) {
	l.ops[op].Add(1)
	l.total[op].Record(d)
	l.mu.Lock()
	l.interval[op].Record(d)
	l.mu.Unlock()
	if err != nil {
		l.errs.Add(1)
		err = fmt.Errorf("%s: %w", soakOps[op], err)
		l.firstErr.CompareAndSwap(nil, &err)
	}
}

// rotate returns the current interval's latencies and starts new ones.
func (l *soakLoad) rotate() (out [soakOpCount]*Latency) {
	l.mu.Lock()
	defer l.mu.Unlock()
	out = l.interval
	for i := range l.interval {
		l.interval[i] = new(Latency)
	}
	return out
}

// soakPayload fills p with bytes derived from key, so that any reader can
// check a block it got without remembering what was put.
func soakPayload(p []byte, key prefixhash.Key) {
	r := rand.NewPCG(bytesSeed(key[:8]), bytesSeed(key[8:]))
	for i := 0; i+8 <= len(p); i += 8 {
		v := r.Uint64()
		for j := range 8 {
			p[i+j] = byte(v >> (8 * j))
		}
	}
}

func bytesSeed(b []byte) uint64 {
	var v uint64
	for i, c := range b {
		v |= uint64(c) << (8 * i)
	}
	return v
}

// worker runs conversations until run ends: each starts with one of a few
// shared system prompts and grows by a few blocks a turn; each turn looks
// the conversation up through a random node, reads the cached prefix
// (checking every byte) and puts the blocks that were missing.
// Calls take their deadline from calls, not from run, so that the run's end
// never fails a call in flight: it finishes within CallTimeout.
func (l *soakLoad) worker(run, calls context.Context, w int) {
	rng := rand.New(rand.NewPCG(l.opts.Seed, uint64(w)))
	bt := l.ns.BlockTokens
	payload := make([]byte, l.ns.BlockBytes())
	var conv []uint32
	turns := 0
	for run.Err() == nil {
		if turns == 0 {
			// 8 system prompts of 4 blocks, shared by every worker.
			sys := rng.IntN(8)
			conv = conv[:0]
			for i := range 4 * bt {
				conv = append(conv, uint32(sys*7919+i)%50000)
			}
			turns = 4 + rng.IntN(8)
		}
		for range 1 + rng.IntN(3) {
			for range bt {
				conv = append(conv, rng.Uint32N(50000))
			}
		}
		turns--
		c := l.clients[rng.IntN(len(l.clients))]
		l.turn(calls, c, conv, payload)
	}
}

// turn is one request of a conversation.
func (l *soakLoad) turn(ctx context.Context, c *client.Client, tokens []uint32, payload []byte) {
	cctx, cancel := context.WithTimeout(ctx, l.opts.CallTimeout)
	defer cancel()
	t0 := time.Now()
	lk, err := c.Lookup(cctx, l.ns, client.Prompt{Tokens: tokens})
	l.record(opLookup, time.Since(t0), err)
	if err != nil {
		return
	}
	l.hit.Add(int64(lk.CachedBlocks))
	l.all.Add(int64(lk.PromptBlocks))

	keys := prefixhash.Keys(l.ns, tokens)
	cached := 0
	if lk.CachedBlocks > 0 {
		t0 = time.Now()
		_, err = c.Get(cctx, l.ns, client.Prompt{Keys: keys[:lk.CachedBlocks]}, client.Each(func(b client.Block) error {
			if !b.Found {
				l.misses.Add(1) // evicted since the lookup: a miss, never an error
				return nil
			}
			soakPayload(payload, b.Key)
			if !bytes.Equal(b.Payload, payload) {
				l.wrong.Add(1)
				return fmt.Errorf("block %s: served bytes differ from those put", b.Key)
			}
			if b.Index == cached {
				cached++
			}
			return nil
		}))
		l.record(opGet, time.Since(t0), err)
		if err != nil {
			return
		}
	}
	if cached == len(keys) {
		return
	}
	payloads := make([][]byte, len(keys))
	for i := cached; i < len(keys); i++ {
		payloads[i] = make([]byte, len(payload))
		soakPayload(payloads[i], keys[i])
	}
	t0 = time.Now()
	_, err = c.Put(cctx, l.ns, client.Prompt{Tokens: tokens}, payloads)
	if status.Code(errors.Unwrap(err)) == codes.ResourceExhausted {
		err = nil // refusing a write under pressure is the contract, not a failure
	}
	l.record(opPut, time.Since(t0), err)
}

// prefiller sends a short prompt to PrefillService every PrefillEvery until
// run ends; calls take their deadline from calls, as worker's do.
func (l *soakLoad) prefiller(run, calls context.Context) {
	rng := rand.New(rand.NewPCG(l.opts.Seed, 1<<32))
	t := time.NewTicker(l.opts.PrefillEvery)
	defer t.Stop()
	for {
		select {
		case <-run.Done():
			return
		case <-t.C:
		}
		prompt := make([]uint32, 128+rng.IntN(128))
		for i := range prompt {
			prompt[i] = uint32(i*31+len(prompt)) % 256 // shared openings: some hits
			if i > 64 {
				prompt[i] = rng.Uint32N(256)
			}
		}
		c := l.clients[rng.IntN(len(l.clients))]
		cctx, cancel := context.WithTimeout(calls, l.opts.CallTimeout)
		t0 := time.Now()
		_, err := c.Prefill(cctx, client.PrefillRequest{Tokens: prompt, Session: "soak"})
		cancel()
		if errors.Is(err, client.ErrNoEngine) {
			return // a node without the engine: no prefills to soak
		}
		l.record(opPrefill, time.Since(t0), err)
	}
}

// Run soaks: it starts the nodes (or takes --addr's), connects to each,
// runs the load while sampling the nodes, and reports.
func (s *SoakSuite) Run(ctx context.Context, env *Env) (*Result, error) {
	o := s.Options
	o.EnsureDefaults(env.Quick)
	if err := o.Validate(); err != nil {
		return nil, err
	}
	res := &Result{Suite: s.Name()}
	ds, addrs, stop, err := startNodes(ctx, env, DaemonOptions{Nodes: o.Nodes, Join: o.Nodes > 1,
		DRAMBytes: o.DRAMBytes, NVMeBytes: o.NVMeBytes})
	if err != nil {
		return res, err
	}
	defer stop()
	l := &soakLoad{ns: soakNamespace(), opts: o}
	for i := range l.interval {
		l.interval[i] = new(Latency)
	}
	defer l.close()
	nodes, err := l.connect(ctx, ds, addrs)
	if err != nil {
		return res, err
	}
	if ds == nil {
		res.Note("measured an existing cluster (--addr): rss_limit_bytes assumes its nodes' DRAM tiers are %s each", formatBytes(float64(o.DRAMBytes)))
	}
	samples, elapsed, sampleErr := l.run(ctx, env, nodes)
	if ctx.Err() != nil {
		return res, ctx.Err()
	}
	return res, l.report(env, res, samples, len(nodes), elapsed, sampleErr)
}

// soakNode is a node the soak samples: its name in the report and its
// metrics address.
type soakNode struct{ name, httpAddr string }

// connect dials a client of each node (close closes them) and finds its
// metrics address.
func (l *soakLoad) connect(ctx context.Context, ds *Daemons, addrs []string) ([]soakNode, error) {
	var nodes []soakNode
	for i, a := range addrs {
		c, err := client.Dial(a, client.Options{MaxRetries: -1})
		if err != nil {
			return nil, err
		}
		l.clients = append(l.clients, c)
		h := ""
		if ds != nil {
			h = ds.list[i].HTTPAddr
		} else if h, err = nodeHTTPAddr(ctx, c); err != nil {
			return nil, fmt.Errorf("bench: soak: node %s: its metrics address: %w", a, err)
		}
		nodes = append(nodes, soakNode{fmt.Sprintf("node%d", i+1), h})
	}
	return nodes, nil
}

// close closes the clients connect dialed.
func (l *soakLoad) close() {
	for _, c := range l.clients {
		c.Close()
	}
}

// run runs the workers (and the prefiller) for the soak's duration,
// sampling every node each interval and once more at the end. It returns
// the samples, how long the load ran, and why sampling failed, if it did.
func (l *soakLoad) run(ctx context.Context, env *Env, nodes []soakNode) ([]soakSample, time.Duration, error) {
	o := l.opts
	bar := env.Progress.Bar(int64(o.Duration/time.Second), "soak")
	defer bar.Finish()
	runCtx, cancel := context.WithTimeout(ctx, o.Duration)
	defer cancel()
	var wg sync.WaitGroup
	workers := o.Concurrency
	if o.PrefillEvery > 0 && workers > 1 {
		workers--
		wg.Go(func() { l.prefiller(runCtx, ctx) })
	}
	for w := range workers {
		wg.Go(func() { l.worker(runCtx, ctx, w) })
	}

	sm := &soakSampler{l: l, nodes: nodes, start: time.Now(), bar: bar}
	tick := time.NewTicker(o.Interval)
	var sampleErr error
loop:
	for {
		select {
		case <-runCtx.Done():
			break loop
		case <-tick.C:
			if sampleErr = sm.sample(ctx); sampleErr != nil {
				cancel()
				break loop
			}
		}
	}
	tick.Stop()
	wg.Wait()
	if sampleErr == nil && ctx.Err() == nil {
		sampleErr = sm.sample(ctx) // the end, after every worker stopped
	}
	return sm.samples, time.Since(sm.start), sampleErr
}

// soakSampler takes the samples of a soak: per node, each interval, its
// RSS and goroutines beside the whole load's ops, errors, latencies and hit
// ratio in the interval.
type soakSampler struct {
	l                          *soakLoad
	nodes                      []soakNode
	start                      time.Time
	bar                        Bar
	samples                    []soakSample
	lastOps, lastErrs, lastHit int64
	lastAll                    int64
}

func (sm *soakSampler) sample(ctx context.Context) error {
	l := sm.l
	lat := l.rotate()
	var ops int64
	for i := range l.ops {
		ops += l.ops[i].Load()
	}
	errs, hit, all := l.errs.Load(), l.hit.Load(), l.all.Load()
	ratio := 0.0
	if all > sm.lastAll {
		ratio = float64(hit-sm.lastHit) / float64(all-sm.lastAll)
	}
	for _, n := range sm.nodes {
		m, err := nodeGauges(ctx, n.httpAddr, "process_resident_memory_bytes", "go_goroutines")
		if err != nil {
			return fmt.Errorf("bench: soak: %s: %w", n.name, err)
		}
		sm.samples = append(sm.samples, soakSample{ElapsedS: time.Since(sm.start).Seconds(), Node: n.name,
			RSSBytes: int64(m["process_resident_memory_bytes"]), Goroutines: int64(m["go_goroutines"]),
			Ops: ops - sm.lastOps, Errors: errs - sm.lastErrs, LookupP99: lat[opLookup].Quantile(0.99),
			GetP99: lat[opGet].Quantile(0.99), PutP99: lat[opPut].Quantile(0.99), HitRatio: ratio})
	}
	sm.lastOps, sm.lastErrs, sm.lastHit, sm.lastAll = ops, errs, hit, all
	sm.bar.Add(int64(l.opts.Interval / time.Second))
	return nil
}

// report adds the soak's tables, checks, notes and plot to res, and returns
// the run's verdict: why sampling failed, wrong bytes, failed calls, or a
// node's RSS over its limit.
func (l *soakLoad) report(env *Env, res *Result, samples []soakSample, nodes int, elapsed time.Duration, sampleErr error) error {
	o := l.opts
	sum := l.summary(o, samples, nodes, elapsed)
	res.AddTable("soak", fmt.Sprintf("%d workers for %v on %d `kvmesh serve` nodes (DRAM %s, NVMe %s each): lookups, gets (every byte checked) and puts of growing conversations, a prefill every %v",
		o.Concurrency, o.Duration, o.Nodes, formatBytes(float64(o.DRAMBytes)), formatBytes(float64(o.NVMeBytes)), o.PrefillEvery), []soakSummary{sum})
	res.AddTable("soak_series", "samples over time, per node (ops, errors and latencies are the whole load's in the interval)", samples)
	res.Checks = append(res.Checks,
		NewCheck("soak: every node's RSS within its DRAM tier + overhead", "max_rss_bytes / rss_limit_bytes",
			float64(sum.MaxRSSBytes)/float64(sum.RSSLimitBytes), "<=", 1, BackendKvmesh),
		NewCheck("soak: no call failed but with a miss", "errors", float64(sum.Errors), "<=", 0, BackendKvmesh))
	res.Note("rss_limit_bytes is the DRAM tier (%s) plus a fixed overhead of %s for the Go runtime, indexes, pebble and I/O buffers.",
		formatBytes(float64(o.DRAMBytes)), formatBytes(float64(o.OverheadBytes)))
	if err := SavePlot(env, res, "soak_rss_over_time", soakPlot(samples, sum.RSSLimitBytes)); err != nil && !errors.Is(err, ErrEmptyPlot) {
		return err
	}
	switch {
	case sampleErr != nil:
		return sampleErr
	case sum.WrongBytes > 0:
		return fmt.Errorf("bench: soak: %d blocks were served with other bytes than were put (%s)", sum.WrongBytes, sum.FirstError)
	case sum.Errors > 0:
		return fmt.Errorf("bench: soak: %d of %d calls failed; the first: %s", sum.Errors, sum.Ops, sum.FirstError)
	case !sum.RSSWithinLimit:
		return fmt.Errorf("bench: soak: a node's RSS reached %s, over its DRAM tier plus overhead (%s)",
			formatBytes(float64(sum.MaxRSSBytes)), formatBytes(float64(sum.RSSLimitBytes)))
	}
	return nil
}

// summary sums the run up.
func (l *soakLoad) summary(o SoakOptions, samples []soakSample, nodes int, elapsed time.Duration) soakSummary {
	s := soakSummary{Nodes: nodes, Concurrency: o.Concurrency, DurationS: elapsed.Seconds(),
		Errors: l.errs.Load(), WrongBytes: l.wrong.Load(), Misses: l.misses.Load(), Prefills: l.ops[opPrefill].Load(),
		RSSLimitBytes: o.DRAMBytes + o.OverheadBytes,
		LookupP50MS:   l.total[opLookup].Quantile(0.5), LookupP99MS: l.total[opLookup].Quantile(0.99),
		GetP99MS: l.total[opGet].Quantile(0.99), PutP99MS: l.total[opPut].Quantile(0.99), PrefillP99MS: l.total[opPrefill].Quantile(0.99)}
	for i := range l.ops {
		s.Ops += l.ops[i].Load()
	}
	s.OpsPerS = float64(s.Ops) / elapsed.Seconds()
	if e := l.firstErr.Load(); e != nil {
		s.FirstError = (*e).Error()
	}
	// Goroutines: the largest node's, per sample time.
	byTime := map[float64]int64{}
	var times []float64
	for _, x := range samples {
		s.MaxRSSBytes = max(s.MaxRSSBytes, x.RSSBytes)
		s.GoroutinesMax = max(s.GoroutinesMax, x.Goroutines)
		if _, ok := byTime[x.ElapsedS]; !ok {
			times = append(times, x.ElapsedS)
		}
		byTime[x.ElapsedS] = max(byTime[x.ElapsedS], x.Goroutines)
	}
	if len(times) > 0 {
		first := times[0]
		if len(times) > 2 {
			first = times[1] // after the warm-up interval
		}
		s.GoroutinesStart, s.GoroutinesEnd = byTime[first], byTime[times[len(times)-1]]
	}
	s.RSSWithinLimit = s.MaxRSSBytes <= s.RSSLimitBytes
	return s
}

// soakPlot is RSS over time per node, with the limit dashed.
func soakPlot(samples []soakSample, limit int64) LinePlot {
	series := GroupSeries(samples, func(x soakSample) (string, bool, bool, float64, float64) {
		return x.Node + " RSS", false, false, x.ElapsedS, float64(x.RSSBytes) / (1 << 20)
	})
	if len(samples) > 0 {
		series = append(series, Series{Name: "limit: DRAM tier + overhead", Dashed: true,
			X: []float64{samples[0].ElapsedS, samples[len(samples)-1].ElapsedS},
			Y: []float64{float64(limit) / (1 << 20), float64(limit) / (1 << 20)}})
	}
	return LinePlot{Title: "soak: resident memory of each node", XLabel: "seconds", YLabel: "RSS (MiB)", Series: series}
}

// nodeGauges reads the named unlabelled gauges from the node's /metrics at
// httpAddr.
func nodeGauges(ctx context.Context, httpAddr string, names ...string) (map[string]float64, error) {
	mf, err := nodeMetrics(ctx, httpAddr)
	if err != nil {
		return nil, err
	}
	out := map[string]float64{}
	for _, n := range names {
		ms := mf[n].GetMetric()
		if len(ms) != 1 {
			return nil, fmt.Errorf("bench: node metrics at %s: %d series named %s, want 1", httpAddr, len(ms), n)
		}
		out[n] = ms[0].GetGauge().GetValue()
	}
	return out, nil
}
