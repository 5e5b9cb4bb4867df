package router

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/kvmesh/kvmesh/gossip"
	"github.com/kvmesh/kvmesh/openai"
)

// Routing policies (Options.Policy).
const (
	PolicyTokens  = "tokens"  // fewest outstanding uncached prompt tokens (the default)
	PolicyRandom  = "random"  // any live node
	PolicySession = "session" // by a hash of x-session-affinity (random without one): the baseline the others are measured against
)

// Options configure a Router.
type Options struct {
	// NodeID names the router among the members. Default
	// "router-<hostname>-<gossip port>".
	NodeID string
	// HTTPAddr is where the router serves /v1/, /metrics and /healthz.
	// Port 0 picks a free port. Default 127.0.0.1:7700.
	HTTPAddr string
	// GossipAddr is where the router's gossip listens. Default
	// 127.0.0.1:0.
	GossipAddr string
	// Join lists gossip addresses of members. Required.
	Join []string
	// GossipKey is the cluster's gossip key, if it has one.
	GossipKey []byte
	// GossipProfile is "lan" or "local", as the nodes' (node.Options).
	// Default "lan".
	GossipProfile string
	// Policy is PolicyTokens, PolicyRandom or PolicySession. Default
	// PolicyTokens.
	Policy string
	// NodeTLS, when set, is the client configuration the router reaches
	// the nodes' HTTP addresses with, over HTTPS (nodes started with
	// node.Options.HTTPTLS: its CA, and a certificate when they want one).
	// Default nil: plain HTTP.
	NodeTLS *tls.Config
	// Logger receives the router's records. Default slog.Default().
	Logger *slog.Logger
}

// DefaultHTTPAddr is Options.HTTPAddr's default.
const DefaultHTTPAddr = "127.0.0.1:7700"

// ErrInvalidOptions is wrapped by every error New returns for its options.
var ErrInvalidOptions = errors.New("router: invalid options")

// OptionError names the option New rejected.
type OptionError struct {
	Field string // the Options field, for example "Policy"
	Msg   string
}

func (e *OptionError) Error() string { return fmt.Sprintf("router: option %s: %s", e.Field, e.Msg) }

// Unwrap makes every OptionError match ErrInvalidOptions.
func (e *OptionError) Unwrap() error { return ErrInvalidOptions }

// routerBackoff is how long a node that failed a request is skipped.
const routerBackoff = 2 * time.Second

// Router is a running kvmesh route.
type Router struct {
	opts    Options
	log     *slog.Logger
	members *gossip.Membership
	lis     net.Listener
	http    *http.Server
	client  *http.Client
	reg     *prometheus.Registry

	requests *prometheus.CounterVec // node, code
	retries  *prometheus.CounterVec // node
	pending  *prometheus.GaugeVec   // node, kind: prompt (uncached tokens), decode (tokens to generate)
	upstream *prometheus.HistogramVec
	hints    prometheus.Counter
	overhead prometheus.Histogram

	mu struct {
		sync.Mutex
		load map[string]*nodeLoad // by member id
	}
}

type nodeLoad struct {
	prompt, decode, requests int
	downUntil                time.Time
}

// New binds the router's HTTP address and joins the cluster. Serve runs
// it.
func New(opts Options) (*Router, error) {
	if opts.HTTPAddr == "" {
		opts.HTTPAddr = DefaultHTTPAddr
	}
	if opts.GossipAddr == "" {
		opts.GossipAddr = "127.0.0.1:0"
	}
	if opts.GossipProfile == "" {
		opts.GossipProfile = "lan"
	}
	if opts.Policy == "" {
		opts.Policy = PolicyTokens
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	switch {
	case len(opts.Join) == 0:
		return nil, &OptionError{Field: "Join", Msg: "a router needs the gossip address of a member to join"}
	case opts.Policy != PolicyTokens && opts.Policy != PolicyRandom && opts.Policy != PolicySession:
		return nil, &OptionError{Field: "Policy", Msg: fmt.Sprintf("%q: want tokens, random or session", opts.Policy)}
	case opts.GossipProfile != "lan" && opts.GossipProfile != "local":
		return nil, &OptionError{Field: "GossipProfile", Msg: fmt.Sprintf("%q: want lan or local", opts.GossipProfile)}
	}
	lis, err := net.Listen("tcp", opts.HTTPAddr)
	if err != nil {
		return nil, fmt.Errorf("router: listen on HTTPAddr %s: %w", opts.HTTPAddr, err)
	}
	if opts.NodeID == "" {
		host, _ := os.Hostname()
		opts.NodeID = fmt.Sprintf("router-%s-%d", host, lis.Addr().(*net.TCPAddr).Port)
	}
	members, err := gossip.Start(gossip.Options{NodeID: opts.NodeID, GossipAddr: opts.GossipAddr, Join: opts.Join,
		RetryJoin: true, SecretKey: opts.GossipKey, Fast: opts.GossipProfile == "local", Logger: opts.Logger,
		Meta: gossip.MemberMeta{HTTPAddr: lis.Addr().String(), Role: gossip.RoleRouter}})
	if err != nil {
		lis.Close()
		return nil, err
	}
	r := &Router{opts: opts, log: opts.Logger, members: members, lis: lis, reg: prometheus.NewRegistry(),
		client: &http.Client{Transport: &http.Transport{
			DialContext:           (&net.Dialer{Timeout: 2 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
			MaxIdleConnsPerHost:   64,
			IdleConnTimeout:       90 * time.Second,
			ResponseHeaderTimeout: 10 * time.Minute, // a long prefill answers late
			TLSClientConfig:       opts.NodeTLS,
		}},
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvmesh_router_requests_total",
			Help: "Requests the router sent to each node, by node and HTTP status (0: the node failed before answering).",
		}, []string{"node", "code"}),
		retries: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvmesh_router_retries_total",
			Help: "Requests sent to another node because this one failed before the first byte of its answer.",
		}, []string{"node"}),
		pending: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "kvmesh_router_outstanding_tokens",
			Help: "Tokens of the requests in flight on each node: prompt (uncached prompt tokens still to compute) and decode (tokens to generate).",
		}, []string{"node", "kind"}),
		upstream: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "kvmesh_router_upstream_first_byte_seconds",
			Help:    "Time from sending a request to a node to the first byte of its answer, by node.",
			Buckets: []float64{.001, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60},
		}, []string{"node"}),
		hints: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "kvmesh_router_session_hints_total",
			Help: "Requests that carried x-session-affinity (a hint: the tokens and random policies never route by it).",
		}),
		overhead: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "kvmesh_router_choice_seconds",
			Help:    "Time the router spent choosing a node for a request (its lookup included).",
			Buckets: []float64{.0001, .00025, .0005, .001, .0025, .005, .01, .025, .1},
		}),
	}
	r.mu.load = map[string]*nodeLoad{}
	r.reg.MustRegister(r.requests, r.retries, r.pending, r.upstream, r.hints, r.overhead)
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(r.reg, promhttp.HandlerOpts{Registry: r.reg}))
	mux.HandleFunc("GET /healthz", r.healthz)
	mux.HandleFunc("POST /v1/completions", r.complete)
	mux.HandleFunc("POST /v1/chat/completions", r.complete)
	mux.HandleFunc("GET "+openai.QueuePath, r.listQueue)
	mux.HandleFunc("POST "+openai.QueuePath, r.submitQueue)
	mux.HandleFunc(openai.QueuePath+"/{id...}", r.forwardQueue)
	// Models, other methods and errors: any node answers the same.
	mux.HandleFunc("/v1/", func(w http.ResponseWriter, req *http.Request) { r.forwardAny(w, req, nil) })
	r.http = &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	return r, nil
}

// healthz answers "ok N nodes" while N > 0 nodes serve the API, else 503.
func (r *Router) healthz(w http.ResponseWriter, _ *http.Request) {
	n := len(r.backends())
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	if n == 0 {
		w.WriteHeader(http.StatusServiceUnavailable)
		io.WriteString(w, "no node serves the API\n")
		return
	}
	fmt.Fprintf(w, "ok %d nodes\n", n)
}

// HTTPAddr returns the address the router serves on.
func (r *Router) HTTPAddr() string { return r.lis.Addr().String() }

// GossipAddr returns the router's gossip address.
func (r *Router) GossipAddr() string { return r.members.GossipAddr() }

// Serve serves until ctx is done, then stops: new connections are refused,
// requests in flight get up to 10s to finish, and the router leaves the
// membership.
func (r *Router) Serve(ctx context.Context) error {
	errc := make(chan error, 1)
	go func() { errc <- r.http.Serve(r.lis) }()
	r.log.Info("kvmesh router serving", "http", r.HTTPAddr(), "gossip", r.GossipAddr(), "policy", r.opts.Policy)
	var err error
	select {
	case <-ctx.Done():
	case err = <-errc:
		err = fmt.Errorf("router: HTTP server: %w", err)
	}
	sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	if serr := r.http.Shutdown(sctx); serr != nil {
		r.http.Close()
	}
	cancel()
	r.members.Leave(time.Second)
	r.members.Close()
	r.client.CloseIdleConnections()
	r.log.Info("kvmesh router stopped")
	return err
}

// Close releases a router that was never served.
func (r *Router) Close() error {
	r.lis.Close()
	return r.members.Close()
}

// backend is a member the router may send requests to.
type backend struct {
	id, addr, role string
}

// backends returns the live members that serve the API, by role.
func (r *Router) backends() []backend {
	ms, _ := r.members.Members()
	var out []backend
	now := time.Now()
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, m := range ms {
		role := m.Meta.Role
		if role == "" {
			role = gossip.RoleBoth
		}
		if m.Meta.HTTPAddr == "" || (role != gossip.RoleBoth && role != gossip.RolePrefill && role != gossip.RoleDecode) {
			continue
		}
		if l := r.mu.load[m.ID]; l != nil && now.Before(l.downUntil) {
			continue
		}
		out = append(out, backend{id: m.ID, addr: m.Meta.HTTPAddr, role: role})
	}
	return out
}

func (r *Router) loadLocked(id string) *nodeLoad {
	l := r.mu.load[id]
	if l == nil {
		l = &nodeLoad{}
		r.mu.load[id] = l
	}
	return l
}

// pick chooses among cands: by policy for prefill work (cost: uncached
// prompt tokens), by outstanding decode tokens for decode work. It
// returns -1 when cands is empty.
func (r *Router) pick(cands []backend, decode bool, session string) int {
	if len(cands) == 0 {
		return -1
	}
	switch {
	case r.opts.Policy == PolicyRandom:
		return rand.IntN(len(cands))
	case r.opts.Policy == PolicySession && session != "":
		// Rendezvous on the session, so a member change moves few sessions.
		best, bestH := 0, uint64(0)
		for i, c := range cands {
			h := fnv.New64a()
			io.WriteString(h, session)
			io.WriteString(h, c.id)
			if v := h.Sum64(); i == 0 || v > bestH {
				best, bestH = i, v
			}
		}
		return best
	case r.opts.Policy == PolicySession:
		return rand.IntN(len(cands))
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	loads := make([]nodeLoad, len(cands))
	for i, c := range cands {
		loads[i] = *r.loadLocked(c.id)
	}
	return chooseLeastLoaded(loads, decode, rand.IntN(len(cands)))
}

// chooseLeastLoaded returns the index of the load with the fewest
// outstanding prompt tokens (decode: tokens to generate), then the fewest
// requests; among equals, the first from start on (a random start spreads
// ties).
func chooseLeastLoaded(loads []nodeLoad, decode bool, start int) int {
	key := func(l nodeLoad) [2]int {
		if decode {
			return [2]int{l.decode, l.requests}
		}
		return [2]int{l.prompt, l.requests}
	}
	best := start % len(loads)
	for k := 1; k < len(loads); k++ {
		i := (start + k) % len(loads)
		a, b := key(loads[i]), key(loads[best])
		if a[0] < b[0] || (a[0] == b[0] && a[1] < b[1]) {
			best = i
		}
	}
	return best
}

// charge adds a request's work to a node's load: prefilled is called
// when its prompt is computed (the first byte of the answer), done when it
// ended; both may be called more than once.
func (r *Router) charge(id string, prompt, decode int) (prefilled, done func()) {
	r.mu.Lock()
	l := r.loadLocked(id)
	l.prompt += prompt
	l.decode += decode
	l.requests++
	r.mu.Unlock()
	r.pending.WithLabelValues(id, "prompt").Add(float64(prompt))
	r.pending.WithLabelValues(id, "decode").Add(float64(decode))
	var p, d sync.Once
	prefilled = func() {
		p.Do(func() {
			r.mu.Lock()
			l.prompt -= prompt
			r.mu.Unlock()
			r.pending.WithLabelValues(id, "prompt").Sub(float64(prompt))
		})
	}
	return prefilled, func() {
		prefilled()
		d.Do(func() {
			r.mu.Lock()
			l.decode -= decode
			l.requests--
			r.mu.Unlock()
			r.pending.WithLabelValues(id, "decode").Sub(float64(decode))
		})
	}
}

func (r *Router) markDown(id string) {
	r.mu.Lock()
	r.loadLocked(id).downUntil = time.Now().Add(routerBackoff)
	r.mu.Unlock()
}

// submitQueue passes POST /v1/queue to any node: it stores the batch and
// runs it, and its id is found later by asking the nodes.
func (r *Router) submitQueue(w http.ResponseWriter, req *http.Request) {
	body, err := io.ReadAll(http.MaxBytesReader(w, req.Body, openai.DefaultBatchMaxBodyBytes))
	if err != nil {
		openai.WriteError(w, http.StatusRequestEntityTooLarge, fmt.Sprintf("the request body is too large (at most %d bytes) or unreadable", openai.DefaultBatchMaxBodyBytes), "invalid_request_error", "", "request_too_large")
		return
	}
	r.forwardAny(w, req, body)
}

// complete routes a completion: on the node chosen by the policy, or, with
// nodes in the prefill and decode roles, split between two.
func (r *Router) complete(w http.ResponseWriter, req *http.Request) {
	body, err := io.ReadAll(http.MaxBytesReader(w, req.Body, openai.MaxBodyBytes))
	if err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			openai.WriteError(w, http.StatusRequestEntityTooLarge, fmt.Sprintf("the request body is over %d bytes", tooBig.Limit), "invalid_request_error", "", "request_too_large")
			return
		}
		openai.WriteError(w, http.StatusBadRequest, "reading the request body: "+err.Error(), "invalid_request_error", "", "")
		return
	}
	c := completion{req: req, body: body, path: req.URL.Path, session: req.Header.Get(openai.SessionHeader)}
	if c.session != "" {
		r.hints.Inc()
	}
	began := time.Now()
	all := r.backends()
	var prefillers, decoders, both []backend
	for _, b := range all {
		switch b.role {
		case gossip.RolePrefill:
			prefillers = append(prefillers, b)
		case gossip.RoleDecode:
			decoders = append(decoders, b)
		default:
			both = append(both, b)
		}
	}
	if len(all) == 0 {
		openai.WriteError(w, http.StatusServiceUnavailable, "no node serves the API: none has joined, or all are down", "server_error", "", "no_backend")
		return
	}
	// The cost of the prompt, from one node's lookup; that node also
	// checks the request, so a bad one is refused here, with the node's
	// error, before any work.
	var lerr *routerError
	if c.look, lerr = r.lookup(req, body, c.path, all); lerr != nil {
		lerr.write(w)
		return
	}
	if len(prefillers) == 0 || len(decoders) == 0 {
		r.overhead.Observe(time.Since(began).Seconds())
		r.forward(w, c, slices.Concat(both, prefillers, decoders), c.look, false, nil)
		return
	}
	r.split(w, c, began, slices.Concat(prefillers, both), slices.Concat(decoders, both))
}

// completion is a completion request the router sends on: the client's
// request and body, and what the lookup found.
type completion struct {
	req           *http.Request
	body          []byte
	path, session string
	look          openai.LookupResult
}

// split runs c's prompt on one of prefillers (max_tokens 1, not streamed,
// published before it answers), then decodes on one of decoders, which
// loads the prefix from the cache; the client is told the prefill node's
// cached tokens.
func (r *Router) split(w http.ResponseWriter, c completion, began time.Time, prefillers, decoders []backend) {
	pre, err := prefillBody(c.body)
	if err != nil {
		openai.WriteError(w, http.StatusBadRequest, err.Error(), "invalid_request_error", "", "")
		return
	}
	r.overhead.Observe(time.Since(began).Seconds())
	rec := &captureWriter{header: http.Header{}}
	pc := c
	pc.req, pc.body = c.req.Clone(c.req.Context()), pre
	pc.req.Header.Set(openai.PublishHeader, "wait")
	t0 := time.Now()
	r.forward(rec, pc, prefillers, openai.LookupResult{PromptTokens: c.look.PromptTokens, CachedTokens: c.look.CachedTokens, MaxTokens: 1},
		false, nil)
	preTook := time.Since(t0)
	if rec.code != http.StatusOK {
		copyHeader(w.Header(), rec.header)
		w.WriteHeader(rec.code)
		w.Write(rec.body.Bytes())
		return
	}
	var pu struct {
		Usage openai.Usage `json:"usage"`
	}
	json.Unmarshal(rec.body.Bytes(), &pu)
	w.Header().Set("X-Kvmesh-Prefill-Node", rec.header.Get("X-Kvmesh-Node"))
	w.Header().Set("X-Kvmesh-Prefill-Node-Ms", strconv.FormatFloat(ms(preTook), 'f', 3, 64))
	w.Header().Set("X-Kvmesh-Prefill-Cached-Tokens", strconv.Itoa(pu.Usage.PromptTokensDetails.CachedTokens))
	rewrite := func(u *openai.Usage) { u.PromptTokensDetails.CachedTokens = pu.Usage.PromptTokensDetails.CachedTokens }
	r.forward(w, c, decoders, openai.LookupResult{PromptTokens: c.look.PromptTokens,
		CachedTokens: c.look.PromptTokens, MaxTokens: c.look.MaxTokens}, true, rewrite)
}

// routerError is an answer the router passes on as is.
type routerError struct {
	code   int
	header http.Header
	body   []byte
}

func (e *routerError) write(w http.ResponseWriter) {
	copyHeader(w.Header(), e.header)
	w.WriteHeader(e.code)
	w.Write(e.body)
}

// lookup asks a node for the prompt's cost; a node that cannot answer is
// skipped, and when none can the cost is the whole prompt, unknown.
func (r *Router) lookup(req *http.Request, body []byte, path string, cands []backend) (openai.LookupResult, *routerError) {
	order := rand.Perm(len(cands))
	for _, i := range order[:min(len(order), 3)] {
		b := cands[i]
		ctx, cancel := context.WithTimeout(req.Context(), 5*time.Second)
		up, err := http.NewRequestWithContext(ctx, http.MethodPost, r.scheme()+b.addr+openai.LookupPath+strings.TrimPrefix(path, "/v1"), bytes.NewReader(body))
		if err != nil {
			cancel()
			continue
		}
		copyRequestHeader(up.Header, req.Header)
		resp, err := r.client.Do(up)
		if err != nil {
			cancel()
			r.markDown(b.id)
			continue
		}
		rb, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
		resp.Body.Close()
		cancel()
		switch {
		case err != nil || resp.StatusCode >= 500:
			continue
		case resp.StatusCode != http.StatusOK:
			return openai.LookupResult{}, &routerError{code: resp.StatusCode, header: resp.Header, body: rb}
		}
		var lr openai.LookupResult
		if json.Unmarshal(rb, &lr) == nil {
			return lr, nil
		}
	}
	return openai.LookupResult{}, nil
}

// forward sends the request to the best of cands, and on a failure before
// the first byte of the answer to the next best, until one answers or none
// is left. decode charges the node by tokens to generate, else by uncached
// prompt tokens. rewrite, when set, edits the usage of the answer.
func (r *Router) forward(w http.ResponseWriter, c completion, cands []backend, look openai.LookupResult, decode bool, rewrite func(*openai.Usage)) {
	cands = slices.Clone(cands)
	for len(cands) > 0 {
		i := r.pick(cands, decode, c.session)
		b := cands[i]
		cands = slices.Delete(cands, i, i+1)
		prefilled, done := r.charge(b.id, max(0, look.PromptTokens-look.CachedTokens), look.MaxTokens)
		sent, err := r.try(w, c.req, c.body, c.path, b, prefilled, rewrite)
		done()
		if err == nil || c.req.Context().Err() != nil {
			return
		}
		r.log.Warn("router: node failed", "node", b.id, "addr", b.addr, "answered", sent, "err", err)
		if sent {
			return // the client has bytes already: the response ends here
		}
		r.markDown(b.id)
		r.retries.WithLabelValues(b.id).Inc()
	}
	openai.WriteError(w, http.StatusServiceUnavailable, "every node failed this request; retry", "server_error", "", "no_backend")
}

// forwardAny sends a request that needs no choice to any live node, with
// the same retries.
func (r *Router) forwardAny(w http.ResponseWriter, req *http.Request, body []byte) {
	if req.Body != nil && body == nil {
		var err error
		if body, err = io.ReadAll(http.MaxBytesReader(w, req.Body, openai.MaxBodyBytes)); err != nil {
			openai.WriteError(w, http.StatusRequestEntityTooLarge, "the request body is too large or unreadable", "invalid_request_error", "", "")
			return
		}
	}
	cands := r.backends()
	for len(cands) > 0 {
		i := rand.IntN(len(cands))
		b := cands[i]
		cands = slices.Delete(cands, i, i+1)
		sent, err := r.try(w, req, body, req.URL.Path, b, func() {}, nil)
		if err == nil || sent {
			return
		}
		r.markDown(b.id)
		r.retries.WithLabelValues(b.id).Inc()
	}
	openai.WriteError(w, http.StatusServiceUnavailable, "no node serves the API: none has joined, or all are down", "server_error", "", "no_backend")
}

// listQueue answers GET /v1/queue with every node's list of the caller's
// batches; a node's error (a refused token) is answered as is.
func (r *Router) listQueue(w http.ResponseWriter, req *http.Request) {
	all := openai.QueueList{Object: "list", Data: []openai.QueueBatch{}}
	answered := false
	for _, b := range r.backends() {
		rec := &captureWriter{header: http.Header{}}
		if _, err := r.try(rec, req, nil, req.URL.Path, b, func() {}, nil); err != nil {
			continue
		}
		if rec.code != http.StatusOK {
			copyHeader(w.Header(), rec.header)
			w.WriteHeader(rec.code)
			w.Write(rec.body.Bytes())
			return
		}
		var l openai.QueueList
		if json.Unmarshal(rec.body.Bytes(), &l) == nil {
			all.Data = append(all.Data, l.Data...)
			answered = true
		}
	}
	if !answered {
		openai.WriteError(w, http.StatusServiceUnavailable, "no node serves the API: none has joined, or all are down", "server_error", "", "no_backend")
		return
	}
	openai.WriteJSON(w, http.StatusOK, all)
}

// forwardQueue passes GET or DELETE /v1/queue/{id} to the node that holds
// the batch: it asks the nodes in turn and answers with the first answer
// that is not 404 (404 when every node says so). A batch is stored by the
// node that accepted it; nothing else knows where.
func (r *Router) forwardQueue(w http.ResponseWriter, req *http.Request) {
	req = req.Clone(req.Context())
	req.Header.Set(openai.ForwardedHeader, "1") // the router asks every node: they need not ask their peers
	var last *captureWriter
	for _, b := range r.backends() {
		rec := &captureWriter{header: http.Header{}}
		if _, err := r.try(rec, req, nil, req.URL.Path, b, func() {}, nil); err != nil {
			continue // down or stopping: another node may hold it, else 404 below
		}
		if rec.code == http.StatusNotFound {
			last = rec
			continue
		}
		last = rec
		break
	}
	if last == nil {
		openai.WriteError(w, http.StatusServiceUnavailable, "no node serves the API: none has joined, or all are down", "server_error", "", "no_backend")
		return
	}
	copyHeader(w.Header(), last.header)
	w.WriteHeader(last.code)
	w.Write(last.body.Bytes())
}

// try sends the request to b and streams its answer to w. It reports
// whether anything reached w; an error with nothing sent may be retried.
// firstByte is called when the node's answer starts (its prefill is done).
func (r *Router) try(w http.ResponseWriter, req *http.Request, body []byte, path string, b backend, firstByte func(), rewrite func(*openai.Usage)) (sent bool, err error) {
	t0 := time.Now()
	up, err := http.NewRequestWithContext(req.Context(), req.Method, r.scheme()+b.addr+path, bytes.NewReader(body))
	if err != nil {
		return false, err
	}
	copyRequestHeader(up.Header, req.Header)
	resp, err := r.client.Do(up)
	if err != nil {
		r.requests.WithLabelValues(b.id, "0").Inc()
		return false, err
	}
	defer resp.Body.Close()
	r.requests.WithLabelValues(b.id, strconv.Itoa(resp.StatusCode)).Inc()
	if resp.StatusCode == http.StatusBadGateway || resp.StatusCode == http.StatusServiceUnavailable {
		io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<16))
		return false, fmt.Errorf("status %d", resp.StatusCode)
	}
	stream := strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream")
	// Read the first bytes before answering: a node that dies before
	// them is retried elsewhere.
	br := make([]byte, 32<<10)
	n, rerr := resp.Body.Read(br)
	if n == 0 && rerr != nil && rerr != io.EOF {
		return false, rerr
	}
	r.upstream.WithLabelValues(b.id).Observe(time.Since(t0).Seconds())
	firstByte()
	copyHeader(w.Header(), resp.Header)
	if rewrite != nil { // the client's cached tokens are the prefill node's
		w.Header().Set("X-Kvmesh-Cached-Tokens", w.Header().Get("X-Kvmesh-Prefill-Cached-Tokens"))
		w.Header().Set("X-Kvmesh-Decode-Node", b.id)
	}
	w.Header().Set("X-Kvmesh-Node", b.id)
	w.Header().Set("X-Kvmesh-Router-Node", b.id)
	if !stream {
		rest, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
		if err != nil {
			return false, err
		}
		all := append(br[:n], rest...)
		if rewrite != nil && resp.StatusCode == http.StatusOK {
			all = rewriteUsage(all, rewrite)
			w.Header().Set("X-Kvmesh-Decode-Node-Ms", strconv.FormatFloat(ms(time.Since(t0)), 'f', 3, 64))
		}
		w.Header().Del("Content-Length")
		w.Header().Set("Content-Length", strconv.Itoa(len(all)))
		w.WriteHeader(resp.StatusCode)
		w.Write(all)
		return true, nil
	}
	w.Header().Del("Content-Length")
	w.WriteHeader(resp.StatusCode)
	rc := http.NewResponseController(w)
	var pending []byte // an event not yet complete (rewrite only)
	out := func(p []byte) error {
		if rewrite != nil {
			pending = append(pending, p...)
			cut := bytes.LastIndex(pending, []byte("\n\n"))
			if cut < 0 {
				return nil
			}
			p = rewriteEvents(pending[:cut+2], rewrite)
			pending = append(pending[:0], pending[cut+2:]...)
		}
		if _, err := w.Write(p); err != nil {
			return err
		}
		return rc.Flush()
	}
	if err := out(br[:n]); err != nil {
		return true, nil // the client left
	}
	for rerr == nil {
		n, rerr = resp.Body.Read(br)
		if n > 0 {
			if err := out(br[:n]); err != nil {
				return true, nil
			}
		}
	}
	if rerr != io.EOF {
		return true, rerr
	}
	return true, nil
}

// rewriteUsage applies f to the usage of a JSON answer; an answer without
// usage is returned as is.
func rewriteUsage(b []byte, f func(*openai.Usage)) []byte {
	var m map[string]json.RawMessage
	if json.Unmarshal(b, &m) != nil || m["usage"] == nil || string(m["usage"]) == "null" {
		return b
	}
	var u openai.Usage
	if json.Unmarshal(m["usage"], &u) != nil {
		return b
	}
	f(&u)
	m["usage"], _ = json.Marshal(u)
	out, err := json.Marshal(m)
	if err != nil {
		return b
	}
	return out
}

// rewriteEvents applies f to the usage of each complete event in b.
func rewriteEvents(b []byte, f func(*openai.Usage)) []byte {
	var out []byte
	for ev := range bytes.SplitSeq(b, []byte("\n\n")) {
		if len(ev) == 0 {
			continue
		}
		if data, ok := bytes.CutPrefix(ev, []byte("data: {")); ok && bytes.Contains(data, []byte(`"usage"`)) {
			ev = append([]byte("data: "), rewriteUsage(append([]byte("{"), data...), f)...)
		}
		out = append(append(out, ev...), '\n', '\n')
	}
	return out
}

// prefillBody is the request body of the prefill step: the client's, not
// streamed, generating one token.
func prefillBody(body []byte) ([]byte, error) {
	var m map[string]json.RawMessage
	if err := json.Unmarshal(body, &m); err != nil {
		return nil, fmt.Errorf("the request body is not a JSON object: %w", err)
	}
	m["stream"] = json.RawMessage("false")
	delete(m, "stream_options")
	delete(m, "max_completion_tokens")
	m["max_tokens"] = json.RawMessage("1")
	return json.Marshal(m)
}

// hopHeaders are not forwarded (RFC 9110 §7.6.1), nor is Content-Length,
// which the transport sets.
var hopHeaders = map[string]bool{"Connection": true, "Keep-Alive": true, "Proxy-Connection": true, "Te": true,
	"Trailer": true, "Transfer-Encoding": true, "Upgrade": true, "Content-Length": true}

func copyRequestHeader(dst, src http.Header) {
	for k, vs := range src {
		if !hopHeaders[k] {
			dst[k] = slices.Clone(vs)
		}
	}
}

func copyHeader(dst, src http.Header) {
	for k, vs := range src {
		if !hopHeaders[k] {
			dst[k] = slices.Clone(vs)
		}
	}
}

// captureWriter is an http.ResponseWriter that keeps the answer.
type captureWriter struct {
	header http.Header
	code   int
	body   bytes.Buffer
}

func (c *captureWriter) Header() http.Header { return c.header }
func (c *captureWriter) WriteHeader(code int) {
	if c.code == 0 {
		c.code = code
	}
}
func (c *captureWriter) Write(b []byte) (int, error) {
	if c.code == 0 {
		c.code = http.StatusOK
	}
	return c.body.Write(b)
}

// scheme is how the router reaches the nodes' HTTP addresses.
func (r *Router) scheme() string {
	if r.opts.NodeTLS != nil {
		return "https://"
	}
	return "http://"
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
