package node

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/kvmesh/kvmesh/auth"
	"github.com/kvmesh/kvmesh/openai"
	"github.com/kvmesh/kvmesh/prefill"
	kvmeshv1 "github.com/kvmesh/kvmesh/proto/kvmesh/v1"
	"github.com/kvmesh/kvmesh/tokenizer"
)

// SessionHeader is the gRPC metadata key of the session-affinity hint (the
// OpenAI-compatible API's header). A request's session field wins over it.
const SessionHeader = openai.SessionHeader

// queueMaxRuns is how often a queued request is started before the queue
// gives up on it: each restart during its run starts it once more.
const queueMaxRuns = 5

// prefillService implements kvmesh.v1.PrefillService: the bundled prefill
// engine over the node's cache (engineCache), and the node's persistent
// queue of prefill requests with the worker that runs them.
//
// Synchronous requests run on gRPC's goroutines with Engine.Prefill. One
// worker goroutine takes queued requests in order and runs each with
// Engine.PrefillBackground, which computes only while no synchronous
// prefill waits or runs and gives way to one at its next check (see
// package prefill). A shutdown cancels the queued request in flight; it is
// still recorded as running, so it runs again (from the blocks it already
// published) when the node reopens its data dir.
type prefillService struct {
	kvmeshv1.UnimplementedPrefillServiceServer
	n      *Node
	engine *prefill.Engine
	// closeBackend releases the engine's backend (a GPU) after the engine.
	closeBackend func() error
	q            *queue
	metrics      *prefillMetrics
	// api is the OpenAI-compatible HTTP API over the engine; its batches
	// are kept in q's database.
	api  *openai.API
	nsPB *kvmeshv1.Namespace

	// ctx is cancelled by close; the worker and the reaper stop on it.
	ctx       context.Context
	cancel    context.CancelFunc
	wg        sync.WaitGroup
	startOnce sync.Once
	closeOnce sync.Once
	closeErr  error
}

var _ kvmeshv1.PrefillServiceServer = (*prefillService)(nil)

// seeded memoizes generated weights: they are read-only, so nodes in one
// process (tests, benchmarks) share them instead of generating each.
var seeded struct {
	sync.Mutex
	cfg     prefill.Config
	seed    uint64
	weights *prefill.Weights
}

func seededWeights(cfg prefill.Config, seed uint64) *prefill.Weights {
	seeded.Lock()
	defer seeded.Unlock()
	if seeded.weights == nil || seeded.cfg != cfg || seeded.seed != seed {
		seeded.cfg, seeded.seed, seeded.weights = cfg, seed, prefill.SeededWeights(cfg, seed)
	}
	return seeded.weights
}

// openPrefill loads the prefill engine and its queue, unless
// Options.Prefill.Disabled, and serves PrefillService. New and Open call it
// before Serve; when it fails they close the node.
func (n *Node) openPrefill() error {
	if n.opts.Prefill.Disabled {
		openai.RegisterDisabled(n.mux)
		return nil
	}
	p, err := newPrefillService(n)
	if err != nil {
		return err
	}
	n.prefill = p
	p.api.Register(n.mux)
	kvmeshv1.RegisterPrefillServiceServer(n.grpc, p)
	n.health.SetServingStatus(kvmeshv1.PrefillService_ServiceDesc.ServiceName, healthpb.HealthCheckResponse_SERVING)
	return nil
}

// newPrefillService loads the engine and opens the queue under DataDir.
// Nothing runs until start.
func newPrefillService(n *Node) (_ *prefillService, err error) {
	o := &n.opts.Prefill
	eopts := o.engineOptions(n)
	backend, closeBackend, err := prefillBackend(o.Backend, n.opts.GPU)
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			err = errors.Join(err, closeBackend())
		}
	}()
	eopts.Backend = backend
	var (
		tok      tokenizer.Tokenizer = tokenizer.Bytes{}
		eos      []uint32
		sampling prefill.SamplingDefaults
	)
	switch {
	case o.ModelDir != "":
		m, err := openModelDir(o.ModelDir, o.Model, n.opts.Limits.MaxBlockBytes)
		if err != nil {
			return nil, modelError(err)
		}
		eopts.Config, tok, eos, sampling = m.cfg, m.tok, m.eos, m.sampling
	case o.WeightsPath == "":
		eopts.Weights = seededWeights(o.Model, o.Seed)
	}
	if o.DraftDir != "" {
		if eopts.Speculative.Draft, err = openDraft(o, n.opts.Limits.MaxBlockBytes); err != nil {
			return nil, err
		}
	}
	engine, err := prefill.New(engineCache{c: n.cache, blockTokens: o.Model.BlockTokens}, eopts)
	if err != nil {
		return nil, modelError(fmt.Errorf("node: prefill engine: %w", err))
	}
	q, err := openQueue(filepath.Join(n.opts.DataDir, "prefill-queue"), queueOptions{
		capacity: o.QueueSize, maxBytes: o.QueueBytes, maxResults: o.MaxResults, ttl: o.ResultTTL, maxRuns: queueMaxRuns,
		now: time.Now, log: n.log,
	})
	if err != nil {
		engine.Close()
		return nil, err
	}
	api, err := openai.New(openaiNode{n}, openai.Options{Engine: engine, Tokenizer: tok, EOS: eos, Sampling: sampling,
		Concurrency: o.Concurrency, MaxWaiting: o.MaxWaiting, Batch: o.Batch, DB: q.db, DataDir: n.opts.DataDir,
		Alone: n.cluster == nil, PeerHTTPS: n.opts.Security.TLS != nil, PeerTLS: n.opts.Security.PeerTLS,
		MaxInFlightBytes: n.opts.Limits.MaxInFlightBytes, PeerToken: peerToken(&n.opts.Security), CallbackSecret: callbackSecret(&n.opts), Registerer: n.metrics.reg, Logger: n.log})
	if err != nil {
		q.close()
		engine.Close()
		return nil, err
	}
	p := &prefillService{n: n, engine: engine, closeBackend: closeBackend, q: q, api: api, nsPB: namespacePB(engine)}
	p.ctx, p.cancel = context.WithCancel(context.Background())
	p.metrics = newPrefillMetrics(n.metrics.reg, engine, q)
	n.names.keep(engine.Namespace())
	if ns, ok := engine.DraftNamespace(); ok {
		n.names.keep(ns)
	}
	return p, nil
}

func fileExists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

func namespacePB(e *prefill.Engine) *kvmeshv1.Namespace {
	ns := e.Namespace()
	return &kvmeshv1.Namespace{
		Model: ns.Model, Dtype: kvmeshv1.Dtype(ns.DType), BlockTokens: uint32(ns.BlockTokens),
		Layers: uint32(ns.Layers), KvHeads: uint32(ns.KVHeads), HeadDim: uint32(ns.HeadDim), TenantSalt: ns.TenantSalt,
		KvLayout: kvmeshv1.KVLayout(ns.Layout), LatentDim: uint32(ns.LatentDim), Scales: kvmeshv1.Scales(ns.Scales),
		Lora: ns.LoRA, KeyScheme: kvmeshv1.KeyScheme(ns.Scheme), HashSeed: ns.HashSeed, ExtraKeyBytes: uint32(ns.ExtraKeyBytes),
	}
}

// start starts the worker that runs queued requests, the reaper that
// deletes expired results, and the OpenAI-compatible API's workers.
func (p *prefillService) start() {
	p.startOnce.Do(func() {
		p.wg.Add(2)
		go p.work()
		go p.reap()
		p.api.Start()
	})
}

// stop stops the worker and the reaper and waits for them; the queued
// request in flight stays queued (running) on disk and runs again after a
// restart. Nothing starts them again.
func (p *prefillService) stop() {
	p.startOnce.Do(func() {}) // a later start does nothing
	p.cancel()
	p.api.Stop()
	p.wg.Wait()
}

// close stops the worker, publishes what the engine still holds (briefly),
// and closes the engine and the queue. The gRPC server must have stopped.
func (p *prefillService) close() error {
	p.closeOnce.Do(func() {
		p.stop()
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		p.engine.Flush(ctx) // best effort: unpublished blocks are only recomputed later
		cancel()
		err := errors.Join(p.engine.Close(), p.closeBackend())
		p.api.Close()
		if qerr := p.q.close(); err == nil {
			err = qerr
		}
		p.closeErr = err
	})
	return p.closeErr
}

func (p *prefillService) work() {
	defer p.wg.Done()
	for {
		r, err := p.q.take(p.ctx)
		if err != nil {
			return
		}
		res, err := p.engine.PrefillBackground(r.Owner.context(p.ctx), r.Tokens, r.Session)
		if p.ctx.Err() != nil {
			p.n.log.Info("prefill: queued request interrupted by shutdown; it runs again after a restart", "id", r.ID)
			return
		}
		if err != nil {
			p.metrics.failed.WithLabelValues("queued").Inc()
			p.n.log.Warn("prefill: queued request failed", "id", r.ID, "session", r.Session, "err", err)
			p.q.finish(r, nil, err)
			continue
		}
		p.metrics.done("queued", res)
		p.q.finish(r, &queueOutcome{PromptTokens: res.Usage.PromptTokens, CachedTokens: res.Usage.CachedTokens,
			TTFT: res.TTFT, TopTokens: res.TopTokens, Logits: res.Logits}, nil)
		p.n.log.Info("prefill", "mode", "queued", "id", r.ID, "session", r.Session, "prompt_tokens", res.Usage.PromptTokens,
			"cached_tokens", res.Usage.CachedTokens, "ttft_ms", ms(res.TTFT), "queue_ms", ms(r.Started.Sub(r.Enqueued)), "runs", r.Runs)
	}
}

func (p *prefillService) reap() {
	defer p.wg.Done()
	t := time.NewTicker(min(p.q.opts.ttl/4, time.Minute))
	defer t.Stop()
	for {
		select {
		case <-p.ctx.Done():
			return
		case <-t.C:
			p.q.expire()
		}
	}
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// check validates a request and returns its prompt and session hint.
func (p *prefillService) check(ctx context.Context, req *kvmeshv1.PrefillRequest) (string, error) {
	if pb := req.GetNamespace(); pb != nil {
		ns, err := p.n.namespace(ctx, pb)
		if err != nil {
			return "", err
		}
		if ns.Digest() != p.engine.Namespace().Digest() {
			return "", invalid("namespace", "%s is not the namespace of this node's engine, %s (leave it unset, or ask Engine)", ns, p.engine.Namespace())
		}
	}
	if m := req.GetModel(); m != "" && m != p.engine.Namespace().Model {
		return "", invalid("model", "%q is not this node's model, %q", m, p.engine.Namespace().Model)
	}
	if err := p.engine.CheckPrompt(req.GetTokens()); err != nil {
		return "", invalid("tokens", "%s", strings.TrimPrefix(err.Error(), prefill.ErrInvalidInput.Error()+": "))
	}
	session := req.GetSession()
	if md, ok := metadata.FromIncomingContext(ctx); ok && session == "" {
		if v := md.Get(SessionHeader); len(v) > 0 {
			session = v[0]
		}
	}
	if len(session) > openai.MaxSessionBytes {
		return "", invalid("session", "%d bytes; at most %d", len(session), openai.MaxSessionBytes)
	}
	if session != "" {
		p.metrics.sessionHints.Inc()
	}
	return session, nil
}

func (p *prefillService) Prefill(ctx context.Context, req *kvmeshv1.PrefillRequest) (*kvmeshv1.PrefillResponse, error) {
	res, err := p.prefill(ctx, req)
	if err != nil {
		return nil, err
	}
	return &kvmeshv1.PrefillResponse{Result: res}, nil
}

// prefill runs or queues req and describes the outcome.
func (p *prefillService) prefill(ctx context.Context, req *kvmeshv1.PrefillRequest) (*kvmeshv1.PrefillResult, error) {
	mode := "sync"
	if req.GetQueue() {
		mode = "queued"
	} else {
		// Queued work stays off the cores for the whole request, not only
		// while the engine computes it, and so do pushes to owners.
		defer p.engine.Hold()()
		defer p.n.foreground()()
	}
	session, err := p.check(ctx, req)
	if err != nil {
		p.metrics.failed.WithLabelValues(mode).Inc()
		return nil, err
	}
	if req.GetQueue() {
		r, err := p.q.enqueue(req.GetTokens(), session, req.GetReturnLogits(), ownerOf(auth.PrincipalFrom(ctx)))
		switch {
		case errors.Is(err, errQueueFull):
			p.metrics.failed.WithLabelValues(mode).Inc()
			p.metrics.queueRejected.Inc()
			return nil, exhausted(kvmeshv1.ErrorReason_ERROR_REASON_QUEUE_FULL, nil, "node:prefill_queue", "%v; retry later, or run the prompt synchronously", err)
		case errors.Is(err, errQueueClosed):
			return nil, status.Errorf(codes.Unavailable, "node is shutting down: %v", err)
		case err != nil:
			return nil, err
		}
		p.n.log.Info("prefill queued", "id", r.ID, "session", session, "prompt_tokens", len(req.GetTokens()))
		return p.recordPB(r), nil
	}
	res, err := p.engine.Prefill(ownerOf(auth.PrincipalFrom(ctx)).context(ctx), req.GetTokens(), session)
	if err != nil {
		p.metrics.failed.WithLabelValues(mode).Inc()
		switch {
		case errors.Is(err, prefill.ErrInvalidInput):
			return nil, invalid("tokens", "%v", err)
		case errors.Is(err, prefill.ErrClosed):
			return nil, status.Errorf(codes.Unavailable, "node is shutting down: %v", err)
		}
		return nil, err
	}
	p.metrics.done(mode, res)
	p.n.log.Info("prefill", "mode", mode, "session", session, "prompt_tokens", res.Usage.PromptTokens,
		"cached_tokens", res.Usage.CachedTokens, "ttft_ms", ms(res.TTFT))
	out := &kvmeshv1.PrefillResult{
		State:  kvmeshv1.PrefillState_PREFILL_STATE_DONE,
		Usage:  &kvmeshv1.Usage{PromptTokens: uint64(res.Usage.PromptTokens), CachedTokens: uint64(res.Usage.CachedTokens)},
		TtftMs: ms(res.TTFT), TopTokens: res.TopTokens, Model: p.nsPB.GetModel(), Session: session,
	}
	if req.GetReturnLogits() {
		out.Logits = res.Logits
	}
	return out, nil
}

// recordPB is the answer about a queued request.
func (p *prefillService) recordPB(r *queueRecord) *kvmeshv1.PrefillResult {
	out := &kvmeshv1.PrefillResult{RequestId: r.ID, State: r.State, Model: p.nsPB.GetModel(), Session: r.Session}
	if !r.Started.IsZero() {
		out.QueueMs = ms(r.Started.Sub(r.Enqueued))
	}
	switch r.State {
	case kvmeshv1.PrefillState_PREFILL_STATE_DONE:
		out.Usage = &kvmeshv1.Usage{PromptTokens: uint64(r.PromptTokens), CachedTokens: uint64(r.CachedTokens)}
		out.TtftMs, out.TopTokens, out.Logits = ms(r.TTFT), r.TopTokens, r.Logits
	case kvmeshv1.PrefillState_PREFILL_STATE_FAILED:
		out.Error = r.Err
	}
	return out
}

func (p *prefillService) GetResult(ctx context.Context, req *kvmeshv1.GetResultRequest) (*kvmeshv1.GetResultResponse, error) {
	id := req.GetRequestId()
	if id == "" {
		return nil, invalid("request_id", "required")
	}
	r, ok, err := p.q.get(id)
	if err != nil {
		return nil, err
	}
	// Another tenant's request is answered as an unknown one: no oracle.
	if who := auth.PrincipalFrom(ctx); !ok || (who.Scoped() && r.Owner.Tenant != who.Tenant) {
		return nil, status.Errorf(codes.NotFound, "request %q: no such queued request on this node (results are kept %v)", id, p.q.opts.ttl)
	}
	return &kvmeshv1.GetResultResponse{Result: p.recordPB(r)}, nil
}

// ownerOf is the owner of a request p makes: its tenant, if any.
func ownerOf(p auth.Principal) queueOwner {
	if !p.Scoped() {
		return queueOwner{}
	}
	return queueOwner{Tenant: p.Tenant, Salt: p.Salt, Tag: p.Tag}
}

// context returns ctx for running a request of o (prefill.RunAs).
func (o queueOwner) context(ctx context.Context) context.Context {
	return prefill.RunAs(ctx, auth.Principal{Tenant: o.Tenant, Salt: o.Salt, Tag: o.Tag})
}

func (p *prefillService) Engine(context.Context, *kvmeshv1.EngineRequest) (*kvmeshv1.EngineResponse, error) {
	c := p.engine.Config()
	pending, _ := p.q.depth()
	return &kvmeshv1.EngineResponse{
		Namespace: p.nsPB, NamespaceDigest: p.engine.Namespace().Digest(), Backend: p.engine.Backend(),
		Layers: uint32(c.Layers), Dim: uint32(c.Dim), Heads: uint32(c.Heads), KvHeads: uint32(c.KVHeads), HeadDim: uint32(c.HeadDim),
		FfnDim: uint32(c.FFNDim), Vocab: uint32(c.Vocab), MaxContext: uint32(c.MaxContext), BlockTokens: uint32(c.BlockTokens),
		WeightsDigest: p.engine.WeightsDigest(), Concurrency: uint32(p.n.opts.Prefill.Concurrency),
		Queued: uint32(pending), QueueCapacity: uint32(p.q.opts.capacity),
	}, nil
}
