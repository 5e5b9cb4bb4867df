package bench_test

import (
	"context"
	"fmt"
	"os"

	"github.com/kvmesh/kvmesh/bench"
)

// Example shows what `kvmesh bench SUITE... [--quick] [-o table|json]
// [--out DIR] [--addr HOST:PORT,...] [--trace FILE --nodes N --routing
// POLICY]` does: the command parses flags into these values and calls
// these functions.
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
	suites, err := bench.Select(bench.Suites(bench.SuiteFlags{
		TracePath: "",      // --trace; empty: the bundled conversation trace
		Nodes:     4,       // --nodes
		Routing:   routing, // --routing, measured beside session-affinity
	}), []string{"trace"}) // positional SUITE..., or "all"
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return
	}
	binary, _ := os.Executable() // kvmesh itself starts the nodes
	rep, err := bench.Run(context.Background(), suites, bench.Env{
		Quick:    true,                                 // --quick
		OutDir:   os.TempDir(),                         // --out
		Binary:   binary,                               // `kvmesh serve` processes, one per node
		Addrs:    nil,                                  // --addr: a running cluster instead
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
