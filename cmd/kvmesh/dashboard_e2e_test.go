package main

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil/promlint"

	"github.com/kvmesh/kvmesh/client"
	"github.com/kvmesh/kvmesh/prefill"
)

// httpGet returns the status and body of GET http://addr+path.
func httpGet(t *testing.T, addr, path string) (int, string) {
	t.Helper()
	resp, err := http.Get("http://" + addr + path)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(b)
}

// dashboardMetrics returns the metric names the Grafana dashboard's
// queries name (every panel's and variable's expression).
func dashboardMetrics(t *testing.T) []string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "..", "deploy", "grafana", "kvmesh.json"))
	if err != nil {
		t.Fatal(err)
	}
	var doc any
	if err := json.Unmarshal(b, &doc); err != nil {
		t.Fatalf("deploy/grafana/kvmesh.json: %v", err)
	}
	var exprs []string
	var walk func(v any)
	walk = func(v any) {
		switch v := v.(type) {
		case map[string]any:
			for k, x := range v {
				if s, ok := x.(string); ok && (k == "expr" || k == "definition") {
					exprs = append(exprs, s)
				}
				walk(x)
			}
		case []any:
			for _, x := range v {
				walk(x)
			}
		}
	}
	walk(doc)
	if len(exprs) < 10 {
		t.Fatalf("deploy/grafana/kvmesh.json: %d queries found; the walk lost them", len(exprs))
	}
	names := map[string]bool{}
	re := regexp.MustCompile(`\b(?:kvmesh|grpc_server)_[a-z0-9_]+\b`)
	for _, e := range exprs {
		for _, m := range re.FindAllString(e, -1) {
			names[m] = true
		}
	}
	out := make([]string, 0, len(names))
	for n := range names {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

// seriesNames returns the names of the series of a /metrics text.
func seriesNames(body string) map[string]bool {
	out := map[string]bool{}
	for _, line := range strings.Split(body, "\n") {
		if line == "" || line[0] == '#' {
			continue
		}
		if i := strings.IndexAny(line, "{ "); i > 0 {
			out[line[:i]] = true
		}
	}
	return out
}

// TestDashboardMetrics runs two kvmesh serve processes (every port 0, found
// through their ready files), puts, looks up, reads and prefills through
// them, and checks what an operator's tooling relies on: every metric the
// Grafana dashboard queries exists on their /metrics, which passes the
// Prometheus linter; kvmesh health answers; /livez and /readyz are 200;
// --pprof serves profiles.
func TestDashboardMetrics(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the kvmesh binary")
	}
	want := dashboardMetrics(t)
	small := []string{"--dram", "32MiB", "--nvme", "256MiB", "--max-block-bytes", "1MiB", "--chunk-tokens", "64", "--gossip-profile", "local"}
	a := startDaemon(t, t.TempDir(), append(small, "--pprof")...)
	b := startDaemon(t, t.TempDir(), append(small, "--join", a.gossip)...)
	ca, cb := dialNode(t, a), dialNode(t, b)
	waitMembers(t, ca, 2, a, b)

	ctx := context.Background()
	for p := range 4 {
		tokens, payloads := e2ePrompt(100+p, 24) // 6 chunks: both nodes own some
		if _, err := cb.Put(ctx, e2eNS, client.Prompt{Tokens: tokens}, payloads); err != nil {
			t.Fatalf("Put through b: %v\n%s", err, b.stderr)
		}
		if _, err := ca.Lookup(ctx, e2eNS, client.Prompt{Tokens: tokens}); err != nil {
			t.Fatal(err)
		}
		if _, err := ca.Get(ctx, e2eNS, client.Prompt{Tokens: tokens}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := ca.Prefill(ctx, client.PrefillRequest{Tokens: prefill.TokenizeBytes("The quick brown fox jumps over the lazy dog.")}); err != nil {
		t.Fatal(err)
	}

	have := map[string]bool{}
	for _, d := range []*daemon{a, b} {
		code, body := httpGet(t, d.http, "/metrics")
		if code != 200 {
			t.Fatalf("%s /metrics: %d", d.id, code)
		}
		problems, err := promlint.New(strings.NewReader(body)).Lint()
		if err != nil {
			t.Fatalf("%s /metrics does not parse: %v", d.id, err)
		}
		for _, p := range problems {
			t.Errorf("%s promlint: %s: %s", d.id, p.Metric, p.Text)
		}
		for n := range seriesNames(body) {
			have[n] = true
		}
		for _, path := range []string{"/livez", "/readyz"} {
			if code, body := httpGet(t, d.http, path); code != 200 {
				t.Errorf("%s %s = %d %q, want 200", d.id, path, code, body)
			}
		}
		if out, err := exec.Command(binary(t), "health", "--addr", d.grpcAddr).CombinedOutput(); err != nil || strings.TrimSpace(string(out)) != "SERVING" {
			t.Errorf("kvmesh health --addr %s: %v %s", d.grpcAddr, err, out)
		}
	}
	for _, m := range want {
		if !have[m] {
			t.Errorf("the dashboard queries %s, which no node's /metrics has", m)
		}
	}
	if code, body := httpGet(t, a.http, "/debug/pprof/heap?debug=1"); code != 200 || !strings.Contains(body, "heap profile") {
		t.Errorf("--pprof: /debug/pprof/heap = %d", code)
	}
	if code, _ := httpGet(t, b.http, "/debug/pprof/"); code != http.StatusNotFound {
		t.Errorf("without --pprof: /debug/pprof/ = %d, want 404", code)
	}
}
