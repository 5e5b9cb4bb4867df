package bench

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// TestKvmeshClusterCapacity: the nodes a trace replay starts are bounded to
// the spec's capacity in blocks across DRAM and NVMe (--max-blocks), not
// only sized in DRAM for it, and run the spec's eviction policy. A stand-in binary records its arguments and
// exits; what kvmesh serve does with the flag is TestServeMaxBlocks's.
func TestKvmeshClusterCapacity(t *testing.T) {
	dir := t.TempDir()
	record := filepath.Join(dir, "args")
	bin := filepath.Join(dir, "kvmesh")
	script := "#!/bin/sh\necho \"$@\" >> " + record + "\nexit 3\n"
	if err := os.WriteFile(bin, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	env := &Env{Binary: bin, WorkDir: t.TempDir()}
	spec := ClusterSpec{Nodes: 1, CapacityBlocks: 1234, BlockBytes: 4096, LocalOnly: true, Namespace: TraceNamespace(),
		Eviction: "lru"}
	if _, err := KvmeshCluster(env)(context.Background(), spec); err == nil {
		t.Fatal("a node that exits at once started")
	}
	args, err := os.ReadFile(record)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{" --max-blocks 1234", " --eviction lru"} {
		if !strings.Contains(string(args), want) {
			t.Fatalf("kvmesh serve ran with %q: want %s", args, want)
		}
	}
}

// policyCluster is the simulation reporting itself as kvmesh nodes, for the
// eviction sweep, which runs only on nodes.
type policyCluster struct {
	*Sim
}

func (policyCluster) Backend() string { return BackendKvmesh }

// TestTraceEvictionSweep: on kvmesh nodes the trace suite replays each
// capacity of NodeSweep under lru and the compared policy, beside the
// simulation's lru and optimum, and checks issue 17's targets.
func TestTraceEvictionSweep(t *testing.T) {
	var asked []string
	factory := func(_ context.Context, spec ClusterSpec) (Cluster, error) {
		asked = append(asked, spec.Eviction)
		s, err := NewSim(SimOptions{Nodes: spec.Nodes, CapacityBlocks: spec.CapacityBlocks, LocalOnly: spec.LocalOnly})
		return policyCluster{s}, err
	}
	s := &TraceSuite{Options: TraceOptions{TracePath: "testdata/small_trace.jsonl", Cluster: factory, Nodes: 2,
		Routing: []Policy{RoutingRandom}, Sweep: []float64{1}, NodeSweep: []float64{0.5, 1}}}
	res := runSuite(t, s, &Env{}, "ideal", "replay", "simulation", "capacity_sweep", "eviction_sweep")
	rows := table[evictionSweepRow](t, res, "eviction_sweep")
	if len(rows) != 2 || rows[0].Policy != "dedup" || rows[1].PooledCapacityFraction != 1 {
		t.Fatalf("eviction sweep rows %+v", rows)
	}
	for _, r := range rows {
		// The stand-in keeps no copies: both policies hit alike.
		if r.LRURatioVsIdeal <= 0 || r.PolicyOverLRU != 1 || r.SimOptimumRatioVsIdeal < r.SimLRURatioVsIdeal {
			t.Errorf("row %+v", r)
		}
	}
	// The comparison (pooled, local-only) then lru and dedup per capacity.
	if want := []string{"", "", "lru", "dedup", "lru", "dedup"}; !slices.Equal(asked, want) {
		t.Fatalf("policies asked of the nodes %q, want %q", asked, want)
	}
	if c := check(t, res, "min hit_ratio(policy) / hit_ratio(lru)"); !c.Met || c.Backend != BackendKvmesh {
		t.Fatalf("check %+v", c)
	}
}
