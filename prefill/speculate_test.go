package prefill

import (
	"context"
	"errors"
	"math"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/kvmesh/kvmesh/prefixhash"
)

// nearWeights returns the weights of c drawn from seed, plus eps times
// another draw: a draft that agrees with them often, not always.
func nearWeights(c Config, seed uint64, eps float32) *Weights {
	w := SeededWeights(c, seed)
	noise := SeededWeights(c, seed+1000)
	wt, nt := c.tensors(w), c.tensors(noise)
	for i := range wt {
		for j := range *wt[i].data {
			(*wt[i].data)[j] += eps * (*nt[i].data)[j]
		}
	}
	return w
}

var tinyDraftWeights = sync.OnceValue(func() *Weights { return nearWeights(tinyConfig(), 7, 0.15) })

// speculating returns an engine over cache that speculates with method
// (the draft: tinyConfig's weights, perturbed) and k tokens.
func speculating(t testing.TB, cache Cache, method string, k int) *Engine {
	return newTinyEngine(t, cache, func(o *Options) {
		o.Speculative = SpeculativeOptions{Method: method, Tokens: k}
		if method == SpeculateDraft {
			o.Speculative.Draft = &Options{Config: tinyConfig(), Weights: tinyDraftWeights()}
		}
	})
}

// repetitive returns a prompt that quotes itself: random runs, some of
// them repeated, so that prompt lookup finds n-grams to propose.
func repetitive(seed uint64, n, vocab int) []uint32 {
	r := newRand(seed)
	p := randTokens(r, 24, vocab)
	for len(p) < n {
		if r.IntN(2) == 0 {
			at := r.IntN(len(p) - 8)
			p = append(p, p[at:at+4+r.IntN(5)]...)
		} else {
			p = append(p, randTokens(r, 1+r.IntN(6), vocab)...)
		}
	}
	return p[:n]
}

// TestSpeculationGreedyEqualsPlain: at temperature 0, an engine that
// speculates, with either proposer and every K from 1 to 8, generates the
// tokens an engine that does not generates, on prompts that quote
// themselves and on random ones, cold and over a cached prefix (its own
// and, for the draft, the draft's); both accepting and rejecting happen.
func TestSpeculationGreedyEqualsPlain(t *testing.T) {
	plain := newTinyEngine(t, nil, nil)
	vocab := tinyConfig().Vocab
	prompts := [][]uint32{repetitive(1, 90, vocab), repetitive(2, 41, vocab), randTokens(newRand(3), 70, vocab)}
	opts := GenerateOptions{MaxTokens: 40}
	want := make([][]uint32, len(prompts))
	for i, p := range prompts {
		want[i] = generate(t, plain, p, opts).Tokens
	}
	for _, method := range []string{SpeculateNgram, SpeculateDraft} {
		var proposed, accepted int
		for k := 1; k <= 8; k++ {
			cache := newMemCache()
			e := speculating(t, cache, method, k)
			for i, p := range prompts {
				// Cold, then with the prompt's blocks (and the first
				// answer's) cached.
				for pass := range 2 {
					g := generate(t, e, p, opts)
					if !slices.Equal(g.Tokens, want[i]) {
						t.Fatalf("%s, K=%d, prompt %d, pass %d: tokens\n%v\nwithout speculation\n%v", method, k, i, pass, g.Tokens, want[i])
					}
					if pass == 1 && g.Usage.CachedTokens == 0 {
						t.Errorf("%s, K=%d, prompt %d: nothing cached the second time", method, k, i)
					}
					if g.Speculative != method || g.Accepted > g.Proposed || g.CompletionTokens != len(want[i]) {
						t.Errorf("%s, K=%d: speculative %q, proposed %d, accepted %d, completion %d", method, k, g.Speculative, g.Proposed, g.Accepted, g.CompletionTokens)
					}
					proposed += g.Proposed
					accepted += g.Accepted
					flush(t, e)
				}
			}
			if s := e.Stats(); s.Proposed == 0 || s.Accepted > s.Proposed {
				t.Errorf("%s, K=%d: stats proposed %d, accepted %d", method, k, s.Proposed, s.Accepted)
			}
		}
		t.Logf("%s: %d of %d proposed tokens accepted", method, accepted, proposed)
		if accepted == 0 || accepted == proposed {
			t.Errorf("%s: %d of %d proposed tokens accepted: both paths must run", method, accepted, proposed)
		}
	}
}

// startsModel records where each forward pass starts.
type startsModel struct {
	Model
	mu     sync.Mutex
	starts []int
}

func (m *startsModel) Forward(ctx context.Context, kv *KV, start int, tokens []uint32, logits []float32) error {
	m.mu.Lock()
	m.starts = append(m.starts, start)
	m.mu.Unlock()
	return m.Model.Forward(ctx, kv, start, tokens, logits)
}

// cachedBlocks returns how many leading blocks of tokens' chain in ns are
// in cache.
func cachedBlocks(cache *memCache, ns prefixhash.Namespace, tokens []uint32) int {
	n, _ := cache.LongestPrefix(context.Background(), prefixhash.Keys(ns, tokens))
	return n
}

// TestSpeculationDraftCached: the draft model's blocks are published under
// a namespace of its own, the conversation's as the model's are, and a
// second engine's draft (another node's) loads them instead of computing
// them.
func TestSpeculationDraftCached(t *testing.T) {
	cache := newMemCache()
	e := speculating(t, cache, SpeculateDraft, 4)
	prompt := repetitive(5, 100, tinyConfig().Vocab)
	g := generate(t, e, prompt, GenerateOptions{MaxTokens: 20})
	flush(t, e)
	dns, ok := e.DraftNamespace()
	if !ok || dns.Digest() == e.Namespace().Digest() {
		t.Fatalf("draft namespace %v (%v), the model's %v", dns, ok, e.Namespace())
	}
	b := tinyConfig().BlockTokens
	seq := append(slices.Clone(prompt), g.Tokens...)
	full := (len(seq) - 1) / b // the last token's K/V are never computed
	if got := cachedBlocks(cache, e.Namespace(), seq); got != full {
		t.Errorf("model: %d blocks cached, want %d", got, full)
	}
	if got := cachedBlocks(cache, dns, seq); got != full {
		t.Errorf("draft: %d blocks cached, want %d", got, full)
	}
	e2 := speculating(t, cache, SpeculateDraft, 4)
	m := &startsModel{Model: e2.draft.model}
	e2.draft.model = m
	g2 := generate(t, e2, prompt, GenerateOptions{MaxTokens: 20})
	if !slices.Equal(g2.Tokens, g.Tokens) {
		t.Fatalf("tokens %v, first engine's %v", g2.Tokens, g.Tokens)
	}
	if len(m.starts) == 0 || m.starts[0] != len(prompt)/b*b {
		t.Errorf("the second draft's passes start at %v, want first at %d (the prompt's cached blocks)", m.starts, len(prompt)/b*b)
	}
}

// TestSpeculationDraftPrefilled: a prompt computed without decoding —
// a generation of one token (a router's prefill step), a prefill, a
// queued prefill — guesses nothing and still publishes the draft's
// blocks of the prompt, for the decoding that follows.
func TestSpeculationDraftPrefilled(t *testing.T) {
	ctx := context.Background()
	for i, how := range []string{"generate one token", "prefill", "background prefill"} {
		cache := newMemCache()
		e := speculating(t, cache, SpeculateDraft, 4)
		prompt := repetitive(uint64(10+i), 70, tinyConfig().Vocab)
		var err error
		switch i {
		case 0:
			var g Generation
			g, err = e.Generate(ctx, prompt, GenerateOptions{MaxTokens: 1})
			if g.Proposed != 0 || g.Speculative != "" || len(g.Tokens) != 1 {
				t.Errorf("one token: proposed %d, speculative %q, tokens %v", g.Proposed, g.Speculative, g.Tokens)
			}
		case 1:
			_, err = e.Prefill(ctx, prompt, "")
		case 2:
			_, err = e.PrefillBackground(ctx, prompt, "")
		}
		if err != nil {
			t.Fatal(err)
		}
		flush(t, e)
		dns, _ := e.DraftNamespace()
		if got, want := cachedBlocks(cache, dns, prompt), len(prompt)/tinyConfig().BlockTokens; got != want {
			t.Errorf("%s: %d of the draft's blocks of the prompt cached, want %d", how, got, want)
		}
	}
}

// TestSpeculationStopsAndStreams: speculation emits each token once, in
// order, holds back what may start a stop sequence, and ends at a stop
// sequence inside an accepted run of guesses.
func TestSpeculationStopsAndStreams(t *testing.T) {
	plain := newTinyEngine(t, nil, nil)
	prompt := repetitive(7, 80, tinyConfig().Vocab)
	base := generate(t, plain, prompt, GenerateOptions{MaxTokens: 30}).Tokens
	stop := [][]uint32{slices.Clone(base[12:14])}
	want := generate(t, plain, prompt, GenerateOptions{MaxTokens: 30, Stop: stop})
	for _, method := range []string{SpeculateNgram, SpeculateDraft} {
		e := speculating(t, nil, method, 6)
		var streamed []uint32
		g := generate(t, e, prompt, GenerateOptions{MaxTokens: 30, Stop: stop, Emit: func(ts []uint32) error {
			streamed = append(streamed, ts...)
			return nil
		}})
		if !slices.Equal(g.Tokens, want.Tokens) || g.Finish != want.Finish || g.CompletionTokens != want.CompletionTokens {
			t.Errorf("%s: %v (%s, %d), want %v (%s, %d)", method, g.Tokens, g.Finish, g.CompletionTokens, want.Tokens, want.Finish, want.CompletionTokens)
		}
		if !slices.Equal(streamed, g.Tokens) {
			t.Errorf("%s: streamed %v, generated %v", method, streamed, g.Tokens)
		}
	}
}

// TestSpeculationBackground: a queued (background) generation speculates
// too, with the same tokens.
func TestSpeculationBackground(t *testing.T) {
	plain := newTinyEngine(t, nil, nil)
	prompt := repetitive(8, 60, tinyConfig().Vocab)
	want := generate(t, plain, prompt, GenerateOptions{MaxTokens: 25}).Tokens
	for _, method := range []string{SpeculateNgram, SpeculateDraft} {
		e := speculating(t, newMemCache(), method, 3)
		g := generate(t, e, prompt, GenerateOptions{MaxTokens: 25, Background: true})
		if !slices.Equal(g.Tokens, want) || g.Proposed == 0 {
			t.Errorf("%s: background %v (%d proposed), want %v", method, g.Tokens, g.Proposed, want)
		}
	}
}

// TestSpeculationOverride: GenerateOptions.SpeculativeTokens turns
// speculation off for one generation, or changes K.
func TestSpeculationOverride(t *testing.T) {
	e := speculating(t, nil, SpeculateNgram, 4)
	prompt := repetitive(9, 80, tinyConfig().Vocab)
	off := generate(t, e, prompt, GenerateOptions{MaxTokens: 30, SpeculativeTokens: -1})
	on := generate(t, e, prompt, GenerateOptions{MaxTokens: 30, SpeculativeTokens: 8})
	if off.Proposed != 0 || off.Speculative != "" || on.Proposed == 0 || !slices.Equal(on.Tokens, off.Tokens) {
		t.Errorf("off: %d proposed (%q); on: %d proposed; tokens equal %v", off.Proposed, off.Speculative, on.Proposed, slices.Equal(on.Tokens, off.Tokens))
	}
}

// TestSpeculationBadOptions: K out of range, an unknown method, a draft
// missing or out of place, a draft of another vocabulary (named), and a
// request's K over the limit are refused.
func TestSpeculationBadOptions(t *testing.T) {
	small := tinyConfig()
	small.Vocab = 200
	for _, c := range []struct {
		spec SpeculativeOptions
		want string
	}{
		{SpeculativeOptions{Method: SpeculateNgram, Tokens: MaxSpeculativeTokens + 1}, "speculative.tokens: 17 is outside 1..16"},
		{SpeculativeOptions{Method: SpeculateNgram, Tokens: -1}, "speculative.tokens: -1 is outside 1..16"},
		{SpeculativeOptions{Method: "medusa"}, `speculative.method: "medusa"`},
		{SpeculativeOptions{Method: SpeculateDraft}, "needs a draft model"},
		{SpeculativeOptions{Method: SpeculateNgram, Draft: &Options{}}, "a draft model is given"},
		{SpeculativeOptions{Method: SpeculateDraft, Draft: &Options{Config: small}}, "its vocabulary has 200 tokens, the model's 260"},
	} {
		_, err := New(nil, Options{Config: tinyConfig(), Weights: tinyWeights(), Speculative: c.spec})
		if !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: %v, want %q", c.spec, err, c.want)
		}
	}
	e := speculating(t, nil, SpeculateNgram, 4)
	_, err := e.Generate(context.Background(), []uint32{1, 2, 3}, GenerateOptions{MaxTokens: 4, SpeculativeTokens: 17})
	if !errors.Is(err, ErrInvalidInput) || !strings.Contains(err.Error(), "speculative_tokens") {
		t.Errorf("a request's K of 17: %v", err)
	}
}

func TestLookup(t *testing.T) {
	for _, c := range []struct {
		seq  string
		k    int
		want string
	}{
		{"abcdxabc", 3, "dxa"},   // the 3-gram abc, then what followed it
		{"abcdxbcyabc", 2, "dx"}, // the longest n-gram wins: abc, not bc
		{"xyzqxy", 4, "zqxy"},    // a match that runs into the end repeats
		{"ababab", 5, "ababa"},   // a period
		{"abcdefg", 3, ""},       // no repeated bigram
		{"aab", 3, ""},           // one token matches are not proposed
		{"a", 3, ""},
	} {
		seq := make([]uint32, len(c.seq))
		for i := range c.seq {
			seq[i] = uint32(c.seq[i])
		}
		got := lookup(nil, seq, c.k)
		var s strings.Builder
		for _, t := range got {
			s.WriteByte(byte(t))
		}
		if s.String() != c.want {
			t.Errorf("lookup(%q, %d) = %q, want %q", c.seq, c.k, s.String(), c.want)
		}
	}
}

// chiSquare returns Pearson's statistic of counts against probabilities
// (n draws), cells of expectation under 5 pooled, and its degrees of
// freedom.
func chiSquare(counts []int, probs []float64, n int) (stat float64, df int) {
	var poolObs, poolExp float64
	cells := 0
	for i, p := range probs {
		exp := p * float64(n)
		if exp < 5 {
			poolObs += float64(counts[i])
			poolExp += exp
			continue
		}
		d := float64(counts[i]) - exp
		stat += d * d / exp
		cells++
	}
	if poolExp > 0 {
		d := poolObs - poolExp
		stat += d * d / max(poolExp, 1e-9)
		cells++
	}
	return stat, cells - 1
}

// chiCritical is the chi-square quantile at 1 − 1e-4 for df degrees of
// freedom (Wilson–Hilferty): a correct sampler fails one seed in 10⁴.
func chiCritical(df int) float64 {
	const z = 3.719 // the standard normal's 1 − 1e-4 quantile
	k := float64(df)
	x := 1 - 2/(9*k) + z*math.Sqrt(2/(9*k))
	return k * x * x * x
}

// TestVerifyDistribution: the first token a verification step generates,
// with a draft drawn from a distribution q or proposed with certainty, is
// distributed as the model's own sampler's (temperature and top-p), over
// many seeded draws.
func TestVerifyDistribution(t *testing.T) {
	const vocab, n = 6, 60000
	target := []float32{1.2, 0.3, -0.5, 2.0, 0.0, -1.0}
	other := []float32{-0.3, 1.5, 0.2, 0.4, 1.0, -2.0}
	for _, c := range []struct {
		name       string
		temp, topP float64
		certain    bool
	}{{"draft model", 1, 1, false}, {"draft model, top-p", 0.8, 0.9, false}, {"prompt lookup", 1.3, 1, true}, {"prompt lookup, top-p", 1, 0.7, true}} {
		o := GenerateOptions{Temperature: c.temp, TopP: c.topP, Seed: 42}
		s := newSampler(o, vocab)
		d := newSamplerStream(o, vocab, draftStream)
		want := slices.Clone(s.distribution(target))
		q := slices.Clone(d.distribution(other))
		rows := slices.Concat(target, other) // the second row is the bonus token's
		counts := make([]int, vocab)
		var out []uint32
		for range n {
			draft, _ := d.draw(q)
			var qs [][]float64
			if c.certain {
				draft = 1 // a guess outside the nucleus at top-p, inside without
			} else {
				qs = [][]float64{q}
			}
			out, _ = s.verify(out[:0], rows, vocab, []uint32{draft}, qs)
			counts[out[0]]++
		}
		stat, df := chiSquare(counts, want, n)
		if stat > chiCritical(df) {
			t.Errorf("%s: chi-square %.1f over %d degrees of freedom (critical %.1f): counts %v, want %v", c.name, stat, df, chiCritical(df), counts, want)
		}
	}
}

// fourTokens returns weights of c drawn from seed, made to speak only
// tokens 0..3: every embedding has a large constant first coordinate, which
// the LM head's rows of those four tokens read and the others' (zero) do
// not, so that the rest of the vocabulary holds about 1e-3 of the
// probability at temperature 1, outside a top-p nucleus of 0.98.
func fourTokens(c Config, seed uint64) *Weights {
	w := SeededWeights(c, seed)
	d := c.Dim
	for t := range c.Vocab {
		w.Embed[t*d] = 5
		row := w.LMHead[t*d : (t+1)*d]
		if t >= 4 {
			clear(row)
		} else {
			row[0] = 4
		}
	}
	return w
}

// TestSpeculationSamplingDistribution: with temperature > 0, the tokens a
// speculating engine generates, with either proposer, are distributed as
// the model's: the joint distribution of four tokens over a vocabulary of
// four, against the model's exact probabilities, over seeded generations.
func TestSpeculationSamplingDistribution(t *testing.T) {
	c := Config{Layers: 1, Dim: 16, Heads: 2, KVHeads: 1, HeadDim: 8, FFNDim: 16, Vocab: 256, MaxContext: 64, BlockTokens: 4, RopeTheta: 10000}
	c.EnsureDefaults()
	w := fourTokens(c, 11)
	const maxTokens, runs = 4, 4000
	o := GenerateOptions{MaxTokens: maxTokens, Temperature: 1, TopP: 0.98}
	prompt := []uint32{0, 1, 2, 3, 0, 1, 3, 2, 1}
	plain, err := New(nil, Options{Config: c, Weights: w})
	if err != nil {
		t.Fatal(err)
	}
	defer plain.Close()
	// The exact probability of every answer: the product of the model's
	// next-token distributions along it.
	cells := 1 << (2 * maxTokens)
	probs := make([]float64, cells)
	s := newSampler(o, c.Vocab)
	var walk func(seq []uint32, p float64, cell int)
	walk = func(seq []uint32, p float64, cell int) {
		if len(seq) == len(prompt)+maxTokens {
			probs[cell] = p
			return
		}
		res := run(t, plain, seq)
		dist := slices.Clone(s.distribution(res.Logits))
		for tok, pt := range dist {
			if pt > 0 {
				walk(append(slices.Clone(seq), uint32(tok)), p*pt, cell*4+tok)
			}
		}
	}
	walk(prompt, 1, 0)
	for _, method := range []string{SpeculateNgram, SpeculateDraft} {
		spec := SpeculativeOptions{Method: method, Tokens: 3}
		if method == SpeculateDraft {
			spec.Draft = &Options{Config: c, Weights: fourTokens(c, 12)}
		}
		e, err := New(nil, Options{Config: c, Weights: w, Speculative: spec})
		if err != nil {
			t.Fatal(err)
		}
		counts := make([]int, cells)
		var proposed, accepted int
		for i := range runs {
			o.Seed = uint64(i)
			g := generate(t, e, prompt, o)
			cell := 0
			for _, tok := range g.Tokens {
				if tok >= 4 {
					t.Fatalf("%s, seed %d: token %d, outside the nucleus", method, i, tok)
				}
				cell = cell*4 + int(tok)
			}
			counts[cell]++
			proposed += g.Proposed
			accepted += g.Accepted
		}
		e.Close()
		stat, df := chiSquare(counts, probs, runs)
		t.Logf("%s: chi-square %.1f over %d degrees of freedom; %d of %d guesses accepted", method, stat, df, accepted, proposed)
		if stat > chiCritical(df) {
			t.Errorf("%s: chi-square %.1f over %d degrees of freedom (critical %.1f)", method, stat, df, chiCritical(df))
		}
		if accepted == 0 || accepted == proposed {
			t.Errorf("%s: %d of %d accepted: both paths must run", method, accepted, proposed)
		}
	}
}

// TestSpeculationConcurrent: generations that run at once on an engine
// with a draft model (each with its own draft K/V over the shared draft
// engine and cache), foreground and queued, each generate the tokens
// plain decoding does.
func TestSpeculationConcurrent(t *testing.T) {
	plain := newTinyEngine(t, nil, nil)
	e := newTinyEngine(t, newMemCache(), func(o *Options) {
		o.Concurrency = 3
		o.Speculative = SpeculativeOptions{Method: SpeculateDraft, Tokens: 3, Draft: &Options{Config: tinyConfig(), Weights: tinyDraftWeights()}}
	})
	vocab := tinyConfig().Vocab
	prompts := [][]uint32{repetitive(30, 50, vocab), repetitive(31, 70, vocab), repetitive(30, 50, vocab), repetitive(32, 40, vocab)}
	got := make([]Generation, len(prompts))
	errs := make([]error, len(prompts))
	var wg sync.WaitGroup
	for i, p := range prompts {
		wg.Go(func() {
			got[i], errs[i] = e.Generate(context.Background(), p, GenerateOptions{MaxTokens: 20, Background: i == 3})
		})
	}
	wg.Wait()
	for i, p := range prompts {
		if errs[i] != nil {
			t.Fatal(errs[i])
		}
		if want := generate(t, plain, p, GenerateOptions{MaxTokens: 20}).Tokens; !slices.Equal(got[i].Tokens, want) || got[i].Proposed == 0 {
			t.Errorf("generation %d: %v (%d proposed), want %v", i, got[i].Tokens, got[i].Proposed, want)
		}
	}
}
