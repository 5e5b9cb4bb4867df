package node

import (
	"context"
	"errors"
	"net/http"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil/promlint"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kvmesh/kvmesh/client"
	"github.com/kvmesh/kvmesh/internal/testkit"
	"github.com/kvmesh/kvmesh/prefixhash"
)

// TestGracefulShutdown stops a node while one stream is mid-flight and
// clients keep sending: the stream in flight completes, the others succeed
// or fail with a clean status, Serve returns nil and the cache is closed
// with nothing pinned (checked by stop).
func TestGracefulShutdown(t *testing.T) {
	tn := startNode(t, nil)
	ctx := context.Background()
	tokens, payloads := prompt(7, 16)
	if _, err := tn.client.Put(ctx, testNS, client.Prompt{Tokens: tokens}, payloads); err != nil {
		t.Fatal(err)
	}

	// One BatchGet holds its second read until the node is stopping.
	entered, release := make(chan struct{}), make(chan struct{})
	var gated atomic.Bool
	tn.cache.gate = func(ctx context.Context, n int64) error {
		if gated.CompareAndSwap(false, true) {
			close(entered)
			<-release
		}
		return nil
	}
	inflight := make(chan error, 1)
	go func() {
		blocks, err := tn.client.Get(ctx, testNS, client.Prompt{Tokens: tokens})
		if err == nil && len(blocks) != 4 {
			err = errors.New("in-flight Get returned a short prefix")
		}
		inflight <- err
	}()
	<-entered

	// Load: bounded loops that stop at their first error.
	var wg sync.WaitGroup
	var ok atomic.Int64
	errs := make(chan error, 4)
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			toks, pays := prompt(uint32(100+w), 8)
			for range 500 {
				var err error
				if _, err = tn.client.Put(ctx, testNS, client.Prompt{Tokens: toks}, pays); err == nil {
					_, err = tn.client.Lookup(ctx, testNS, client.Prompt{Tokens: toks})
				}
				if err != nil {
					errs <- err
					return
				}
				ok.Add(1)
			}
		}()
	}
	testkit.WaitFor(t, "some requests served", func() bool { return ok.Load() >= 10 })

	tn.cancel()
	testkit.WaitFor(t, "/healthz to turn 503", func() bool {
		resp, err := http.Get("http://" + tn.HTTPAddr() + "/healthz")
		if err != nil {
			return true // already closed
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusServiceUnavailable
	})
	close(release)
	if err := <-inflight; err != nil {
		t.Fatalf("request in flight at shutdown: %v, want it to complete", err)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if c := status.Code(errors.Unwrap(err)); c != codes.Unavailable && c != codes.Canceled {
			t.Errorf("request during shutdown failed with %v; want Unavailable or Canceled", err)
		}
	}
	tn.stop(t)
}

func TestMetrics(t *testing.T) {
	tn := startNode(t, nil)
	ctx := context.Background()
	tokens, payloads := prompt(8, 12)
	if _, err := tn.client.Put(ctx, testNS, client.Prompt{Tokens: tokens[:8]}, payloads[:2]); err != nil {
		t.Fatal(err)
	}
	if _, err := tn.client.Get(ctx, testNS, client.Prompt{Tokens: tokens}); err != nil {
		t.Fatal(err)
	}
	if _, err := tn.client.Lookup(ctx, testNS, client.Prompt{Tokens: tokens}); err != nil {
		t.Fatal(err)
	}
	_, _ = tn.client.Exists(ctx, []prefixhash.Key{{}})

	resp, err := http.Get("http://" + tn.HTTPAddr() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var body strings.Builder
	problems, err := promlint.New(teeReader{resp.Body, &body}).Lint()
	if err != nil {
		t.Fatalf("/metrics does not parse: %v", err)
	}
	for _, p := range problems {
		t.Errorf("promlint: %s: %s", p.Metric, p.Text)
	}
	text := body.String()
	for _, want := range []string{
		"kvmesh_cache_hits_total 2",
		"kvmesh_cache_misses_total 1",
		"kvmesh_lookup_cached_tokens_total 8",
		"kvmesh_lookup_prompt_tokens_total 12",
		`kvmesh_tier_blocks{tier="dram"} 2`,
		`kvmesh_tier_bytes{tier="dram"}`,
		`kvmesh_tier_capacity_bytes{tier="dram"} 1.048576e+06`,
		`kvmesh_tier_warm_bytes{tier="dram"}`,
		"kvmesh_cache_evictions_total 0",
		`kvmesh_tier_evictions_total{reason="capacity",tier="dram"} 0`,
		"kvmesh_cache_second_chances_total 0",
		"kvmesh_cache_reused_blocks 0",
		"kvmesh_cache_branching_blocks 0",
		`kvmesh_tier_evictions_total{reason="expired",tier="dram"} 0`,
		`kvmesh_tier_written_bytes_total{tier="dram"} 0`,
		"kvmesh_cache_promotions_deferred_total 0",
		"kvmesh_cache_partials 0",
		`kvmesh_cache_parts_total{result="conflict"} 0`,
		`kvmesh_cache_partials_dropped_total{reason="expired"} 0`,
		`kvmesh_cache_claims_total{status="claimed"} 0`,
		`kvmesh_blocks_total{op="put"} 2`,
		`grpc_server_handled_total{grpc_code="OK",grpc_method="Lookup",grpc_service="kvmesh.v1.CacheService",grpc_type="unary"} 1`,
		`grpc_server_handling_seconds_bucket{grpc_method="Exists",grpc_service="kvmesh.v1.CacheService",grpc_type="unary",le="+Inf"} 1`,
		"kvmesh_grpc_requests_in_flight 0",
		"kvmesh_namespaces 0", // the fake cache keeps no namespace counts
		// Lookup found 8 of the 12 tokens: the namespace has a row.
		`kvmesh_namespace_lookup_cached_tokens_total{model="test/tiny",namespace="` + digestString(testNS.Digest()) + `"} 8`,
		`kvmesh_namespace_lookup_prompt_tokens_total{model="test/tiny",namespace="` + digestString(testNS.Digest()) + `"} 12`,
		`kvmesh_build_info{goversion="` + runtime.Version() + `",revision=`,
	} {
		if !strings.Contains(text, want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
}

type teeReader struct {
	r interface{ Read([]byte) (int, error) }
	w *strings.Builder
}

func (t teeReader) Read(p []byte) (int, error) {
	n, err := t.r.Read(p)
	t.w.Write(p[:n])
	return n, err
}
