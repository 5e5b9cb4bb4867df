package client

import (
	"context"
	"errors"
	"fmt"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/kvmesh/kvmesh/prefixhash"
	kvmeshv1 "github.com/kvmesh/kvmesh/proto/kvmesh/v1"
)

// SessionHeader is the gRPC metadata key that carries a prefill request's
// session, so that a proxy in front of the nodes can route on it. Nodes
// record it as a hint; their cache hits never depend on it.
const SessionHeader = "x-session-affinity"

// PrefillRequest is a prompt for the node's bundled prefill engine.
type PrefillRequest struct {
	// Tokens is the prompt (text tokenized byte by byte: one token per
	// UTF-8 byte). Read during the call only.
	Tokens []uint32
	// Session is a routing hint, sent in the request and as the
	// x-session-affinity header. Optional.
	Session string
	// Queue asks the node to run the prompt when its engine has headroom:
	// Prefill then returns at once with a RequestID to poll.
	Queue bool
	// ReturnLogits asks for the last position's logits (vocabulary-sized).
	ReturnLogits bool
}

// Usage is what a prefill cost: the prompt's tokens, and how many of them
// came from the cache instead of being computed.
type Usage struct {
	PromptTokens int `json:"prompt_tokens"`
	CachedTokens int `json:"cached_tokens"`
}

// Prefill states.
const (
	PrefillQueued  = "queued"
	PrefillRunning = "running" // the engine has it; it may be paused for synchronous requests
	PrefillDone    = "done"
	PrefillFailed  = "failed"
)

// PrefillResult is the outcome of a prefill, or the state of a queued one.
type PrefillResult struct {
	// RequestID names a queued request; empty for a synchronous one.
	RequestID string
	// State is PrefillQueued, PrefillRunning, PrefillDone or PrefillFailed.
	State string
	// Usage, TTFT and TopTokens are set once State is PrefillDone.
	Usage Usage
	// TTFT is the time to first token; for a queued request, from the start
	// of its run (pauses for synchronous requests included).
	TTFT time.Duration
	// QueueWait is how long a queued request waited before its run.
	QueueWait time.Duration
	// TopTokens are the five most likely next tokens, most likely first.
	TopTokens []uint32
	// Logits are the last position's logits, when asked for.
	Logits []float32
	// Error says why a PrefillFailed request failed.
	Error string
	// Model is the model id of the engine's namespace; Session the hint
	// the request carried.
	Model, Session string
}

// Finished reports whether the request is done or failed.
func (r PrefillResult) Finished() bool { return r.State == PrefillDone || r.State == PrefillFailed }

func prefillResult(pb *kvmeshv1.PrefillResult) PrefillResult {
	r := PrefillResult{
		RequestID: pb.GetRequestId(),
		Usage:     Usage{PromptTokens: int(pb.GetUsage().GetPromptTokens()), CachedTokens: int(pb.GetUsage().GetCachedTokens())},
		TTFT:      time.Duration(pb.GetTtftMs() * float64(time.Millisecond)),
		QueueWait: time.Duration(pb.GetQueueMs() * float64(time.Millisecond)),
		TopTokens: pb.GetTopTokens(), Logits: pb.GetLogits(), Error: pb.GetError(),
		Model: pb.GetModel(), Session: pb.GetSession(),
	}
	switch pb.GetState() {
	case kvmeshv1.PrefillState_PREFILL_STATE_QUEUED:
		r.State = PrefillQueued
	case kvmeshv1.PrefillState_PREFILL_STATE_RUNNING:
		r.State = PrefillRunning
	case kvmeshv1.PrefillState_PREFILL_STATE_DONE:
		r.State = PrefillDone
	case kvmeshv1.PrefillState_PREFILL_STATE_FAILED:
		r.State = PrefillFailed
	default:
		r.State = "unknown"
	}
	return r
}

// Prefill runs a prompt on the node's prefill engine and returns its
// result, or, with Queue, enqueues it and returns its RequestID (poll it
// with GetResult or WaitResult). A synchronous prefill of a long prompt can
// take longer than Options.Timeout: give ctx a deadline. Only synchronous
// prefills are retried (a queued one could be enqueued twice). Errors carry
// the node's status: InvalidArgument for a bad prompt, ResourceExhausted
// for a full queue.
func (c *Client) Prefill(ctx context.Context, req PrefillRequest) (PrefillResult, error) {
	if len(req.Tokens) == 0 {
		return PrefillResult{}, fmt.Errorf("%w: the prompt is empty", ErrInvalid)
	}
	pb := &kvmeshv1.PrefillRequest{Tokens: req.Tokens, Session: req.Session, Queue: req.Queue, ReturnLogits: req.ReturnLogits}
	if req.Session != "" {
		ctx = metadata.AppendToOutgoingContext(ctx, SessionHeader, req.Session)
	}
	var resp *kvmeshv1.PrefillResponse
	call := func(ctx context.Context) (err error) {
		resp, err = c.prefill.Prefill(ctx, pb)
		return err
	}
	var err error
	if req.Queue {
		err = c.once(ctx, call)
	} else {
		err = c.retry(ctx, call)
	}
	if err != nil {
		return PrefillResult{}, callError("prefill", err)
	}
	return prefillResult(resp.GetResult()), nil
}

// GetResult returns the state of a queued request, and its result once it
// is done. A NotFound error means the node does not know the id (or the
// result outlived the node's result TTL).
func (c *Client) GetResult(ctx context.Context, id string) (PrefillResult, error) {
	if id == "" {
		return PrefillResult{}, fmt.Errorf("%w: empty request id", ErrInvalid)
	}
	var resp *kvmeshv1.GetResultResponse
	err := c.retry(ctx, func(ctx context.Context) (err error) {
		resp, err = c.prefill.GetResult(ctx, &kvmeshv1.GetResultRequest{RequestId: id})
		return err
	})
	if err != nil {
		return PrefillResult{}, callError("get result", err)
	}
	return prefillResult(resp.GetResult()), nil
}

// WaitResult polls GetResult every poll (default 100ms) until the request
// is done or failed, or ctx ends. It returns ctx's error then; each poll
// gets Options.Timeout unless ctx has a deadline.
func (c *Client) WaitResult(ctx context.Context, id string, poll time.Duration) (PrefillResult, error) {
	if poll <= 0 {
		poll = 100 * time.Millisecond
	}
	t := time.NewTicker(poll)
	defer t.Stop()
	for {
		r, err := c.GetResult(ctx, id)
		if err != nil || r.Finished() {
			return r, err
		}
		select {
		case <-ctx.Done():
			return r, fmt.Errorf("client: waiting for %s (%s): %w", id, r.State, ctx.Err())
		case <-t.C:
		}
	}
}

// Engine describes a node's prefill engine.
type Engine struct {
	// Namespace is the namespace the engine caches its blocks under: pass
	// it to Lookup and Get to see them.
	Namespace prefixhash.Namespace
	Backend   string
	// The model's shape.
	Layers, Dim, Heads, KVHeads, HeadDim, FFNDim, Vocab, MaxContext, BlockTokens int
	WeightsDigest                                                                uint64
	// Concurrency is the synchronous prefills that run at once; Queued the
	// queued requests not yet done, of at most QueueCapacity.
	Concurrency, Queued, QueueCapacity int
}

// ErrNoEngine is returned by Engine when the node serves no prefill engine.
var ErrNoEngine = errors.New("client: the node serves no prefill engine")

// Engine returns the node's prefill engine: its namespace, shape and
// queue. It wraps ErrNoEngine (and the Unimplemented status) when the node
// runs without one.
func (c *Client) Engine(ctx context.Context) (Engine, error) {
	var resp *kvmeshv1.EngineResponse
	err := c.retry(ctx, func(ctx context.Context) (err error) {
		resp, err = c.prefill.Engine(ctx, &kvmeshv1.EngineRequest{})
		return err
	})
	if err != nil {
		if status.Code(err) == codes.Unimplemented {
			return Engine{}, fmt.Errorf("%w: %w", ErrNoEngine, err)
		}
		return Engine{}, callError("engine", err)
	}
	ns := resp.GetNamespace()
	groups, err := groupsOf(ns.GetGroups())
	if err != nil {
		return Engine{}, fmt.Errorf("client: engine: the node's namespace: %w", err)
	}
	return Engine{
		Namespace: prefixhash.Namespace{
			Groups: groups,
			Model:  ns.GetModel(), DType: prefixhash.DType(ns.GetDtype()), BlockTokens: int(ns.GetBlockTokens()),
			Layers: int(ns.GetLayers()), KVHeads: int(ns.GetKvHeads()),
			HeadDim: int(ns.GetHeadDim()), TenantSalt: ns.GetTenantSalt(),
			Layout: prefixhash.KVLayout(ns.GetKvLayout()), LatentDim: int(ns.GetLatentDim()), Scales: prefixhash.Scales(ns.GetScales()),
			LoRA: ns.GetLora(), Scheme: prefixhash.KeyScheme(ns.GetKeyScheme()), HashSeed: ns.GetHashSeed(),
			ExtraKeyBytes: int(ns.GetExtraKeyBytes()),
		},
		Backend: resp.GetBackend(),
		Layers:  int(resp.GetLayers()), Dim: int(resp.GetDim()), Heads: int(resp.GetHeads()), KVHeads: int(resp.GetKvHeads()),
		HeadDim: int(resp.GetHeadDim()), FFNDim: int(resp.GetFfnDim()), Vocab: int(resp.GetVocab()),
		MaxContext: int(resp.GetMaxContext()), BlockTokens: int(resp.GetBlockTokens()), WeightsDigest: resp.GetWeightsDigest(),
		Concurrency: int(resp.GetConcurrency()), Queued: int(resp.GetQueued()), QueueCapacity: int(resp.GetQueueCapacity()),
	}, nil
}
