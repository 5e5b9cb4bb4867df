package bench

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/kvmesh/kvmesh/prefill"
)

// SpeculateOptions configure the speculate suite. Zero fields take the
// defaults documented on each, for a full run or for --quick.
type SpeculateOptions struct {
	// Config is the model decoded. Default 4 layers of d=1024 (8 heads, 2
	// KV heads, FFN 2816) over a vocabulary of 256 byte tokens, seeded
	// weights: 190 MB of float32 weights, which each decode step reads
	// once, as a real model's decode is bound by reading its weights.
	Config prefill.Config
	// DraftLayers is how many of the model's layers the draft model keeps:
	// the draft is the model's first DraftLayers layers under its
	// embeddings, final norm and LM head (a layer-skipping draft, the only
	// draft that agrees with seeded weights more often than chance).
	// Default 1.
	DraftLayers int
	// DeepScale scales the output projections (attention's O, the MLP's
	// down projection) of the model's layers past DraftLayers, so that
	// they refine what the first layers computed rather than overturn it,
	// as a trained model's deeper layers mostly do, and the draft agrees
	// with the model often but not always. 1 leaves the seeded weights
	// alone (the draft then agrees little more than chance). Default 0.3.
	DeepScale float64
	// Tokens is K, the tokens each proposer guesses per step. Default 4.
	Tokens int
	// PromptTokens is the prompt's length. Default 256; quick 64.
	PromptTokens int
	// DecodeTokens is how many tokens each generation decodes. Default
	// 128; quick 32.
	DecodeTokens int
	// Runs is how many prompts each workload decodes, each with and
	// without speculation; medians and spreads are over them. Default 3.
	Runs int
}

// EnsureDefaults fills zero fields with their defaults for a full run, or
// for --quick when quick is set.
func (o *SpeculateOptions) EnsureDefaults(quick bool) {
	if o.Config.Layers == 0 && o.Config.Dim == 0 {
		o.Config = prefill.Config{Layers: 4, Dim: 1024, Heads: 8, KVHeads: 2, HeadDim: 128, FFNDim: 2816, Vocab: 256, MaxContext: 4096}
	}
	o.Config.EnsureDefaults()
	if o.DraftLayers == 0 {
		o.DraftLayers = 1
	}
	if o.DeepScale == 0 {
		o.DeepScale = 0.3
	}
	if o.Tokens == 0 {
		o.Tokens = prefill.DefaultSpeculativeTokens
	}
	if o.PromptTokens == 0 {
		o.PromptTokens = pick(quick, 256, 64)
	}
	if o.DecodeTokens == 0 {
		o.DecodeTokens = pick(quick, 128, 32)
	}
	if o.Runs == 0 {
		o.Runs = 3
	}
}

// Validate names the first field that is out of range.
func (o *SpeculateOptions) Validate() error {
	if err := o.Config.Validate(); err != nil {
		return err
	}
	switch {
	case o.DraftLayers < 1 || o.DraftLayers > o.Config.Layers:
		return fmt.Errorf("bench: speculate: draft layers %d is outside 1..%d (the model's)", o.DraftLayers, o.Config.Layers)
	case !(o.DeepScale > 0 && o.DeepScale <= 1):
		return fmt.Errorf("bench: speculate: deep scale %g is outside (0, 1]", o.DeepScale)
	case o.Tokens < 1 || o.Tokens > prefill.MaxSpeculativeTokens:
		return fmt.Errorf("bench: speculate: tokens %d is outside 1..%d", o.Tokens, prefill.MaxSpeculativeTokens)
	case o.PromptTokens < 8 || o.DecodeTokens < 2 || o.PromptTokens+o.DecodeTokens > o.Config.MaxContext:
		return fmt.Errorf("bench: speculate: prompt %d and decode %d tokens: want ≥ 8, ≥ 2, within max context %d", o.PromptTokens, o.DecodeTokens, o.Config.MaxContext)
	case o.Runs < 1 || o.Runs > 100:
		return fmt.Errorf("bench: speculate: runs %d is outside 1..100", o.Runs)
	}
	return nil
}

// SpeculateSuite measures speculative decoding in the bundled engine (CPU
// backend, in the bench's process): the decode tokens per second of each
// proposer (prompt lookup, a draft model) against decoding without
// speculation, the same prompts in the same run, interleaved, and the share
// of guesses the model accepted. Greedy workloads also check that the
// tokens equal those without speculation.
type SpeculateSuite struct {
	Options SpeculateOptions
}

// Name returns "speculate".
func (s *SpeculateSuite) Name() string { return "speculate" }

func (*SpeculateSuite) notInAll() {}

// speculateRow is one proposer on one workload.
type speculateRow struct {
	Workload string `json:"workload"`
	Proposer string `json:"proposer"`
	K        int    `json:"k"`
	// DecodeTokS is the median decode tokens per second, Min and Max its
	// spread; PlainTokS the median without speculation, same prompts.
	DecodeTokS float64 `json:"decode_tok_s"`
	DecodeMin  float64 `json:"decode_tok_s_min"`
	DecodeMax  float64 `json:"decode_tok_s_max"`
	PlainTokS  float64 `json:"plain_tok_s"`
	// Speedup is the median over runs of DecodeTokS / PlainTokS of the same
	// prompt; SpeedupMin and SpeedupMax its spread.
	Speedup    float64 `json:"speedup"`
	SpeedupMin float64 `json:"speedup_min"`
	SpeedupMax float64 `json:"speedup_max"`
	// CPUSpeedup is the median over runs of the process CPU time of the
	// whole generation without speculation over with it: the work saved,
	// which the neighbours' load on a shared machine moves less than the
	// wall clock. It includes the prompt's prefill, the same for both.
	CPUSpeedup    float64 `json:"cpu_speedup"`
	CPUSpeedupMin float64 `json:"cpu_speedup_min"`
	CPUSpeedupMax float64 `json:"cpu_speedup_max"`
	// Acceptance is accepted over proposed guesses, all runs together;
	// TokensPerPass is the tokens generated per forward pass of the model.
	Acceptance    float64 `json:"acceptance"`
	TokensPerPass float64 `json:"tokens_per_pass"`
	Runs          int     `json:"runs"`
}

// speculateWorkload is a kind of request.
type speculateWorkload struct {
	name   string
	prompt func(seed uint64, n, vocab int) []uint32
	opts   prefill.GenerateOptions
}

// Run measures.
func (s *SpeculateSuite) Run(ctx context.Context, env *Env) (*Result, error) {
	o := s.Options
	o.EnsureDefaults(env.Quick)
	if err := o.Validate(); err != nil {
		return nil, err
	}
	res := &Result{Suite: s.Name()}
	cfg := o.Config
	w := prefill.SeededWeights(cfg, 1)
	for _, l := range w.Layers[o.DraftLayers:] {
		for _, m := range [][]float32{l.O, l.Down} {
			for i := range m {
				m[i] *= float32(o.DeepScale)
			}
		}
	}
	dcfg := cfg
	dcfg.Layers = o.DraftLayers
	dw := &prefill.Weights{Embed: w.Embed, Layers: w.Layers[:o.DraftLayers], Norm: w.Norm, LMHead: w.LMHead}
	logger := slog.New(slog.DiscardHandler)
	engines := map[string]*prefill.Engine{}
	for _, method := range []string{prefill.SpeculateOff, prefill.SpeculateNgram, prefill.SpeculateDraft} {
		spec := prefill.SpeculativeOptions{Method: method, Tokens: o.Tokens}
		if method == prefill.SpeculateDraft {
			spec.Draft = &prefill.Options{Config: dcfg, Weights: dw}
		}
		e, err := prefill.New(nil, prefill.Options{Config: cfg, Weights: w, Logger: logger, Speculative: spec})
		if err != nil {
			return nil, err
		}
		defer e.Close()
		engines[method] = e
	}
	res.Note("model: %d layers, d=%d, %d heads, %d KV heads, FFN %d, vocabulary %d, %d MiB of float32 weights (seeded); draft: its first %d layer(s), same embeddings and head; the output projections of the layers past the draft's scaled by %g",
		cfg.Layers, cfg.Dim, cfg.Heads, cfg.KVHeads, cfg.FFNDim, cfg.Vocab, cfg.WeightBytes(false)>>20, o.DraftLayers, o.DeepScale)
	workloads := []speculateWorkload{
		// Greedy decoding of seeded weights falls into loops that repeat
		// earlier text, the way a tool call quotes its context: prompt
		// lookup's case.
		{"greedy, prompt quotes itself", quotingPrompt, prefill.GenerateOptions{MaxTokens: o.DecodeTokens}},
		// Sampling at temperature 1 from seeded weights is close to
		// uniform: nothing repeats, every guess is a cost.
		{"sampled T=1, nothing repeats", randomPrompt, prefill.GenerateOptions{MaxTokens: o.DecodeTokens, Temperature: 1}},
	}
	bar := env.Progress.Bar(int64(len(workloads)*o.Runs), "speculate")
	defer bar.Finish()
	var rows []speculateRow
	for _, wl := range workloads {
		type figures struct {
			tokS, speedup, cpu []float64
			proposed, accepted int
			tokens, passes     int
		}
		by := map[string]*figures{}
		for run := range o.Runs {
			bar.Describe(fmt.Sprintf("speculate: %s, run %d", wl.name, run+1))
			prompt := wl.prompt(uint64(run)+1, o.PromptTokens, cfg.Vocab)
			opts := wl.opts
			opts.Seed = uint64(run) + 1
			var plain prefill.Generation
			var plainCPU time.Duration
			for _, method := range []string{prefill.SpeculateOff, prefill.SpeculateNgram, prefill.SpeculateDraft} {
				c0 := processCPU()
				g, err := engines[method].Generate(ctx, prompt, opts)
				if err != nil {
					return res, err
				}
				used := processCPU() - c0
				if method == prefill.SpeculateOff {
					plain, plainCPU = g, used
				} else if opts.Temperature == 0 && !slices.Equal(g.Tokens, plain.Tokens) {
					return res, fmt.Errorf("bench: speculate: %s, run %d: %s decoded other tokens than plain decoding", wl.name, run+1, method)
				}
				f := by[method]
				if f == nil {
					f = &figures{}
					by[method] = f
				}
				tokS := float64(g.CompletionTokens-1) / g.Decode.Seconds()
				f.tokS = append(f.tokS, tokS)
				f.speedup = append(f.speedup, tokS/(float64(plain.CompletionTokens-1)/plain.Decode.Seconds()))
				f.cpu = append(f.cpu, plainCPU.Seconds()/used.Seconds())
				f.proposed += g.Proposed
				f.accepted += g.Accepted
				f.tokens += g.CompletionTokens - 1
				// Each pass but the prompt's yields one token of the model's
				// own beside the guesses it accepted.
				f.passes += g.CompletionTokens - 1 - g.Accepted
			}
			bar.Add(1)
		}
		plainMed, _, _ := spread(by[prefill.SpeculateOff].tokS)
		for _, method := range []string{prefill.SpeculateOff, prefill.SpeculateNgram, prefill.SpeculateDraft} {
			f := by[method]
			r := speculateRow{Workload: wl.name, Proposer: method, PlainTokS: plainMed, Runs: o.Runs}
			if method != prefill.SpeculateOff {
				r.K = o.Tokens
			}
			r.DecodeTokS, r.DecodeMin, r.DecodeMax = spread(f.tokS)
			r.Speedup, r.SpeedupMin, r.SpeedupMax = spread(f.speedup)
			r.CPUSpeedup, r.CPUSpeedupMin, r.CPUSpeedupMax = spread(f.cpu)
			if f.proposed > 0 {
				r.Acceptance = float64(f.accepted) / float64(f.proposed)
			}
			r.TokensPerPass = float64(f.tokens) / float64(max(f.passes, 1))
			rows = append(rows, r)
		}
	}
	res.AddTable("speculate", fmt.Sprintf("decode tokens per second of %d tokens after a %d-token prompt, each proposer (K=%d) against plain decoding of the same prompt in the same run, one engine each, CPU backend",
		o.DecodeTokens, o.PromptTokens, o.Tokens), rows)
	for _, r := range rows {
		if r.Proposer == prefill.SpeculateNgram {
			target, what := 1.5, "decode speedup with prompt lookup where the answer repeats"
			if r.Workload != workloads[0].name {
				target, what = 0.95, "decode speed with prompt lookup where nothing repeats, over plain decoding"
			}
			// The wall clock is the target's figure; the CPU time is the
			// one a shared machine's load moves least.
			res.Checks = append(res.Checks, NewCheck("speculate: "+what, "speedup", r.Speedup, ">=", target, BackendKvmesh),
				NewCheck("speculate: "+what+", in CPU time", "cpu_speedup", r.CPUSpeedup, ">=", target, BackendKvmesh))
		}
	}
	return res, nil
}

// quotingPrompt returns n tokens of a prompt that quotes itself: runs of
// 1 to 6 random tokens, and copies of 4 to 12 tokens of what came before.
func quotingPrompt(seed uint64, n, vocab int) []uint32 {
	r := rand.New(rand.NewPCG(seed, 0x71756f7465)) // "quote"
	p := randomPrompt(seed, 16, vocab)
	for len(p) < n {
		if r.IntN(2) == 0 {
			at := r.IntN(len(p) - 4)
			p = append(p, p[at:min(at+4+r.IntN(9), len(p))]...)
		} else {
			p = append(p, randomPrompt(r.Uint64(), 1+r.IntN(6), vocab)...)
		}
	}
	return p[:n]
}
