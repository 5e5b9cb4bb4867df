package prefill

import (
	"context"
	"fmt"
	"slices"

	"github.com/kvmesh/kvmesh/prefixhash"
)

// draftRun is a draft model's side of one generation (SpeculateDraft): its
// own K/V of the sequence, loaded from the cache under the draft's
// namespace and published there, and the guesses it decodes one token at
// a time. Its K/V hold the tokens of fed: the sequence as far as the model
// confirmed it, then the guesses of the last step, which the next step
// cuts back to what the model accepted, so that the K/V of a rejected
// guess is overwritten and never published.
type draftRun struct {
	e, d       *Engine // the model's engine, the draft's
	sc         scope   // the draft's namespace, for the caller's tenant
	prompt     []uint32
	capTokens  int
	background bool

	started bool
	kv      *sharedKV
	keys    []prefixhash.Key // the prompt's chain in the draft's namespace
	loaded  int              // leading blocks of it loaded from the cache
	fed     []uint32         // the tokens whose K/V kv holds, from position 0
	final   int              // fed[:final] is confirmed by the sequence
	logits  []float32
	s       *sampler // the draft's own draws (a stream of their own)
	q       [][]float64
	drafts  []uint32
	steps   Timing // background waits, not reported
}

func (e *Engine) newDraftRun(ctx context.Context, prompt []uint32, opts GenerateOptions) *draftRun {
	return &draftRun{
		e: e, d: e.draft, sc: e.draft.scopeOf(ctx), prompt: prompt,
		capTokens:  len(prompt) + opts.MaxTokens - 1,
		background: opts.Background,
		logits:     make([]float32, e.cfg.Vocab),
		s:          newSamplerStream(opts, e.cfg.Vocab, draftStream),
	}
}

// start loads the prompt's cached prefix in the draft's namespace.
func (r *draftRun) start(ctx context.Context) error {
	var res Result
	keys, kv, loaded, err := r.d.load(ctx, r.sc, r.prompt, r.capTokens, &res)
	if err != nil {
		return err
	}
	r.started, r.keys, r.loaded, r.kv = true, keys, loaded, newSharedKV(r.d, kv)
	r.fed = append(r.fed[:0], r.prompt[:loaded*r.d.cfg.BlockTokens]...)
	return nil
}

// forward runs the draft model on positions [pos, pos+len(tokens)).
func (r *draftRun) forward(ctx context.Context, pos int, tokens []uint32) error {
	if r.background {
		return r.e.backgroundStep(ctx, r.d.model, r.kv.kv, pos, tokens, r.logits, &r.steps)
	}
	if err := r.d.model.Forward(ctx, r.kv.kv, pos, tokens, r.logits); err != nil {
		if ctx.Err() != nil {
			return r.e.ctxErr(ctx, "draft")
		}
		return fmt.Errorf("prefill: draft on %s: %w", r.d.backend, err)
	}
	return nil
}

// sync cuts fed back to what seq confirms and computes the rest of seq,
// so that r.logits are the draft's at seq's last token. The prompt's
// blocks are published once computed.
func (r *draftRun) sync(ctx context.Context, seq []uint32) error {
	if !r.started {
		if err := r.start(ctx); err != nil {
			return err
		}
	}
	c := r.final
	for c < len(r.fed) && c < len(seq) && r.fed[c] == seq[c] {
		c++
	}
	// The last token is computed even when a guess put it there already:
	// its logits are the next guess's.
	c = min(c, len(seq)-1)
	r.fed = append(r.fed[:c], seq[c:]...)
	r.final = len(seq)
	if err := r.forward(ctx, c, seq[c:]); err != nil {
		return err
	}
	if n := len(r.prompt); c < n { // the prompt was computed now: publish it
		r.d.publishShared(r.sc, r.kv.kv, r.kv.share(), r.prompt, r.keys, r.loaded)
	}
	return nil
}

func (r *draftRun) propose(ctx context.Context, seq []uint32, k int) ([]uint32, [][]float64, error) {
	if err := r.sync(ctx, seq); err != nil {
		return nil, nil, err
	}
	r.drafts, r.q = r.drafts[:0], r.q[:0]
	for i := range k {
		if i > 0 {
			last := r.drafts[i-1]
			if err := r.forward(ctx, len(r.fed), []uint32{last}); err != nil {
				return nil, nil, err
			}
			r.fed = append(r.fed, last)
		}
		if r.s.temp == 0 {
			r.drafts = append(r.drafts, topK(r.logits, 1)[0])
			continue
		}
		if len(r.q) == cap(r.q) {
			r.q = append(r.q, make([]float64, len(r.logits)))
		}
		r.q = r.q[:i+1]
		copy(r.q[i], r.s.distribution(r.logits))
		t, _ := r.s.draw(r.q[i])
		r.drafts = append(r.drafts, t)
	}
	if r.s.temp == 0 {
		return r.drafts, nil, nil
	}
	return r.drafts, r.q, nil
}

// finish publishes the draft's blocks of seq, the generation's final
// sequence: the full blocks of the tokens whose K/V it computed and seq
// confirms. A draft that guessed nothing (one token generated) computes
// the prompt now, so that the decoding that follows elsewhere finds it.
func (r *draftRun) finish(ctx context.Context, seq []uint32) error {
	if !r.started {
		if err := r.start(ctx); err != nil {
			return err
		}
		if c := len(r.fed); c < len(r.prompt) {
			if err := r.forward(ctx, c, r.prompt[c:]); err != nil {
				return err
			}
			r.fed = append(r.fed, r.prompt[c:]...)
			r.d.publishShared(r.sc, r.kv.kv, r.kv.share(), r.prompt, r.keys, r.loaded)
		}
	}
	c := r.final
	for c < len(r.fed) && c < len(seq) && r.fed[c] == seq[c] {
		c++
	}
	b := r.d.cfg.BlockTokens
	if full := c / b; r.d.cache != nil && full > len(r.keys) {
		all := prefixhash.AppendKeys(slices.Clip(r.keys), lastKey(r.sc.ns, r.keys), b, seq[len(r.keys)*b:full*b])
		r.d.publishShared(r.sc, r.kv.kv, r.kv.share(), seq[:full*b], all, len(r.keys))
	}
	return nil
}

// close drops the run's reference to its K/V.
func (r *draftRun) close() {
	if r.kv != nil {
		r.kv.release()
		r.kv = nil
	}
}

// prefillDraft computes and publishes the draft model's K/V of a prompt
// that was prefilled without decoding, so that a decoding that follows,
// here or on another node, finds the draft's prefix cached as well as the
// model's. A failure costs that decoding compute, and is only logged.
func (e *Engine) prefillDraft(ctx context.Context, tokens []uint32, background bool) {
	r := e.newDraftRun(ctx, tokens, GenerateOptions{MaxTokens: 1, Background: background})
	defer r.close()
	if err := r.finish(ctx, tokens); err != nil {
		e.opts.Logger.Debug("prefill: the draft's blocks are not published", "err", err)
	}
}
