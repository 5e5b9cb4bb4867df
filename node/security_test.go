package node

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/emptypb"

	"github.com/kvmesh/kvmesh/client"
	"github.com/kvmesh/kvmesh/internal/testkit"
	"github.com/kvmesh/kvmesh/prefixhash"
	"github.com/kvmesh/kvmesh/transfer"
	"github.com/kvmesh/kvmesh/transfer/certtest"
)

// scrape returns the node's /metrics text.
func scrape(t testing.TB, httpAddr string, tlsCfg ...*tls.Config) string {
	t.Helper()
	get, url := http.Get, "http://"+httpAddr+"/metrics"
	if len(tlsCfg) > 0 { // a node with TLS serves its HTTP address over TLS
		get, url = (&http.Client{Transport: &http.Transport{TLSClientConfig: tlsCfg[0]}}).Get, "https://"+httpAddr+"/metrics"
	}
	resp, err := get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// metricValue returns the value of one series of a /metrics text, written
// as it appears there (`name{label="v"}`), or -1 when it is absent.
func metricValue(body, series string) float64 {
	sc := bufio.NewScanner(strings.NewReader(body))
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), series+" "); ok {
			f, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
			if err == nil {
				return f
			}
		}
	}
	return -1
}

// callEvery calls every method the node serves but health checking, with
// empty requests, over conn, and returns each call's status by method.
func callEvery(t *testing.T, n *Node, conn *grpc.ClientConn) map[string]*status.Status {
	t.Helper()
	out := map[string]*status.Status{}
	for svc, info := range n.grpc.GetServiceInfo() {
		if svc == healthpb.Health_ServiceDesc.ServiceName {
			continue
		}
		for _, m := range info.Methods {
			method := "/" + svc + "/" + m.Name
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			var err error
			if !m.IsClientStream && !m.IsServerStream {
				err = conn.Invoke(ctx, method, &emptypb.Empty{}, &emptypb.Empty{})
			} else {
				var s grpc.ClientStream
				s, err = conn.NewStream(ctx, &grpc.StreamDesc{ClientStreams: m.IsClientStream, ServerStreams: m.IsServerStream}, method)
				if err == nil {
					s.SendMsg(&emptypb.Empty{})
					s.CloseSend()
					err = s.RecvMsg(&emptypb.Empty{})
				}
			}
			cancel()
			out[method] = status.Convert(err)
		}
	}
	if len(out) < 10 {
		t.Fatalf("only %d methods served: %v", len(out), out)
	}
	return out
}

// TestTokenOnEveryCall: a node with tokens refuses every call (unary and
// streaming, reflection included) that carries no token or a wrong one,
// with Unauthenticated and a message saying what to send, and counts the
// refusals; health checks stay open; a client with the token is served.
func TestTokenOnEveryCall(t *testing.T) {
	tn := startNode(t, func(o *Options) { o.Security.Tokens = []string{"s3cret", "n3xt"} })
	for _, tc := range []struct {
		name, token, says string
	}{
		{"no token", "", `send "authorization: Bearer <token>" metadata`},
		{"wrong token", "guess", "bearer token not accepted"},
	} {
		opts := []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}
		if tc.token != "" {
			opts = append(opts, grpc.WithPerRPCCredentials(bearer(tc.token)))
		}
		conn, err := grpc.NewClient(tn.GRPCAddr(), opts...)
		if err != nil {
			t.Fatal(err)
		}
		for method, st := range callEvery(t, tn.Node, conn) {
			if st.Code() != codes.Unauthenticated || !strings.Contains(st.Message(), tc.says) {
				t.Errorf("%s: %s = %v; want Unauthenticated saying %q", tc.name, method, st, tc.says)
			}
		}
		hc, err := healthpb.NewHealthClient(conn).Check(context.Background(), &healthpb.HealthCheckRequest{})
		if err != nil || hc.GetStatus() != healthpb.HealthCheckResponse_SERVING {
			t.Errorf("%s: health check = %v, %v; want SERVING without a token", tc.name, hc, err)
		}
		conn.Close()
	}

	// Either token of the set, the scheme in any case, is served.
	for _, md := range []string{"Bearer s3cret", "bearer n3xt", "BEARER  s3cret"} {
		conn, err := grpc.NewClient(tn.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()),
			grpc.WithPerRPCCredentials(rawAuth(md)))
		if err != nil {
			t.Fatal(err)
		}
		for method, st := range callEvery(t, tn.Node, conn) {
			if st.Code() == codes.Unauthenticated {
				t.Errorf("authorization %q: %s = %v", md, method, st)
			}
		}
		conn.Close()
	}
	c, err := client.Dial(tn.GRPCAddr(), client.Options{Token: "n3xt"})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx := context.Background()
	tokens, payloads := prompt(3, 9)
	if _, err := c.Put(ctx, testNS, client.Prompt{Tokens: tokens}, payloads); err != nil {
		t.Fatalf("Put with the token: %v", err)
	}
	if l, err := c.Lookup(ctx, testNS, client.Prompt{Tokens: tokens}); err != nil || l.CachedBlocks != len(payloads) {
		t.Fatalf("Lookup with the token = %+v, %v", l, err)
	}
	if _, err := tn.client.Stats(ctx); status.Code(errors.Unwrap(err)) != codes.Unauthenticated {
		t.Fatalf("a client without the token: %v, want Unauthenticated", err)
	}

	body := scrape(t, tn.HTTPAddr())
	if metricValue(body, `kvmesh_grpc_refused_requests_total{reason="no_token"}`) < 10 ||
		metricValue(body, `kvmesh_grpc_refused_requests_total{reason="bad_token"}`) < 10 {
		t.Errorf("refusals not counted:\n%s", grep(body, "kvmesh_grpc_refused"))
	}

	// Rotation: the set changes at once, without a restart.
	if err := tn.SetTokens([]string{"rotated"}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Stats(ctx); status.Code(errors.Unwrap(err)) != codes.Unauthenticated {
		t.Fatalf("a rotated-out token: %v, want Unauthenticated", err)
	}
	if err := startNode(t, nil).SetTokens([]string{"x"}); err == nil {
		t.Fatal("SetTokens on a node started without tokens succeeded")
	}
}

type rawAuth string

func (r rawAuth) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	return map[string]string{"authorization": string(r)}, nil
}
func (r rawAuth) RequireTransportSecurity() bool { return false }

func grep(body, prefix string) string {
	var out []string
	for _, l := range strings.Split(body, "\n") {
		if strings.HasPrefix(l, prefix) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// tlsFiles makes a CA and a certificate for 127.0.0.1 signed by it, and
// returns the node's server and client configurations.
func tlsFiles(t *testing.T, clientAuth bool) (ca *certtest.CA, server, peer *tls.Config) {
	t.Helper()
	dir := t.TempDir()
	ca = certtest.NewCA(t, dir, "kvmesh")
	cert, key := ca.Issue(t, dir, "node", "127.0.0.1")
	server, peer, err := transfer.LoadTLS(transfer.TLSFiles{Cert: cert, Key: key, CA: ca.File, ClientAuth: clientAuth})
	if err != nil {
		t.Fatal(err)
	}
	return ca, server, peer
}

// TestTLSNode: a node with TLS serves clients that trust its CA, refuses
// plain clients and clients that do not trust it (each failed handshake
// counted), and with mutual TLS refuses clients without a certificate.
func TestTLSNode(t *testing.T) {
	ctx := context.Background()
	t.Run("server", func(t *testing.T) {
		ca, server, peer := tlsFiles(t, false)
		tn := startNode(t, func(o *Options) { o.Security.TLS, o.Security.PeerTLS = server, peer })
		_, anon, err := transfer.LoadTLS(transfer.TLSFiles{CA: ca.File})
		if err != nil {
			t.Fatal(err)
		}
		c, err := client.Dial(tn.GRPCAddr(), client.Options{TLS: anon, MaxRetries: -1})
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		tokens, payloads := prompt(5, 8)
		if _, err := c.Put(ctx, testNS, client.Prompt{Tokens: tokens}, payloads); err != nil {
			t.Fatalf("Put over TLS: %v", err)
		}
		if got, err := c.Get(ctx, testNS, client.Prompt{Tokens: tokens}); err != nil || len(got) != len(payloads) {
			t.Fatalf("Get over TLS = %d blocks, %v", len(got), err)
		}
		plain, _ := client.Dial(tn.GRPCAddr(), client.Options{MaxRetries: -1})
		defer plain.Close()
		untrusting, _ := client.Dial(tn.GRPCAddr(), client.Options{MaxRetries: -1, TLS: &tls.Config{}})
		defer untrusting.Close()
		for name, cl := range map[string]*client.Client{"plain": plain, "untrusting": untrusting} {
			cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			_, err := cl.Stats(cctx)
			cancel()
			if status.Code(errors.Unwrap(err)) != codes.Unavailable {
				t.Errorf("%s client of a TLS node: %v, want Unavailable", name, err)
			}
		}
		testkit.WaitFor(t, "failed handshakes counted", func() bool {
			return metricValue(scrape(t, tn.HTTPAddr(), peer), "kvmesh_grpc_tls_handshake_failures_total") >= 2
		})
	})
	t.Run("mutual", func(t *testing.T) {
		ca, server, peer := tlsFiles(t, true)
		tn := startNode(t, func(o *Options) { o.Security.TLS, o.Security.PeerTLS = server, peer })
		_, anon, err := transfer.LoadTLS(transfer.TLSFiles{CA: ca.File})
		if err != nil {
			t.Fatal(err)
		}
		conn, err := grpc.NewClient(tn.GRPCAddr(), grpc.WithTransportCredentials(credentials.NewTLS(anon)))
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		if _, err := healthpb.NewHealthClient(conn).Check(cctx, &healthpb.HealthCheckRequest{}); err == nil {
			t.Fatal("mutual TLS served a client without a certificate")
		}
		c, err := client.Dial(tn.GRPCAddr(), client.Options{TLS: peer})
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		if _, err := c.Stats(ctx); err != nil {
			t.Fatalf("a client with a certificate of the CA: %v", err)
		}
	})
	if err := (&Options{Security: SecurityOptions{TLS: &tls.Config{}}}).EnsureDefaults().Validate(); err == nil || !strings.Contains(err.Error(), "PeerTLS") {
		t.Errorf("TLS without PeerTLS: %v", err)
	}
}

// TestSecureCluster: nodes with mutual TLS and tokens form a cluster whose
// peers read, push and look up blocks (data plane and PeerService alike), and
// whose clients use the data plane (TCP over TLS, shared memory with the
// token); a client with a wrong token is refused on both planes, counted.
func TestSecureCluster(t *testing.T) {
	_, server, peer := tlsFiles(t, true)
	nodes := startClusterNodes(t, 2, func(_ int, o *Options) {
		o.Security.TLS, o.Security.PeerTLS, o.Security.Tokens = server, peer, []string{"cluster-token", "client-token"}
		o.Cluster.GossipKey = []byte("0123456789abcdef0123456789abcdef")
	})
	ctx := context.Background()
	dial := func(n *clusterNode, transport, token string) *client.Client {
		c, err := client.Dial(n.GRPCAddr(), client.Options{TLS: peer, Token: token, Transport: transport, MaxRetries: -1})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	const prompts, blocks = 4, 12 // 3 chunks each
	tokens, payloads := make([][]uint32, prompts), make([][][]byte, prompts)
	put := dial(nodes[0], client.TransportTCP, "client-token")
	for p := range prompts {
		tokens[p], payloads[p] = clusterPrompt(40+p, blocks)
		if _, err := put.Put(ctx, clusterNS, client.Prompt{Tokens: tokens[p]}, payloads[p]); err != nil {
			t.Fatalf("Put over the TLS data plane: %v", err)
		}
	}
	for _, transport := range []string{client.TransportAuto, client.TransportTCP} {
		c := dial(nodes[1], transport, "client-token")
		for p := range prompts {
			testkit.WaitFor(t, "the prompt is a hit through the other node", func() bool {
				l, err := c.Lookup(ctx, clusterNS, client.Prompt{Tokens: tokens[p]})
				return err == nil && l.CachedBlocks == blocks
			})
			got, err := c.Get(ctx, clusterNS, client.Prompt{Tokens: tokens[p]})
			if err != nil || len(got) != blocks {
				t.Fatalf("%s: Get through n1 = %d blocks, %v", transport, len(got), err)
			}
			for i := range got {
				if string(got[i].Payload) != string(payloads[p][i]) {
					t.Fatalf("%s: block %d differs", transport, i)
				}
			}
		}
	}
	// The clients did use the data plane: shared memory with the token, TCP
	// over TLS.
	body := scrape(t, nodes[1].HTTPAddr(), peer)
	if metricValue(body, `kvmesh_transfer_requests_total{transport="shm"}`) < 1 || metricValue(body, `kvmesh_transfer_requests_total{transport="tcp"}`) < 1 {
		t.Errorf("the clients did not use the data plane:\n%s", grep(body, "kvmesh_transfer_requests_total"))
	}
	// The peers' gRPC connection (PeerService) carries TLS and the token.
	keys := prefixhash.Keys(clusterNS, tokens[0])
	counts, err := nodes[0].cluster.peers.grpcLookup(ctx, nodes[1].ID(), [][]prefixhash.Key{keys})
	if err != nil || len(counts) != 1 {
		t.Fatalf("PeerService.Lookup between secure nodes: %v, %v", counts, err)
	}

	bad := dial(nodes[1], client.TransportTCP, "wrong")
	if _, err := bad.Get(ctx, clusterNS, client.Prompt{Tokens: tokens[0]}); status.Code(errors.Unwrap(err)) != codes.Unauthenticated {
		t.Fatalf("a wrong token: %v, want Unauthenticated", err)
	}
	direct, err := transfer.NewClient(nodes[1].DataAddr(), &transfer.ClientOptions{TLS: peer, Token: "wrong"})
	if err != nil {
		t.Fatal(err)
	}
	defer direct.Close()
	if _, err := direct.Get(ctx, keys[:1]); !errors.Is(err, transfer.ErrAuth) {
		t.Fatalf("data plane with a wrong token: %v, want ErrAuth", err)
	}
	if _, err := transfer.DialShm(ctx, nodes[1].ShmSocket(), &transfer.ShmClientOptions{Token: "wrong"}); !errors.Is(err, transfer.ErrAuth) {
		t.Fatalf("shared memory with a wrong token: %v, want ErrAuth", err)
	}
	// The servers count a refusal after sending it: wait for the count.
	testkit.WaitFor(t, "the data-plane refusals to be counted", func() bool {
		body = scrape(t, nodes[1].HTTPAddr(), peer)
		return metricValue(body, `kvmesh_transfer_unauthorized_connections_total{transport="tcp"}`) >= 1 &&
			metricValue(body, `kvmesh_transfer_unauthorized_connections_total{transport="shm"}`) >= 1
	})
}
