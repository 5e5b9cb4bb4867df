package prefill

import (
	"context"
	"errors"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/block"
	"github.com/kvmesh/kvmesh/prefixhash"
)

// memCache is the in-memory fake Cache: a map of encoded blocks, with knobs
// for the faults the engine must survive.
type memCache struct {
	mu        sync.Mutex
	blocks    map[prefixhash.Key][]byte
	frozen    bool                    // ignore Puts (benchmarks keep the cache as set up)
	lookupErr error                   // returned by LongestPrefix
	getErr    error                   // returned by Get
	putErr    error                   // returned by Put
	overclaim int                     // LongestPrefix reports this many more blocks than it has
	vanished  map[prefixhash.Key]bool // Get misses these, LongestPrefix still counts them
	puts      int
	putGate   chan struct{} // when set, Put waits for a receive... or its ctx
	released  int
	gets      int
}

func newMemCache() *memCache { return &memCache{blocks: make(map[prefixhash.Key][]byte)} }

func (c *memCache) LongestPrefix(ctx context.Context, keys []prefixhash.Key) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.lookupErr != nil {
		return 0, c.lookupErr
	}
	n := 0
	for n < len(keys) && c.blocks[keys[n]] != nil {
		n++
	}
	return n + c.overclaim, nil
}

func (c *memCache) Get(ctx context.Context, keys []prefixhash.Key) ([][]byte, func(), error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.getErr != nil {
		return nil, nil, c.getErr
	}
	c.gets++
	out := make([][]byte, len(keys))
	for i, k := range keys {
		if !c.vanished[k] {
			out[i] = c.blocks[k]
		}
	}
	return out, func() {
		c.mu.Lock()
		c.released++
		c.mu.Unlock()
	}, nil
}

func (c *memCache) Put(ctx context.Context, chain []prefixhash.Key, from int, blocks [][]byte) error {
	if c.putGate != nil {
		select {
		case <-c.putGate:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.puts++
	if c.putErr != nil {
		return c.putErr
	}
	if c.frozen {
		return nil
	}
	for i, k := range chain[from : from+len(blocks)] {
		c.blocks[k] = append([]byte(nil), blocks[i]...) // the engine reuses blocks
	}
	return nil
}

func (c *memCache) len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.blocks)
}

func (c *memCache) set(k prefixhash.Key, b []byte) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.blocks[k] = b
}

func (c *memCache) get(k prefixhash.Key) []byte {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.blocks[k]
}

var tinyWeights = sync.OnceValue(func() *Weights { return SeededWeights(tinyConfig(), 7) })

func newTinyEngine(t testing.TB, cache Cache, edit func(*Options)) *Engine {
	t.Helper()
	opts := Options{Config: tinyConfig(), Weights: tinyWeights()}
	if edit != nil {
		edit(&opts)
	}
	e, err := New(cache, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	return e
}

func run(t testing.TB, e *Engine, tokens []uint32) Result {
	t.Helper()
	res, err := e.Prefill(context.Background(), tokens, "s")
	if err != nil {
		t.Fatal(err)
	}
	return res
}

func flush(t testing.TB, e *Engine) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := e.Flush(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestPrefixHitEqualsCold: for random prompts and random split points, a
// first request publishes the blocks of a prefix, a second, longer request
// hits them, and its logits equal those of a cold engine.
func TestPrefixHitEqualsCold(t *testing.T) {
	cold := newTinyEngine(t, nil, nil)
	r := rand.New(rand.NewPCG(11, 12))
	b := tinyConfig().BlockTokens
	for i := range 10 {
		cache := newMemCache()
		e := newTinyEngine(t, cache, nil)
		n := 2 + r.IntN(500)
		tokens := randTokens(r, n, tinyConfig().Vocab)
		split := 1 + r.IntN(n-1)
		first := run(t, e, tokens[:split])
		if first.Usage.CachedTokens != 0 {
			t.Fatalf("case %d: a first request on an empty cache reports %d cached tokens", i, first.Usage.CachedTokens)
		}
		flush(t, e)
		if got, want := cache.len(), split/b; got != want {
			t.Fatalf("case %d: %d blocks published for a %d-token prompt, want %d", i, got, split, want)
		}
		warm := run(t, e, tokens)
		want := run(t, cold, tokens)
		if got, want := warm.Usage, (Usage{PromptTokens: n, CachedTokens: split / b * b}); got != want {
			t.Errorf("case %d (n=%d, split=%d): usage %+v, want %+v", i, n, split, got, want)
		}
		if e := relErr(warm.Logits, want.Logits); e > 1e-4 {
			t.Errorf("case %d (n=%d, split=%d): warm logits differ from cold by %.2g", i, n, split, e)
		}
		if warm.TopTokens[0] != want.TopTokens[0] {
			t.Errorf("case %d: top token %d, cold says %d", i, warm.TopTokens[0], want.TopTokens[0])
		}
	}
}

// TestAllBlocksCached: a prompt of whole blocks, all cached, still computes
// its last position; cached_tokens is then prompt_tokens−1 and nothing new
// is published.
func TestAllBlocksCached(t *testing.T) {
	cache := newMemCache()
	e := newTinyEngine(t, cache, nil)
	cold := newTinyEngine(t, nil, nil)
	tokens := randTokens(rand.New(rand.NewPCG(1, 1)), 4*tinyConfig().BlockTokens, tinyConfig().Vocab)
	run(t, e, tokens)
	flush(t, e)
	published := e.Stats().Published
	res := run(t, e, tokens)
	flush(t, e)
	if got, want := res.Usage, (Usage{PromptTokens: len(tokens), CachedTokens: len(tokens) - 1}); got != want {
		t.Errorf("usage %+v, want %+v", got, want)
	}
	if e := relErr(res.Logits, run(t, cold, tokens).Logits); e > 1e-4 {
		t.Errorf("all-cached logits differ from cold by %.2g", e)
	}
	if got := e.Stats().Published; got != published {
		t.Errorf("an all-cached prefill published %d more blocks", got-published)
	}
	if res.FLOPs >= tinyConfig().ForwardFLOPs(0, 2) {
		t.Errorf("an all-cached prefill did %g FLOPs, more than two positions cost", res.FLOPs)
	}
}

// corruptions are the ways a cached block of namespace ns can be bad; each
// must read as a miss from that block on, never as an error or as wrong
// logits.
func corruptions(t *testing.T) map[string]func(ns prefixhash.Namespace, b []byte) []byte {
	other := newTinyEngine(t, nil, func(o *Options) { o.Weights = nil; o.Seed = 99 })
	return map[string]func(prefixhash.Namespace, []byte) []byte{
		"payload bit flip": func(_ prefixhash.Namespace, b []byte) []byte {
			c := append([]byte(nil), b...)
			c[len(c)-5] ^= 0x10
			return c
		},
		"truncated": func(_ prefixhash.Namespace, b []byte) []byte { return b[:len(b)-1] },
		"garbage":   func(_ prefixhash.Namespace, b []byte) []byte { return []byte("not a block") },
		"other tokens": func(ns prefixhash.Namespace, b []byte) []byte {
			// A valid block of this namespace and parent, but of other tokens.
			blk, _ := block.Decode(b, 0)
			toks := append([]uint32(nil), blk.Tokens...)
			toks[0] ^= 1
			enc, _, _ := block.Encode(nil, ns, blk.Parent, toks, blk.Payload)
			return enc
		},
		"other namespace": func(_ prefixhash.Namespace, b []byte) []byte {
			// Self-consistent, same tokens and parent, but another model's.
			blk, _ := block.Decode(b, 0)
			enc, _, _ := block.Encode(nil, other.Namespace(), blk.Parent, blk.Tokens, blk.Payload)
			return enc
		},
	}
}

func TestCorruptBlockIsRecomputed(t *testing.T) {
	cold := newTinyEngine(t, nil, nil)
	c := tinyConfig()
	tokens := randTokens(rand.New(rand.NewPCG(2, 2)), 6*c.BlockTokens+5, c.Vocab)
	want := run(t, cold, tokens).Logits
	for name, corrupt := range corruptions(t) {
		t.Run(name, func(t *testing.T) {
			cache := newMemCache()
			e := newTinyEngine(t, cache, nil)
			run(t, e, tokens)
			flush(t, e)
			keys := prefixhash.Keys(e.Namespace(), tokens)
			const bad = 3
			cache.set(keys[bad], corrupt(e.Namespace(), cache.get(keys[bad])))
			res := run(t, e, tokens)
			if res.Usage.CachedTokens != bad*c.BlockTokens {
				t.Errorf("cached_tokens %d, want %d (the blocks before the bad one)", res.Usage.CachedTokens, bad*c.BlockTokens)
			}
			if e := relErr(res.Logits, want); e > 1e-4 {
				t.Errorf("logits differ from cold by %.2g", e)
			}
			st := e.Stats()
			if st.CorruptBlocks != 1 || st.LostBlocks != int64(len(keys)-bad) {
				t.Errorf("stats %+v: want 1 corrupt block and %d lost", st, len(keys)-bad)
			}
			// The recomputed blocks are published again and repair the cache.
			flush(t, e)
			res = run(t, e, tokens)
			if res.Usage.CachedTokens != len(keys)*c.BlockTokens {
				t.Errorf("after repair: cached_tokens %d, want %d", res.Usage.CachedTokens, len(keys)*c.BlockTokens)
			}
		})
	}
}

// TestCacheFaultsAreMisses: a cache that fails, lies or loses blocks costs
// recomputation, never an error or wrong logits.
func TestCacheFaultsAreMisses(t *testing.T) {
	c := tinyConfig()
	tokens := randTokens(rand.New(rand.NewPCG(3, 3)), 5*c.BlockTokens, c.Vocab)
	want := run(t, newTinyEngine(t, nil, nil), tokens).Logits
	for _, tc := range []struct {
		name   string
		break_ func(*memCache, []prefixhash.Key)
		cached int
		check  func(Stats) bool
	}{
		{"lookup fails", func(m *memCache, _ []prefixhash.Key) { m.lookupErr = errors.New("peer down") }, 0,
			func(s Stats) bool { return s.LookupErrors == 1 }},
		{"get fails", func(m *memCache, _ []prefixhash.Key) { m.getErr = errors.New("timeout") }, 0,
			func(s Stats) bool { return s.FetchErrors == 1 && s.LostBlocks == 5 }},
		{"block vanished", func(m *memCache, k []prefixhash.Key) { m.vanished = map[prefixhash.Key]bool{k[2]: true} }, 2 * c.BlockTokens,
			func(s Stats) bool { return s.MissingBlocks == 1 && s.LostBlocks == 3 }},
		{"lookup overclaims", func(m *memCache, _ []prefixhash.Key) { m.overclaim = 1000 }, 5*c.BlockTokens - 1,
			func(s Stats) bool { return s.MissingBlocks == 0 }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cache := newMemCache()
			e := newTinyEngine(t, cache, nil)
			run(t, e, tokens)
			flush(t, e)
			tc.break_(cache, prefixhash.Keys(e.Namespace(), tokens))
			res := run(t, e, tokens)
			if res.Usage.CachedTokens != tc.cached {
				t.Errorf("cached_tokens %d, want %d", res.Usage.CachedTokens, tc.cached)
			}
			if e := relErr(res.Logits, want); e > 1e-4 {
				t.Errorf("logits differ from cold by %.2g", e)
			}
			if st := e.Stats(); !tc.check(st) {
				t.Errorf("stats %+v", st)
			}
			if cache.gets != cache.released {
				t.Errorf("%d Gets, %d releases", cache.gets, cache.released)
			}
		})
	}
}

// TestPublishNeverBlocks: with Put stuck, prefills still return, the queue
// fills, and the overflow is dropped and counted.
func TestPublishNeverBlocks(t *testing.T) {
	cache := newMemCache()
	cache.putGate = make(chan struct{})
	e := newTinyEngine(t, cache, func(o *Options) { o.PublishQueue = 2 })
	c := tinyConfig()
	r := rand.New(rand.NewPCG(4, 4))
	const prompts = 6
	for range prompts {
		run(t, e, randTokens(r, 2*c.BlockTokens, c.Vocab)) // 2 blocks each
	}
	// One job is in the stuck Put, at most two wait in the queue: at least
	// three prompts' blocks were dropped without waiting.
	if got := e.Stats().DroppedBlocks; got < 2*(prompts-3) {
		t.Errorf("%d blocks dropped, want at least %d", got, 2*(prompts-3))
	}
	close(cache.putGate)
	flush(t, e)
	st := e.Stats()
	if st.Published+st.DroppedBlocks != 2*prompts {
		t.Errorf("published %d + dropped %d, want %d blocks in all", st.Published, st.DroppedBlocks, 2*prompts)
	}
	if cache.len() != int(st.Published) {
		t.Errorf("cache holds %d blocks, %d published", cache.len(), st.Published)
	}
}

func TestPublishErrorsAreCounted(t *testing.T) {
	cache := newMemCache()
	cache.putErr = errors.New("disk full")
	e := newTinyEngine(t, cache, nil)
	run(t, e, randTokens(rand.New(rand.NewPCG(5, 5)), 3*tinyConfig().BlockTokens, tinyConfig().Vocab))
	flush(t, e)
	if st := e.Stats(); st.PublishErrors != 1 || st.DroppedBlocks != 3 || st.Published != 0 {
		t.Errorf("stats %+v: want 1 publish error and 3 dropped blocks", st)
	}
}

func TestBadInput(t *testing.T) {
	e := newTinyEngine(t, newMemCache(), func(o *Options) { o.Config.MaxContext = 100 })
	c := e.Config()
	for _, tc := range []struct {
		name   string
		tokens []uint32
		says   string
	}{
		{"empty", nil, "empty"},
		{"token outside vocab", []uint32{1, 2, uint32(c.Vocab)}, "token 260 at position 2"},
		{"huge token", []uint32{1 << 31}, "outside the vocabulary"},
		{"too long", make([]uint32, c.MaxContext+1), "101 tokens, the context holds 100"},
	} {
		_, err := e.Prefill(context.Background(), tc.tokens, "")
		if !errors.Is(err, ErrInvalidInput) || !strings.Contains(err.Error(), tc.says) {
			t.Errorf("%s: got %v, want ErrInvalidInput saying %q", tc.name, err, tc.says)
		}
	}
	if st := e.Stats(); st.Failed != 4 || st.Requests != 0 {
		t.Errorf("stats %+v", st)
	}
	// A prompt of exactly MaxContext tokens is fine.
	if _, err := e.Prefill(context.Background(), make([]uint32, c.MaxContext), ""); err != nil {
		t.Errorf("a prompt of max context: %v", err)
	}
}

func TestNamespaceSeparatesModels(t *testing.T) {
	base := newTinyEngine(t, nil, nil)
	for name, edit := range map[string]func(*Options){
		"other seed":   func(o *Options) { o.Weights = nil; o.Seed = 8 },
		"other shape":  func(o *Options) { o.Weights = nil; o.Config.FFNDim = 128 },
		"other theta":  func(o *Options) { o.Config.RopeTheta = 500000 },
		"other block":  func(o *Options) { o.Config.BlockTokens = 32 },
		"other tenant": func(o *Options) { o.TenantSalt = "t2" },
	} {
		e := newTinyEngine(t, nil, edit)
		if e.Namespace().Digest() == base.Namespace().Digest() {
			t.Errorf("%s: same namespace %s", name, e.Namespace())
		}
	}
	// Same shape and weights, other seed spelled out as the same weights: same namespace.
	same := newTinyEngine(t, nil, func(o *Options) { o.Weights = nil; o.Seed = 7 })
	if same.Namespace() != base.Namespace() {
		t.Errorf("the same weights give namespaces %s and %s", same.Namespace(), base.Namespace())
	}
}

// TestTenantsDoNotShare: two engines over one cache with different salts
// never hit each other's blocks.
func TestTenantsDoNotShare(t *testing.T) {
	cache := newMemCache()
	a := newTinyEngine(t, cache, func(o *Options) { o.TenantSalt = "a" })
	b := newTinyEngine(t, cache, func(o *Options) { o.TenantSalt = "b" })
	tokens := randTokens(rand.New(rand.NewPCG(6, 6)), 4*tinyConfig().BlockTokens, tinyConfig().Vocab)
	run(t, a, tokens)
	flush(t, a)
	if res := run(t, b, tokens); res.Usage.CachedTokens != 0 {
		t.Errorf("tenant b hit %d tokens of tenant a", res.Usage.CachedTokens)
	}
}

func TestCloseAndCancel(t *testing.T) {
	cache := newMemCache()
	cache.putGate = make(chan struct{}) // Put waits until Close cancels it
	e := newTinyEngine(t, cache, nil)
	tokens := randTokens(rand.New(rand.NewPCG(7, 7)), 3*tinyConfig().BlockTokens, tinyConfig().Vocab)
	run(t, e, tokens)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := e.Prefill(ctx, tokens, ""); !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled prefill: %v", err)
	}
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := e.Prefill(context.Background(), tokens, ""); !errors.Is(err, ErrClosed) {
		t.Errorf("prefill after close: %v", err)
	}
	if err := e.Flush(context.Background()); !errors.Is(err, ErrClosed) {
		t.Errorf("flush after close: %v", err)
	}
	if st := e.Stats(); st.DroppedBlocks != 3 {
		t.Errorf("stats %+v: the 3 blocks stuck in Put should be dropped", st)
	}
	if err := e.Close(); err != nil {
		t.Errorf("second close: %v", err)
	}
}

// TestConcurrentPrefills runs prefills from several goroutines over one
// cache (under -race) and checks each against the cold answer.
func TestConcurrentPrefills(t *testing.T) {
	cache := newMemCache()
	e := newTinyEngine(t, cache, func(o *Options) { o.Concurrency = 2 })
	cold := newTinyEngine(t, nil, nil)
	r := rand.New(rand.NewPCG(8, 8))
	shared := randTokens(r, 3*tinyConfig().BlockTokens, tinyConfig().Vocab)
	prompts := make([][]uint32, 8)
	for i := range prompts {
		prompts[i] = append(append([]uint32(nil), shared...), randTokens(r, 1+r.IntN(40), tinyConfig().Vocab)...)
	}
	got := make([]Result, len(prompts))
	var wg sync.WaitGroup
	for i, p := range prompts {
		wg.Go(func() { got[i] = run(t, e, p) })
	}
	wg.Wait()
	for i, p := range prompts {
		if err := relErr(got[i].Logits, run(t, cold, p).Logits); err > 1e-4 {
			t.Errorf("prompt %d: logits differ from cold by %.2g", i, err)
		}
	}
}

func TestSessionIsRecorded(t *testing.T) {
	e := newTinyEngine(t, nil, nil)
	res, err := e.Prefill(context.Background(), TokenizeBytes("hello"), "sess-42")
	if err != nil {
		t.Fatal(err)
	}
	if res.Session != "sess-42" || len(res.TopTokens) != TopK || res.Usage.PromptTokens != 5 {
		t.Errorf("result %+v", res)
	}
	if res.TTFT < res.Timing.Compute {
		t.Errorf("TTFT %v shorter than its compute %v", res.TTFT, res.Timing.Compute)
	}
}
