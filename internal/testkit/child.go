package testkit

import (
	"os"
	"os/exec"
	"runtime"
	"strings"
	"testing"
	"time"
)

// childEnv marks a test binary run again by ExpectCrash; its value is the
// test that is to crash.
const childEnv = "KVMESH_TESTKIT_CHILD"

// InChild reports whether this process is the child ExpectCrash started
// for the running test: the test then does what must crash, and the parent
// checks how it died.
func InChild(t testing.TB) bool {
	return os.Getenv(childEnv) == t.Name()
}

// ExpectCrash runs the current test again in a child process (the test
// binary, with InChild true there) and fails unless the child exits with an
// error and printed every string of want. For what ends a process on
// purpose: a panic on a runtime goroutine, a leak report.
func ExpectCrash(t *testing.T, want ...string) {
	t.Helper()
	out, err := Child(t).CombinedOutput()
	if err == nil {
		t.Fatalf("the child run of %s exited 0, want a crash:\n%s", t.Name(), out)
	}
	for _, w := range want {
		if !strings.Contains(string(out), w) {
			t.Fatalf("the child run of %s crashed (%v) without %q:\n%s", t.Name(), err, w, out)
		}
	}
}

// Child returns the command that runs the current test again in a child
// process (the test binary, with InChild true there), for a parent that
// decides how the child ends: it kills it in the middle of a write, say.
// The caller starts it and waits for it.
func Child(t testing.TB) *exec.Cmd {
	cmd := exec.Command(os.Args[0], "-test.run=^"+t.Name()+"$", "-test.count=1")
	cmd.Env = append(os.Environ(), childEnv+"="+t.Name())
	return cmd
}

// CollectGarbage runs the collector, giving cleanups time to run between
// rounds, for about a second: what a child that leaked a handle does until
// the leak report ends it. It returns if nothing did.
func CollectGarbage() {
	for range 1000 {
		runtime.GC()
		time.Sleep(time.Millisecond)
	}
}
