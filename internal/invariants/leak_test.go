package invariants

import (
	"runtime"
	"testing"

	"github.com/kvmesh/kvmesh/internal/testkit"
)

type handle struct {
	leak Leak
	name string // not empty: a handle of zero size would never be collected
}

//go:noinline
func makeHandle(release bool) {
	h := &handle{name: "h"}
	Track(h, &h.leak, "invariants.handle")
	if release {
		h.leak.Stop()
		h.leak.Stop() // twice does nothing
	}
}

// TestLeakStopped: a tracked handle that was released is collected without
// a report (a report panics the test binary).
func TestLeakStopped(t *testing.T) {
	makeHandle(true)
	runtime.GC()
	runtime.GC()
}

// TestLeakReported: a tracked handle collected without Stop ends the
// process with a report naming it and where it was made. The leak happens
// in a child process, since the report panics.
func TestLeakReported(t *testing.T) {
	if testkit.InChild(t) {
		makeHandle(false)
		testkit.CollectGarbage()
		return
	}
	if !Enabled {
		t.Skip("leak reports are off in a build without invariants (-race or -tags invariants)")
	}
	testkit.ExpectCrash(t, "leaked, never released: invariants.handle created at:", "makeHandle")
}
