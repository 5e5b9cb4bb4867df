package invariants

import (
	"os"
	"os/exec"
	"runtime"
	"strings"
	"testing"
	"time"
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
// process with a report naming it. The leak happens in a child process (the
// test binary run again), since the report panics.
func TestLeakReported(t *testing.T) {
	if os.Getenv("KVMESH_INVARIANTS_LEAK") == "1" {
		makeHandle(false)
		// The cleanup runs on its own goroutine after a GC; it ends the
		// process. A bounded loop: a child that outlives it exits 0 and the
		// parent fails.
		for range 1000 {
			runtime.GC()
			time.Sleep(time.Millisecond)
		}
		return
	}
	if !Enabled {
		t.Skip("leak reports are off in a build without invariants (-race or -tags invariants)")
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestLeakReported$")
	cmd.Env = append(os.Environ(), "KVMESH_INVARIANTS_LEAK=1")
	out, err := cmd.CombinedOutput()
	if err == nil || !strings.Contains(string(out), "leaked, never released: invariants.handle created at:") ||
		!strings.Contains(string(out), "makeHandle") {
		t.Fatalf("child leaking a handle: %v\n%s", err, out)
	}
}
