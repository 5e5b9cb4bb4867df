package lint

import (
	"os/exec"
	"strings"
	"testing"
)

const module = "github.com/kvmesh/kvmesh/"

// TestFormatsDoNotLinkTheEngine fails when a package that an inference
// worker links (the client, the prefill engine) or the block format itself
// depends, directly or not, on the storage engine: store, tiers or pebble.
// Formats are leaf packages (STYLE.md): client.Dial must not pay pebble's
// build time, binary size and init.
func TestFormatsDoNotLinkTheEngine(t *testing.T) {
	for _, pkg := range []string{"block", "client", "prefill"} {
		for _, dep := range deps(t, pkg) {
			if dep == module+"store" || strings.HasPrefix(dep, module+"store/") ||
				dep == module+"tiers" || strings.HasPrefix(dep, module+"tiers/") ||
				strings.Contains(dep, "cockroachdb/pebble") {
				t.Errorf("%s depends on %s: it must not link the storage engine", pkg, dep)
			}
		}
	}
}

// TestNoHarnessInProduction fails when the node or the client links a
// test-support package (transfertest, transporttest, certtest, blocktest,
// internal/testkit): harnesses live beside the tests and benchmarks that
// use them, never in what ships.
func TestNoHarnessInProduction(t *testing.T) {
	for _, pkg := range []string{"client", "node", "store", "transfer"} {
		for _, dep := range deps(t, pkg) {
			if strings.HasPrefix(dep, module) && (strings.HasSuffix(dep, "test") || strings.Contains(dep, "/internal/testkit")) {
				t.Errorf("%s depends on the test-support package %s", pkg, dep)
			}
		}
	}
}

// TestBlockIsALeaf fails when the block format depends on another kvmesh
// package than prefixhash, or on a module other than xxhash.
func TestBlockIsALeaf(t *testing.T) {
	for _, dep := range deps(t, "block") {
		switch {
		case dep == module+"block" || dep == module+"prefixhash" || dep == "github.com/cespare/xxhash/v2":
		case strings.Contains(strings.SplitN(dep, "/", 2)[0], "."):
			t.Errorf("block depends on %s: it may import only prefixhash, xxhash and the standard library", dep)
		}
	}
}

// deps returns the import paths of every package pkg (relative to the
// module root) depends on, itself included, as the go tool lists them for
// this platform's default build. It skips the test when no go tool is at
// hand.
func deps(t *testing.T, pkg string) []string {
	t.Helper()
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Skipf("no go tool to list dependencies: %v", err)
	}
	cmd := exec.Command(goTool, "list", "-deps", "./"+pkg)
	cmd.Dir = repoRoot(t)
	out, err := cmd.Output()
	if err != nil {
		msg := ""
		if ee, ok := err.(*exec.ExitError); ok {
			msg = string(ee.Stderr)
		}
		t.Fatalf("go list -deps ./%s: %v\n%s", pkg, err, msg)
	}
	return strings.Fields(string(out))
}
