package lint

import (
	"strconv"
	"strings"
	"testing"
)

// TestServingDoesNotImportTheDaemon fails when a serving package depends,
// directly or not, on node: the daemon wires the surfaces, which declare
// the small interface they need of it (openai.Node) and never reach into
// it (STYLE.md, "The daemon package wires"). Their tests may start nodes.
func TestServingDoesNotImportTheDaemon(t *testing.T) {
	for _, pkg := range []string{"gossip", "openai", "router"} {
		for _, dep := range deps(t, pkg) {
			if dep == module+"node" || strings.HasPrefix(dep, module+"node/") {
				t.Errorf("%s depends on %s: it must not depend on the daemon; declare the interface it needs and let node implement it", pkg, dep)
			}
		}
	}
}

// TestNobodyImportsCmd fails when any Go file, test or not, imports a
// package under cmd/: binaries are thin and hold no logic another package
// could want.
func TestNobodyImportsCmd(t *testing.T) {
	for _, g := range goFiles(t) {
		for _, imp := range g.f.Imports {
			if p, _ := strconv.Unquote(imp.Path.Value); strings.HasPrefix(p, module+"cmd/") {
				t.Errorf("%s imports %s: nothing imports a binary; move what it needs into a package", g.rel, p)
			}
		}
	}
}
