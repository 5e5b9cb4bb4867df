package node

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/kvmesh/kvmesh/transfer"
)

// The node's doors: TLS on the gRPC API (the data plane has its own, from
// the same configuration, in package transfer) and a bearer token on every
// call. See the package doc, Security.

// tokenSet returns the set of accepted tokens, nil when none is configured.
func tokenSet(tokens []string) (*transfer.Tokens, error) {
	if len(tokens) == 0 {
		return nil, nil
	}
	t, err := transfer.NewTokens(tokens...)
	if err != nil {
		return nil, &OptionError{Field: "Tokens", Msg: err.Error()}
	}
	return t, nil
}

// firstToken is the token a node presents to its peers.
func firstToken(tokens []string) string {
	if len(tokens) == 0 {
		return ""
	}
	return tokens[0]
}

// healthPrefix names the methods open without a token: load balancers and
// Kubernetes probes check health without credentials, and health tells an
// unauthenticated caller nothing but that the node is up.
const healthPrefix = "/grpc.health.v1.Health/"

// Reasons a gRPC call or connection was refused, as metric labels.
const (
	refusedNoToken  = "no_token"
	refusedBadToken = "bad_token"
)

// guard checks the bearer token of every gRPC call and counts refusals,
// of calls (no or wrong token) and of connections (TLS handshakes that
// failed).
type guard struct {
	tokens     *transfer.Tokens // nil: no token asked for
	calls      *prometheus.CounterVec
	handshakes prometheus.Counter
}

func newGuard(tokens *transfer.Tokens) *guard {
	return &guard{
		tokens: tokens,
		calls: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvmesh_grpc_refused_requests_total",
			Help: "gRPC calls refused as Unauthenticated, by reason: no_token (no authorization: Bearer metadata) or bad_token (a token the node does not accept).",
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

// check returns nil when the call may proceed: no token is asked for, the
// method is health checking, or the call carries an accepted token.
func (g *guard) check(ctx context.Context, method string) error {
	if g.tokens == nil || strings.HasPrefix(method, healthPrefix) {
		return nil
	}
	md, _ := metadata.FromIncomingContext(ctx)
	vals := md.Get("authorization")
	if len(vals) == 0 {
		g.calls.WithLabelValues(refusedNoToken).Inc()
		return status.Error(codes.Unauthenticated, `this node requires a bearer token: send "authorization: Bearer <token>" metadata `+
			`(kvmesh CLI: --auth-token-file FILE; Go client: client.Options.Token)`)
	}
	for _, v := range vals {
		// RFC 6750: the scheme is case-insensitive.
		if len(v) > len("bearer ") && strings.EqualFold(v[:len("bearer ")], "bearer ") &&
			g.tokens.Check([]byte(strings.TrimSpace(v[len("bearer "):]))) {
			return nil
		}
	}
	g.calls.WithLabelValues(refusedBadToken).Inc()
	return status.Error(codes.Unauthenticated, "bearer token not accepted by this node")
}

func (g *guard) unary(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
	if err := g.check(ctx, info.FullMethod); err != nil {
		return nil, err
	}
	return h(ctx, req)
}

func (g *guard) stream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
	if err := g.check(ss.Context(), info.FullMethod); err != nil {
		return err
	}
	return h(srv, ss)
}

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
// data plane at once, without a restart (connections already accepted stay
// open). The token the node presents to its peers stays the first of
// Options.Tokens until it restarts. A node started without tokens cannot
// be given some: restart it with Options.Tokens.
func (n *Node) SetTokens(tokens []string) error {
	if n.guard.tokens == nil {
		return errors.New("node: started without tokens; restart it with some to require them")
	}
	if err := n.guard.tokens.Set(tokens...); err != nil {
		return fmt.Errorf("node: %w", err)
	}
	return nil
}
