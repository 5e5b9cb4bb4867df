package openai

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"sync"
	"time"

	"github.com/kvmesh/kvmesh/auth"
	"github.com/kvmesh/kvmesh/prefill"
	"github.com/kvmesh/kvmesh/tokenizer"
)

// Node is what the API needs of the node that serves it; the node
// implements it (as raft's user implements Storage).
type Node interface {
	// ID names the node: in X-Kvmesh-Node, and as the claimer of a peer's
	// batch.
	ID() string
	// Authorize checks a request's Authorization header values for scope
	// need, as the node's gRPC API checks its calls, and returns the
	// principal they authenticate. what names the request in a refusal. A
	// refusal is an *AuthError.
	Authorize(header []string, what string, need auth.Scope) (auth.Principal, error)
	// Stopping reports whether the node is shutting down: the API then
	// refuses requests with 503.
	Stopping() bool
	// Foreground marks serving work in flight until done is called, so
	// that the node's background traffic (pushes to owners) yields to it.
	Foreground() (done func())
	// Flush waits, within ctx, until the blocks the engine handed to the
	// cache have reached their owners, where other nodes look for them.
	Flush(ctx context.Context) error
	// Peers returns the other live members that run an engine, in random
	// order: whom to ask for a batch this node does not hold (its owner,
	// when the batch's id names it; else all of them).
	Peers() []Peer
	// Lenders returns the other live members that run an engine and
	// advertise a backlog (AdvertiseBacklog), as gossip last told: where
	// to pull batches from. A node alone has none.
	Lenders() []Lender
	// AdvertiseBacklog tells the other members how many of this node's
	// queued batches a peer could take now (a coarse value: each change is
	// gossiped to the whole cluster).
	AdvertiseBacklog(n int)
	// Vouch returns the value (VouchHeader) with which this node vouches,
	// toward a peer it calls with the cluster credential, for p making the
	// request what (method and path); "" when the node has no tokens file
	// (no tenants: the cluster credential is all a peer needs).
	Vouch(p auth.Principal, what string) string
	// Vouched checks a peer's VouchHeader value for the request what and
	// returns the principal it vouches for (auth.File.Vouched).
	Vouched(v, what string) (auth.Principal, error)
	// Tenant returns the principal of the named tenant as this node's
	// tokens file derives it (its salt and tag); false when the node knows
	// no such tenant. A node that runs a peer's batch derives the tenant's
	// salt so, rather than being sent it.
	Tenant(name string) (auth.Principal, bool)
}

// Peer is another member that runs an engine.
type Peer struct {
	ID   string // its member id (Node.ID there)
	Addr string // its HTTP address
}

// Lender is a peer that advertises queued batches nobody runs.
type Lender struct {
	Addr    string // its HTTP address
	Backlog int    // batches it holds that a peer could take, as advertised
}

// AuthError is Node.Authorize's refusal.
type AuthError struct {
	// Forbidden: the token is valid but lacks the scope (403). Else no
	// token or an unknown one (401).
	Forbidden bool
	Msg       string // for the client
}

func (e *AuthError) Error() string { return e.Msg }

// SessionHeader is the session-affinity hint: an HTTP header here, a gRPC
// metadata key on the node's API. It is logged, counted and echoed, never
// used for a lookup.
const SessionHeader = "x-session-affinity"

// MaxSessionBytes bounds a session id.
const MaxSessionBytes = 256

// API serves the OpenAI-compatible HTTP API over a node's engine: the
// completions, the batches of the asynchronous API with the workers that
// run them, work stealing and callbacks. New builds it, Register mounts
// it, Start starts its workers, Stop stops them and Close closes it.
type API struct {
	n      Node
	opts   Options
	engine *prefill.Engine
	log    *slog.Logger
	model  string
	// tok tokenizes prompts and reads answers back; chatML renders chats
	// as ChatML (the tokenizer has <|im_start|> and <|im_end|>);
	// endOfTurn are the token sequences that end every answer.
	tok       tokenizer.Tokenizer
	chatML    bool
	endOfTurn [][]uint32
	// admit bounds the requests that run or wait for the engine.
	admit chan struct{}
	// inflight bounds the request bodies being read and decoded (body.go).
	inflight *budget
	metrics  *metrics

	// batches are the asynchronous API's, in Options.DB; workers run them.
	batches      *batches
	batchMetrics *batchMetrics
	callbacks    *callbacks
	// peerHTTP reaches the peers' HTTP addresses (steal.go).
	peerHTTP *http.Client
	// stealRand draws the lenders a steal asks (pickLenders).
	stealRand struct {
		sync.Mutex
		r *rand.Rand
	}

	// ctx is cancelled by Stop; the workers, the reaper and the callbacks'
	// sender stop on it.
	ctx       context.Context
	cancel    context.CancelFunc
	wg        sync.WaitGroup
	startOnce sync.Once
	closeOnce sync.Once
}

// New loads the batches stored in opts.DB and the callback secret, and
// registers the API's metrics. Nothing runs until Start.
func New(n Node, opts Options) (*API, error) {
	if opts.Tokenizer == nil {
		opts.Tokenizer = tokenizer.Bytes{}
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.MaxInFlightBytes <= 0 {
		opts.MaxInFlightBytes = DefaultMaxInFlightBytes
	}
	b, err := openBatches(opts.DB, opts.Batch, time.Now, opts.Logger)
	if err != nil {
		return nil, err
	}
	b.idSuffix = "_" + ownerTag(n.ID())
	secret := opts.CallbackSecret
	if len(secret) == 0 {
		if secret, err = loadCallbackSecret(opts.DataDir); err != nil {
			b.close()
			return nil, err
		}
	}
	o := &API{n: n, opts: opts, engine: opts.Engine, log: opts.Logger, model: opts.Engine.Namespace().Model, tok: opts.Tokenizer,
		admit: make(chan struct{}, opts.Concurrency+opts.MaxWaiting), batches: b, inflight: newBudget(opts.MaxInFlightBytes),
		peerHTTP: &http.Client{Transport: &http.Transport{TLSClientConfig: opts.PeerTLS, MaxIdleConnsPerHost: 4,
			IdleConnTimeout: 90 * time.Second, ResponseHeaderTimeout: time.Minute}}}
	o.endOfTurn, o.chatML = endsOfTurn(o.tok, opts.EOS)
	o.metrics = newMetrics(opts.Registerer, o.admit)
	o.batchMetrics = newBatchMetrics(opts.Registerer, b)
	b.cancelled = func(k int) { o.batchMetrics.requests.WithLabelValues("cancelled").Add(float64(k)) }
	o.callbacks = newCallbacks(opts.Batch.CallbackAllow, secret, opts.Registerer, opts.Logger)
	o.callbacks.pending, o.callbacks.done = b.pendingCallbacks, b.callbackDone
	b.finished = o.callbacks.enqueue
	o.stealRand.r = rand.New(rand.NewPCG(rand.Uint64(), rand.Uint64()))
	o.ctx, o.cancel = context.WithCancel(context.Background())
	return o, nil
}

// Start starts the workers that run queued batches, the reaper of expired
// ones and the callbacks' sender.
func (o *API) Start() {
	o.startOnce.Do(func() {
		workers := batchWorkers(o.opts)
		o.wg.Add(2 + workers)
		go func() { defer o.wg.Done(); o.callbacks.run(o.ctx) }()
		for range workers {
			go o.workBatches()
		}
		go o.reapBatches()
		if !o.opts.Alone && o.opts.Batch.StealInterval > 0 {
			o.wg.Add(1)
			go o.advertiseBacklog()
		}
	})
}

// Stop stops the workers and waits for them: a request in flight is not
// recorded and runs again from its start when the node reopens its data
// dir. Nothing starts them again.
func (o *API) Stop() {
	o.startOnce.Do(func() {}) // a later Start does nothing
	o.cancel()
	o.wg.Wait()
}

// Close stops the workers; later operations on the batches fail. The
// caller closes Options.DB after it.
func (o *API) Close() {
	o.closeOnce.Do(func() {
		o.Stop()
		o.batches.close()
	})
}

// VouchHeader carries a node's vouch for the caller it acts for toward a
// peer (Node.Vouch): the peer acts as that caller, never on a bearer token
// the first node passed on.
const VouchHeader = "X-Kvmesh-Vouch"

// authorize checks r's credentials for need through the node. A request
// that carries VouchHeader must come with the cluster credential, and runs
// as the principal the vouch names, which must hold need.
func (o *API) authorize(r *http.Request, what string, need auth.Scope) (auth.Principal, error) {
	if v := r.Header.Get(VouchHeader); v != "" {
		if _, err := o.n.Authorize(r.Header.Values("Authorization"), what, auth.Cluster); err != nil {
			return auth.Principal{}, newHTTPError(http.StatusForbidden, "", "insufficient_scope", "a vouched request needs the cluster credential")
		}
		who, err := o.n.Vouched(v, what)
		if err != nil {
			return auth.Principal{}, newHTTPError(http.StatusForbidden, "", "invalid_vouch", "%v", err)
		}
		if !who.Can(need) {
			return who, newHTTPError(http.StatusForbidden, "", "insufficient_scope", "the caller vouched for lacks the %s scope", need)
		}
		return who, nil
	}
	who, err := o.n.Authorize(r.Header.Values("Authorization"), what, need)
	if err == nil {
		return who, nil
	}
	if ae, ok := err.(*AuthError); ok && ae.Forbidden {
		return who, newHTTPError(http.StatusForbidden, "", "insufficient_scope", "%s", ae.Msg)
	}
	return who, newHTTPError(http.StatusUnauthorized, "", "invalid_api_key", "%s", err.Error())
}

// queueOwner is the tenant a queued request belongs to.
type queueOwner struct {
	Tenant string // name; empty: none
	Salt   string // its namespace salt (auth.Principal.Salt)
	Tag    uint64 // its blocks' tag
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

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

func digestString(d uint64) string { return fmt.Sprintf("%016x", d) }
