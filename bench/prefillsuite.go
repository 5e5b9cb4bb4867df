package bench

import (
	"context"
	"errors"
	"fmt"
	"github.com/kvmesh/kvmesh/auth"
	"log/slog"
	"math/rand/v2"
	"slices"
	"sync/atomic"
	"time"

	"github.com/kvmesh/kvmesh/client"
	"github.com/kvmesh/kvmesh/gpu/gpumem"
	"github.com/kvmesh/kvmesh/prefill"
	"github.com/kvmesh/kvmesh/prefixhash"
	"github.com/kvmesh/kvmesh/store"
	"github.com/kvmesh/kvmesh/tiers"
)

// PrefillOptions configures the prefill suite. Zero fields take the
// defaults documented on each, for a full run or for --quick.
type PrefillOptions struct {
	// PromptTokens is the prompt's length. Default 8192 (DESIGN's target);
	// quick 2048.
	PromptTokens int
	// Fractions are the cached fractions of the prompt measured, 0 (cold)
	// first. Default 0, 0.5 and 0.9. A fraction is rounded down to whole
	// blocks.
	Fractions []float64
	// Runs is how many times each prefill is timed; the median is
	// reported. Default 3; quick 1.
	Runs int
	// SgemmSize is n of the n×n×n Sgemm whose best GFLOP/s is the engine's
	// ceiling. Default 2048; quick 1024.
	SgemmSize int
	// SgemmRuns is how many times Sgemm runs (the best counts). Default 3.
	SgemmRuns int
	// Config is the model. Default prefill.DefaultConfig(), the bundled
	// model, with seeded weights.
	Config prefill.Config
	// Device, when set, is a GPU (gpu.OpenBLAS) the engines run on
	// (prefill.Device), in the bench's process (no nodes are started), and
	// the ceiling is its Sgemm (cuBLAS). The suite does not close it.
	// Default nil: the CPU backend.
	Device gpumem.BLAS
	// ModelDir, when set, names a Hugging Face model directory to measure
	// instead: tokens per second of prefill and decode, beside PyTorch's
	// forward of the same checkpoint (onModelDir). PromptTokens then
	// defaults to 512 (quick 128).
	ModelDir string
	// DecodeTokens is how many tokens are decoded after the prompt, with
	// ModelDir. Default 32; quick 8.
	DecodeTokens int
}

// EnsureDefaults fills zero fields with their defaults for a full run, or
// for --quick when quick is set.
func (o *PrefillOptions) EnsureDefaults(quick bool) {
	if o.ModelDir != "" && o.PromptTokens == 0 {
		o.PromptTokens = pick(quick, 512, 128)
	}
	if o.DecodeTokens == 0 {
		o.DecodeTokens = pick(quick, 32, 8)
	}
	if o.PromptTokens == 0 {
		o.PromptTokens = pick(quick, 8192, 2048)
	}
	if len(o.Fractions) == 0 {
		o.Fractions = []float64{0, 0.5, 0.9}
	}
	if o.Runs == 0 {
		o.Runs = pick(quick, 3, 1)
	}
	if o.SgemmSize == 0 {
		o.SgemmSize = pick(quick, 2048, 1024)
	}
	if o.SgemmRuns == 0 {
		o.SgemmRuns = 3
	}
	o.Config.EnsureDefaults()
}

// Validate names the first field that is out of range.
func (o *PrefillOptions) Validate() error {
	if err := o.Config.Validate(); err != nil {
		return err
	}
	if o.ModelDir != "" {
		if o.PromptTokens < 1 || o.DecodeTokens < 2 || o.Runs < 1 || o.Runs > 100 {
			return fmt.Errorf("bench: prefill: prompt tokens %d, decode tokens %d, runs %d: want ≥ 1, ≥ 2, 1..100", o.PromptTokens, o.DecodeTokens, o.Runs)
		}
		return nil
	}
	switch {
	case o.PromptTokens < 2*o.Config.BlockTokens || o.PromptTokens > o.Config.MaxContext:
		return fmt.Errorf("bench: prefill: prompt tokens %d is outside 2 blocks (%d)..max context (%d)",
			o.PromptTokens, 2*o.Config.BlockTokens, o.Config.MaxContext)
	case len(o.Fractions) == 0 || o.Fractions[0] != 0:
		return fmt.Errorf("bench: prefill: fractions %v must start with 0 (cold)", o.Fractions)
	case o.Runs < 1 || o.Runs > 100:
		return fmt.Errorf("bench: prefill: runs %d is outside 1..100", o.Runs)
	case o.SgemmSize < 64 || o.SgemmSize > 8192 || o.SgemmRuns < 1:
		return fmt.Errorf("bench: prefill: sgemm %d×%d runs is outside 64..8192, ≥ 1", o.SgemmSize, o.SgemmRuns)
	}
	for _, f := range o.Fractions {
		if f < 0 || f >= 1 {
			return fmt.Errorf("bench: prefill: fraction %v is outside [0, 1)", f)
		}
	}
	return nil
}

// PrefillSuite measures the time to first token of one prompt with the
// bundled engine (CPU backend), cold and with a fraction of it prefilled
// earlier by another engine that published its blocks to the shared cache,
// next to the arithmetic floor of that fraction and to gonum's Sgemm peak
// measured in the same run.
type PrefillSuite struct {
	Options PrefillOptions
}

// Name returns "prefill".
func (s *PrefillSuite) Name() string { return "prefill" }

// prefillRow is one cached fraction.
type prefillRow struct {
	Backend        string  `json:"backend"`
	PromptTokens   int     `json:"prompt_tokens"`
	CachedFraction float64 `json:"cached_fraction"`
	CachedTokens   int     `json:"cached_tokens"`
	TTFTMS         float64 `json:"ttft_ms"`
	// TTFTVsCold is the median TTFT over the cold one: the target's figure.
	TTFTVsCold float64 `json:"ttft_vs_cold"`
	// CPUVsCold is the process CPU time of the prefill (and of publishing
	// its new blocks) over the cold one's: the work done, which the
	// neighbours' load on a shared machine does not move.
	CPUVsCold float64 `json:"cpu_vs_cold" table:"wide"`
	// FLOPFloor is the arithmetic of this prefill over the cold one's
	// (prefill.Config.ForwardFLOPs): the best ratio any engine can reach.
	FLOPFloor float64 `json:"flop_floor"`
	// LookupMS, FetchMS and ComputeMS split the TTFT, where the engine
	// reports it (in process); EngineGFLOP is GFLOP over ComputeMS, or
	// over the whole TTFT without it.
	LookupMS    *float64 `json:"lookup_ms,omitempty" table:"-"`
	FetchMS     *float64 `json:"fetch_ms,omitempty" table:"wide"`
	ComputeMS   *float64 `json:"compute_ms,omitempty" table:"wide"`
	GFLOP       float64  `json:"gflop" table:"wide"`
	EngineGFLOP float64  `json:"engine_gflops" table:"wide"`
	Runs        int      `json:"runs" table:"-"`
}

// sgemmRow is the engine's ceiling.
type sgemmRow struct {
	SgemmN         int     `json:"sgemm_n"`
	SgemmGFLOPS    float64 `json:"sgemm_gflops"`
	EngineGFLOPS   float64 `json:"engine_gflops_cold"`
	EngineVsSgemm  float64 `json:"engine_vs_sgemm"`
	Backend        string  `json:"engine_backend"`
	ModelGFLOPCold float64 `json:"cold_gflop"`
}

// Run measures.
func (s *PrefillSuite) Run(ctx context.Context, env *Env) (*Result, error) {
	o := s.Options
	o.EnsureDefaults(env.Quick)
	if err := o.Validate(); err != nil {
		return nil, err
	}
	res := &Result{Suite: s.Name()}
	if o.ModelDir != "" {
		bar := env.Progress.Bar(int64(o.Runs+1), "prefill")
		defer bar.Finish()
		return res, s.onModelDir(ctx, o, res, bar)
	}
	bar := env.Progress.Bar(int64(o.Runs*(2*len(o.Fractions)-1)+len(o.Fractions)+1), "prefill")
	defer bar.Finish()
	var rows []prefillRow
	var desc string
	var err error
	if o.Device == nil && (env.Binary != "" || len(env.Addrs) > 0) {
		rows, desc, err = s.onNodes(ctx, env, o, res, bar)
		if errors.Is(err, client.ErrNoEngine) {
			res.Skip("prefill on kvmesh nodes", err)
			rows, err = nil, nil
		}
		if err != nil {
			return res, err
		}
	}
	if rows == nil {
		if rows, desc, err = s.inProcess(ctx, o, res, bar); err != nil {
			return res, err
		}
	}
	bar.Describe("prefill: sgemm peak")
	peak, peakOf := 0.0, "gonum's Sgemm peak measured in the same run (in the bench's process)"
	if o.Device != nil {
		peakOf = "the device's Sgemm (cuBLAS) alone, measured in the same run"
		if peak, err = prefill.DeviceSgemmPeak(ctx, o.Device, o.SgemmSize, o.SgemmRuns); err != nil {
			return res, err
		}
	} else {
		peak = prefill.SgemmPeak(ctx, o.SgemmSize, o.SgemmRuns)
	}
	bar.Add(1)
	if err := ctx.Err(); err != nil {
		return res, err
	}
	n := o.PromptTokens
	res.AddTable("prefill", fmt.Sprintf("time to first token of a %d-token prompt, the first fraction of it prefilled elsewhere earlier: %s", n, desc), rows)
	res.AddTable("sgemm", "the engine's cold prefill against "+peakOf,
		[]sgemmRow{{SgemmN: o.SgemmSize, SgemmGFLOPS: peak, EngineGFLOPS: rows[0].EngineGFLOP,
			EngineVsSgemm: rows[0].EngineGFLOP / max(peak, 1e-9), Backend: rows[0].Backend, ModelGFLOPCold: rows[0].GFLOP}})
	for _, r := range rows {
		if r.CachedFraction != 0.9 {
			continue
		}
		res.Checks = append(res.Checks,
			NewCheck(fmt.Sprintf("prefill: %d-token prompt, 90%% prefilled elsewhere", n), "ttft_vs_cold", r.TTFTVsCold, "<=", 0.15, BackendKvmesh))
		if r.CPUVsCold > 0 {
			res.Checks = append(res.Checks,
				NewCheck(fmt.Sprintf("prefill: %d-token prompt, 90%% prefilled elsewhere, work done", n), "cpu_vs_cold", r.CPUVsCold, "<=", 0.15, BackendKvmesh))
		}
	}
	if n != 8192 {
		res.Note("the prompt has %d tokens (the TTFT target is stated for 8192; --quick uses a shorter one)", n)
	}
	measured := Series{Name: "TTFT (median)"}
	floor := Series{Name: "cold TTFT × arithmetic floor", Dashed: true}
	for _, r := range rows {
		measured.X, measured.Y = append(measured.X, r.CachedFraction), append(measured.Y, r.TTFTMS)
		floor.X, floor.Y = append(floor.X, r.CachedFraction), append(floor.Y, rows[0].TTFTMS*r.FLOPFloor)
	}
	if err := SavePlot(env, res, "prefill_ttft_vs_cached_fraction",
		TTFTPlot(fmt.Sprintf("prefill of a %d-token prompt: TTFT vs cached fraction", n), measured, floor)); err != nil {
		return res, err
	}
	return res, nil
}

// prefillSample is one timed prefill.
type prefillSample struct {
	ttft, cpu              time.Duration
	lookup, fetch, compute time.Duration
	cachedTokens           int
	flops                  float64
}

// prefillRows reduces samples[i] (the runs of fraction i) to rows of
// medians, against the cold prefill's (fraction 0).
// With split, the samples carry the engine's split of the TTFT (lookup,
// fetch, compute); without, compute is the whole TTFT.
func prefillRows(backend string, split bool, cfg prefill.Config, n int, fractions []float64, samples [][]prefillSample) []prefillRow {
	median := func(f func(prefillSample) time.Duration, ss []prefillSample) time.Duration {
		var xs []time.Duration
		for _, s := range ss {
			xs = append(xs, f(s))
		}
		slices.Sort(xs)
		return xs[len(xs)/2]
	}
	ttft := func(s prefillSample) time.Duration { return s.ttft }
	cpu := func(s prefillSample) time.Duration { return s.cpu }
	ms := func(d time.Duration) float64 { return float64(d) / 1e6 }
	coldTTFT, coldCPU := median(ttft, samples[0]), median(cpu, samples[0])
	var rows []prefillRow
	for i, f := range fractions {
		ss := samples[i]
		last := ss[len(ss)-1]
		compute := median(func(s prefillSample) time.Duration { return s.compute }, ss)
		row := prefillRow{Backend: backend, PromptTokens: n, CachedFraction: f, CachedTokens: last.cachedTokens,
			TTFTMS: ms(median(ttft, ss)), TTFTVsCold: float64(median(ttft, ss)) / float64(max(coldTTFT, 1)),
			FLOPFloor: cfg.ForwardFLOPs(last.cachedTokens, n-last.cachedTokens) / cfg.ForwardFLOPs(0, n),
			GFLOP:     last.flops / 1e9, EngineGFLOP: last.flops / compute.Seconds() / 1e9, Runs: len(ss)}
		if split {
			lookup := ms(median(func(s prefillSample) time.Duration { return s.lookup }, ss))
			fetch := ms(median(func(s prefillSample) time.Duration { return s.fetch }, ss))
			comp := ms(compute)
			row.LookupMS, row.FetchMS, row.ComputeMS = &lookup, &fetch, &comp
		}
		if coldCPU > 0 {
			row.CPUVsCold = float64(median(cpu, ss)) / float64(coldCPU)
		}
		rows = append(rows, row)
	}
	return rows
}

// runOrder returns the order of the fractions in run number run: every
// other run goes from the most cached to cold, so that a single run does
// not charge first-use costs to the cold prefill.
func runOrder(run, fractions int) []int {
	order := make([]int, fractions)
	for j := range order {
		order[j] = j
		if run%2 == 0 {
			order[j] = fractions - 1 - j
		}
	}
	return order
}

// randomPrompt returns n tokens below vocab, seeded by seed.
func randomPrompt(seed uint64, n, vocab int) []uint32 {
	r := rand.New(rand.NewPCG(seed, 0x707265))
	p := make([]uint32, n)
	for j := range p {
		p[j] = uint32(r.IntN(vocab))
	}
	return p
}

// inProcess measures the engine in the bench's process: two engines over one
// store.Local, the producer prefilling the prefixes and publishing their
// blocks, the consumer measuring, as two nodes of a cluster would.
func (s *PrefillSuite) inProcess(ctx context.Context, o PrefillOptions, res *Result, bar Bar) ([]prefillRow, string, error) {
	cache, err := newLocalPrefillCache(int64(len(o.Fractions)+1) * int64(o.PromptTokens) * int64(o.Config.Layers*2*o.Config.KVDim()*4) * 2)
	if err != nil {
		return nil, "", err
	}
	defer cache.Close()
	w := prefill.SeededWeights(o.Config, 0)
	var backend prefill.Backend // the engine's default, the CPU
	if o.Device != nil {
		// Not closed: that would close the caller's device.
		if backend, err = prefill.NewDevice(o.Device, prefill.DeviceOptions{}); err != nil {
			return nil, "", err
		}
	}
	newEngine := func() (*prefill.Engine, error) {
		return prefill.New(cache, prefill.Options{Config: o.Config, Weights: w, Backend: backend, Logger: slog.New(slog.DiscardHandler)})
	}
	producer, err := newEngine()
	if err != nil {
		return nil, "", err
	}
	defer producer.Close()
	consumer, err := newEngine()
	if err != nil {
		return nil, "", err
	}
	defer consumer.Close()

	n, b := o.PromptTokens, o.Config.BlockTokens
	prompts := make([][]uint32, len(o.Fractions))
	for i := range prompts {
		prompts[i] = randomPrompt(uint64(i)+1, n, o.Config.Vocab)
	}
	for i, f := range o.Fractions[1:] {
		bar.Describe(fmt.Sprintf("prefill: producer prefills %.0f%%", 100*f))
		if prefix := prompts[i+1][:int(f*float64(n))/b*b]; len(prefix) > 0 {
			if _, err := producer.Prefill(ctx, prefix, "producer"); err != nil {
				return nil, "", err
			}
		}
		bar.Add(1)
	}
	if err := producer.Flush(ctx); err != nil {
		return nil, "", err
	}
	// From now on the cache keeps what it holds: every run of a prompt sees
	// the same hit, and the cold prompt stays cold.
	cache.frozen.Store(true)
	samples := make([][]prefillSample, len(o.Fractions))
	for run := range o.Runs {
		for _, i := range runOrder(run, len(o.Fractions)) {
			bar.Describe(fmt.Sprintf("prefill: %d tokens, %.0f%% cached, run %d", n, 100*o.Fractions[i], run+1))
			c0 := processCPU()
			r, err := consumer.Prefill(ctx, prompts[i], "consumer")
			if err != nil {
				return nil, "", err
			}
			if err := consumer.Flush(ctx); err != nil { // its publishing is part of its cost
				return nil, "", err
			}
			samples[i] = append(samples[i], prefillSample{ttft: r.TTFT, cpu: processCPU() - c0, lookup: r.Timing.Lookup,
				fetch: r.Timing.Fetch, compute: r.Timing.Compute, cachedTokens: r.Usage.CachedTokens, flops: r.FLOPs})
			bar.Add(1)
		}
		bar.Add(int64(len(o.Fractions) - 1)) // no fills between runs here
	}
	res.Note("backend %q: the engine runs in the bench's process over a store.Local (DRAM tier) shared with the engine that "+
		"prefilled the prefixes; the cache is frozen after those prefixes, so every run of a prompt sees the same hit; "+
		"cpu_vs_cold is the bench process's CPU time, publishing included.", backendInProcess)
	return prefillRows(backendInProcess, true, o.Config, n, o.Fractions, samples),
		fmt.Sprintf("by another engine in the same process over the same cache (%s model: %d layer(s), d=%d, %d heads of %d, %d KV head(s), FFN %d; %d-token blocks)",
			consumer.Backend(), o.Config.Layers, o.Config.Dim, o.Config.Heads, o.Config.HeadDim, o.Config.KVHeads, o.Config.FFNDim, b), nil
}

// backendInProcess names the in-process engine's rows.
const backendInProcess = "in-process engine + store.Local"

// localPrefillCache is prefill.Cache over a store.Local with a DRAM tier.
// Once frozen, Put stores nothing.
type localPrefillCache struct {
	l      *store.Local
	frozen atomic.Bool
}

var _ prefill.Cache = (*localPrefillCache)(nil)

func newLocalPrefillCache(capacity int64) (*localPrefillCache, error) {
	dram, err := tiers.NewDRAM(tiers.DRAMOptions{Capacity: max(capacity, 64<<20)})
	if err != nil {
		return nil, fmt.Errorf("bench: prefill cache: %w", err)
	}
	l, err := store.Open(store.Options{DRAM: dram})
	if err != nil {
		dram.Close()
		return nil, fmt.Errorf("bench: prefill cache: %w", err)
	}
	return &localPrefillCache{l: l}, nil
}

func (c *localPrefillCache) LongestPrefix(_ context.Context, keys []prefixhash.Key) (int, error) {
	return c.l.LongestPrefix(auth.Access{}, keys), nil
}

func (c *localPrefillCache) Get(ctx context.Context, keys []prefixhash.Key) ([][]byte, func(), error) {
	refs, err := c.l.GetMany(ctx, keys)
	if err != nil {
		return nil, nil, err
	}
	blocks := make([][]byte, len(refs))
	for i, r := range refs {
		if r != nil {
			blocks[i] = r.Bytes()
		}
	}
	return blocks, func() {
		for _, r := range refs {
			if r != nil {
				r.Release()
			}
		}
	}, nil
}

func (c *localPrefillCache) Put(ctx context.Context, _ []prefixhash.Key, _ int, blocks [][]byte) error {
	if c.frozen.Load() {
		return nil
	}
	return c.l.PutMany(ctx, blocks)
}

// Close closes the store (and its tier).
func (c *localPrefillCache) Close() error { return c.l.Close() }
