package prefill

import (
	"context"
	"errors"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// hookBackend runs the CPU backend with a hook before every forward pass, so
// that tests can see each chunk and stall it.
type hookBackend struct {
	before func(ctx context.Context, start int, tokens []uint32) error
	after  func(start int, tokens []uint32)
}

func (hookBackend) Name() string { return "cpu/hooked" }

func (h hookBackend) Load(cfg Config, w *Weights) (Model, error) {
	cpu, err := NewCPU(CPUOptions{})
	if err != nil {
		return nil, err
	}
	m, err := cpu.Load(cfg, w)
	return &hookModel{Model: m, h: h}, err
}

type hookModel struct {
	Model
	h hookBackend
}

func (m *hookModel) Forward(ctx context.Context, kv *KV, start int, tokens []uint32, logits []float32) error {
	if m.h.before != nil {
		if err := m.h.before(ctx, start, tokens); err != nil {
			return err
		}
	}
	if m.h.after != nil {
		defer m.h.after(start, tokens)
	}
	return m.Model.Forward(ctx, kv, start, tokens, logits)
}

func runBackground(t testing.TB, e *Engine, tokens []uint32) Result {
	t.Helper()
	res, err := e.PrefillBackground(context.Background(), tokens, "bg")
	if err != nil {
		t.Fatal(err)
	}
	return res
}

// TestBackgroundEqualsCold: for random prompts, cached prefixes and chunk
// sizes, a background prefill's logits equal a cold foreground prefill's,
// its usage counts the cached prefix, and every new full block is in the
// cache when it returns (published chunk by chunk, no Flush needed).
func TestBackgroundEqualsCold(t *testing.T) {
	cold := newTinyEngine(t, nil, nil)
	r := rand.New(rand.NewPCG(21, 22))
	c := tinyConfig()
	for i := range 8 {
		cache := newMemCache()
		e := newTinyEngine(t, cache, func(o *Options) { o.BackgroundBlocks = 1 + r.IntN(4) })
		n := 2 + r.IntN(400)
		tokens := randTokens(r, n, c.Vocab)
		split := r.IntN(n)
		if split > 0 {
			run(t, e, tokens[:split])
			flush(t, e)
		}
		got := runBackground(t, e, tokens)
		want := run(t, cold, tokens)
		if u := (Usage{PromptTokens: n, CachedTokens: split / c.BlockTokens * c.BlockTokens}); got.Usage != u {
			t.Errorf("case %d (n=%d, split=%d): usage %+v, want %+v", i, n, split, got.Usage, u)
		}
		if err := relErr(got.Logits, want.Logits); err > 1e-4 {
			t.Errorf("case %d (n=%d, split=%d): background logits differ from cold by %.2g", i, n, split, err)
		}
		if cache.len() != n/c.BlockTokens {
			t.Errorf("case %d: %d blocks cached after the background prefill, want %d", i, cache.len(), n/c.BlockTokens)
		}
	}
	if st := cold.Stats(); st.Background != 0 {
		t.Errorf("foreground prefills counted as background: %+v", st)
	}
}

// TestBackgroundYields: a foreground prefill that arrives while a
// background chunk computes preempts it at once (the stalled chunk only
// ends because it was cancelled); the background then resumes and still
// gets the cold answer.
func TestBackgroundYields(t *testing.T) {
	c := tinyConfig()
	chunk := 2 * c.BlockTokens
	var stalled atomic.Bool
	inChunk := make(chan struct{})
	e := newTinyEngine(t, newMemCache(), func(o *Options) {
		o.BackgroundBlocks = 2
		o.Backend = hookBackend{before: func(ctx context.Context, start int, tokens []uint32) error {
			// The background's second chunk stalls, the first time, until
			// a foreground prefill cancels it.
			if start == chunk && len(tokens) == chunk && stalled.CompareAndSwap(false, true) {
				close(inChunk)
				<-ctx.Done()
				return ctx.Err()
			}
			return nil
		}}
	})
	r := rand.New(rand.NewPCG(23, 23))
	long := randTokens(r, 5*chunk+3, c.Vocab)
	short := randTokens(r, 7, c.Vocab)
	type outcome struct {
		res Result
		err error
	}
	bg := make(chan outcome, 1)
	go func() {
		res, err := e.PrefillBackground(context.Background(), long, "bg")
		bg <- outcome{res, err}
	}()
	<-inChunk
	fg := run(t, e, short) // returns only because the stalled chunk gave way
	got := <-bg
	if got.err != nil {
		t.Fatal(got.err)
	}
	cold := newTinyEngine(t, nil, nil)
	if err := relErr(got.res.Logits, run(t, cold, long).Logits); err > 1e-4 {
		t.Errorf("preempted background logits differ from cold by %.2g", err)
	}
	if err := relErr(fg.Logits, run(t, cold, short).Logits); err > 1e-4 {
		t.Errorf("foreground logits differ from cold by %.2g", err)
	}
	if st := e.Stats(); st.Preempted != 1 || st.Background != 1 || st.Requests != 2 {
		t.Errorf("stats %+v: want 1 preemption, 1 background of 2 requests", st)
	}
	if got.res.Timing.Wait <= 0 || got.res.TTFT < got.res.Timing.Compute {
		t.Errorf("timing %+v, TTFT %v", got.res.Timing, got.res.TTFT)
	}
}

// TestBackgroundNeverStartsUnderForeground mixes foreground and background
// prefills from several goroutines with two slots: no background chunk
// starts while a foreground forward pass runs, and every answer is the
// cold one.
func TestBackgroundNeverStartsUnderForeground(t *testing.T) {
	var fgRunning atomic.Int64
	var violations atomic.Int64
	isFG := func(tokens []uint32) bool { return tokens[0] == 0 } // foreground prompts start with token 0, and are never cached
	e := newTinyEngine(t, newMemCache(), func(o *Options) {
		o.Concurrency = 2
		o.BackgroundBlocks = 1
		o.Backend = hookBackend{
			before: func(ctx context.Context, _ int, tokens []uint32) error {
				// A chunk whose context a foreground prefill already
				// cancelled stops at the forward pass's first check: a
				// violation is one that starts with a live context.
				if isFG(tokens) {
					fgRunning.Add(1)
				} else if fgRunning.Load() > 0 && ctx.Err() == nil {
					violations.Add(1)
				}
				return nil
			},
			after: func(_ int, tokens []uint32) {
				if isFG(tokens) {
					fgRunning.Add(-1)
				}
			},
		}
	})
	cold := newTinyEngine(t, nil, nil)
	c := tinyConfig()
	r := rand.New(rand.NewPCG(24, 24))
	type job struct {
		tokens []uint32
		fg     bool
	}
	var jobs []job
	for i := range 12 {
		fg := i%3 == 0
		tokens := randTokens(r, 20+r.IntN(120), c.Vocab)
		tokens[0] = 1 + tokens[0]%uint32(c.Vocab-1)
		if fg {
			tokens[0] = 0
		}
		jobs = append(jobs, job{tokens, fg})
	}
	got := make([]Result, len(jobs))
	var wg sync.WaitGroup
	for i, j := range jobs {
		wg.Go(func() {
			if j.fg {
				got[i] = run(t, e, j.tokens)
			} else {
				got[i] = runBackground(t, e, j.tokens)
			}
		})
	}
	wg.Wait()
	if v := violations.Load(); v != 0 {
		t.Errorf("%d background chunks started while a foreground forward pass ran", v)
	}
	for i, j := range jobs {
		if err := relErr(got[i].Logits, run(t, cold, j.tokens).Logits); err > 1e-4 {
			t.Errorf("job %d (foreground %v): logits differ from cold by %.2g", i, j.fg, err)
		}
	}
}

// TestBackgroundResumesFromCache: a background prefill cancelled midway
// (a shutdown) has published the chunks it finished; run again, it starts
// from them.
func TestBackgroundResumesFromCache(t *testing.T) {
	c := tinyConfig()
	chunk := c.BlockTokens
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	e := newTinyEngine(t, newMemCache(), func(o *Options) {
		o.BackgroundBlocks = 1
		o.Backend = hookBackend{before: func(fctx context.Context, start int, _ []uint32) error {
			if start == 3*chunk && ctx.Err() == nil {
				cancel() // the caller gives up during the fourth chunk
				<-fctx.Done()
				return fctx.Err()
			}
			return nil
		}}
	})
	tokens := randTokens(rand.New(rand.NewPCG(25, 25)), 6*chunk+5, c.Vocab)
	if _, err := e.PrefillBackground(ctx, tokens, ""); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled background prefill: %v, want context.Canceled", err)
	}
	res := runBackground(t, e, tokens)
	if res.Usage.CachedTokens != 3*chunk {
		t.Errorf("rerun: cached_tokens %d, want %d (the three chunks published before the cancel)", res.Usage.CachedTokens, 3*chunk)
	}
	if err := relErr(res.Logits, run(t, newTinyEngine(t, nil, nil), tokens).Logits); err > 1e-4 {
		t.Errorf("resumed logits differ from cold by %.2g", err)
	}
}

// TestBackgroundCloseWhileWaiting: a background prefill held off by a
// foreground one ends with ErrClosed when the engine closes.
func TestBackgroundCloseWhileWaiting(t *testing.T) {
	c := tinyConfig()
	fgIn := make(chan struct{})
	e := newTinyEngine(t, nil, func(o *Options) {
		o.Backend = hookBackend{before: func(ctx context.Context, start int, tokens []uint32) error {
			if len(tokens) == 9 { // the foreground prompt stalls until Close
				close(fgIn)
				<-ctx.Done()
				return ctx.Err()
			}
			return nil
		}}
	})
	r := rand.New(rand.NewPCG(26, 26))
	fgErr := make(chan error, 1)
	go func() {
		_, err := e.Prefill(context.Background(), randTokens(r, 9, c.Vocab), "")
		fgErr <- err
	}()
	<-fgIn
	bgErr := make(chan error, 1)
	go func() {
		_, err := e.PrefillBackground(context.Background(), randTokens(newRand(27), 40, c.Vocab), "")
		bgErr <- err
	}()
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	for name, ch := range map[string]chan error{"foreground": fgErr, "background": bgErr} {
		select {
		case err := <-ch:
			if !errors.Is(err, ErrClosed) {
				t.Errorf("%s: %v, want ErrClosed", name, err)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("%s did not return after Close", name)
		}
	}
}

// TestHoldKeepsBackgroundOff: while the engine is held, no background chunk
// computes; after release the background prefill completes.
func TestHoldKeepsBackgroundOff(t *testing.T) {
	var held atomic.Bool
	var violations atomic.Int64
	e := newTinyEngine(t, nil, func(o *Options) {
		o.BackgroundGrace = -1
		o.Backend = hookBackend{before: func(_ context.Context, _ int, tokens []uint32) error {
			if held.Load() && len(tokens) != 5 { // the foreground prompt has 5 tokens
				violations.Add(1)
			}
			return nil
		}}
	})
	held.Store(true)
	release := e.Hold()
	done := make(chan error, 1)
	go func() {
		_, err := e.PrefillBackground(context.Background(), randTokens(newRand(28), 70, tinyConfig().Vocab), "")
		done <- err
	}()
	// Give the background every chance to run while held: a foreground
	// prefill comes and goes, and the hold still stands.
	run(t, e, randTokens(newRand(29), 5, tinyConfig().Vocab))
	held.Store(false)
	release()
	release() // a second release does nothing
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if v := violations.Load(); v != 0 {
		t.Errorf("%d forward passes ran while the engine was held", v)
	}
}

// TestBackgroundGenerateYields: a background Generate (queued work) gives
// way to a foreground Generate that arrives while it decodes: with one
// slot, the foreground returns only because the background's stalled
// decode step was cancelled for it; the background then resumes and its
// tokens are those of a foreground Generate, for random prompts, cached
// prefixes and chunk sizes too.
func TestBackgroundGenerateYields(t *testing.T) {
	c := tinyConfig()
	r := rand.New(rand.NewPCG(31, 32))
	long := randTokens(r, 3*c.BlockTokens+5, c.Vocab)
	short := randTokens(r, 9, c.Vocab)
	stallAt := len(long) + 3 // the fourth decode step
	var stalled atomic.Bool
	inStep := make(chan struct{})
	e := newTinyEngine(t, newMemCache(), func(o *Options) {
		o.Concurrency = 1
		o.Backend = hookBackend{before: func(ctx context.Context, start int, tokens []uint32) error {
			if start == stallAt && len(tokens) == 1 && stalled.CompareAndSwap(false, true) {
				close(inStep)
				<-ctx.Done() // only a foreground arrival ends it
				return ctx.Err()
			}
			return nil
		}}
	})
	opts := GenerateOptions{MaxTokens: 12}
	type outcome struct {
		g   Generation
		err error
	}
	bg := make(chan outcome, 1)
	go func() {
		g, err := e.Generate(context.Background(), long, GenerateOptions{MaxTokens: 12, Background: true})
		bg <- outcome{g, err}
	}()
	<-inStep
	fg := make(chan outcome, 1)
	go func() {
		g, err := e.Generate(context.Background(), short, opts)
		fg <- outcome{g, err}
	}()
	var f outcome
	select {
	case f = <-fg:
	case b := <-bg:
		t.Fatalf("the background generation finished (%v) before the foreground one that arrived during it", b.err)
	case <-time.After(60 * time.Second):
		t.Fatal("the foreground generation waited behind the background one for 60s")
	}
	b := <-bg
	if f.err != nil || b.err != nil {
		t.Fatalf("foreground: %v; background: %v", f.err, b.err)
	}
	cold := newTinyEngine(t, nil, nil)
	for _, k := range []struct {
		what   string
		prompt []uint32
		got    Generation
	}{{"foreground", short, f.g}, {"background", long, b.g}} {
		want, err := cold.Generate(context.Background(), k.prompt, opts)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(k.got.Tokens, want.Tokens) || k.got.CompletionTokens != want.CompletionTokens {
			t.Errorf("%s tokens %v, want %v", k.what, k.got.Tokens, want.Tokens)
		}
	}
	if st := e.Stats(); st.Preempted < 1 {
		t.Errorf("stats %+v: want a preemption", st)
	}

	// Without preemption: the same tokens as a foreground generation,
	// whatever the chunk size and cached prefix.
	for i := range 6 {
		cache := newMemCache()
		e := newTinyEngine(t, cache, func(o *Options) { o.BackgroundBlocks = 1 + r.IntN(3) })
		n := 2 + r.IntN(300)
		prompt := randTokens(r, n, c.Vocab)
		if split := r.IntN(n); split > 0 {
			run(t, e, prompt[:split])
			flush(t, e)
		}
		o := GenerateOptions{MaxTokens: 1 + r.IntN(8), Temperature: 0.8, Seed: uint64(i)}
		want, err := cold.Generate(context.Background(), prompt, o)
		if err != nil {
			t.Fatal(err)
		}
		o.Background = true
		got, err := e.Generate(context.Background(), prompt, o)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(got.Tokens, want.Tokens) {
			t.Errorf("case %d (n=%d): background tokens %v, want %v", i, n, got.Tokens, want.Tokens)
		}
	}
}
