package openai

import (
	"context"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// TestCallbackAllowlist: an entry without a port allows its scheme's
// default port only; at delivery the host is resolved once and a callback
// goes to that address (pinned), never to a loopback or link-local one
// unless the allowlist names the address itself.
func TestCallbackAllowlist(t *testing.T) {
	c := newCallbacks([]string{"hooks.example.com", "api.example.com:8443", "127.0.0.1:9000"}, []byte("k"), prometheus.NewRegistry(), slog.New(slog.DiscardHandler))
	for raw, ok := range map[string]bool{
		"https://hooks.example.com/x": true, "http://hooks.example.com/x": true, "https://hooks.example.com:8443/x": false,
		"http://hooks.example.com:443/x": false, "https://api.example.com:8443/": true, "https://api.example.com/": false,
		"http://127.0.0.1:9000/": true, "http://127.0.0.1/": false, "http://169.254.169.254/": false,
	} {
		if err := c.allowed(raw); (err == nil) != ok {
			t.Errorf("allowed(%s) = %v, want ok %v", raw, err, ok)
		}
	}
	ctx := context.Background()
	for answer, want := range map[string]string{
		"10.1.2.3": "10.1.2.3:443", "127.0.0.1": "", "169.254.169.254": "", "::1": "", "0.0.0.0": "",
	} {
		c.resolve = func(context.Context, string) ([]net.IP, error) { return []net.IP{net.ParseIP(answer)}, nil }
		got, err := c.pin(ctx, "https://hooks.example.com/x")
		if got != want || (want == "") != (err != nil) {
			t.Errorf("hooks.example.com resolving to %s: pinned %q, %v; want %q", answer, got, err, want)
		}
	}
	if got, err := c.pin(ctx, "http://127.0.0.1:9000/x"); err != nil || got != "127.0.0.1:9000" {
		t.Errorf("a loopback address the allowlist names: %q, %v", got, err)
	}
}

// TestCallbackFairness: one tenant whose endpoint hangs holds at most
// callbackTenant senders; another tenant's callback is delivered at once.
func TestCallbackFairness(t *testing.T) {
	release := make(chan struct{})
	var mu sync.Mutex
	var got []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasSuffix(r.URL.Path, "/slow") {
			select {
			case <-release:
			case <-r.Context().Done():
			}
		}
		mu.Lock()
		got = append(got, r.URL.Path)
		mu.Unlock()
	}))
	defer srv.Close()
	defer close(release)
	c := newCallbacks([]string{strings.TrimPrefix(srv.URL, "http://")}, []byte("k"), prometheus.NewRegistry(), slog.New(slog.DiscardHandler))
	delivered := make(chan string, 16)
	c.done = func(id string) { delivered <- id }
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	for i := range 6 {
		c.enqueue(batchMeta{ID: "slow" + string(rune('0'+i)), State: batchCompleted, Callback: srv.URL + "/slow", Owner: queueOwner{Tenant: "acme"}})
	}
	c.enqueue(batchMeta{ID: "fast", State: batchCompleted, Callback: srv.URL + "/fast", Owner: queueOwner{Tenant: "beta"}})
	go c.run(ctx)
	select {
	case id := <-delivered:
		if id != "fast" {
			t.Fatalf("first delivered: %s, want beta's", id)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("beta's callback waited behind acme's hung endpoint")
	}
	c.mu.Lock()
	busy := c.mu.busy["acme"]
	c.mu.Unlock()
	if busy > callbackTenant {
		t.Errorf("acme holds %d senders, more than its %d", busy, callbackTenant)
	}
}
