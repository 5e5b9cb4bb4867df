package node

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/kvmesh/kvmesh/auth"
	kvmeshv1 "github.com/kvmesh/kvmesh/proto/kvmesh/v1"
)

// The node's doors: TLS on the gRPC API (the data plane has its own, from
// the same configuration, in package transfer) and a bearer token on every
// call. See the package doc, Security.

// tokenSet returns the set of accepted tokens, nil when none is configured:
// the tokens file's credentials, or shared tokens.
func tokenSet(o *SecurityOptions) (*auth.Tokens, error) {
	var (
		t   *auth.Tokens
		err error
	)
	switch {
	case o.TokensFile != nil:
		t, err = auth.NewCredentials(o.TokensFile.Credentials)
	case len(o.Tokens) > 0:
		t, err = auth.NewTokens(o.Tokens...)
	default:
		return nil, nil
	}
	if err != nil {
		return nil, badOption("Security.Tokens", "%s", err.Error())
	}
	return t, nil
}

// peerToken is the token a node presents to its peers: the tokens file's
// cluster token, or the first shared token.
func peerToken(o *SecurityOptions) string {
	switch {
	case o.TokensFile != nil:
		return o.TokensFile.ClusterToken
	case len(o.Tokens) > 0:
		return o.Tokens[0]
	}
	return ""
}

// callbackSecret is the secret the queue's callbacks are signed from, the
// same on every node of a cluster so that a callback verifies whichever
// node delivers it: derived from the tokens file's secret, else from the
// gossip key; nil (each node's own, in its data dir) without either.
func callbackSecret(opts *Options) []byte {
	if opts.Security.TokensFile != nil {
		if k := opts.Security.TokensFile.Derive("callback"); k != nil {
			return k
		}
	}
	if len(opts.Cluster.GossipKey) > 0 {
		m := hmac.New(sha256.New, opts.Cluster.GossipKey)
		m.Write([]byte("kvmesh/callback/v1"))
		return m.Sum(nil)
	}
	return nil
}

// healthPrefix names the methods open without a token: load balancers and
// Kubernetes probes check health without credentials, and health tells an
// unauthenticated caller nothing but that the node is up.
const healthPrefix = "/grpc.health.v1.Health/"

// Reasons a gRPC call or connection was refused, as metric labels.
const (
	refusedNoToken  = "no_token"
	refusedBadToken = "bad_token"
	refusedScope    = "scope"
)

// guard checks the bearer token of every gRPC call and counts refusals,
// of calls (no or wrong token) and of connections (TLS handshakes that
// failed).
type guard struct {
	tokens     *auth.Tokens              // nil: no token asked for
	file       atomic.Pointer[auth.File] // the tokens file in force; nil without one
	calls      *prometheus.CounterVec
	handshakes prometheus.Counter
}

func newGuard(tokens *auth.Tokens) *guard {
	return &guard{
		tokens: tokens,
		calls: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvmesh_grpc_refused_requests_total",
			Help: "gRPC calls refused, by reason: no_token (no authorization: Bearer metadata) or bad_token (a token the node does not accept), both Unauthenticated; scope (PermissionDenied: the token lacks the scope the method needs).",
		}, []string{"reason"}),
		handshakes: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "kvmesh_grpc_tls_handshake_failures_total",
			Help: "Connections to the gRPC API whose TLS handshake failed: a plain-TCP client, an untrusted certificate, or none where mutual TLS asks for one.",
		}),
	}
}

func (g *guard) collectors() []prometheus.Collector {
	return []prometheus.Collector{g.calls, g.handshakes}
}

// check returns the principal a call authenticates as: auth.Open when no
// token is asked for, and for health checks; else the principal of the
// call's token, which must be accepted and hold the scope the method needs.
func (g *guard) check(ctx context.Context, method string) (auth.Principal, error) {
	if g.tokens == nil || strings.HasPrefix(method, healthPrefix) {
		return auth.Open, nil
	}
	md, _ := metadata.FromIncomingContext(ctx)
	return g.authorize(md.Get("authorization"), method, methodScope(method))
}

// authorize returns the principal of the first of vals ("Bearer <token>"
// values of an authorization header or metadata) that the node accepts,
// which must hold the scope need; the errors are gRPC statuses
// (Unauthenticated, PermissionDenied). The HTTP API authenticates with it
// too, so that a token means the same on both.
func (g *guard) authorize(vals []string, method string, need auth.Scope) (auth.Principal, error) {
	if g.tokens == nil {
		return auth.Open, nil
	}
	if len(vals) == 0 {
		g.calls.WithLabelValues(refusedNoToken).Inc()
		return auth.Principal{}, status.Error(codes.Unauthenticated, `this node requires a bearer token: send "authorization: Bearer <token>" metadata `+
			`(kvmesh CLI: --auth-token-file FILE; Go client: client.Options.Token)`)
	}
	for _, v := range vals {
		// RFC 6750: the scheme is case-insensitive.
		if len(v) > len("bearer ") && strings.EqualFold(v[:len("bearer ")], "bearer ") {
			if p, ok := g.tokens.Lookup([]byte(strings.TrimSpace(v[len("bearer "):]))); ok {
				if !p.Can(need) {
					g.calls.WithLabelValues(refusedScope).Inc()
					return p, denied(kvmeshv1.ErrorReason_ERROR_REASON_SCOPE_MISSING, map[string]string{"scope": need.String(), "method": method},
						"%s needs the %s scope; this token (%s) has %s", method, need, p, p.Scopes)
				}
				return p, nil
			}
		}
	}
	g.calls.WithLabelValues(refusedBadToken).Inc()
	return auth.Principal{}, status.Error(codes.Unauthenticated, "bearer token not accepted by this node")
}

// methodScope returns the scope a gRPC method needs. Handlers check more
// where a method's request decides it (a prefill that publishes writes;
// quotas of other tenants' namespaces need a node-wide admin).
func methodScope(method string) auth.Scope {
	switch {
	case strings.HasPrefix(method, "/kvmesh.v1.PeerService/"):
		return auth.Cluster
	case strings.HasPrefix(method, "/kvmesh.v1.AdminService/SetQuota"),
		strings.HasPrefix(method, "/kvmesh.v1.AdminService/DropNamespace"):
		return auth.Admin
	case strings.HasPrefix(method, "/kvmesh.v1.CacheService/BatchPut"),
		strings.HasPrefix(method, "/kvmesh.v1.CacheService/Publish"),
		strings.HasPrefix(method, "/kvmesh.v1.PrefillService/Prefill"): // it publishes the blocks it computes
		return auth.Write
	}
	return auth.Read
}

func (g *guard) unary(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
	p, err := g.check(ctx, info.FullMethod)
	if err != nil {
		return nil, err
	}
	return h(auth.WithPrincipal(ctx, p), req)
}

func (g *guard) stream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
	p, err := g.check(ss.Context(), info.FullMethod)
	if err != nil {
		return err
	}
	return h(srv, &principalStream{ServerStream: ss, ctx: auth.WithPrincipal(ss.Context(), p)})
}

// principalStream is a server stream whose context carries the caller's
// principal.
type principalStream struct {
	grpc.ServerStream
	ctx context.Context
}

func (s *principalStream) Context() context.Context { return s.ctx }

// serverCreds returns the gRPC server's transport credentials for cfg,
// counting failed handshakes.
func (g *guard) serverCreds(cfg *tls.Config) credentials.TransportCredentials {
	return &countedCreds{TransportCredentials: credentials.NewTLS(cfg), failed: g.handshakes}
}

// countedCreds counts the server handshakes that fail.
type countedCreds struct {
	credentials.TransportCredentials
	failed prometheus.Counter
}

func (c *countedCreds) ServerHandshake(conn net.Conn) (net.Conn, credentials.AuthInfo, error) {
	nc, info, err := c.TransportCredentials.ServerHandshake(conn)
	if err != nil {
		c.failed.Inc()
	}
	return nc, info, err
}

func (c *countedCreds) Clone() credentials.TransportCredentials {
	return &countedCreds{TransportCredentials: c.TransportCredentials.Clone(), failed: c.failed}
}

// bearer is the token a node presents on its gRPC calls to peers.
type bearer string

func (b bearer) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	return map[string]string{"authorization": "Bearer " + string(b)}, nil
}

// RequireTransportSecurity is false: a cluster without TLS may still use
// tokens (they then travel in the clear, as on the data plane).
func (b bearer) RequireTransportSecurity() bool { return false }

// SetTokens replaces the bearer tokens the node accepts, on gRPC and on the
// data plane at once, without a restart. Data-plane and shared-memory
// connections opened with a token no longer accepted are closed (see
// closeRevoked); gRPC checks the token of every call. The token the node
// presents to its peers stays the first of Options.Security.Tokens until
// it restarts. A node started without tokens cannot be given some: restart
// it with Options.Security.Tokens.
func (n *Node) SetTokens(tokens []string) error {
	if n.guard.tokens == nil {
		return errors.New("node: started without tokens; restart it with some to require them")
	}
	if n.opts.Security.TokensFile != nil {
		return errors.New("node: started with a tokens file; reload it with SetTokensFile")
	}
	if err := n.guard.tokens.Set(tokens...); err != nil {
		return fmt.Errorf("node: %w", err)
	}
	n.closeRevoked()
	return nil
}

// SetTokensFile replaces the credentials of a node started with a tokens
// file (Options.Security.TokensFile) by those of f, on gRPC and the data plane at
// once. The secret and the cluster token must not change: the first would
// move every tenant's namespaces, the second cut the node from its peers
// until they all restart; both need a restart of the whole cluster.
func (n *Node) SetTokensFile(f *auth.File) error {
	if n.opts.Security.TokensFile == nil {
		return errors.New("node: started without a tokens file; restart it with one")
	}
	if f.ClusterToken != n.opts.Security.TokensFile.ClusterToken {
		return errors.New("node: the tokens file's cluster token changed: restart every node of the cluster to change it")
	}
	if !bytes.Equal(f.LabelKey, n.opts.Security.TokensFile.LabelKey) { // derived from the secret
		return errors.New("node: the tokens file's secret changed: it derives every tenant's namespaces; restart every node of the cluster to change it")
	}
	if err := n.guard.tokens.SetCredentials(f.Credentials); err != nil {
		return fmt.Errorf("node: %w", err)
	}
	n.guard.file.Store(f)
	n.closeRevoked()
	return nil
}

// closeRevoked closes the data-plane and shared-memory connections whose
// token the node no longer accepts, or that now names another principal
// (other scopes or tenant): a revoked credential stops reading at once,
// not when its pooled connections idle out. A shared-memory client keeps
// what it already copied out of its region, and the region's pages as they
// were (the node unmaps its side; it cannot unmap the client's), and a
// node-wide writer keeps its mapping of the DRAM arena until it exits:
// revoke such a token by restarting the node, or the client's process.
func (n *Node) closeRevoked() {
	if n.cluster == nil {
		return
	}
	tcp := n.cluster.data.CloseRevoked()
	shm := 0
	if n.cluster.shm != nil {
		shm = n.cluster.shm.CloseRevoked()
	}
	if tcp+shm > 0 {
		n.log.Info("node: closed the connections of revoked tokens", "data_plane", tcp, "shared_memory", shm)
	}
}
