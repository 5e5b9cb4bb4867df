package node

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil/promlint"

	"github.com/kvmesh/kvmesh/internal/testkit"
)

// get returns the status code and body of GET http://addr+path.
func get(t testing.TB, addr, path string) (int, string) {
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

func TestProbes(t *testing.T) {
	tn := startNode(t, func(o *Options) { o.Pprof = true })
	if code, body := get(t, tn.HTTPAddr(), "/livez"); code != 200 {
		t.Errorf("/livez = %d %q, want 200", code, body)
	}
	testkit.WaitFor(t, "/readyz 200", func() bool {
		code, _ := get(t, tn.HTTPAddr(), "/readyz")
		return code == 200
	})
	if code, body := get(t, tn.HTTPAddr(), "/debug/pprof/cmdline"); code != 200 || body == "" {
		t.Errorf("/debug/pprof/cmdline with Pprof = %d %q, want 200 and the command line", code, body)
	}

	off := startNode(t, nil)
	if code, _ := get(t, off.HTTPAddr(), "/debug/pprof/"); code != http.StatusNotFound {
		t.Errorf("/debug/pprof/ without Pprof = %d, want 404", code)
	}
}

func TestReadyzBeforeServeAndWhileStopping(t *testing.T) {
	n, err := New(Options{
		DataDir: t.TempDir(),
		Listen:  ListenOptions{GRPCAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0"},
		Tiers:   TierOptions{DRAMBytes: 64 * MiB, NVMeBytes: 64 * MiB},
	}, newFakeCache(1<<20))
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	probe := func(h http.HandlerFunc) (int, string) {
		w := httptest.NewRecorder()
		h(w, httptest.NewRequest("GET", "/", nil))
		return w.Code, strings.TrimSpace(w.Body.String())
	}
	if code, body := probe(n.readyz); code != 503 || body != "starting" {
		t.Errorf("/readyz before Serve = %d %q, want 503 starting", code, body)
	}
	n.serving.Store(true)
	if code, _ := probe(n.readyz); code != 200 {
		t.Errorf("/readyz serving = %d, want 200", code)
	}
	n.stopping.Store(true)
	if code, body := probe(n.readyz); code != 503 || body != "stopping" {
		t.Errorf("/readyz stopping = %d %q, want 503 stopping", code, body)
	}
	if code, _ := probe(n.livez); code != 200 {
		t.Errorf("/livez stopping = %d, want 200 (a stopping node is alive)", code)
	}
}

// A node whose seeds do not answer serves alone but is not ready until it
// is part of a cluster: here, until another node joins it.
func TestReadyzWaitsForJoin(t *testing.T) {
	gone := openClusterNode(t, t.TempDir(), "gone", nil, nil)
	seed := gone.GossipAddr()
	gone.stop(t)

	b := openClusterNode(t, t.TempDir(), "b", []string{seed}, nil)
	testkit.WaitFor(t, "b serving", func() bool { return b.serving.Load() })
	if code, body := get(t, b.HTTPAddr(), "/readyz"); code != 503 || !strings.Contains(body, "joining") {
		t.Errorf("/readyz with no seed answering = %d %q, want 503 joining", code, body)
	}
	openClusterNode(t, t.TempDir(), "c", []string{b.GossipAddr()}, nil)
	testkit.WaitFor(t, "b ready once c joined it", func() bool {
		code, _ := get(t, b.HTTPAddr(), "/readyz")
		return code == 200
	})
}

func TestTopNamespaces(t *testing.T) {
	ns := func(d uint64, bytes int64) NamespaceStats {
		return NamespaceStats{Digest: d, Blocks: 1, Bytes: bytes, Tokens: 16, DRAMBytes: bytes, QuotaDRAM: 99}
	}
	for _, tc := range []struct {
		all       []NamespaceStats
		n         int
		top       []uint64
		otherSize int64 // -1: no other row
	}{
		{nil, 2, nil, -1},
		{[]NamespaceStats{ns(1, 10), ns(2, 20)}, 2, []uint64{1, 2}, -1},
		{[]NamespaceStats{ns(1, 10), ns(2, 30), ns(3, 20), ns(4, 5)}, 2, []uint64{2, 3}, 15},
		{[]NamespaceStats{ns(9, 10), ns(3, 10), ns(5, 10)}, 1, []uint64{3}, 20}, // ties: the lower digest
	} {
		t.Run(fmt.Sprint(tc.all, tc.n), func(t *testing.T) {
			before := append([]NamespaceStats(nil), tc.all...)
			top, other := topNamespaces(tc.all, tc.n)
			var got []uint64
			for _, s := range top {
				got = append(got, s.Digest)
			}
			if !reflect.DeepEqual(got, tc.top) {
				t.Errorf("top = %v, want %v", got, tc.top)
			}
			switch {
			case tc.otherSize < 0 && other != nil:
				t.Errorf("other = %+v, want none", *other)
			case tc.otherSize >= 0 && (other == nil || other.Bytes != tc.otherSize || other.DRAMBytes != tc.otherSize ||
				other.Blocks != int64(len(tc.all)-tc.n) || other.QuotaDRAM != 0):
				t.Errorf("other = %+v, want %d bytes in %d blocks, no quota", other, tc.otherSize, len(tc.all)-tc.n)
			}
			if !reflect.DeepEqual(tc.all, before) {
				t.Errorf("topNamespaces reordered its input")
			}
		})
	}
}

// statsCache is a Cache whose Stats are given; the collector calls nothing
// else.
type statsCache struct {
	Cache
	st CacheStats
}

func (c statsCache) Stats() CacheStats { return c.st }

// TestNamespaceSeries: a node with more namespaces than maxNamespaceSeries
// shows the largest one by one, labelled with their model, and the rest
// summed under "other"; the series pass the Prometheus linter.
func TestNamespaceSeries(t *testing.T) {
	var st CacheStats
	var otherBytes int64
	for i := range maxNamespaceSeries + 8 {
		b := int64(1000 + i) // the 8 smallest are the first 8
		st.Namespaces = append(st.Namespaces, NamespaceStats{Digest: uint64(i + 1), Blocks: 1, Bytes: b, DRAMBytes: b})
		if i < 8 {
			otherBytes += b
		}
	}
	model := func(d uint64) string {
		if d == uint64(maxNamespaceSeries+8) {
			return "meta-llama/Llama-3.1-8B"
		}
		return ""
	}
	c := newCacheCollector(statsCache{st: st}, nil, model)
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(c)
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	if problems, err := promlint.NewWithMetricFamilies(fams).Lint(); err != nil || len(problems) > 0 {
		t.Errorf("lint: %v %v", problems, err)
	}
	var other, largest float64 = -1, -1
	series := 0
	for _, f := range fams {
		if f.GetName() == "kvmesh_namespaces" && f.GetMetric()[0].GetGauge().GetValue() != float64(len(st.Namespaces)) {
			t.Errorf("kvmesh_namespaces = %v, want %d", f.GetMetric()[0].GetGauge().GetValue(), len(st.Namespaces))
		}
		if f.GetName() != "kvmesh_namespace_bytes" {
			continue
		}
		series = len(f.GetMetric())
		for _, m := range f.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			switch {
			case labels["namespace"] == otherNamespaces && labels["model"] == otherNamespaces:
				other = m.GetGauge().GetValue()
			case labels["model"] == "meta-llama/Llama-3.1-8B" && labels["namespace"] == digestString(uint64(maxNamespaceSeries+8)):
				largest = m.GetGauge().GetValue()
			case labels["model"] != "unknown":
				t.Errorf("series %v: want model=\"unknown\" for a namespace no request named", labels)
			}
		}
	}
	if series != maxNamespaceSeries+1 {
		t.Errorf("%d kvmesh_namespace_bytes series, want %d and other", series, maxNamespaceSeries)
	}
	if other != float64(otherBytes) {
		t.Errorf("other row = %v bytes, want %d (the 8 smallest namespaces)", other, otherBytes)
	}
	if largest < 0 {
		t.Errorf("the largest namespace's series lacks its model label")
	}
}

// TestLookupCounts: per-namespace lookup rows go to the first namespaces
// whose lookups found blocks, up to the bound; lookups that found nothing
// in a namespace without a row, and those past the bound, count as
// "other"; the totals are the node's.
func TestLookupCounts(t *testing.T) {
	var l lookupCounts
	for d := range uint64(1000) {
		l.add(d+1_000_000, 100, 0) // a flood of namespaces that hold nothing
	}
	for d := range uint64(maxNamespaceSeries + 5) {
		l.add(d+1, 100, 40)
		l.add(d+1, 100, 0) // a miss in a namespace with a row stays in it
	}
	if got := l.n.Load(); got != maxNamespaceSeries {
		t.Errorf("%d rows, want %d", got, maxNamespaceSeries)
	}
	v, ok := l.rows.Load(uint64(1))
	if !ok {
		t.Fatal("namespace 1 has no row")
	}
	if r := v.(*lookupRow); r.prompt.Load() != 200 || r.cached.Load() != 40 {
		t.Errorf("namespace 1: %d of %d tokens cached, want 40 of 200", r.cached.Load(), r.prompt.Load())
	}
	if p, c := l.other.prompt.Load(), l.other.cached.Load(); p != 1000*100+5*200 || c != 5*40 {
		t.Errorf("other: %d of %d tokens cached, want %d of %d", c, p, 5*40, 1000*100+5*200)
	}

	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(newLookupCollector(&l, nil, func(d uint64) string {
		if d == 1 {
			return "meta-llama/Llama-3.1-8B"
		}
		return ""
	}))
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	if problems, err := promlint.NewWithMetricFamilies(fams).Lint(); err != nil || len(problems) > 0 {
		t.Errorf("lint: %v %v", problems, err)
	}
	for _, f := range fams {
		if n := len(f.GetMetric()); n != maxNamespaceSeries+1 {
			t.Errorf("%s: %d series, want %d and other", f.GetName(), n, maxNamespaceSeries)
		}
	}
}
