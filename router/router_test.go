package router

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

func TestChooseLeastLoaded(t *testing.T) {
	for _, c := range []struct {
		loads  []nodeLoad
		decode bool
		start  int
		want   int
	}{
		{[]nodeLoad{{prompt: 500}, {prompt: 10}, {prompt: 90}}, false, 0, 1},
		{[]nodeLoad{{prompt: 500, decode: 1}, {prompt: 10, decode: 900}}, true, 1, 0},
		// Equal tokens: fewer requests; all equal: the start.
		{[]nodeLoad{{prompt: 5, requests: 3}, {prompt: 5, requests: 1}, {prompt: 5, requests: 2}}, false, 2, 1},
		{[]nodeLoad{{}, {}, {}}, false, 2, 2},
	} {
		if got := chooseLeastLoaded(c.loads, c.decode, c.start); got != c.want {
			t.Errorf("chooseLeastLoaded(%+v, decode %v, start %d) = %d, want %d", c.loads, c.decode, c.start, got, c.want)
		}
	}
}

// TestRouterPicksByUncachedTokens: the token policy sends a request to the
// node with the fewest uncached prompt tokens in flight, whatever the
// session; the session policy keeps a session on one node.
func TestRouterPicksByUncachedTokens(t *testing.T) {
	r := &Router{opts: Options{Policy: PolicyTokens}, pending: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "x"}, []string{"node", "kind"})}
	r.mu.load = map[string]*nodeLoad{}
	cands := []backend{{id: "a"}, {id: "b"}, {id: "c"}}
	_, doneA := r.charge("a", 4000, 10)
	preB, doneB := r.charge("b", 300, 10)
	_, doneC := r.charge("c", 900, 10)
	for range 5 {
		if i := r.pick(cands, false, "session-1"); cands[i].id != "b" {
			t.Fatalf("picked %s with loads a=4000 b=300 c=900", cands[i].id)
		}
	}
	preB() // b's prompt is computed: it decodes, its prompt load is gone
	if i := r.pick(cands, false, ""); cands[i].id != "b" {
		t.Errorf("picked %s once b's prefill was done", cands[i].id)
	}
	doneA()
	doneB()
	doneC()
	if l := r.mu.load["b"]; l.prompt != 0 || l.decode != 0 || l.requests != 0 {
		t.Errorf("load of b after its requests ended: %+v", *l)
	}
	r.opts.Policy = PolicySession
	first := r.pick(cands, false, "conv-7")
	for range 5 {
		if r.pick(cands, false, "conv-7") != first {
			t.Fatal("the session policy moved a session")
		}
	}
}

// startRouter serves a router alone (its seed answers nothing) until the
// test ends.
func startRouter(t *testing.T, opts Options) *Router {
	t.Helper()
	opts.HTTPAddr, opts.GossipProfile, opts.Logger = "127.0.0.1:0", "local", slog.New(slog.DiscardHandler)
	if opts.Join == nil {
		opts.Join = []string{"127.0.0.1:1"}
	}
	r, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Serve(ctx) }()
	t.Cleanup(func() {
		cancel()
		<-done
	})
	return r
}

func get(t *testing.T, url, token string) (int, string) {
	t.Helper()
	req, _ := http.NewRequest("GET", url, nil)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// TestRouterWithoutGossipKey: a router without a gossip key forwards no
// request that carries a bearer token (any host that joins its gossip
// would be sent it), saying why; with the key, or InsecureGossip, it does.
func TestRouterWithoutGossipKey(t *testing.T) {
	plain := startRouter(t, Options{})
	if code, body := get(t, "http://"+plain.HTTPAddr()+"/v1/models", "secret"); code != http.StatusServiceUnavailable || !strings.Contains(body, "no_gossip_key") {
		t.Errorf("a token through a router without a gossip key: %d %s", code, body)
	}
	if _, body := get(t, "http://"+plain.HTTPAddr()+"/v1/models", ""); strings.Contains(body, "no_gossip_key") {
		t.Errorf("a request without credentials refused for the gossip key: %s", body)
	}
	for _, o := range []Options{{GossipKey: make([]byte, 32)}, {InsecureGossip: true}} {
		r := startRouter(t, o)
		if _, body := get(t, "http://"+r.HTTPAddr()+"/v1/models", "secret"); strings.Contains(body, "no_gossip_key") {
			t.Errorf("%+v: refused: %s", o, body)
		}
	}
}

// TestRouterPaths: the router forwards the API's paths only, cleaned:
// encoded traversals to a node's /metrics, /debug/pprof or /internal never
// leave it (404 here), whatever their encoding.
func TestRouterPaths(t *testing.T) {
	for p, want := range map[string]bool{
		"/v1/models": true, "/v1/models/org/model-7b": true, "/v1/completions": true, "/v1/chat/completions": true,
		"/v1/queue": true, "/v1/queue/batch_0123": true, "/v1/queue/callback-key": true, "/v1/kvmesh/lookup/completions": true,
		"/v1/../metrics": false, "/v1/queue/../../internal/queue/claim": false, "/v1/models/../../debug/pprof/cmdline": false,
		"/v1/queue/a/b": false, "/v1/completions/": false, "/v1//completions": false, "/metrics": false, "/internal/queue/claim": false,
		"/v1/models/a\\b": false, "/v1/other": false,
	} {
		if got := apiPath(p); got != want {
			t.Errorf("apiPath(%q) = %v, want %v", p, got, want)
		}
	}
	r := startRouter(t, Options{InsecureGossip: true})
	for _, p := range []string{"/v1/..%2Fmetrics", "/v1/..%2Fdebug%2Fpprof%2Fcmdline", "/v1/..%2Finternal%2Fqueue%2Fclaim",
		"/v1/queue/..%2F..%2Fmetrics", "/v1/models/..%2F..%2Fmetrics", "/v1/queue/a%2Fb", "/v1/%2e%2e/metrics"} {
		if code, body := get(t, "http://"+r.HTTPAddr()+p, ""); code != http.StatusNotFound || !strings.Contains(body, "unknown_url") {
			t.Errorf("GET %s through the router: %d %s, want 404 unknown_url", p, code, body)
		}
	}
}
