package prefill

import (
	"context"
	"errors"
	"slices"
	"testing"
)

func generate(t testing.TB, e *Engine, prompt []uint32, o GenerateOptions) Generation {
	t.Helper()
	g, err := e.Generate(context.Background(), prompt, o)
	if err != nil {
		t.Fatal(err)
	}
	return g
}

// TestGenerateMatchesPrefill: each greedily decoded token is the top token
// of a cold prefill of the prompt and the tokens before it, so decoding
// appends to the prompt's K/V exactly what a prefill would compute.
func TestGenerateMatchesPrefill(t *testing.T) {
	e := newTinyEngine(t, nil, nil)
	r := newRand(3)
	prompt := randTokens(r, 37, tinyConfig().Vocab)
	g := generate(t, e, prompt, GenerateOptions{MaxTokens: 12})
	if len(g.Tokens) != 12 || g.Finish != FinishLength || g.CompletionTokens != 12 {
		t.Fatalf("%d tokens, finish %q, completion %d; want 12, length, 12", len(g.Tokens), g.Finish, g.CompletionTokens)
	}
	seq := slices.Clone(prompt)
	for i, tok := range g.Tokens {
		if want := run(t, e, seq).TopTokens[0]; tok != want {
			t.Fatalf("token %d: decoded %d, a prefill of the %d tokens before it says %d", i, tok, len(seq), want)
		}
		seq = append(seq, tok)
	}
}

// TestGenerateHitEqualsCold: for random prompts and split points, greedy
// and seeded sampling generate the same tokens whether the prompt's prefix
// came from the cache or was computed, and usage reports the hit.
func TestGenerateHitEqualsCold(t *testing.T) {
	cold := newTinyEngine(t, nil, nil)
	r := newRand(21)
	b := tinyConfig().BlockTokens
	for i := range 6 {
		cache := newMemCache()
		e := newTinyEngine(t, cache, nil)
		n := 2 + r.IntN(300)
		prompt := randTokens(r, n, tinyConfig().Vocab)
		split := 1 + r.IntN(n-1)
		run(t, e, prompt[:split])
		flush(t, e)
		for _, o := range []GenerateOptions{
			{MaxTokens: 20},
			{MaxTokens: 20, Temperature: 0.9, TopP: 0.95, Seed: uint64(i)},
			{MaxTokens: 20, Temperature: 2, Seed: 5},
		} {
			want := generate(t, cold, prompt, o)
			got := generate(t, e, prompt, o)
			if !slices.Equal(got.Tokens, want.Tokens) {
				t.Errorf("case %d (n=%d, split=%d, %+v): tokens %v, cold %v", i, n, split, o, got.Tokens, want.Tokens)
			}
			if hit := split / b * b; got.Usage.CachedTokens < hit || got.Usage.PromptTokens != n {
				t.Errorf("case %d: usage %+v, want at least %d cached", i, got.Usage, hit)
			}
		}
	}
}

// TestGeneratePublishesTheConversation: the full blocks of prompt and
// generated tokens are published, so that the next turn, which appends to
// both, hits them.
func TestGeneratePublishesTheConversation(t *testing.T) {
	cache := newMemCache()
	e := newTinyEngine(t, cache, nil)
	b := tinyConfig().BlockTokens
	prompt := randTokens(newRand(8), 2*b+3, tinyConfig().Vocab)
	g := generate(t, e, prompt, GenerateOptions{MaxTokens: 2 * b})
	flush(t, e)
	turn := append(append(slices.Clone(prompt), g.Tokens...), 1, 2, 3)
	res := run(t, e, turn)
	// Every position but the last generated one has K/V.
	if want := (len(prompt) + len(g.Tokens) - 1) / b * b; res.Usage.CachedTokens != want {
		t.Errorf("the next turn found %d tokens cached, want %d", res.Usage.CachedTokens, want)
	}
}

// TestGenerateStop: a stop sequence ends the generation with finish reason
// stop and is not returned; tokens that might start it are held back from
// Emit until they cannot, and what Emit got is what Generate returns.
func TestGenerateStop(t *testing.T) {
	e := newTinyEngine(t, nil, nil)
	prompt := randTokens(newRand(4), 20, tinyConfig().Vocab)
	free := generate(t, e, prompt, GenerateOptions{MaxTokens: 16})
	// Stop on the 6th and 7th tokens of the free run; a decoy that starts
	// like it but diverges is held back and then released.
	stop := slices.Clone(free.Tokens[5:7])
	decoy := []uint32{free.Tokens[2], free.Tokens[3], 9999}
	var streamed []uint32
	g := generate(t, e, prompt, GenerateOptions{MaxTokens: 16, Stop: [][]uint32{decoy, stop}, Emit: func(tok []uint32) error {
		streamed = append(streamed, tok...)
		return nil
	}})
	at := 0 // where the stop sequence first occurs in the free run
	for !slices.Equal(free.Tokens[at:at+2], stop) {
		at++
	}
	want := free.Tokens[:at]
	if g.Finish != FinishStop || !slices.Equal(g.Tokens, want) || g.CompletionTokens != at+2 {
		t.Errorf("got %v (%s, %d sampled), want %v (stop, %d sampled)", g.Tokens, g.Finish, g.CompletionTokens, want, at+2)
	}
	if !slices.Equal(streamed, g.Tokens) {
		t.Errorf("Emit got %v, Generate returned %v", streamed, g.Tokens)
	}
	// At the length limit, a partial match is output.
	var all []uint32
	g = generate(t, e, prompt, GenerateOptions{MaxTokens: 6, Stop: [][]uint32{stop}, Emit: func(tok []uint32) error {
		all = append(all, tok...)
		return nil
	}})
	if g.Finish != FinishLength || !slices.Equal(g.Tokens, free.Tokens[:6]) || !slices.Equal(all, g.Tokens) {
		t.Errorf("at the limit: %v %s (emitted %v), want %v length", g.Tokens, g.Finish, all, free.Tokens[:6])
	}
}

// TestGenerateSeed: a seed fixes sampled tokens; another seed changes them;
// top_p near 0 is greedy.
func TestGenerateSeed(t *testing.T) {
	e := newTinyEngine(t, nil, nil)
	prompt := randTokens(newRand(5), 30, tinyConfig().Vocab)
	o := GenerateOptions{MaxTokens: 24, Temperature: 1.5, Seed: 1}
	a, b := generate(t, e, prompt, o), generate(t, e, prompt, o)
	if !slices.Equal(a.Tokens, b.Tokens) {
		t.Errorf("the same seed generated %v and %v", a.Tokens, b.Tokens)
	}
	o.Seed = 2
	if c := generate(t, e, prompt, o); slices.Equal(a.Tokens, c.Tokens) {
		t.Errorf("seeds 1 and 2 generated the same %d tokens at temperature 1.5", len(a.Tokens))
	}
	greedy := generate(t, e, prompt, GenerateOptions{MaxTokens: 24})
	nucleus := generate(t, e, prompt, GenerateOptions{MaxTokens: 24, Temperature: 1, TopP: 1e-9, Seed: 3})
	if !slices.Equal(greedy.Tokens, nucleus.Tokens) {
		t.Errorf("top_p≈0 generated %v, greedy %v", nucleus.Tokens, greedy.Tokens)
	}
}

func TestGenerateBadOptions(t *testing.T) {
	e := newTinyEngine(t, nil, nil)
	prompt := []uint32{1, 2, 3}
	for name, o := range map[string]GenerateOptions{
		"max_tokens 0":        {},
		"past the context":    {MaxTokens: tinyConfig().MaxContext},
		"negative temp":       {MaxTokens: 1, Temperature: -1},
		"hot":                 {MaxTokens: 1, Temperature: 2.5},
		"top_p":               {MaxTokens: 1, TopP: 1.5},
		"empty stop":          {MaxTokens: 1, Stop: [][]uint32{{}}},
		"nine stops":          {MaxTokens: 1, Stop: [][]uint32{{1}, {2}, {3}, {4}, {5}, {6}, {7}, {8}, {9}}},
		"empty prompt (next)": {MaxTokens: 1},
	} {
		p := prompt
		if name == "empty prompt (next)" {
			p = nil
		}
		if _, err := e.Generate(context.Background(), p, o); !errors.Is(err, ErrInvalidInput) {
			t.Errorf("%s: err %v, want ErrInvalidInput", name, err)
		}
	}
	boom := errors.New("client gone")
	_, err := e.Generate(context.Background(), prompt, GenerateOptions{MaxTokens: 5, Emit: func([]uint32) error { return boom }})
	if !errors.Is(err, boom) {
		t.Errorf("an Emit error: got %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := e.Generate(ctx, prompt, GenerateOptions{MaxTokens: 5}); !errors.Is(err, context.Canceled) {
		t.Errorf("a cancelled context: got %v", err)
	}
}

func TestHeldBack(t *testing.T) {
	stops := [][]uint32{{1, 2, 3}, {7}}
	for _, c := range []struct {
		gen  []uint32
		held int
	}{
		{nil, 0}, {[]uint32{5}, 0}, {[]uint32{5, 1}, 1}, {[]uint32{1, 2}, 2}, {[]uint32{2, 1, 2}, 2}, {[]uint32{1, 2, 4}, 0},
	} {
		if got := heldBack(c.gen, stops); got != c.held {
			t.Errorf("heldBack(%v) = %d, want %d", c.gen, got, c.held)
		}
	}
	if stopMatch([]uint32{4, 1, 2, 3}, stops) != 3 || stopMatch([]uint32{7}, stops) != 1 || stopMatch([]uint32{3}, stops) != 0 {
		t.Error("stopMatch")
	}
}
