package prefill

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/kvmesh/kvmesh/prefixhash"
)

// Finish reasons of a Generation, in OpenAI's words.
const (
	// FinishStop: the model generated one of the stop sequences (which is
	// not part of Generation.Tokens).
	FinishStop = "stop"
	// FinishLength: MaxTokens tokens were generated.
	FinishLength = "length"
)

// Limits of GenerateOptions.
const (
	// MaxStops is the most stop sequences a generation takes (the API allows
	// 4 of the caller's, to which a server adds end-of-turn tokens).
	MaxStops = 8
	// MaxStopTokens is the longest stop sequence, in tokens.
	MaxStopTokens = 256
	// MaxTemperature is the highest sampling temperature (OpenAI's 2).
	MaxTemperature = 2
)

// GenerateOptions say how Generate decodes after the prompt.
type GenerateOptions struct {
	// MaxTokens is the most tokens to generate, ≥ 1. The prompt and them
	// must fit the context: len(prompt)+MaxTokens ≤ Config.MaxContext.
	MaxTokens int
	// Temperature 0 decodes greedily (the highest logit, ties to the lower
	// id); above 0 (at most MaxTemperature) samples from softmax(logits/T).
	Temperature float64
	// TopP samples from the smallest set of most probable tokens whose
	// probabilities add up to TopP, in (0, 1]. 0 reads as 1. Ignored when
	// Temperature is 0.
	TopP float64
	// Seed seeds sampling: the same prompt, options and seed generate the
	// same tokens, wherever the prompt's prefix came from.
	Seed uint64
	// Stop are token sequences that end the generation when generated
	// (token-level: a sequence matches the generated tokens exactly). At
	// most MaxStops sequences, each 1..MaxStopTokens tokens.
	Stop [][]uint32
	// Session is the session hint, recorded and never used for lookups.
	Session string
	// Emit, when set, receives the generated tokens as they become final,
	// in order, once each: tokens that could still be the start of a stop
	// sequence are held back until they cannot. The slice is valid during
	// the call only. Emit runs on the engine's slot: a slow Emit delays
	// other requests, so it should only hand the tokens to a writer. An
	// error from it ends the generation with that error.
	Emit func(tokens []uint32) error
	// Background makes the generation queued work, as PrefillBackground's:
	// it computes only while no foreground prefill or generation (or Hold)
	// is active, on the background's slots, its prompt in chunks of
	// Options.BackgroundBlocks blocks and then one decode step at a time. A
	// foreground request that arrives preempts it at once: the chunk or
	// step in flight stops at the forward pass's next check and is
	// computed again once the foreground has been idle for
	// Options.BackgroundGrace; tokens already generated are kept. The
	// tokens are those of a foreground Generate with the same prompt and
	// options. Default false: a foreground generation.
	Background bool
	// SpeculativeTokens overrides, for this generation, how many tokens
	// the engine's proposer guesses per step (Options.Speculative):
	// 0 keeps the engine's, a negative value decodes one token per step,
	// 1..MaxSpeculativeTokens guesses that many. It has no effect on an
	// engine without a proposer.
	SpeculativeTokens int
}

// Generation is the outcome of Generate.
type Generation struct {
	// Tokens are the generated tokens, without the stop sequence that
	// ended them, if any.
	Tokens []uint32
	// Finish is FinishStop or FinishLength.
	Finish string
	// Usage of the prompt: its length and how many leading positions came
	// from the cache (as Prefill's).
	Usage Usage
	// CompletionTokens is the number of tokens sampled, the stop sequence
	// included.
	CompletionTokens int
	// Prefill is the prompt's time to logits (Result.TTFT) and Timing its
	// parts.
	Prefill time.Duration
	Timing  Timing
	// TTFT is the time from the call to the first generated token.
	TTFT time.Duration
	// Decode is the time from the first generated token to the last.
	Decode time.Duration
	// Session is the hint the caller passed.
	Session string
	// Speculative is the proposer that guessed tokens for this generation
	// (SpeculateNgram or SpeculateDraft), or "" when none did. Proposed
	// counts its guesses and Accepted those the model accepted: each is
	// one of Tokens (or of the stop sequence), the others were decoded by
	// the model itself. CompletionTokens counts them all, once.
	Speculative        string
	Proposed, Accepted int
}

// Cached returns how many leading positions of tokens a prefill would not
// compute if it ran now: the cached full blocks (one LongestPrefix under
// ctx's tenant, as Prefill asks), at most len(tokens)−1. An error or a
// cache-less engine reads as 0. Routers weigh a prompt by what is left.
func (e *Engine) Cached(ctx context.Context, tokens []uint32) int {
	if len(tokens) == 0 {
		return 0
	}
	keys := prefixhash.Keys(e.scopeOf(ctx).ns, tokens)
	return min(e.lookup(ctx, keys)*e.cfg.BlockTokens, len(tokens)-1)
}

// CheckGenerate returns nil when Generate would accept prompt and opts,
// else an error wrapping ErrInvalidInput that names the problem. Servers
// check a request with it before they commit to an answer (a stream's
// status line).
func (e *Engine) CheckGenerate(prompt []uint32, opts GenerateOptions) error {
	if opts.TopP == 0 {
		opts.TopP = 1
	}
	if err := e.checkInput(prompt); err != nil {
		return err
	}
	return e.checkGenerate(len(prompt), &opts)
}

// checkGenerate names the first bad option for a prompt of n tokens.
func (e *Engine) checkGenerate(n int, o *GenerateOptions) error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: %s", ErrInvalidInput, fmt.Sprintf(format, args...))
	}
	switch {
	case o.MaxTokens < 1:
		return bad("max_tokens: %d must be at least 1", o.MaxTokens)
	case n+o.MaxTokens > e.cfg.MaxContext:
		return bad("max_tokens: the prompt's %d tokens and %d more exceed the context of %d tokens", n, o.MaxTokens, e.cfg.MaxContext)
	case math.IsNaN(o.Temperature) || o.Temperature < 0 || o.Temperature > MaxTemperature:
		return bad("temperature: %g is outside 0..%d", o.Temperature, MaxTemperature)
	case math.IsNaN(o.TopP) || o.TopP < 0 || o.TopP > 1:
		return bad("top_p: %g is outside (0, 1]", o.TopP)
	case len(o.Stop) > MaxStops:
		return bad("stop: %d sequences, at most %d", len(o.Stop), MaxStops)
	case o.SpeculativeTokens > MaxSpeculativeTokens:
		return bad("speculative_tokens: %d is over %d", o.SpeculativeTokens, MaxSpeculativeTokens)
	}
	for i, s := range o.Stop {
		if len(s) == 0 || len(s) > MaxStopTokens {
			return bad("stop[%d]: %d tokens, want 1..%d", i, len(s), MaxStopTokens)
		}
	}
	return nil
}

// Generate runs prompt like Prefill (longest cached prefix, only the rest
// computed, new blocks published) and then decodes: one token at a time,
// each sampled from the last position's logits and fed back as the next
// position, its K/V appended to the prompt's. It stops after
// opts.MaxTokens tokens or at a stop sequence. The prompt's blocks are
// published as soon as it is computed; once decoding ends, the full blocks
// of prompt and generated tokens together (those whose K/V were computed:
// every token but the last) are published too, so that the next turn of a
// conversation hits them.
//
// The tokens depend only on the prompt, the options and the weights: a
// prefix hit changes the cost, not the answer. Generate holds one of the
// engine's slots (Options.Concurrency) from the prefill to its last token.
// Errors: ErrInvalidInput for a bad prompt or option, ErrClosed, ctx's
// error, or Emit's.
func (e *Engine) Generate(ctx context.Context, prompt []uint32, opts GenerateOptions) (Generation, error) {
	began := e.opts.Now()
	if opts.TopP == 0 {
		opts.TopP = 1
	}
	if err := e.checkGenerate(len(prompt), &opts); err != nil {
		e.stats.failed.Add(1)
		return Generation{}, err
	}
	g, res, err := e.generate(ctx, began, prompt, opts)
	if _, err := e.account(res, err, opts.Background); err != nil {
		return Generation{}, err
	}
	e.stats.generations.Add(1)
	e.stats.generated.Add(int64(g.CompletionTokens))
	e.stats.proposed.Add(int64(g.Proposed))
	e.stats.accepted.Add(int64(g.Accepted))
	return g, nil
}

func (e *Engine) generate(ctx context.Context, began time.Time, prompt []uint32, opts GenerateOptions) (Generation, Result, error) {
	ctx, end, err := e.begin(ctx, prompt)
	if err != nil {
		return Generation{}, Result{}, err
	}
	defer end()
	if !opts.Background {
		e.sched.enter()
		defer e.sched.exit()
		select {
		case e.slots <- struct{}{}:
		case <-ctx.Done():
			return Generation{}, Result{}, e.ctxErr(ctx, "waiting for a slot")
		}
		defer func() { <-e.slots }()
	}

	n := len(prompt)
	b := e.cfg.BlockTokens
	res := Result{Session: opts.Session, Usage: Usage{PromptTokens: n}}
	res.Timing.Wait = e.opts.Now().Sub(began)
	sc := e.scopeOf(ctx)
	// The last generated token is never fed back: its K/V are not needed.
	keys, kv, loaded, err := e.load(ctx, sc, prompt, n+opts.MaxTokens-1, &res)
	if err != nil {
		return Generation{}, Result{}, err
	}
	// kv is shared by this call and the publisher's jobs: whoever is done
	// with it last pools it.
	shared := newSharedKV(e, kv)
	defer shared.release()

	t2 := e.opts.Now()
	start := min(loaded*b, n-1)
	logits := make([]float32, e.cfg.Vocab)
	if opts.Background {
		chunk := e.opts.BackgroundBlocks * b
		for pos := start; pos < n; pos = min(pos+chunk, n) {
			if err := e.backgroundStep(ctx, e.model, kv, pos, prompt[pos:min(pos+chunk, n)], logits, &res.Timing); err != nil {
				return Generation{}, Result{}, err
			}
		}
	} else if err := e.model.Forward(ctx, kv, start, prompt[start:], logits); err != nil {
		if ctx.Err() != nil {
			return Generation{}, Result{}, e.ctxErr(ctx, "forward")
		}
		return Generation{}, Result{}, fmt.Errorf("prefill: forward on %s: %w", e.backend, err)
	}
	t3 := e.opts.Now()
	if !opts.Background {
		res.Timing.Compute = t3.Sub(t2)
	}
	res.TTFT = t3.Sub(began)
	res.Usage.CachedTokens = start
	res.FLOPs = e.cfg.ForwardFLOPs(start, n-start)
	e.publishShared(sc, kv, shared.share(), prompt, keys, loaded)

	g := Generation{Usage: res.Usage, Prefill: res.TTFT, Timing: res.Timing, Session: opts.Session, Finish: FinishLength}
	s := newSampler(opts, e.cfg.Vocab)
	seq := make([]uint32, n, n+opts.MaxTokens)
	copy(seq, prompt)
	emitted := 0 // generated tokens handed to Emit
	emit := func(upTo int) error {
		if opts.Emit == nil || upTo <= emitted {
			return nil
		}
		err := opts.Emit(seq[n+emitted : n+upTo])
		emitted = upTo
		return err
	}
	stopLen := 0
	// push appends a generated token and says whether the generation ends
	// with it.
	push := func(t uint32) bool {
		seq = append(seq, t)
		gen := seq[n:]
		if len(gen) == 1 {
			g.TTFT = e.opts.Now().Sub(began)
		}
		if stopLen = stopMatch(gen, opts.Stop); stopLen > 0 {
			g.Finish = FinishStop
			return true
		}
		return len(gen) == opts.MaxTokens
	}
	sp := e.speculation(ctx, prompt, opts)
	defer sp.close()
	var steps Timing // a background generation's decode waits, not the prompt's
	for done := push(s.next(logits)); !done; {
		gen := seq[n:]
		if err := emit(len(gen) - heldBack(gen, opts.Stop)); err != nil {
			return Generation{}, Result{}, err
		}
		feed, rows := seq[len(seq)-1:], logits
		var drafts []uint32
		var q [][]float64
		if sp != nil && sp.prop != nil {
			// Guesses the model's next token would follow, never past
			// MaxTokens: their K/V must fit.
			if k := min(sp.k, opts.MaxTokens-len(gen)-1); k > 0 {
				if drafts, q, err = sp.prop.propose(ctx, seq, k); err != nil {
					return Generation{}, Result{}, err
				}
			}
			sp.feed = append(append(sp.feed[:0], feed...), drafts...)
			feed, rows = sp.feed, sp.rows[:len(sp.feed)*e.cfg.Vocab]
		}
		if opts.Background {
			if err := e.backgroundStep(ctx, e.model, kv, len(seq)-1, feed, rows, &steps); err != nil {
				return Generation{}, Result{}, err
			}
		} else if err := e.model.Forward(ctx, kv, len(seq)-1, feed, rows); err != nil {
			if ctx.Err() != nil {
				return Generation{}, Result{}, e.ctxErr(ctx, "decode")
			}
			return Generation{}, Result{}, fmt.Errorf("prefill: decode on %s: %w", e.backend, err)
		}
		if len(drafts) == 0 {
			done = push(s.next(rows))
			continue
		}
		var accepted int
		sp.out, accepted = s.verify(sp.out[:0], rows, e.cfg.Vocab, drafts, q)
		g.Proposed += len(drafts)
		for i, t := range sp.out {
			if i < accepted {
				g.Accepted++
			}
			if done = push(t); done {
				break
			}
		}
	}
	gen := seq[n:]
	g.CompletionTokens = len(gen)
	g.Tokens = slices.Clone(gen[:len(gen)-stopLen])
	if err := emit(len(g.Tokens)); err != nil {
		return Generation{}, Result{}, err
	}
	g.Decode = e.opts.Now().Sub(began) - g.TTFT
	// K/V exist for every position but the last sampled one.
	if full := (len(seq) - 1) / b; e.cache != nil && full > len(keys) {
		all := prefixhash.AppendKeys(slices.Clip(keys), lastKey(sc.ns, keys), b, seq[len(keys)*b:full*b])
		e.publishShared(sc, kv, shared.share(), seq[:full*b], all, len(keys))
	}
	if sp != nil && sp.draft != nil {
		if err := sp.draft.finish(ctx, seq); err != nil {
			e.opts.Logger.Debug("prefill: the draft's blocks are not published", "err", err)
		}
	}
	if sp != nil && sp.prop != nil {
		g.Speculative = e.opts.Speculative.Method
	}
	return g, res, nil
}

// backgroundStep computes positions [pos, pos+len(tokens)) of a background
// generation on m (the engine's model, or its draft's) as a background
// chunk: once no foreground request is active, again each time one
// preempts it.
func (e *Engine) backgroundStep(ctx context.Context, m Model, kv *KV, pos int, tokens []uint32, logits []float32, timing *Timing) error {
	for {
		preempted, err := e.backgroundChunk(ctx, m, kv, pos, tokens, logits, timing, e.opts.Now())
		if err != nil {
			return err
		}
		if !preempted {
			return nil
		}
		e.stats.preempted.Add(1)
	}
}

// lastKey returns the parent of the block after keys: the chain's last key,
// or the namespace's root for an empty chain.
func lastKey(ns prefixhash.Namespace, keys []prefixhash.Key) prefixhash.Key {
	if len(keys) == 0 {
		return ns.Root()
	}
	return keys[len(keys)-1]
}

// stopMatch returns the length of the stop sequence gen ends with, or 0.
func stopMatch(gen []uint32, stops [][]uint32) int {
	for _, s := range stops {
		if len(s) <= len(gen) && slices.Equal(gen[len(gen)-len(s):], s) {
			return len(s)
		}
	}
	return 0
}

// heldBack returns how many tokens at the end of gen must wait before they
// are emitted: the longest tail of gen that is a proper prefix of a stop
// sequence.
func heldBack(gen []uint32, stops [][]uint32) int {
	held := 0
	for _, s := range stops {
		for k := min(len(s)-1, len(gen)); k > held; k-- {
			if slices.Equal(gen[len(gen)-k:], s[:k]) {
				held = k
				break
			}
		}
	}
	return held
}

// sampler picks the next token from logits: greedily at temperature 0,
// else from the top-p nucleus of softmax(logits/T) with its own seeded
// generator, so that a seed fixes the tokens.
type sampler struct {
	temp, topP float64
	rng        *rand.Rand
	ids        []int
	p          []float64
	dist       []float64 // distribution's, made on first use
}

// Streams of the samplers' generators: the target's, and a draft model's
// (speculation), so that the draft's draws never shift the target's.
const (
	targetStream = 0x6b766d657368 // "kvmesh"
	draftStream  = 0x6472616674   // "draft"
)

func newSampler(o GenerateOptions, vocab int) *sampler {
	return newSamplerStream(o, vocab, targetStream)
}

func newSamplerStream(o GenerateOptions, vocab int, stream uint64) *sampler {
	s := &sampler{temp: o.Temperature, topP: o.TopP}
	if s.temp > 0 {
		s.rng = rand.New(rand.NewPCG(o.Seed, stream))
		s.ids = make([]int, vocab)
		s.p = make([]float64, vocab)
	}
	return s
}

func (s *sampler) next(logits []float32) uint32 {
	if s.temp == 0 {
		return topK(logits, 1)[0]
	}
	keep, cum := s.nucleus(logits)
	u := s.rng.Float64() * cum
	var acc float64
	for _, id := range s.ids[:keep] {
		acc += s.p[id]
		if u < acc {
			return uint32(id)
		}
	}
	return uint32(s.ids[keep-1])
}

// nucleus fills s.p with the unnormalised probabilities exp((logit −
// max)/T) and s.ids with the token ids, most probable first, and returns
// how many of them make the top-p nucleus and their total. Temperature >
// 0 only.
func (s *sampler) nucleus(logits []float32) (keep int, cum float64) {
	mx := math.Inf(-1)
	for _, v := range logits {
		mx = max(mx, float64(v))
	}
	for i, v := range logits {
		s.ids[i] = i
		s.p[i] = math.Exp((float64(v) - mx) / s.temp)
	}
	// Most probable first, ties to the lower id: the order, and so the
	// token a draw picks, does not depend on the sort's stability.
	slices.SortFunc(s.ids, func(a, b int) int {
		switch {
		case s.p[a] > s.p[b]:
			return -1
		case s.p[a] < s.p[b]:
			return 1
		}
		return a - b
	})
	var total float64
	for _, id := range s.ids {
		total += s.p[id]
	}
	keep = len(s.ids)
	for i, id := range s.ids {
		cum += s.p[id]
		if cum >= s.topP*total {
			keep = i + 1
			break
		}
	}
	return keep, cum
}
