package transfer

import (
	"context"
	"testing"

	"github.com/kvmesh/kvmesh/internal/invariants"
	"github.com/kvmesh/kvmesh/internal/testkit"
)

// TestResultLeakReported: in the invariants build, a Result collected
// without Release ends the process with a report of where it was made (in
// a child process, since the report panics).
func TestResultLeakReported(t *testing.T) {
	if testkit.InChild(t) {
		src := newMemSource()
		_, addr := startServer(t, src, nil)
		leakResult(t, newClient(t, addr, nil), src)
		testkit.CollectGarbage()
		return
	}
	if !invariants.Enabled {
		t.Skip("leak reports are on in the invariants build only (-race or -tags invariants)")
	}
	testkit.ExpectCrash(t, "leaked, never released: transfer.Result created at:", "leakResult")
}

//go:noinline
func leakResult(t *testing.T, c *Client, src *memSource) {
	keys := fill(src, []int{100})
	if _, err := c.Get(context.Background(), keys); err != nil {
		t.Fatal(err)
	}
}
