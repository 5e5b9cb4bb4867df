package node

import (
	"context"
	"crypto/tls"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/internal/testkit"
	"github.com/kvmesh/kvmesh/router"
)

// TestHTTPTLS: with HTTPTLS the node's HTTP address (the OpenAI-compatible
// API, /metrics, health) speaks TLS with the node's certificate: a client
// that trusts its CA is served, also without a client certificate under
// mutual TLS (tokens guard the API); a plain-HTTP client is not. A router
// with NodeTLS routes to it over HTTPS.
func TestHTTPTLS(t *testing.T) {
	_, server, peer := tlsFiles(t, true)
	nodes := startClusterNodes(t, 1, func(_ int, o *Options) {
		o.Security.TLS, o.Security.PeerTLS, o.Security.HTTPTLS = server, peer, true
		o.Prefill.Model = tinyModel()
	})
	addr := nodes[0].HTTPAddr()
	trusting := peer.Clone()
	trusting.Certificates = nil // no client certificate: probes and scrapers have none
	cli := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{TLSClientConfig: trusting}}
	for _, path := range []string{"/metrics", "/livez", "/v1/models"} {
		resp, err := cli.Get("https://" + addr + path)
		if err != nil {
			t.Fatalf("GET https %s: %v", path, err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Errorf("GET https %s: %d %s", path, resp.StatusCode, body)
		}
	}
	if resp, err := (&http.Client{Timeout: 5 * time.Second}).Get("http://" + addr + "/metrics"); err == nil {
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode == 200 && strings.Contains(string(body), "kvmesh_") {
			t.Error("the HTTP address served plain HTTP with HTTPTLS")
		}
	}
	if _, err := (&http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{}}}).Get("https://" + addr + "/metrics"); err == nil {
		t.Error("a client that does not trust the node's CA was served")
	}

	r, err := router.New(router.Options{HTTPAddr: "127.0.0.1:0", Join: []string{nodes[0].GossipAddr()}, GossipProfile: "local",
		NodeTLS: peer, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Serve(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("router: %v", err)
		}
	}()
	waitRouterNodes(t, r, 1)
	got := callAPI(t, "POST", "http://"+r.HTTPAddr()+"/v1/completions", "", map[string]any{"model": "kvmesh", "prompt": "hello over TLS", "max_tokens": 4, "temperature": 0})
	if got.status != 200 {
		t.Fatalf("a completion through the router over HTTPS: %d %s", got.status, got.body)
	}

	// A router without the cluster's CA routes nothing to a node with TLS:
	// it would send clients' tokens and prompts to it in the clear.
	plain := startRouter(t, nodes[0].GossipAddr(), router.PolicyTokens)
	testkit.WaitFor(t, "the node to see both routers", func() bool {
		ms, _ := nodes[0].cluster.members.Members()
		return len(ms) == 3
	})
	if got := callAPI(t, "GET", "http://"+plain.HTTPAddr()+"/healthz", "", nil); got.status != http.StatusServiceUnavailable {
		t.Errorf("a router without NodeTLS in front of a TLS node: %d %s, want 503 (no node)", got.status, got.body)
	}

	o := Options{DataDir: t.TempDir(), Security: SecurityOptions{HTTPTLS: true}}
	o.EnsureDefaults()
	if err := o.Validate(); err == nil || !strings.Contains(err.Error(), "HTTPTLS") {
		t.Errorf("HTTPTLS without TLS: %v", err)
	}
}
