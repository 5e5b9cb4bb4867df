package node

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"github.com/kvmesh/kvmesh/auth"
	"log/slog"
	"net"
	"net/http"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/reflection"
	"google.golang.org/grpc/status"

	"github.com/kvmesh/kvmesh/node/ready"
	"github.com/kvmesh/kvmesh/openai"
	kvmeshv1 "github.com/kvmesh/kvmesh/proto/kvmesh/v1"
)

// Node is one kvmesh daemon: the gRPC API over a Cache, and an HTTP server
// with /metrics, /healthz, /livez and /readyz (and /debug/pprof/ with
// Options.Pprof), and the OpenAI-compatible API (/v1/, package openai).
type Node struct {
	opts    Options
	cache   Cache
	log     *slog.Logger
	metrics *metrics
	names   names           // model ids of the namespaces seen, for Stats
	prefill *prefillService // nil when Options.Prefill.Disabled

	grpcLis, httpLis net.Listener
	grpc             *grpc.Server
	guard            *guard // tokens and TLS refusals of the gRPC API
	health           *health.Server
	http             *http.Server
	mux              *http.ServeMux // http's; openPrefill mounts the OpenAI-compatible API on it
	stopping         atomic.Bool    // /healthz and /readyz answer 503 once set
	serving          atomic.Bool    // set once Serve serves; /readyz answers 503 until then

	// cluster is the production cache (Open), nil for a cache given to
	// New: it knows the members and the data plane's addresses.
	cluster *clusterCache

	putBudget *budget // BatchPut's block buffers (MaxInFlightBytes)
	serveOnce sync.Once
	closeOnce sync.Once
	closeErr  error
}

// nodeListeners are the gRPC and HTTP listeners of a node being built.
type nodeListeners struct{ grpc, http net.Listener }

func listen(opts Options) (nodeListeners, error) {
	var l nodeListeners
	var err error
	if l.grpc, err = net.Listen("tcp", opts.Listen.GRPCAddr); err != nil {
		return l, fmt.Errorf("node: listen on GRPCAddr %s: %w", opts.Listen.GRPCAddr, err)
	}
	if l.http, err = net.Listen("tcp", opts.Listen.HTTPAddr); err != nil {
		l.grpc.Close()
		return l, fmt.Errorf("node: listen on HTTPAddr %s: %w", opts.Listen.HTTPAddr, err)
	}
	return l, nil
}

func (l nodeListeners) close() {
	l.grpc.Close()
	l.http.Close()
}

// New validates opts (after EnsureDefaults), binds the gRPC and HTTP
// listeners and returns a node ready to Serve cache, alone: it joins no
// cluster and serves no data plane (Open builds the node that does). The node
// owns cache from here on: it closes it when Serve returns, or in Close if
// Serve is never called, and also when New fails.
func New(opts Options, cache Cache) (*Node, error) {
	opts.EnsureDefaults()
	if err := opts.Validate(); err != nil {
		cache.Close()
		return nil, err
	}
	if opts.NodeID == "" {
		if err := resolveNodeID(&opts); err != nil {
			cache.Close()
			return nil, err
		}
	}
	tokens, err := tokenSet(&opts.Security)
	if err != nil {
		cache.Close()
		return nil, err
	}
	lis, err := listen(opts)
	if err != nil {
		cache.Close()
		return nil, err
	}
	n := newNode(opts, cache, lis, tokens)
	if err := n.openPrefill(); err != nil {
		n.Close()
		return nil, err
	}
	return n, nil
}

// tenantCount is the number of tenants the node's tokens file names.
func (n *Node) tenantCount() int {
	if n.opts.Security.TokensFile == nil {
		return 0
	}
	return len(n.opts.Security.TokensFile.Tenants)
}

// newNode builds the servers of a node over cache and its listeners; tokens
// (nil: none) guard every call; extra collectors join its metrics.
func newNode(opts Options, cache Cache, lis nodeListeners, tokens *auth.Tokens, extra ...prometheus.Collector) *Node {
	n := &Node{opts: opts, cache: cache, log: opts.Logger, grpcLis: lis.grpc, httpLis: lis.http, guard: newGuard(tokens),
		putBudget: newBudget(opts.Limits.MaxInFlightBytes)}
	if opts.Security.TokensFile != nil {
		n.guard.file.Store(opts.Security.TokensFile)
	}
	var labelKey []byte
	// A namespace in the metrics holds blocks: keep its name, as Stats does.
	model := func(d uint64) string { n.names.keepSeen(d); return n.names.model(d) }
	if opts.Security.TokensFile != nil {
		// On a node with tenants /metrics, which needs no token, names
		// neither a tenant's namespace (a keyed hash of its digest) nor
		// its model (a tenant's model ids are its own): "unknown".
		labelKey = opts.Security.TokensFile.LabelKey
		model = func(d uint64) string { n.names.keepSeen(d); return "" }
	}
	n.metrics = newMetrics(cache, metricsOptions{labelKey: labelKey, version: opts.Version, model: model},
		append(extra, n.guard.collectors()...)...)
	sopts := []grpc.ServerOption{
		grpc.MaxRecvMsgSize(opts.Limits.MaxMessageBytes),
		grpc.MaxSendMsgSize(opts.Limits.MaxMessageBytes),
		// Streams past the limit wait on their client (HTTP/2 flow
		// control), so one connection cannot start unbounded handlers.
		grpc.MaxConcurrentStreams(uint32(opts.Limits.MaxConcurrentStreams)),
		// The guard runs inside unary and stream, so that refused calls
		// are counted and logged like every other refusal; the server
		// metrics, outermost, see the status code the client gets.
		grpc.ChainUnaryInterceptor(n.metrics.grpc.UnaryServerInterceptor(), n.unary, n.guard.unary),
		grpc.ChainStreamInterceptor(n.metrics.grpc.StreamServerInterceptor(), n.stream, n.guard.stream),
		// Stop (after ShutdownTimeout) waits for handlers to return, so
		// that no pin is held when the cache closes.
		grpc.WaitForHandlers(true),
		// gRPC's proto codec with buffers that fit large messages (a
		// Lookup's chain) without clearing a MiB for each.
		grpc.ForceServerCodecV2(kvmeshv1.Codec),
	}
	if opts.Security.TLS != nil {
		sopts = append(sopts, grpc.Creds(n.guard.serverCreds(opts.Security.TLS)))
	}
	n.grpc = grpc.NewServer(sopts...)
	kvmeshv1.RegisterCacheServiceServer(n.grpc, &cacheService{n: n})
	kvmeshv1.RegisterAdminServiceServer(n.grpc, &adminService{n: n})
	kvmeshv1.RegisterPeerServiceServer(n.grpc, &peerService{n: n})
	n.health = health.NewServer()
	for _, svc := range []string{"", kvmeshv1.CacheService_ServiceDesc.ServiceName, kvmeshv1.AdminService_ServiceDesc.ServiceName} {
		n.health.SetServingStatus(svc, healthpb.HealthCheckResponse_SERVING)
	}
	healthpb.RegisterHealthServer(n.grpc, n.health)
	reflection.Register(n.grpc)

	mux := http.NewServeMux()
	n.mux = mux
	mux.Handle("GET /metrics", promhttp.HandlerFor(n.metrics.reg, promhttp.HandlerOpts{Registry: n.metrics.reg}))
	mux.HandleFunc("GET /healthz", n.healthz)
	mux.HandleFunc("GET /livez", n.livez)
	mux.HandleFunc("GET /readyz", n.readyz)
	if opts.Pprof {
		registerPprof(mux)
	}
	n.http = openai.NewServer(mux, openai.Timeouts{})
	if opts.Security.TLS != nil { // every listener: HTTPTLS is implied
		cfg := opts.Security.TLS.Clone()
		if cfg.ClientAuth == tls.RequireAndVerifyClientCert {
			cfg.ClientAuth = tls.VerifyClientCertIfGiven // probes and scrapers carry no certificate; tokens guard /v1/
		}
		cfg.NextProtos = []string{"h2", "http/1.1"}
		n.http.TLSConfig = cfg
		n.httpLis = tls.NewListener(n.httpLis, cfg)
	}
	return n
}

// GRPCAddr returns the address the gRPC API listens on (the chosen port
// when Options.Listen.GRPCAddr had port 0).
func (n *Node) GRPCAddr() string { return n.grpcLis.Addr().String() }

// HTTPAddr returns the address /metrics and /healthz are served on.
func (n *Node) HTTPAddr() string { return n.httpLis.Addr().String() }

// ID returns the node's id.
func (n *Node) ID() string { return n.opts.NodeID }

// DataAddr returns the data plane's address as other nodes and clients
// reach it, or "" for a node built by New.
func (n *Node) DataAddr() string {
	if n.cluster == nil {
		return ""
	}
	return n.cluster.dataAddr
}

// ShmSocket returns the path of the shared-memory data plane's unix socket,
// or "" when it is off.
func (n *Node) ShmSocket() string {
	if n.cluster == nil {
		return ""
	}
	return n.cluster.shmPath
}

// GossipAddr returns the address membership listens on (what other nodes
// Join), or "" for a node built by New.
func (n *Node) GossipAddr() string {
	if n.cluster == nil {
		return ""
	}
	return n.cluster.members.GossipAddr()
}

// Ready returns where the node is reached, as its ready file says it
// (Options.ReadyFile): the ports it bound, and for an address bound to an
// unspecified host (0.0.0.0, ::) the advertised host.
func (n *Node) Ready() ready.Info {
	info := ready.Info{NodeID: n.opts.NodeID, PID: os.Getpid(), GRPCAddr: n.GRPCAddr(), HTTPAddr: n.HTTPAddr(),
		DataAddr: n.DataAddr(), GossipAddr: n.GossipAddr(), ShmSocket: n.ShmSocket()}
	if n.cluster != nil {
		info.GRPCAddr, info.HTTPAddr = n.cluster.grpcAddr, n.cluster.httpAddr
	}
	return info
}

// Serve serves until ctx is done or a server fails, then shuts down: health
// turns NOT_SERVING, new requests are refused, requests in flight get
// ShutdownTimeout to finish before they are cancelled; then a node of a
// cluster pushes its DRAM blocks to their next owners and leaves the
// membership (within ShutdownTimeout again), writes what remains only in
// DRAM to NVMe (Tiers.SpillOnStopBytes, within ShutdownTimeout again), and the
// cache is closed. It
// returns nil after a shutdown asked for through ctx. Serve may be called
// once.
func (n *Node) Serve(ctx context.Context) error {
	served := false
	n.serveOnce.Do(func() { served = true })
	if !served {
		return errors.New("node: Serve called twice")
	}
	if n.prefill != nil {
		n.prefill.start() // queued prefills run while the node serves; Close stops them
	}
	errc := make(chan error, 2)
	var wg sync.WaitGroup
	wg.Add(2)
	go func() {
		defer wg.Done()
		if err := n.grpc.Serve(n.grpcLis); err != nil {
			errc <- fmt.Errorf("node: gRPC server: %w", err)
		}
	}()
	go func() {
		defer wg.Done()
		if err := n.http.Serve(n.httpLis); err != nil && !errors.Is(err, http.ErrServerClosed) {
			errc <- fmt.Errorf("node: HTTP server: %w", err)
		}
	}()
	n.serving.Store(true)
	// Every address as bound (port 0 resolved), in one line.
	n.log.Info("kvmesh node serving", "id", n.opts.NodeID, "grpc", n.GRPCAddr(), "http", n.HTTPAddr(),
		"data", n.DataAddr(), "shm", n.ShmSocket(), "gossip", n.GossipAddr(), "ready_file", n.opts.ReadyFile,
		"data_dir", n.opts.DataDir, "dram_bytes", n.opts.Tiers.DRAMBytes, "nvme_bytes", n.opts.Tiers.NVMeBytes,
		"tls", n.opts.Security.TLS != nil, "mutual_tls", n.opts.Security.TLS != nil && n.opts.Security.TLS.ClientAuth == tls.RequireAndVerifyClientCert,
		"tokens", len(n.opts.Security.Tokens), "tenants", n.tenantCount())

	var serveErr error
	if n.opts.ReadyFile != "" {
		// The listeners are bound and served: a connection made after
		// this point is answered.
		if err := ready.Write(n.opts.ReadyFile, n.Ready()); err != nil {
			serveErr = fmt.Errorf("node: option ReadyFile: %w", err)
			n.log.Error("kvmesh node failed", "err", serveErr)
		}
	}
	if serveErr == nil {
		select {
		case <-ctx.Done():
			n.log.Info("kvmesh node stopping", "cause", context.Cause(ctx))
		case serveErr = <-errc:
			n.log.Error("kvmesh node failed", "err", serveErr)
		}
	}
	if n.opts.ReadyFile != "" {
		// A node that stops serving is no longer ready.
		if err := os.Remove(n.opts.ReadyFile); err != nil && !errors.Is(err, os.ErrNotExist) {
			n.log.Warn("ready file not removed", "file", n.opts.ReadyFile, "err", err)
		}
	}
	n.shutdown()
	wg.Wait()
	if n.cluster != nil {
		// Requests are done: hand the hot blocks over, then leave, so
		// that the others stop asking this node before it stops
		// answering.
		ctx, cancel := context.WithTimeout(context.Background(), n.opts.ShutdownTimeout)
		taken := n.cluster.leave(ctx)
		cancel()
		// Then what no other member took goes to NVMe: a restart on
		// this data dir serves it.
		ctx, cancel = context.WithTimeout(context.Background(), n.opts.ShutdownTimeout)
		n.cluster.spill(ctx, taken)
		cancel()
	}
	if err := n.Close(); err != nil && serveErr == nil {
		serveErr = err
	}
	return serveErr
}

// shutdown stops the servers, letting requests in flight finish for up to
// ShutdownTimeout.
func (n *Node) shutdown() {
	n.stopping.Store(true)
	n.health.Shutdown()
	if n.prefill != nil {
		// Queued work stops first: the request in flight stays queued on
		// disk, and the cores go to the synchronous requests finishing.
		n.prefill.stop()
	}
	done := make(chan struct{})
	go func() {
		n.grpc.GracefulStop()
		close(done)
	}()
	timer := time.NewTimer(n.opts.ShutdownTimeout)
	defer timer.Stop()
	select {
	case <-done:
	case <-timer.C:
		n.log.Warn("requests still in flight after the shutdown timeout; cancelling them", "timeout", n.opts.ShutdownTimeout)
		n.grpc.Stop()
		<-done
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if err := n.http.Shutdown(ctx); err != nil {
		n.http.Close()
	}
}

// Close closes a node that was never served (listeners and cache); after
// Serve it only returns the cache's Close error. It is safe to call twice.
func (n *Node) Close() error {
	n.closeOnce.Do(func() {
		n.grpc.Stop()
		n.http.Close()
		n.grpcLis.Close()
		n.httpLis.Close()
		if n.prefill != nil {
			if err := n.prefill.close(); err != nil {
				n.closeErr = err
			}
		}
		if err := n.cache.Close(); err != nil {
			n.closeErr = fmt.Errorf("node: close cache: %w", err)
		}
		n.log.Info("kvmesh node stopped", "id", n.opts.NodeID)
	})
	return n.closeErr
}

func (n *Node) healthz(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	if n.stopping.Load() {
		w.WriteHeader(http.StatusServiceUnavailable)
		fmt.Fprintln(w, "stopping")
		return
	}
	fmt.Fprintln(w, "ok")
}

func (n *Node) logRequest(method string, start time.Time, err error) {
	code := status.Code(err)
	switch code {
	case codes.OK:
		n.log.Debug("request", "method", method, "dur", time.Since(start))
	case codes.Internal, codes.Unknown, codes.DataLoss:
		n.log.Error("request failed", "method", method, "code", code.String(), "err", status.Convert(err).Message())
	default:
		n.log.Info("request refused", "method", method, "code", code.String(), "err", status.Convert(err).Message())
	}
}

func digestString(d uint64) string { return fmt.Sprintf("%016x", d) }
