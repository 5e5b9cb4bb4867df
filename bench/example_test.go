package bench_test

import (
	"context"
	"fmt"
	"os"

	"github.com/kvmesh/kvmesh/bench"
)

// Example shows what `kvmesh bench SUITE... [--quick] [-o table|json]
// [--out DIR] [--trace FILE --nodes N --routing POLICY]` does: the command
// parses flags into options and calls these functions.
func Example() {
	format, err := bench.ParseFormat("table") // -o
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return
	}
	routing, err := bench.ParsePolicy("random") // --routing
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return
	}
	available := []bench.Suite{
		&bench.PeersSuite{},
		&bench.TraceSuite{Options: bench.TraceOptions{
			TracePath: "",                                            // --trace; empty: the bundled conversation trace
			Nodes:     4,                                             // --nodes
			Routing:   []bench.Policy{routing, bench.RoutingSession}, // --routing, with session-affinity side by side
			Cluster:   nil,                                           // a kvmesh ClusterFactory; nil: the simulation
		}},
		// ... and the kvmesh-backed suites (transfer, store, lookup, nvme, prefill).
	}
	suites, err := bench.Select(available, []string{"trace"}) // positional SUITE...
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return
	}
	rep, err := bench.Run(context.Background(), suites, bench.Env{
		Quick:    true,                                 // --quick
		OutDir:   os.TempDir(),                         // --out
		Progress: bench.ProgressFor(os.Stderr, format), // bars only on a terminal, never with -o json
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
	}
	_ = bench.Write(os.Stdout, rep, format)
	if failed := rep.Failed(); len(failed) > 0 {
		fmt.Fprintln(os.Stderr, "kvmesh bench: failed:", failed) // and exit 1
	}
}
