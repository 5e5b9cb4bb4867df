package prefill

import (
	"context"
	"fmt"
	"sync"
	"time"
)

// sched keeps background prefills off the cores while any foreground one is
// active. A foreground prefill enters before it waits for a slot and exits
// when it returns; the first to enter cancels bg, under which every
// background chunk in flight runs, and the last to exit opens idle and
// makes a fresh bg.
type sched struct {
	grace    time.Duration    // how long the background stays off after the last exit
	now      func() time.Time // Options.Now
	mu       sync.Mutex
	fg       int             // foreground prefills between enter and exit
	idle     chan struct{}   // closed while fg == 0
	lastExit time.Time       // when fg last fell to 0
	bg       context.Context // background chunks run under it; done once fg > 0
	cancelBG context.CancelFunc
}

func (s *sched) init(grace time.Duration, now func() time.Time) {
	s.grace, s.now = grace, now
	s.idle = make(chan struct{})
	close(s.idle)
	s.bg, s.cancelBG = context.WithCancel(context.Background())
}

func (s *sched) enter() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.fg == 0 {
		s.idle = make(chan struct{})
		s.cancelBG()
	}
	s.fg++
}

func (s *sched) exit() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.fg--
	switch {
	case s.fg < 0:
		panic("prefill: foreground exit without enter")
	case s.fg == 0:
		s.bg, s.cancelBG = context.WithCancel(context.Background())
		s.lastExit = s.now()
		close(s.idle)
	}
}

// turn waits until no foreground prefill has been active for the grace
// period and returns the context a background chunk runs under: it is done
// as soon as a foreground prefill arrives.
func (s *sched) turn(ctx context.Context) (context.Context, error) {
	for {
		s.mu.Lock()
		if s.fg == 0 {
			rest := s.grace - s.now().Sub(s.lastExit)
			if rest <= 0 {
				bg := s.bg
				s.mu.Unlock()
				return bg, nil
			}
			s.mu.Unlock()
			t := time.NewTimer(rest)
			select {
			case <-t.C:
			case <-ctx.Done():
				t.Stop()
				return nil, ctx.Err()
			}
			continue
		}
		idle := s.idle
		s.mu.Unlock()
		select {
		case <-idle:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

// Hold keeps background prefills off the cores, as a foreground prefill
// does, until release is called (once; later calls do nothing). A server
// holds the engine for a whole synchronous request, decoding and answering
// included, so that queued work does not compete with them either.
func (e *Engine) Hold() (release func()) {
	e.sched.enter()
	var once sync.Once
	return func() { once.Do(e.sched.exit) }
}

// WaitIdle returns once no foreground prefill (or Hold) has been active
// for the grace period, or ctx's error. A caller that runs queued work with
// Generate waits on it before each request, so queued work starts only
// while synchronous traffic leaves the engine idle; what started then is
// not preempted.
func (e *Engine) WaitIdle(ctx context.Context) error {
	_, err := e.sched.turn(ctx)
	return err
}

// CheckPrompt returns nil when Prefill would accept tokens, else an error
// wrapping ErrInvalidInput that names the problem (empty, longer than the
// context, a token outside the vocabulary). Callers that queue prompts check
// them before they queue them.
func (e *Engine) CheckPrompt(tokens []uint32) error { return e.checkInput(tokens) }

// PrefillBackground is Prefill for work nobody waits on: it gives way to
// every foreground Prefill. It looks up and loads the cached prefix like
// Prefill, then computes the rest in chunks of Options.BackgroundBlocks
// blocks, and computes only while no foreground prefill is waiting or
// running. A foreground prefill that arrives cancels the chunk in flight,
// which stops at the forward pass's next check (a layer, a slab of rows, an
// attention tile) and is computed again later; the K/V computed so far stay
// in this call's memory, so at most one chunk's work is lost. Each chunk's
// full blocks are published (synchronously, under PublishTimeout) as soon as
// it is computed, so a request interrupted by a shutdown resumes from the
// cache when it is run again, and other prompts hit them meanwhile.
//
// The result is Prefill's: TTFT runs from the call to the logits, pauses
// included (Timing.Wait sums them; Timing.Compute includes preempted
// chunks). Errors: ErrInvalidInput, ErrClosed, or ctx's error.
func (e *Engine) PrefillBackground(ctx context.Context, tokens []uint32, session string) (Result, error) {
	began := e.opts.Now()
	res, err := e.background(ctx, began, tokens, session)
	return e.account(res, err, true)
}

func (e *Engine) background(ctx context.Context, began time.Time, tokens []uint32, session string) (Result, error) {
	ctx, end, err := e.begin(ctx, tokens)
	if err != nil {
		return Result{}, err
	}
	defer end()

	n := len(tokens)
	b := e.cfg.BlockTokens
	res := Result{Session: session, Usage: Usage{PromptTokens: n}}
	sc := e.scopeOf(ctx)
	keys, kv, loaded, err := e.load(ctx, sc, tokens, len(tokens), &res)
	if err != nil {
		return Result{}, err
	}
	defer e.kvPool.Put(kv)

	start := min(loaded*b, n-1) // the last position is always computed
	res.Logits = make([]float32, e.cfg.Vocab)
	var (
		chunk     = e.opts.BackgroundBlocks * b
		published = loaded // blocks [0, published) are in the cache
		buf       []byte
		blocks    [][]byte
		payload   []byte
	)
	for pos := start; pos < n; {
		end := min(pos+chunk, n)
		w0 := e.opts.Now()
		preempted, err := e.backgroundChunk(ctx, e.model, kv, pos, tokens[pos:end], res.Logits, &res.Timing, w0)
		if err != nil {
			return Result{}, err
		}
		if preempted {
			e.stats.preempted.Add(1)
			continue
		}
		pos = end
		if to := min(end/b, len(keys)); e.cache != nil && to > published {
			if payload == nil {
				payload = make([]byte, e.ns.BlockBytes())
			}
			buf, blocks = e.encode(sc, buf, blocks, payload, kv, keys, tokens[published*b:], published, to)
			e.put(keys, published, blocks)
			published = to
		}
	}
	done := e.opts.Now()
	res.TTFT = done.Sub(began)
	res.TopTokens = topK(res.Logits, TopK)
	res.Usage.CachedTokens = start
	res.FLOPs = e.cfg.ForwardFLOPs(start, n-start)
	if e.draft != nil {
		e.prefillDraft(ctx, tokens, true)
	}
	return res, nil
}

// backgroundChunk computes positions [pos, pos+len(tokens)) on m once no
// foreground prefill is active. It reports preempted when one arrived
// before the chunk was done; the chunk must then be computed again. It adds
// its waits and compute to timing (w0: when it began waiting). Background
// chunks take slots of their own (bgSlots), never the foreground's: a
// foreground prefill starts at once, while the chunk it cancelled runs on to
// its next check of ctx.
func (e *Engine) backgroundChunk(ctx context.Context, m Model, kv *KV, pos int, tokens []uint32, logits []float32, timing *Timing, w0 time.Time) (preempted bool, err error) {
	bg, err := e.sched.turn(ctx)
	if err != nil {
		return false, e.ctxErr(ctx, "waiting for the foreground")
	}
	// The chunk's context is bg's child, so that a foreground prefill's
	// arrival (sched.enter cancels bg) cancels it before that prefill's
	// own forward pass can begin; the request's end reaches it through
	// AfterFunc. The forward pass needs ctx's cancellation, not its values.
	cctx, cancel := context.WithCancel(bg)
	defer cancel()
	defer context.AfterFunc(ctx, cancel)()
	select {
	case e.bgSlots <- struct{}{}:
	case <-cctx.Done():
		if ctx.Err() != nil {
			return false, e.ctxErr(ctx, "waiting for a slot")
		}
		timing.Wait += e.opts.Now().Sub(w0)
		return true, nil
	}
	c0 := e.opts.Now()
	timing.Wait += c0.Sub(w0)
	// A foreground prefill may have arrived while this chunk waited for
	// its slot: give way before computing anything, not at the forward
	// pass's first check.
	if cctx.Err() != nil {
		<-e.bgSlots
		if ctx.Err() != nil {
			return false, e.ctxErr(ctx, "waiting for a slot")
		}
		return true, nil
	}
	err = m.Forward(cctx, kv, pos, tokens, logits)
	<-e.bgSlots
	timing.Compute += e.opts.Now().Sub(c0)
	switch {
	case err == nil:
		return false, nil
	case ctx.Err() != nil:
		return false, e.ctxErr(ctx, "forward")
	case bg.Err() != nil:
		return true, nil
	}
	return false, fmt.Errorf("prefill: forward on %s: %w", e.backend, err)
}
