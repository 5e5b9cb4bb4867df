package prefill

import (
	"context"
	"fmt"
	"slices"
	"sync/atomic"

	"github.com/kvmesh/kvmesh/prefixhash"
)

// Proposers of speculative decoding (SpeculativeOptions.Method).
const (
	// SpeculateOff decodes one token per forward pass.
	SpeculateOff = "off"
	// SpeculateNgram is prompt lookup: the tokens that followed the most
	// recent earlier occurrence of the sequence's last n tokens (n from 4
	// down to 2) in the prompt or the text generated so far. No model; it
	// guesses right where an answer quotes its context (tool calls that
	// repeat a path or a snippet, code edits, JSON).
	SpeculateNgram = "ngram"
	// SpeculateDraft is a draft model: a smaller model of the same
	// tokenizer decodes the guesses one at a time, on its own K/V, which
	// it loads from and publishes to the cache under its own namespace.
	SpeculateDraft = "draft"
)

// Limits and defaults of SpeculativeOptions.
const (
	DefaultSpeculativeTokens = 4
	MaxSpeculativeTokens     = 16
)

// The n-grams prompt lookup matches, longest first. One token matches too
// often to guess well: a miss costs a wider verification for nothing.
const (
	ngramMax = 4
	ngramMin = 2
)

// SpeculativeOptions configure speculative decoding (Options.Speculative):
// a proposer guesses up to Tokens tokens after the sequence, the model
// verifies them in one forward pass over Tokens+1 positions, and the
// answer keeps the longest prefix of the guesses the model accepts, then
// one token of the model's own. The tokens generated are distributed as
// without speculation (greedy: the same tokens); only the cost changes.
type SpeculativeOptions struct {
	// Method is SpeculateOff, SpeculateNgram or SpeculateDraft. Default
	// SpeculateOff.
	Method string
	// Tokens is how many tokens the proposer guesses per step, K, in
	// 1..MaxSpeculativeTokens. Default DefaultSpeculativeTokens (4).
	Tokens int
	// Draft is the draft model of SpeculateDraft, loaded as the engine's
	// own model is (its Config, Weights, WeightsPath, ModelDir,
	// MaxModelBytes and Seed). Its vocabulary must be the model's; its
	// BlockTokens and MaxContext are the model's; it shares the engine's
	// cache, backend, tenant salt and publishing options, and its other
	// fields are ignored. Its blocks are cached under its own namespace.
	// Required with SpeculateDraft, refused with the others.
	Draft *Options
}

// EnsureDefaults fills zero fields with their defaults.
func (o *SpeculativeOptions) EnsureDefaults() {
	if o.Method == "" {
		o.Method = SpeculateOff
	}
	if o.Tokens == 0 {
		o.Tokens = DefaultSpeculativeTokens
	}
}

// Validate names the first bad field.
func (o SpeculativeOptions) Validate() error {
	switch o.Method {
	case SpeculateOff, SpeculateNgram, SpeculateDraft:
	default:
		return fmt.Errorf("%w: speculative.method: %q: want %s, %s or %s", ErrInvalidConfig, o.Method, SpeculateOff, SpeculateNgram, SpeculateDraft)
	}
	switch {
	case o.Tokens < 1 || o.Tokens > MaxSpeculativeTokens:
		return fmt.Errorf("%w: speculative.tokens: %d is outside 1..%d", ErrInvalidConfig, o.Tokens, MaxSpeculativeTokens)
	case o.Method == SpeculateDraft && o.Draft == nil:
		return fmt.Errorf("%w: speculative.draft: method %s needs a draft model", ErrInvalidConfig, SpeculateDraft)
	case o.Method != SpeculateDraft && o.Draft != nil:
		return fmt.Errorf("%w: speculative.draft: a draft model is given, but the method is %s", ErrInvalidConfig, o.Method)
	}
	return nil
}

// ErrDraft is wrapped by New's errors about a draft model that cannot
// propose for the engine's model (another vocabulary); the message names
// the difference.
var ErrDraft = fmt.Errorf("%w: speculative.draft", ErrInvalidConfig)

// newDraft loads the draft model of o, an engine of its own over the same
// cache, shaped for the model of cfg.
func newDraft(cache Cache, o Options, cfg Config) (*Engine, error) {
	d := *o.Speculative.Draft
	d.Config.BlockTokens, d.Config.MaxContext = cfg.BlockTokens, cfg.MaxContext
	d.Config.EnsureDefaults()
	if d.Config.Vocab != cfg.Vocab {
		return nil, fmt.Errorf("%w: its vocabulary has %d tokens, the model's %d: a draft must share the model's tokenizer and vocabulary", ErrDraft, d.Config.Vocab, cfg.Vocab)
	}
	d.TenantSalt, d.Backend, d.Logger, d.Now = o.TenantSalt, o.Backend, o.Logger, o.Now
	d.PublishQueue, d.PublishTimeout = o.PublishQueue, o.PublishTimeout
	d.Concurrency, d.BackgroundBlocks, d.BackgroundGrace = 1, o.BackgroundBlocks, o.BackgroundGrace
	d.Speculative = SpeculativeOptions{}
	e, err := New(cache, d)
	if err != nil {
		return nil, fmt.Errorf("prefill: speculative draft: %w", err)
	}
	return e, nil
}

// Speculative returns the engine's proposer (SpeculateOff, SpeculateNgram
// or SpeculateDraft) and how many tokens it guesses per step.
func (e *Engine) Speculative() (method string, tokens int) {
	return e.opts.Speculative.Method, e.opts.Speculative.Tokens
}

// DraftNamespace returns the namespace of the draft model's blocks, and
// false when the engine has no draft model.
func (e *Engine) DraftNamespace() (ns prefixhash.Namespace, ok bool) {
	if e.draft == nil {
		return prefixhash.Namespace{}, false
	}
	return e.draft.ns, true
}

// proposer guesses the tokens that follow a sequence, for one generation.
type proposer interface {
	// propose returns up to k tokens that may follow seq, and, when the
	// generation samples, the distribution (len vocab) each was drawn
	// from; a nil distribution is a guess made with certainty. The slices
	// are valid until the next call.
	propose(ctx context.Context, seq []uint32, k int) (drafts []uint32, q [][]float64, err error)
}

// speculation is one generation's proposer and the buffers of its
// verification steps.
type speculation struct {
	k     int
	prop  proposer
	draft *draftRun // prop, when it is a draft model; nil for prompt lookup
	feed  []uint32  // the last token and the guesses, fed to the model
	rows  []float32 // their logits, [k+1][vocab]
	out   []uint32
}

// speculation returns the speculation of a generation, or nil when it
// decodes one token per step.
func (e *Engine) speculation(ctx context.Context, prompt []uint32, opts GenerateOptions) *speculation {
	k := e.opts.Speculative.Tokens
	if opts.SpeculativeTokens != 0 {
		k = opts.SpeculativeTokens
	}
	if e.opts.Speculative.Method == SpeculateOff || k < 1 || opts.MaxTokens < 2 {
		if e.draft != nil && k >= 1 {
			// No guess is made, but the draft's prefix is still cached
			// for the decoding that follows (a router's prefill step).
			return &speculation{draft: e.newDraftRun(ctx, prompt, opts)}
		}
		return nil
	}
	sp := &speculation{k: k, rows: make([]float32, (k+1)*e.cfg.Vocab)}
	if e.draft != nil {
		sp.draft = e.newDraftRun(ctx, prompt, opts)
		sp.prop = sp.draft
	} else {
		sp.prop = &ngram{}
	}
	return sp
}

// close releases what the speculation holds.
func (sp *speculation) close() {
	if sp != nil && sp.draft != nil {
		sp.draft.close()
	}
}

// ngram is prompt lookup (SpeculateNgram).
type ngram struct{ buf []uint32 }

func (p *ngram) propose(_ context.Context, seq []uint32, k int) ([]uint32, [][]float64, error) {
	p.buf = lookup(p.buf[:0], seq, k)
	return p.buf, nil, nil
}

// lookup appends to dst up to k tokens to follow seq: those that followed
// the most recent earlier occurrence of seq's last n tokens, for the
// longest n from ngramMax down to ngramMin that occurs before. A match
// whose continuation runs into seq's end goes on with the tokens it has
// proposed, so that a repeating pattern repeats.
func lookup(dst, seq []uint32, k int) []uint32 {
	l := len(seq)
	for n := min(ngramMax, l-1); n >= ngramMin; n-- {
		tail := seq[l-n:]
		for j := l - n - 1; j >= 0; j-- {
			if seq[j] != tail[0] || !slices.Equal(seq[j:j+n], tail) {
				continue
			}
			base := len(dst)
			for i := range k {
				if at := j + n + i; at < l {
					dst = append(dst, seq[at])
				} else {
					dst = append(dst, dst[base+at-l])
				}
			}
			return dst
		}
	}
	return dst
}

// verify appends to dst the tokens one speculative step generates, given
// rows, the model's logits at the sequence's last token and at each of
// drafts ([len(drafts)+1][vocab]): the longest prefix of drafts the model
// accepts, then one token of its own, the correction at the first rejected
// position or, when every draft is accepted, the token after the last. It
// returns how many drafts were accepted.
//
// Greedy, a draft is accepted when it is the model's top token, so the
// tokens are those of decoding without speculation. Sampling, draft i,
// drawn from q[i] (nil: guessed with certainty), is accepted with
// probability min(1, p(d)/q(d)), p the distribution next draws from, and a
// rejection draws from max(p − q, 0) normalised: standard speculative
// sampling (Leviathan et al., Chen et al., 2023), under which every token
// is distributed as the model's alone.
func (s *sampler) verify(dst []uint32, rows []float32, vocab int, drafts []uint32, q [][]float64) (_ []uint32, accepted int) {
	for i, d := range drafts {
		row := rows[i*vocab : (i+1)*vocab]
		if s.temp == 0 {
			if t := topK(row, 1)[0]; t != d {
				return append(dst, t), i
			}
			dst = append(dst, d)
			continue
		}
		p := s.distribution(row)
		var qi []float64
		if q != nil {
			qi = q[i]
		}
		qd := 1.0
		if qi != nil {
			qd = qi[d]
		}
		if s.rng.Float64()*qd < p[d] {
			dst = append(dst, d)
			continue
		}
		for x, px := range p {
			switch {
			case qi != nil:
				p[x] = max(px-qi[x], 0)
			case uint32(x) == d:
				p[x] = 0
			}
		}
		t, ok := s.draw(p)
		if !ok { // p = q to rounding: nothing is left to draw from
			t = s.next(row)
		}
		return append(dst, t), i
	}
	return append(dst, s.next(rows[len(drafts)*vocab:])), len(drafts)
}

// distribution returns the distribution next draws from for logits:
// softmax(logits/T) cut to the top-p nucleus and normalised, len vocab,
// valid until the next call. Temperature > 0 only.
func (s *sampler) distribution(logits []float32) []float64 {
	if s.dist == nil {
		s.dist = make([]float64, len(logits))
	}
	keep, cum := s.nucleus(logits)
	clear(s.dist)
	for _, id := range s.ids[:keep] {
		s.dist[id] = s.p[id] / cum
	}
	return s.dist
}

// draw draws a token from w, weights that need not add up to 1; false
// when they add up to nothing.
func (s *sampler) draw(w []float64) (uint32, bool) {
	var total float64
	for _, x := range w {
		total += x
	}
	if !(total > 0) {
		return 0, false
	}
	u := s.rng.Float64() * total
	last := -1
	for id, x := range w {
		if x <= 0 {
			continue
		}
		if u < x {
			return uint32(id), true
		}
		u -= x
		last = id
	}
	return uint32(last), true
}

// sharedKV is a KV that a generation and the publisher's jobs read:
// whoever is done with it last returns it to its engine's pool.
type sharedKV struct {
	e    *Engine
	kv   *KV
	refs atomic.Int32
}

// newSharedKV returns kv shared, with one reference: the caller's.
func newSharedKV(e *Engine, kv *KV) *sharedKV {
	s := &sharedKV{e: e, kv: kv}
	s.refs.Store(1)
	return s
}

// share takes one more reference and returns its release.
func (s *sharedKV) share() func() {
	s.refs.Add(1)
	return s.release
}

// release drops one reference.
func (s *sharedKV) release() {
	if s.refs.Add(-1) == 0 {
		s.e.kvPool.Put(s.kv)
	}
}
