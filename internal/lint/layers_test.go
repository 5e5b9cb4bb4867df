package lint

import (
	"go/ast"
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

// TestNoBackEdges fails when a package depends on another for want of a
// small type that belongs lower down (docs/ARCHITECTURE.md): gpu names its
// device type from gpu/gpumem (tiers.Device is an alias of it), not from
// tiers; store takes the claim answers from block (block.ClaimStatus), not
// from the wire package transfer.
func TestNoBackEdges(t *testing.T) {
	for _, c := range []struct{ pkg, above string }{
		{"gpu", "tiers"},
		{"store", "transfer"},
	} {
		for _, dep := range deps(t, c.pkg) {
			if dep == module+c.above || strings.HasPrefix(dep, module+c.above+"/") {
				t.Errorf("%s depends on %s: a back-edge", c.pkg, dep)
			}
		}
	}
}

// maxFileLines is the most lines a Go file may have (issue 29: one concern
// per file, named so that a newcomer finds it).
const maxFileLines = 800

// longFiles are the files allowed past maxFileLines for now, each with
// why; a directory ends in a slash.
var longFiles = map[string]string{
	"node/":                        "being split into gossip, openai and router (branch house)",
	"openai/openai.go":             "moved out of node whole (branch house); its split by concern is house's to do",
	"router/router.go":             "moved out of node whole (branch house); its split by concern is house's to do",
	"transfer/server.go":           "under security fixes on another branch; split after they land",
	"transfer/shm_server_linux.go": "under security fixes on another branch; split after they land",
}

// TestNoLongFiles fails when a Go file of the module (generated code
// aside) is longer than maxFileLines and not in longFiles.
func TestNoLongFiles(t *testing.T) {
	for _, g := range goFiles(t) {
		if isGenerated(g.f) || allowedLong(g.rel) {
			continue
		}
		if n := g.fset.File(g.f.Pos()).LineCount(); n > maxFileLines {
			t.Errorf("%s has %d lines, over %d: split it by concern", g.rel, n, maxFileLines)
		}
	}
}

func allowedLong(rel string) bool {
	for p := range longFiles {
		if rel == p || (strings.HasSuffix(p, "/") && strings.HasPrefix(rel, p)) {
			return true
		}
	}
	return false
}

// isGenerated reports whether f carries Go's generated-code comment.
func isGenerated(f *ast.File) bool {
	for _, c := range f.Comments {
		if c.Pos() > f.Package {
			break
		}
		for _, l := range c.List {
			if strings.HasPrefix(l.Text, "// Code generated ") && strings.HasSuffix(l.Text, " DO NOT EDIT.") {
				return true
			}
		}
	}
	return false
}
