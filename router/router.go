package router

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/kvmesh/kvmesh/gossip"
	"github.com/kvmesh/kvmesh/internal/probe"
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
	// GossipKey is the cluster's gossip key, if it has one. Gossip is
	// authenticated by it alone: without it, any host that reaches the
	// router's gossip can join as a "node" and be sent the requests, so the
	// router then forwards no request that carries credentials (an
	// Authorization header; 503 saying so), unless InsecureGossip.
	GossipKey []byte
	// InsecureGossip lets a router without a GossipKey forward requests
	// with credentials, on a network only the cluster's hosts reach.
	// Default false.
	InsecureGossip bool
	// GossipProfile is "lan" or "local", as the nodes' (node.Options).
	// Default "lan".
	GossipProfile string
	// Policy is PolicyTokens, PolicyRandom or PolicySession. Default
	// PolicyTokens.
	Policy string
	// NodeTLS, when set, is the client configuration the router reaches
	// the nodes' HTTP addresses with, over HTTPS verified against the
	// cluster's CA (nodes with TLS serve every listener over it: its CA,
	// and a certificate when they want one). Default nil: plain HTTP. The
	// router routes only to nodes that agree: with NodeTLS to nodes that
	// gossip TLS, without it to nodes that do not (MemberMeta.TLS).
	NodeTLS *tls.Config
	// EngineEvents are KV-event sources (engines', kvmesh nodes') the
	// router subscribes to: with any, the token policy weighs each node's
	// cost of a prompt by what its engine holds in GPU memory and where
	// the store holds the rest (Weights), instead of the store's cached
	// prefix alone.
	EngineEvents []EngineEvents
	// Weights weigh a block's tokens by where it is held. Zero:
	// DefaultWeights.
	Weights Weights
	// EngineEventsTTL is how long a member may be gone from the cluster,
	// or a publisher's connection lost, before the blocks its engine
	// published are dropped. Default 30s.
	EngineEventsTTL time.Duration
	// MaxIndexedBlocks bounds the blocks the event index holds, all
	// members together. Default 1<<22 (about 200 MiB).
	MaxIndexedBlocks int
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

// membership is what the router needs of the cluster's gossip
// (*gossip.Membership; tests give a router members of their own).
type membership interface {
	Members() ([]gossip.MemberInfo, uint64)
	GossipAddr() string
	Leave(timeout time.Duration) error
	Close() error
}

var _ membership = (*gossip.Membership)(nil)

// Router is a running kvmesh route.
type Router struct {
	opts    Options
	log     *slog.Logger
	members membership
	lis     net.Listener
	http    *http.Server
	client  *http.Client
	reg     *prometheus.Registry
	events  *eventIndex // nil without Options.EngineEvents

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
	if err := opts.ensureEvents(); err != nil {
		return nil, err
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
	if !members.Joined() {
		// A node's gRPC or HTTP port given as a seed is retried forever:
		// say so now.
		for _, s := range opts.Join {
			if what := probe.NotGossip(s); what != "" {
				members.Close()
				lis.Close()
				return nil, &OptionError{Field: "Join", Msg: fmt.Sprintf("%s answers %s; join takes the members' gossip addresses (their --gossip-addr, port 7603 by default)", s, what)}
			}
		}
	}
	r := &Router{opts: opts, log: opts.Logger, members: members, lis: lis, reg: prometheus.NewRegistry(),
		client: &http.Client{Transport: &http.Transport{
			DialContext:           (&net.Dialer{Timeout: 2 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
			MaxIdleConnsPerHost:   64,
			IdleConnTimeout:       90 * time.Second,
			ResponseHeaderTimeout: 10 * time.Minute, // a long prefill answers late
			TLSClientConfig:       opts.NodeTLS,
		},
			// A node's redirect is passed to the client, never followed
			// here (it could point anywhere, /metrics included).
			CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
		},
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
	if len(opts.EngineEvents) > 0 {
		r.events = newEventIndex(opts)
		r.reg.MustRegister(r.events.collectors()...)
	}
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(r.reg, promhttp.HandlerOpts{Registry: r.reg}))
	mux.HandleFunc("GET /healthz", r.healthz)
	mux.HandleFunc("POST /v1/completions", r.gate(r.complete))
	mux.HandleFunc("POST /v1/chat/completions", r.gate(r.complete))
	mux.HandleFunc("GET "+openai.QueuePath, r.gate(r.listQueue))
	mux.HandleFunc("POST "+openai.QueuePath, r.gate(r.submitQueue))
	mux.HandleFunc(openai.QueuePath+"/{id...}", r.gate(r.forwardQueue))
	// Models, other methods and errors: any node answers the same.
	mux.HandleFunc("/v1/", r.gate(func(w http.ResponseWriter, req *http.Request) { r.forwardAny(w, req, nil) }))
	mux.HandleFunc("/", openai.NotFound)
	r.http = openai.NewServer(mux, openai.Timeouts{})
	return r, nil
}

// apiPath reports whether p, a request's decoded path, is one the router
// forwards: the OpenAI API's paths as package openai serves them, clean
// (no "." or ".." segment, no empty one, no backslash), and nothing else:
// never /metrics, /debug or /internal of a node, however encoded.
func apiPath(p string) bool {
	if p != path.Clean(p) || strings.ContainsAny(p, "\\\x00") {
		return false
	}
	switch p {
	case "/v1/models", "/v1/completions", "/v1/chat/completions", openai.QueuePath,
		openai.LookupPath + "/completions", openai.LookupPath + "/chat/completions":
		return true
	}
	if id, ok := strings.CutPrefix(p, openai.QueuePath+"/"); ok {
		return id != "" && !strings.Contains(id, "/")
	}
	id, ok := strings.CutPrefix(p, "/v1/models/")
	return ok && id != "" // model ids may hold '/' (org/model)
}

// gate refuses a request the router must not forward: a path that is not
// the API's (apiPath: 404, whatever its encoding), or one with credentials
// when gossip is not authenticated (no GossipKey, not InsecureGossip).
func (r *Router) gate(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, req *http.Request) {
		if !apiPath(req.URL.Path) || strings.Contains(strings.ToLower(req.URL.RawPath), "%2f") {
			openai.WriteError(w, http.StatusNotFound, "no such path: the router forwards the OpenAI API's paths only (/v1/models, /v1/completions, /v1/chat/completions, /v1/queue)",
				"invalid_request_error", "", "unknown_url")
			return
		}
		if req.Header.Get("Authorization") != "" && len(r.opts.GossipKey) == 0 && !r.opts.InsecureGossip {
			openai.WriteError(w, http.StatusServiceUnavailable, "this router has no gossip key (--gossip-key-file): it cannot tell "+
				"the cluster's nodes from any host that joined its gossip, and sends them no bearer token", "server_error", "", "no_gossip_key")
			return
		}
		h(w, req)
	}
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
	stopEvents := r.followEvents(ctx)
	defer stopEvents()
	r.log.Info("kvmesh router serving", "http", r.HTTPAddr(), "gossip", r.GossipAddr(), "policy", r.opts.Policy,
		"engine_events", len(r.opts.EngineEvents))
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

// backends returns the live members that serve the API, by role, but
// those marked down (routerBackoff).
func (r *Router) backends() []backend { return r.serving(true) }

// serving returns the live members that serve the API; skipDown leaves out
// those marked down.
func (r *Router) serving(skipDown bool) []backend {
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
		if m.Meta.TLS != (r.opts.NodeTLS != nil) {
			// A node with TLS is never sent clients' tokens and prompts in
			// the clear, and a router with the cluster's CA speaks to no
			// node without TLS (that node could be anyone's).
			continue
		}
		if l := r.mu.load[m.ID]; skipDown && l != nil && now.Before(l.downUntil) {
			continue
		}
		out = append(out, backend{id: m.ID, addr: m.Meta.HTTPAddr, role: role})
	}
	return out
}
