package prefill

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kvmesh/kvmesh/block"
	"github.com/kvmesh/kvmesh/prefixhash"
)

// Cache is what the engine needs from the KV store. It is declared here, by
// its consumer; the node adapts store.Local and store.Cluster to it. Every
// method must honour ctx and turn a slow or failed peer into a miss (a short
// answer), not a hang.
type Cache interface {
	// LongestPrefix returns how many leading keys of keys, a chain in order,
	// are cached: 0..len(keys). One call covers the whole prompt (in a
	// cluster, one parallel round trip). An error reads as 0.
	LongestPrefix(ctx context.Context, keys []prefixhash.Key) (int, error)
	// Get returns the encoded blocks (block.Encode) of keys, in order. A
	// missing block is a nil entry; a slice shorter than keys reads as
	// padded with nils. The blocks are read-only and valid until release is
	// called; when err is nil, release is non-nil and the engine calls it
	// exactly once.
	Get(ctx context.Context, keys []prefixhash.Key) (blocks [][]byte, release func(), err error)
	// Put stores encoded blocks: blocks[i] is the block of chain[from+i].
	// chain is the prompt's whole chain from block 0, so that a cluster can
	// place each block by the first key of its placement chunk. The engine
	// owns the slices and reuses them after Put returns: Put copies what it
	// keeps. Put may drop blocks (a full cache) without an error.
	Put(ctx context.Context, chain []prefixhash.Key, from int, blocks [][]byte) error
}

// Sentinel errors of the engine.
var (
	// ErrInvalidInput is wrapped by errors about a prompt the engine cannot
	// run: empty, longer than the context, or with a token outside the
	// vocabulary. The message names the problem.
	ErrInvalidInput = errors.New("prefill: invalid input")
	// ErrClosed is returned by calls on a closed Engine.
	ErrClosed = errors.New("prefill: engine closed")
)

// Options configure an Engine.
type Options struct {
	// Config is the model's shape; zero fields take Config's defaults.
	Config Config
	// Weights, when set, are used as is (they must fit Config).
	Weights *Weights
	// WeightsPath, when Weights is nil, names a safetensors file to load.
	// Default "": weights are generated from Seed.
	WeightsPath string
	// ModelDir, when Weights is nil, names a Hugging Face model directory
	// whose checkpoint the engine loads (LoadCheckpoint, with
	// tie_word_embeddings from its config.json) and releases at Close.
	// Config must be the directory's (LoadConfigJSON), BlockTokens and
	// MaxContext aside. Default "".
	ModelDir string
	// MaxModelBytes bounds the host memory the weights may take
	// (Config.WeightBytes): a larger model is refused before anything is
	// loaded. Default 0: the machine's physical memory.
	MaxModelBytes int64
	// Seed seeds generated weights. Default 0, itself a valid seed.
	Seed uint64
	// TenantSalt, when set, is part of the namespace: engines with different
	// salts never share blocks. Default "".
	TenantSalt string
	// Backend runs the model. Default: the CPU backend with default options.
	Backend Backend
	// Concurrency is how many prefills run at once; the others wait for a
	// slot (or their context). Default 1: one forward pass already keeps
	// every core busy (gonum's products use GOMAXPROCS goroutines, attention
	// tiles use the backend's threads), so a second one would only split the
	// cores, double the memory, and delay both.
	Concurrency int
	// PublishQueue bounds the prefills whose new blocks wait to be published.
	// A prefill that finds it full drops its blocks (counted in
	// Stats.DroppedBlocks) rather than wait. Each queued prefill holds its KV
	// (Layers·2·tokens·KVHeads·HeadDim·4 bytes). Default 8.
	PublishQueue int
	// PublishTimeout is the deadline of one Put. Default 10s.
	PublishTimeout time.Duration
	// BackgroundBlocks is the size, in blocks, of the chunks a background
	// prefill (PrefillBackground) computes and publishes one at a time; a
	// foreground prefill preempts it between two checks of the forward
	// pass, and at most one chunk's work is redone. Default 2.
	BackgroundBlocks int
	// BackgroundGrace is how long background prefills stay off the cores
	// after the last foreground prefill returned: time for its answer to be
	// sent, and for the next request of a burst to arrive, before queued
	// work competes for the cores again. Default 5ms; negative: none.
	BackgroundGrace time.Duration
	// Speculative configures speculative decoding in Generate. Default:
	// off, one token per forward pass.
	Speculative SpeculativeOptions
	// Logger receives debug records per prefill. Default slog.Default().
	Logger *slog.Logger
	// Now is the clock TTFT is measured with. Default time.Now.
	Now func() time.Time
}

// Defaults of Options.
const (
	DefaultConcurrency      = 1
	DefaultPublishQueue     = 8
	DefaultPublishTimeout   = 10 * time.Second
	DefaultBackgroundBlocks = 2
	DefaultBackgroundGrace  = 5 * time.Millisecond
)

// EnsureDefaults fills zero fields with their defaults. It leaves Backend
// nil (New makes the CPU backend).
func (o *Options) EnsureDefaults() {
	o.Config.EnsureDefaults()
	if o.Concurrency == 0 {
		o.Concurrency = DefaultConcurrency
	}
	if o.PublishQueue == 0 {
		o.PublishQueue = DefaultPublishQueue
	}
	if o.PublishTimeout == 0 {
		o.PublishTimeout = DefaultPublishTimeout
	}
	if o.BackgroundBlocks == 0 {
		o.BackgroundBlocks = DefaultBackgroundBlocks
	}
	if o.BackgroundGrace == 0 {
		o.BackgroundGrace = DefaultBackgroundGrace
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	o.Speculative.EnsureDefaults()
}

// Validate names the first bad field.
func (o Options) Validate() error {
	if err := o.Config.Validate(); err != nil {
		return err
	}
	switch {
	case o.Concurrency < 1 || o.Concurrency > 1024:
		return fmt.Errorf("%w: concurrency: %d is outside 1..1024", ErrInvalidConfig, o.Concurrency)
	case o.PublishQueue < 1 || o.PublishQueue > 1<<16:
		return fmt.Errorf("%w: publish_queue: %d is outside 1..65536", ErrInvalidConfig, o.PublishQueue)
	case o.BackgroundBlocks < 1 || o.BackgroundBlocks > 1<<16:
		return fmt.Errorf("%w: background_blocks: %d is outside 1..65536", ErrInvalidConfig, o.BackgroundBlocks)
	case o.PublishTimeout < 0:
		return fmt.Errorf("%w: publish_timeout: %v is negative", ErrInvalidConfig, o.PublishTimeout)
	case len(o.TenantSalt) > prefixhash.MaxSaltLen:
		return fmt.Errorf("%w: tenant_salt: %d bytes, the limit is %d", ErrInvalidConfig, len(o.TenantSalt), prefixhash.MaxSaltLen)
	}
	return o.Speculative.Validate()
}

// Usage is what a prefill cost, in the OpenAI usage shape.
type Usage struct {
	// PromptTokens is the prompt's length.
	PromptTokens int `json:"prompt_tokens"`
	// CachedTokens is the number of leading prompt positions that were not
	// computed because their K/V came from the cache. When every block of
	// the prompt is cached, the last position is still computed (its logits
	// are the answer), so CachedTokens is PromptTokens−1.
	CachedTokens int `json:"cached_tokens"`
}

// Timing splits a prefill's time to first token.
type Timing struct {
	Wait    time.Duration // waiting for a slot (Options.Concurrency)
	Lookup  time.Duration // key chain and Cache.LongestPrefix
	Fetch   time.Duration // Cache.Get, verification, K/V load
	Compute time.Duration // the forward pass of the suffix
}

// TopK is the number of token ids a Result ranks.
const TopK = 5

// Result is the outcome of one prefill.
type Result struct {
	// TopTokens are the TopK token ids with the highest last-position
	// logits, best first; ties go to the lower id.
	TopTokens []uint32
	// Logits are the last position's logits, len Config.Vocab. The caller
	// owns them.
	Logits []float32
	Usage  Usage
	// TTFT is the time from the call to the logits being ready: the wait
	// for a slot, lookup, fetch and compute. Publishing comes after and is
	// not in it.
	TTFT   time.Duration
	Timing Timing
	// FLOPs is the arithmetic the forward pass did (Config.ForwardFLOPs).
	FLOPs float64
	// Session is the session hint the caller passed; hits never depend on it.
	Session string
}

// Stats are the engine's counters since New.
type Stats struct {
	Requests       int64 // prefills that returned a result
	Failed         int64 // prefills that returned an error
	PromptTokens   int64
	CachedTokens   int64
	ComputedTokens int64
	LookupErrors   int64 // LongestPrefix failed; read as a miss
	FetchErrors    int64 // Get failed; read as a miss
	MissingBlocks  int64 // blocks LongestPrefix reported that Get did not return (first per prefill)
	CorruptBlocks  int64 // fetched blocks that failed verification (first per prefill)
	LostBlocks     int64 // blocks LongestPrefix reported that were recomputed anyway
	Published      int64 // blocks handed to Put successfully
	PublishErrors  int64 // Put calls that failed
	DroppedBlocks  int64 // new blocks not published: queue full, Put failed, or engine closing
	Background     int64 // of Requests, background ones (PrefillBackground, GenerateOptions.Background)
	Preempted      int64 // background chunks cancelled for a foreground prefill and run again
	Generations    int64 // of Requests, those that decoded (Generate)
	Generated      int64 // tokens sampled by Generate, stop sequences included
	Proposed       int64 // tokens the speculative proposer guessed (Options.Speculative)
	Accepted       int64 // of Proposed, those the model accepted (each one of Generated)
}

type counters struct {
	requests, failed, prompt, cached, computed atomic.Int64
	lookupErrors, fetchErrors                  atomic.Int64
	missing, corrupt, lost                     atomic.Int64
	published, publishErrors, dropped          atomic.Int64
	background, preempted                      atomic.Int64
	generations, generated                     atomic.Int64
	proposed, accepted                         atomic.Int64
}

// Engine is the prefill engine: it answers Prefill with a model, a cache
// and a background publisher. It is safe for concurrent use.
type Engine struct {
	opts    Options
	cfg     Config
	ns      prefixhash.Namespace
	root    prefixhash.Key // ns.Root(), the parent of every prompt's block 0
	digest  uint64
	cache   Cache
	model   Model
	backend string
	slots   chan struct{}
	bgSlots chan struct{} // background prefills' own slots (PrefillBackground)
	kvPool  sync.Pool     // *KV
	owned   *Weights      // released by Close (Options.ModelDir)
	draft   *Engine       // the draft model of SpeculateDraft; closed by Close
	stats   counters
	sched   sched // foreground prefills before background ones

	// ctx is cancelled by Close: in-flight prefills stop, Put returns.
	ctx    context.Context
	cancel context.CancelFunc
	active sync.WaitGroup // in-flight Prefill calls
	pubWG  sync.WaitGroup // the publisher goroutine
	mu     struct {
		sync.RWMutex
		closed bool
		queue  chan publishJob // closed by Close under the write lock
	}
}

// New returns an engine over cache (nil: no caching, every prefill is cold).
// It loads or generates the weights, derives the namespace from the config
// and the weights' digest, loads the model on the backend, and starts the
// publisher. Close stops it.
func New(cache Cache, opts Options) (*Engine, error) {
	opts.EnsureDefaults()
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	cfg := opts.Config
	w := opts.Weights
	var owned *Weights // weights the engine loaded and releases
	if w == nil && opts.ModelDir != "" {
		_, info, err := LoadConfigJSON(filepath.Join(opts.ModelDir, "config.json"))
		if err != nil {
			return nil, err
		}
		tied := info.TieEmbeddings != nil && *info.TieEmbeddings
		if err := checkModelBytes(cfg.WeightBytes(tied), opts.MaxModelBytes); err != nil {
			return nil, err
		}
		if w, err = LoadCheckpoint(opts.ModelDir, cfg, info.TieEmbeddings); err != nil {
			return nil, err
		}
		owned = w
	}
	if w == nil && opts.WeightsPath != "" {
		if err := checkModelBytes(cfg.WeightBytes(false), opts.MaxModelBytes); err != nil {
			return nil, err
		}
		var err error
		if w, err = LoadWeights(opts.WeightsPath, cfg); err != nil {
			return nil, err
		}
	}
	e, err := newEngine(cache, opts, w)
	if err != nil {
		return nil, errors.Join(err, owned.Release())
	}
	e.owned = owned
	if opts.Speculative.Method == SpeculateDraft {
		if e.draft, err = newDraft(cache, opts, cfg); err != nil {
			return nil, errors.Join(err, e.Close())
		}
	}
	return e, nil
}

// ErrModelTooLarge is returned by New for weights over
// Options.MaxModelBytes, or over the machine's memory.
var ErrModelTooLarge = errors.New("prefill: model too large")

// checkModelBytes refuses weights of need bytes over limit (0: the
// machine's physical memory).
func checkModelBytes(need, limit int64) error {
	of := "--max-model-bytes"
	if limit <= 0 {
		var si unix.Sysinfo_t
		if unix.Sysinfo(&si) != nil {
			return nil
		}
		limit, of = int64(si.Totalram)*int64(si.Unit), "the machine's memory"
	}
	if need > limit {
		return fmt.Errorf("%w: its weights take %.1f MiB in float32, over %s (%.1f MiB)", ErrModelTooLarge, float64(need)/(1<<20), of, float64(limit)/(1<<20))
	}
	return nil
}

func newEngine(cache Cache, opts Options, w *Weights) (*Engine, error) {
	cfg := opts.Config
	if w == nil {
		w = SeededWeights(cfg, opts.Seed)
	}
	if err := w.Check(cfg); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrWeights, err)
	}
	backend := opts.Backend
	if backend == nil {
		cpu, err := NewCPU(CPUOptions{})
		if err != nil {
			return nil, err
		}
		backend = cpu
	}
	digest := w.Digest(cfg)
	ns := cfg.Namespace(digest, opts.TenantSalt)
	if err := ns.Validate(); err != nil {
		return nil, fmt.Errorf("prefill: namespace: %w", err)
	}
	model, err := backend.Load(cfg, w)
	if err != nil {
		return nil, fmt.Errorf("prefill: load model on %s: %w", backend.Name(), err)
	}
	e := &Engine{
		opts:    opts,
		cfg:     cfg,
		ns:      ns,
		root:    ns.Root(),
		digest:  digest,
		cache:   cache,
		model:   model,
		backend: backend.Name(),
		slots:   make(chan struct{}, opts.Concurrency),
		bgSlots: make(chan struct{}, opts.Concurrency),
	}
	e.ctx, e.cancel = context.WithCancel(context.Background())
	e.sched.init(opts.BackgroundGrace, opts.Now)
	e.mu.queue = make(chan publishJob, opts.PublishQueue)
	e.pubWG.Add(1)
	go e.publishLoop(e.mu.queue)
	return e, nil
}

// Namespace returns the namespace of the blocks this engine reads and writes.
func (e *Engine) Namespace() prefixhash.Namespace { return e.ns }

// Config returns the model's shape.
func (e *Engine) Config() Config { return e.cfg }

// WeightsDigest returns the digest of the model's weights (Weights.Digest).
func (e *Engine) WeightsDigest() uint64 { return e.digest }

// Backend returns the name of the backend the model runs on.
func (e *Engine) Backend() string { return e.backend }

// Stats returns a snapshot of the counters.
func (e *Engine) Stats() Stats {
	s := &e.stats
	return Stats{
		Requests: s.requests.Load(), Failed: s.failed.Load(),
		PromptTokens: s.prompt.Load(), CachedTokens: s.cached.Load(), ComputedTokens: s.computed.Load(),
		LookupErrors: s.lookupErrors.Load(), FetchErrors: s.fetchErrors.Load(),
		MissingBlocks: s.missing.Load(), CorruptBlocks: s.corrupt.Load(), LostBlocks: s.lost.Load(),
		Published: s.published.Load(), PublishErrors: s.publishErrors.Load(), DroppedBlocks: s.dropped.Load(),
		Background: s.background.Load(), Preempted: s.preempted.Load(),
		Generations: s.generations.Load(), Generated: s.generated.Load(),
		Proposed: s.proposed.Load(), Accepted: s.accepted.Load(),
	}
}

// TokenizeBytes is the byte-level tokenizer: the UTF-8 bytes of text as token
// ids (0..255).
func TokenizeBytes(text string) []uint32 {
	t := make([]uint32, len(text))
	for i := range len(text) {
		t[i] = uint32(text[i])
	}
	return t
}

func (e *Engine) checkInput(tokens []uint32) error {
	switch {
	case len(tokens) == 0:
		return fmt.Errorf("%w: the prompt is empty", ErrInvalidInput)
	case len(tokens) > e.cfg.MaxContext:
		return fmt.Errorf("%w: the prompt has %d tokens, the context holds %d", ErrInvalidInput, len(tokens), e.cfg.MaxContext)
	}
	for i, t := range tokens {
		if int64(t) >= int64(e.cfg.Vocab) {
			return fmt.Errorf("%w: token %d at position %d is outside the vocabulary of %d", ErrInvalidInput, t, i, e.cfg.Vocab)
		}
	}
	return nil
}

// Prefill runs one prompt: it looks up the longest cached prefix, loads
// those blocks' K/V, computes only the rest, queues the new full blocks for
// publication, and returns the last position's logits. tokens are read
// during the call only. A cache that fails, or returns a missing or corrupt
// block, costs recomputation, never an error. session is recorded, not used
// for lookups. Errors: ErrInvalidInput for a bad prompt, ErrClosed, or ctx's
// error.
func (e *Engine) Prefill(ctx context.Context, tokens []uint32, session string) (Result, error) {
	began := e.opts.Now()
	res, err := e.prefill(ctx, began, tokens, session)
	return e.account(res, err, false)
}

// account counts a prefill's outcome in Stats and passes it on.
func (e *Engine) account(res Result, err error, background bool) (Result, error) {
	if err != nil {
		e.stats.failed.Add(1)
		return Result{}, err
	}
	e.stats.requests.Add(1)
	if background {
		e.stats.background.Add(1)
	}
	e.stats.prompt.Add(int64(res.Usage.PromptTokens))
	e.stats.cached.Add(int64(res.Usage.CachedTokens))
	e.stats.computed.Add(int64(res.Usage.PromptTokens - res.Usage.CachedTokens))
	e.opts.Logger.Debug("prefill", "session", res.Session, "background", background, "prompt_tokens", res.Usage.PromptTokens,
		"cached_tokens", res.Usage.CachedTokens, "ttft", res.TTFT)
	return res, nil
}

// begin checks a prompt and registers a call with the engine: it returns
// the call's context, which Close also cancels, and end, which the call
// must run when it returns.
func (e *Engine) begin(ctx context.Context, tokens []uint32) (_ context.Context, end func(), _ error) {
	if err := e.checkInput(tokens); err != nil {
		return nil, nil, err
	}
	e.mu.RLock()
	if e.mu.closed {
		e.mu.RUnlock()
		return nil, nil, ErrClosed
	}
	e.active.Add(1)
	e.mu.RUnlock()
	ctx, cancel := context.WithCancel(ctx)
	stop := context.AfterFunc(e.ctx, cancel)
	return ctx, func() {
		stop()
		cancel()
		e.active.Done()
	}, nil
}

func (e *Engine) prefill(ctx context.Context, began time.Time, tokens []uint32, session string) (Result, error) {
	ctx, end, err := e.begin(ctx, tokens)
	if err != nil {
		return Result{}, err
	}
	defer end()
	// From here until it returns, this prefill holds background ones off
	// the cores (see PrefillBackground).
	e.sched.enter()
	defer e.sched.exit()

	select {
	case e.slots <- struct{}{}:
	case <-ctx.Done():
		return Result{}, e.ctxErr(ctx, "waiting for a slot")
	}
	defer func() { <-e.slots }()

	n := len(tokens)
	b := e.cfg.BlockTokens
	res := Result{Session: session, Usage: Usage{PromptTokens: n}}
	t0 := e.opts.Now()
	res.Timing.Wait = t0.Sub(began)

	sc := e.scopeOf(ctx)
	keys, kv, loaded, err := e.load(ctx, sc, tokens, len(tokens), &res)
	if err != nil {
		return Result{}, err
	}
	t2 := e.opts.Now()

	start := min(loaded*b, n-1) // the last position is always computed
	res.Logits = make([]float32, e.cfg.Vocab)
	if err := e.model.Forward(ctx, kv, start, tokens[start:], res.Logits); err != nil {
		e.kvPool.Put(kv)
		if ctx.Err() != nil {
			return Result{}, e.ctxErr(ctx, "forward")
		}
		return Result{}, fmt.Errorf("prefill: forward on %s: %w", e.backend, err)
	}
	done := e.opts.Now()
	res.Timing.Compute = done.Sub(t2)
	res.TTFT = done.Sub(began)
	res.TopTokens = topK(res.Logits, TopK)
	res.Usage.CachedTokens = start
	res.FLOPs = e.cfg.ForwardFLOPs(start, n-start)
	e.publish(sc, kv, tokens, keys, loaded)
	if e.draft != nil {
		e.prefillDraft(ctx, tokens, false)
	}
	return res, nil
}

// load looks up the cached prefix of tokens and fetches it into a KV from
// the pool that holds at least capTokens (≥ len(tokens)). It returns the prompt's chain, the KV (the caller puts it back
// in the pool or hands it on) and the number of blocks loaded, and records
// the lookup and fetch times in res.
func (e *Engine) load(ctx context.Context, sc scope, tokens []uint32, capTokens int, res *Result) ([]prefixhash.Key, *KV, int, error) {
	t0 := e.opts.Now()
	keys := prefixhash.Keys(sc.ns, tokens)
	hit := e.lookup(ctx, keys)
	if ctx.Err() != nil {
		return nil, nil, 0, e.ctxErr(ctx, "lookup")
	}
	t1 := e.opts.Now()
	res.Timing.Lookup = t1.Sub(t0)
	kv := e.getKV(max(capTokens, len(tokens)))
	loaded := e.fetch(ctx, sc, keys[:hit], tokens, kv)
	if ctx.Err() != nil {
		e.kvPool.Put(kv)
		return nil, nil, 0, e.ctxErr(ctx, "fetch")
	}
	res.Timing.Fetch = e.opts.Now().Sub(t1)
	return keys, kv, loaded, nil
}

// ctxErr wraps the error of a done request context, saying ErrClosed when
// it was Close that ended it.
func (e *Engine) ctxErr(ctx context.Context, stage string) error {
	if e.ctx.Err() != nil {
		return fmt.Errorf("prefill: %s: %w", stage, ErrClosed)
	}
	return fmt.Errorf("prefill: %s: %w", stage, context.Cause(ctx))
}

// lookup returns the number of leading blocks the cache reports, clamped to
// the chain; an error is a miss.
func (e *Engine) lookup(ctx context.Context, keys []prefixhash.Key) int {
	if e.cache == nil || len(keys) == 0 {
		return 0
	}
	hit, err := e.cache.LongestPrefix(ctx, keys)
	if err != nil {
		if ctx.Err() == nil {
			e.stats.lookupErrors.Add(1)
		}
		return 0
	}
	return max(0, min(hit, len(keys)))
}

// fetch loads the K/V of the blocks of keys, the chain of tokens from block
// 0, into kv and returns how many leading blocks it loaded: it stops at the
// first block that is missing or fails verification (decoding, checksums,
// namespace, parent and tokens against the prompt's, key), and the rest is
// recomputed.
func (e *Engine) fetch(ctx context.Context, sc scope, keys []prefixhash.Key, tokens []uint32, kv *KV) int {
	if len(keys) == 0 {
		return 0
	}
	blocks, release, err := e.cache.Get(ctx, keys)
	if err != nil {
		if ctx.Err() == nil {
			e.stats.fetchErrors.Add(1)
			e.stats.lost.Add(int64(len(keys)))
		}
		return 0
	}
	defer release()
	b := e.cfg.BlockTokens
	maxPayload := sc.ns.BlockBytes()
	for i, key := range keys {
		if i >= len(blocks) || blocks[i] == nil {
			e.stats.missing.Add(1)
			e.stats.lost.Add(int64(len(keys) - i))
			return i
		}
		blk, err := block.Decode(blocks[i], maxPayload)
		if err == nil {
			err = blk.CheckNamespace(sc.ns)
		}
		if err == nil {
			parent := sc.root
			if i > 0 {
				parent = keys[i-1]
			}
			err = blk.CheckTokens(parent, tokens[i*b:(i+1)*b])
		}
		if err == nil && blk.Key != key {
			err = fmt.Errorf("block %d has key %s, want %s", i, blk.Key, key)
		}
		if err != nil {
			e.stats.corrupt.Add(1)
			e.stats.lost.Add(int64(len(keys) - i))
			e.opts.Logger.Debug("prefill: dropping a cached block", "block", i, "err", err)
			return i
		}
		kv.readBlock(i*b, b, blk.Payload)
	}
	return len(keys)
}

// getKV returns a KV for n tokens from the pool, or a new one.
func (e *Engine) getKV(n int) *KV {
	if kv, _ := e.kvPool.Get().(*KV); kv != nil && kv.fits(e.cfg, n) {
		return kv
	}
	return NewKV(e.cfg, n)
}

// topK returns the indexes of the k largest values, largest first, ties to
// the lower index.
func topK(v []float32, k int) []uint32 {
	k = min(k, len(v))
	top := make([]uint32, 0, k+1)
	for i, x := range v {
		if len(top) == k && x <= v[top[k-1]] {
			continue
		}
		j := len(top)
		top = append(top, uint32(i))
		for j > 0 && v[top[j-1]] < x {
			top[j] = top[j-1]
			j--
		}
		top[j] = uint32(i)
		top = top[:min(len(top), k)]
	}
	return top
}

// Close stops the engine: new calls fail with ErrClosed, in-flight prefills
// are cancelled and waited for, blocks still queued for publication are
// dropped (call Flush first to publish them), and the model is closed.
func (e *Engine) Close() error {
	e.mu.Lock()
	if e.mu.closed {
		e.mu.Unlock()
		return nil
	}
	e.mu.closed = true
	close(e.mu.queue)
	e.mu.Unlock()
	e.cancel()
	e.active.Wait()
	e.pubWG.Wait()
	var err error
	if e.draft != nil {
		err = e.draft.Close()
	}
	return errors.Join(err, e.model.Close(), e.owned.Release())
}
