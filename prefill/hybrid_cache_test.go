package prefill

import (
	"context"
	"errors"
	"math/rand/v2"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/block"
	"github.com/kvmesh/kvmesh/prefill/prefilltest"
	"github.com/kvmesh/kvmesh/prefixhash"
)

// recordCache is the in-memory fake GroupCache: records by the key their
// header names, and a hit rule of its own, written out from its
// definition (every full record of [0,P), the window's records before P,
// the state after block P−1), not prefixhash.Resume.
type recordCache struct {
	mu      sync.Mutex
	recs    map[prefixhash.Key][]byte
	claim   int  // Resume answers this many more blocks than it finds (a lying peer)
	frozen  bool // ignore Puts (benchmarks keep the cache as set up)
	resumes int
	reads   int
	read    int64 // bytes GetRecords returned
}

func newRecordCache() *recordCache { return &recordCache{recs: make(map[prefixhash.Key][]byte)} }

func (c *recordCache) LongestPrefix(context.Context, []prefixhash.Key) (int, error) {
	return 0, errors.New("recordCache: LongestPrefix of a hybrid model")
}

func (c *recordCache) Get(context.Context, []prefixhash.Key) ([][]byte, func(), error) {
	return nil, nil, errors.New("recordCache: Get of a hybrid model")
}

func (c *recordCache) Put(_ context.Context, chain []prefixhash.Key, from int, blocks [][]byte) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	for i, b := range blocks {
		if c.frozen {
			break
		}
		h, err := block.DecodeHeader(b, 1<<20)
		if err != nil {
			return err
		}
		if h.Chain != chain[from+i] {
			return errors.New("recordCache: a record put as another block's")
		}
		c.recs[h.Key] = append([]byte(nil), b...)
	}
	return nil
}

func (c *recordCache) has(chain []prefixhash.Key, g, i int) bool {
	return c.recs[prefixhash.GroupKey(chain[i], g)] != nil
}

func (c *recordCache) Resume(_ context.Context, groups []prefixhash.Group, b int, chain []prefixhash.Key) (prefixhash.Hit, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.resumes++
	for p := len(chain); p > 0; p-- {
		ok := true
		for g, gr := range groups {
			first := 0
			switch gr.Kind {
			case prefixhash.GroupSliding:
				first = max(0, p-(gr.Window+b-1)/b)
			case prefixhash.GroupState:
				first = p - 1
			}
			for i := first; i < p; i++ {
				ok = ok && c.has(chain, g, i)
			}
		}
		if ok {
			return prefixhash.Hit{Blocks: min(p+c.claim, len(chain))}, nil
		}
	}
	return prefixhash.Hit{Blocks: min(c.claim, len(chain))}, nil
}

func (c *recordCache) GetRecords(_ context.Context, chain []prefixhash.Key, records []prefixhash.Probe) ([][]byte, func(), error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.reads++
	out := make([][]byte, len(records))
	for j, r := range records {
		out[j] = c.recs[prefixhash.GroupKey(chain[r.Block], r.Group)]
		c.read += int64(len(out[j]))
	}
	return out, func() {}, nil
}

// edit changes group g's record of block i of chain (nil: removes it).
func (c *recordCache) edit(chain []prefixhash.Key, g, i int, f func([]byte) []byte) {
	c.mu.Lock()
	defer c.mu.Unlock()
	k := prefixhash.GroupKey(chain[i], g)
	if r := f(c.recs[k]); r != nil {
		c.recs[k] = r
	} else {
		delete(c.recs, k)
	}
}

var hybridWeights = sync.OnceValue(func() *Weights { return SeededWeights(hybridConfig(), 11) })

func newHybridEngine(t testing.TB, cache Cache, edit func(*Options)) *Engine {
	t.Helper()
	return newTinyEngine(t, cache, func(o *Options) {
		o.Config, o.Weights = hybridConfig(), hybridWeights()
		if edit != nil {
			edit(o)
		}
	})
}

// hybridRef returns the float64 reference's logits of the last position of
// tokens.
func hybridRef(tokens []uint32) []float64 {
	return refHybrid(hybridConfig(), hybridWeights(), tokens, []int{len(tokens) - 1})[0]
}

// TestHybridEngineHitEqualsCold: a hybrid engine over a record cache
// resumes a prompt whose prefix an earlier request published at the hit
// rule's prefix — the prefix's whole blocks, but never past the last block
// boundary before the last position (the linear layer's state) — and its
// logits are the float64 reference's within 1e-4 relative, for random
// prompts and split points (windows of 24 tokens over 16-token blocks:
// hits end inside a window).
func TestHybridEngineHitEqualsCold(t *testing.T) {
	c := hybridConfig()
	b := c.BlockTokens
	r := rand.New(rand.NewPCG(41, 42))
	for i := range 6 {
		cache := newRecordCache()
		e := newHybridEngine(t, cache, nil)
		n := 2 + r.IntN(300)
		if i == 0 {
			n = 5 * b // whole blocks: the state at the end is of no use
		}
		tokens := randTokens(r, n, c.Vocab)
		split := 1 + r.IntN(n-1)
		if i == 0 {
			split = n
		}
		if first := run(t, e, tokens[:split]); first.Usage.CachedTokens != 0 {
			t.Fatalf("case %d: a first request on an empty cache reports %d cached tokens", i, first.Usage.CachedTokens)
		}
		flush(t, e)
		if got, want := len(cache.recs), 3*(split/b); got != want {
			t.Fatalf("case %d: %d records published for %d blocks, want one per group", i, got, split/b)
		}
		hit := min(split/b, (n-1)/b) * b
		if got := e.Cached(context.Background(), tokens); got != hit {
			t.Errorf("case %d: Cached says %d before the prefill, which resumes at %d", i, got, hit)
		}
		warm := run(t, e, tokens)
		if got, want := warm.Usage, (Usage{PromptTokens: n, CachedTokens: hit}); got != want {
			t.Errorf("case %d (n=%d, split=%d): usage %+v, want %+v", i, n, split, got, want)
		}
		if e := relErr(warm.Logits, hybridRef(tokens)); e > 1e-4 {
			t.Errorf("case %d (n=%d, split=%d): logits over the hit differ from the reference by %.2g", i, n, split, e)
		}
		if s := e.Stats(); s.LostBlocks+s.CorruptBlocks+s.MissingBlocks+s.LookupErrors+s.FetchErrors != 0 {
			t.Errorf("case %d: faults in %+v", i, s)
		}
	}
}

// TestHybridEngineShorterHits: a missing state or window record, or a
// corrupt one, makes the hit shorter — where the hit rule says, or from
// the corrupt record's prefix down — and never changes the logits.
func TestHybridEngineShorterHits(t *testing.T) {
	c := hybridConfig()
	b := c.BlockTokens
	tokens := randTokens(newRand(43), 10*b+5, c.Vocab)
	want := hybridRef(tokens)
	keys := prefixhash.Keys(c.Namespace(hybridWeights().Digest(c), ""), tokens)
	for _, tc := range []struct {
		name   string
		break_ func(*recordCache)
		hit    int // blocks
		faults func(Stats) bool
	}{
		{"all there", func(*recordCache) {}, 10, nil},
		// The state after block 9 gone: resume after block 9 (state 8, window 8-9... [7,9)).
		{"no state at 10", func(rc *recordCache) { rc.edit(keys, 2, 9, func([]byte) []byte { return nil }) }, 9, nil},
		// Window block 8 gone: P=10 needs [8,10), P=9 needs [7,9): P=8.
		{"no window block 8", func(rc *recordCache) { rc.edit(keys, 1, 8, func([]byte) []byte { return nil }) }, 8, nil},
		// A full block gone: nothing after it.
		{"no full block 3", func(rc *recordCache) { rc.edit(keys, 0, 3, func([]byte) []byte { return nil }) }, 3, nil},
		// The cache claims more than it holds: a miss at the fetch, the hit
		// rule over what came.
		{"lying cache", func(rc *recordCache) {
			rc.edit(keys, 1, 8, func([]byte) []byte { return nil })
			rc.claim = 2
		}, 0, func(s Stats) bool { return s.MissingBlocks == 1 && s.LostBlocks == 10 }},
		// A state whose payload was flipped: its checksum fails; the states
		// before it were not read, so nothing resumes.
		{"corrupt state", func(rc *recordCache) {
			rc.edit(keys, 2, 9, func(r []byte) []byte {
				r = append([]byte(nil), r...)
				r[len(r)-1] ^= 1
				return r
			})
		}, 0, func(s Stats) bool { return s.CorruptBlocks == 1 && s.LostBlocks == 10 }},
		// Another block's window record under this one's key.
		{"misplaced window", func(rc *recordCache) {
			other := rc.recs[prefixhash.GroupKey(keys[8], 1)]
			rc.edit(keys, 1, 9, func([]byte) []byte { return other })
		}, 0, func(s Stats) bool { return s.CorruptBlocks == 1 }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cache := newRecordCache()
			e := newHybridEngine(t, cache, nil)
			run(t, e, tokens)
			flush(t, e)
			tc.break_(cache)
			before := e.Stats()
			got := run(t, e, tokens)
			if got.Usage.CachedTokens != tc.hit*b {
				t.Errorf("cached_tokens %d, want %d", got.Usage.CachedTokens, tc.hit*b)
			}
			if e := relErr(got.Logits, want); e > 1e-4 {
				t.Errorf("logits differ from the reference by %.2g", e)
			}
			s := e.Stats()
			s.MissingBlocks -= before.MissingBlocks
			s.CorruptBlocks -= before.CorruptBlocks
			s.LostBlocks -= before.LostBlocks
			if tc.faults != nil && !tc.faults(s) {
				t.Errorf("stats %+v", s)
			}
			if tc.faults == nil && s.LostBlocks != 0 {
				t.Errorf("%d blocks lost on a hit the cache reported truly", s.LostBlocks)
			}
		})
	}
}

// TestHybridEngineGenerate: a generation over a hybrid model's cached
// prefix decodes the tokens a cold engine does, and the next turn (prompt,
// answer, more) hits the blocks of the answer too.
func TestHybridEngineGenerate(t *testing.T) {
	c := hybridConfig()
	b := c.BlockTokens
	cache := newRecordCache()
	e := newHybridEngine(t, cache, nil)
	cold := newHybridEngine(t, nil, nil)
	r := newRand(47)
	prompt := randTokens(r, 3*b+7, c.Vocab)
	opts := GenerateOptions{MaxTokens: 2 * b}
	first, err := e.Generate(context.Background(), prompt, opts)
	if err != nil {
		t.Fatal(err)
	}
	flush(t, e)
	next := append(append(append([]uint32(nil), prompt...), first.Tokens...), randTokens(r, 9, c.Vocab)...)
	warm, err := e.Generate(context.Background(), next, opts)
	if err != nil {
		t.Fatal(err)
	}
	want, err := cold.Generate(context.Background(), next, opts)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(warm.Tokens, want.Tokens) {
		t.Errorf("tokens over the cache %v, cold %v", warm.Tokens, want.Tokens)
	}
	// The conversation's whole blocks, the last token aside, are cached.
	if got, wantHit := warm.Usage.CachedTokens, (len(prompt)+len(first.Tokens)-1)/b*b; got != wantHit {
		t.Errorf("the next turn resumed at %d, want %d (the prompt and answer's blocks)", got, wantHit)
	}
}

// TestHybridEngineBackground: a background prefill publishes its chunks'
// records of every group, and a foreground prefill of the same prompt
// resumes from them with the reference's logits.
func TestHybridEngineBackground(t *testing.T) {
	c := hybridConfig()
	b := c.BlockTokens
	cache := newRecordCache()
	e := newHybridEngine(t, cache, nil)
	tokens := randTokens(newRand(53), 7*b+3, c.Vocab)
	if _, err := e.PrefillBackground(context.Background(), tokens, ""); err != nil {
		t.Fatal(err)
	}
	got := run(t, e, tokens)
	if got.Usage.CachedTokens != 7*b {
		t.Errorf("cached_tokens %d after a background prefill, want %d", got.Usage.CachedTokens, 7*b)
	}
	if e := relErr(got.Logits, hybridRef(tokens)); e > 1e-4 {
		t.Errorf("logits differ from the reference by %.2g", e)
	}
}

// TestHybridEngineNeedsGroupCache: a hybrid model over a cache that reads
// no records is refused by New, naming what it needs.
func TestHybridEngineNeedsGroupCache(t *testing.T) {
	_, err := New(newMemCache(), Options{Config: hybridConfig(), Weights: hybridWeights()})
	if err == nil || !strings.Contains(err.Error(), "GroupCache") {
		t.Errorf("New over a plain Cache: %v", err)
	}
}

// TestHybridCheckpointMatchesPyTorch: a small random checkpoint of a
// hybrid model (config.json's layer_types: full, sliding-window and
// linear-attention layers), written by the independent PyTorch
// implementation, loads and computes that implementation's logits: decoded
// one position at a time (K/V and state carried), as a whole cold prompt,
// and resumed from the cache at several prefixes — the full blocks, the
// window and the state read back as records.
func TestHybridCheckpointMatchesPyTorch(t *testing.T) {
	const n = 120
	out := t.TempDir()
	m := prefilltest.Hybrid(n)
	ref := prefilltest.Suite(t, out, []prefilltest.Model{m})[0]
	dir := filepath.Join(out, m.Name)
	cfg, _, err := LoadConfigJSON(filepath.Join(dir, "config.json"))
	if err != nil {
		t.Fatal(err)
	}
	if cfg.LayerTypes != "fslfs" || cfg.SlidingWindow != 24 {
		t.Fatalf("config.json read as layer plan %q, window %d", cfg.LayerTypes, cfg.SlidingWindow)
	}
	cfg.BlockTokens = 16
	cache := newRecordCache()
	e, err := New(cache, Options{Config: cfg, ModelDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	check := func(what string, got []float32, p int) {
		t.Helper()
		if err := prefilltest.MaxRelErr(got, ref[p]); err > refTolerance {
			t.Errorf("%s: position %d: logits off the reference by %.2g of their scale", what, p, err)
		}
	}
	kv := NewKV(cfg, n)
	logits := make([]float32, cfg.Vocab)
	for p := range n {
		if err := e.model.Forward(context.Background(), kv, p, m.Prompt[p:p+1], logits); err != nil {
			t.Fatal(err)
		}
		check("decoded", logits, p)
	}
	check("cold", run(t, e, m.Prompt).Logits, n-1)
	flush(t, e)
	for _, k := range []int{n, 100, 48, 33} {
		hit := run(t, e, m.Prompt[:k])
		if want := (k - 1) / 16 * 16; hit.Usage.CachedTokens != want {
			t.Errorf("prefix of %d: %d tokens cached, want %d", k, hit.Usage.CachedTokens, want)
		}
		check("over a cached prefix", hit.Logits, k-1)
	}
}

// TestHybridConfigJSON: config.json's layer_types become the layer plan;
// one kind of layer throughout is a plain model; a kind the engine does
// not run, a plan of the wrong length, sliding layers without a window are
// refused by name.
func TestHybridConfigJSON(t *testing.T) {
	base := `"hidden_size": 64, "num_hidden_layers": 3, "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 96, "vocab_size": 300`
	for _, tc := range []struct {
		extra, plan string
		window      int
		err         string
	}{
		{`"layer_types": ["full_attention", "sliding_attention", "linear_attention"], "sliding_window": 32`, "fsl", 32, ""},
		{`"layer_types": ["full_attention", "linear_attention", "linear_attention"], "sliding_window": 4096`, "fll", 0, ""},
		{`"layer_types": ["full_attention", "full_attention", "full_attention"], "sliding_window": 4096`, "", 0, ""},
		{`"layer_types": ["sliding_attention", "sliding_attention", "sliding_attention"], "sliding_window": 64`, "", 64, ""},
		{`"layer_types": ["full_attention", "mamba", "full_attention"]`, "", 0, `layer_types[1]: "mamba" is not supported`},
		{`"layer_types": ["full_attention", "sliding_attention"], "sliding_window": 8`, "", 0, "layer_types: 2 entries for 3 layers"},
		{`"layer_types": ["full_attention", "sliding_attention", "full_attention"]`, "", 0, "sliding_window"},
		{`"layer_types": ["linear_attention", "linear_attention", "linear_attention"]`, "", 0, "full_attention layer"},
		{`"model_type": "qwen3", "layer_types": ["full_attention", "linear_attention", "full_attention"]`, "", 0, "qk_norm"},
		{`"model_type": "qwen3_next", "layer_types": ["full_attention", "linear_attention", "full_attention"]`, "", 0, `model_type "qwen3_next"`},
	} {
		c, _, err := parseConfigJSON([]byte("{" + base + ", " + tc.extra + "}"))
		switch {
		case tc.err != "":
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("%s: %v, want an error naming %q", tc.extra, err, tc.err)
			}
		case err != nil:
			t.Errorf("%s: %v", tc.extra, err)
		case c.LayerTypes != tc.plan || c.SlidingWindow != tc.window:
			t.Errorf("%s: plan %q, window %d; want %q, %d", tc.extra, c.LayerTypes, c.SlidingWindow, tc.plan, tc.window)
		}
	}
}

// BenchmarkHybridPrefill measures a hybrid model's time to first token of
// a 2048-token prompt, cold and with 90% of it cached (a frozen record
// cache filled by an earlier prefill of the prefix), on a model of the
// issue's shape: five sliding-window layers (W = 1024) to one full layer,
// and one linear-attention layer. It reports the TTFTs, the ratio of wall
// and of process CPU time, and the bytes the hit read against what
// reading every layer as full attention would take.
//
//	go test -run '^$' -bench HybridPrefill -benchtime 1x -count 3 ./prefill/
func BenchmarkHybridPrefill(b *testing.B) {
	cfg := Config{Layers: 7, Dim: 256, Heads: 4, KVHeads: 2, HeadDim: 64, FFNDim: 512, Vocab: 1024, BlockTokens: 64,
		LayerTypes: "sssssfl", SlidingWindow: 1024}
	cfg.EnsureDefaults()
	w := SeededWeights(cfg, 0)
	const n = 2048
	tokens := randTokens(newRand(3), n, cfg.Vocab)
	cold := benchEngine(b, nil, cfg, w)
	cache := newRecordCache()
	warm := benchEngine(b, cache, cfg, w)
	run(b, warm, tokens[:n*9/10])
	flush(b, warm)
	cache.frozen = true
	b.ResetTimer()
	var ttft, cpu [2]time.Duration
	var hit int
	var read int64
	for range b.N {
		for i, e := range []*Engine{cold, warm} {
			before := cache.read
			c0 := cpuTime()
			r := run(b, e, tokens)
			flush(b, e)
			cpu[i] += cpuTime() - c0
			ttft[i] += r.TTFT
			if i == 1 {
				hit, read = r.Usage.CachedTokens, cache.read-before
			}
		}
	}
	b.StopTimer()
	asFull := int64(hit/cfg.BlockTokens) * int64(block.EncodedLen(cfg.BlockTokens, cfg.Layers*2*cfg.BlockTokens*cfg.KVHeads*cfg.HeadDim*4))
	b.ReportMetric(ttft[0].Seconds()/float64(b.N), "cold-s")
	b.ReportMetric(ttft[1].Seconds()/float64(b.N), "c90-s")
	b.ReportMetric(float64(ttft[1])/float64(ttft[0]), "c90/cold")
	b.ReportMetric(float64(cpu[1])/float64(cpu[0]), "c90/cold-cpu")
	b.ReportMetric(float64(hit)/n, "cached-frac")
	b.ReportMetric(float64(read)/float64(asFull), "read/as-full")
}

// benchEngine returns an engine of cfg and w over cache, closed when b ends.
func benchEngine(b *testing.B, cache Cache, cfg Config, w *Weights) *Engine {
	e, err := New(cache, Options{Config: cfg, Weights: w})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { e.Close() })
	return e
}

// TestHybridEngineTenants: a hybrid prompt one tenant published is a hit
// for that tenant only: another tenant's prefill of it resumes at 0.
func TestHybridEngineTenants(t *testing.T) {
	c := hybridConfig()
	cache := newRecordCache()
	e := newHybridEngine(t, cache, nil)
	tokens := randTokens(newRand(59), 5*c.BlockTokens+3, c.Vocab)
	as := func(salt string) Result {
		t.Helper()
		res, err := e.Prefill(WithTenant(context.Background(), Tenant{Salt: salt, Tag: 7}), tokens, "")
		if err != nil {
			t.Fatal(err)
		}
		return res
	}
	as("a")
	flush(t, e)
	if got := as("b").Usage.CachedTokens; got != 0 {
		t.Errorf("tenant b resumed at %d from tenant a's records", got)
	}
	if got := as("a").Usage.CachedTokens; got != 5*c.BlockTokens {
		t.Errorf("tenant a resumed at %d, want %d", got, 5*c.BlockTokens)
	}
}

// TestHybridSpeculation: a model with a linear-attention layer refuses
// speculative decoding (and as a draft), naming why; one of full and
// sliding-window layers only speculates with prompt lookup over its
// groups' records and generates the tokens it does without.
func TestHybridSpeculation(t *testing.T) {
	lin := Options{Config: hybridConfig(), Weights: hybridWeights(), Speculative: SpeculativeOptions{Method: SpeculateNgram}}
	if _, err := New(newRecordCache(), lin); err == nil || !strings.Contains(err.Error(), "speculative.method") {
		t.Errorf("speculation on a model with a linear layer: %v", err)
	}
	draft := Options{Config: tinyConfig(), Weights: tinyWeights(),
		Speculative: SpeculativeOptions{Method: SpeculateDraft, Draft: &Options{Config: hybridConfig(), Weights: hybridWeights()}}}
	if _, err := New(newMemCache(), draft); err == nil || !strings.Contains(err.Error(), "speculative.draft") {
		t.Errorf("a draft with a linear layer: %v", err)
	}
	c := hybridConfig()
	c.LayerTypes = "fssfs"
	w := SeededWeights(c, 13)
	plain := newTinyEngine(t, nil, func(o *Options) { o.Config, o.Weights = c, w })
	e := newTinyEngine(t, newRecordCache(), func(o *Options) {
		o.Config, o.Weights, o.Speculative = c, w, SpeculativeOptions{Method: SpeculateNgram, Tokens: 4}
	})
	prompt := repetitive(5, 90, c.Vocab)
	opts := GenerateOptions{MaxTokens: 40}
	want := generate(t, plain, prompt, opts).Tokens
	proposed := 0
	for pass := range 2 { // cold, then over the records the first pass published
		g := generate(t, e, prompt, opts)
		proposed += g.Proposed
		if !slices.Equal(g.Tokens, want) {
			t.Errorf("pass %d: speculating %v, plain %v", pass, g.Tokens, want)
		}
		if pass == 1 && g.Usage.CachedTokens == 0 {
			t.Error("the second pass resumed nothing")
		}
		flush(t, e)
	}
	if proposed == 0 {
		t.Error("prompt lookup proposed nothing")
	}
}
