package lint

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// goFile is one parsed Go file of the repository.
type goFile struct {
	rel  string // slash-separated path from the repository root
	fset *token.FileSet
	f    *ast.File
}

// goFiles parses every Go file of the module (testdata, node_modules and
// the deploy/chartcheck module left out), tests included.
func goFiles(t *testing.T) []goFile {
	t.Helper()
	root := repoRoot(t)
	var files []goFile
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		rel = filepath.ToSlash(rel)
		if d.IsDir() {
			if name := d.Name(); path != root && (name == ".git" || name == "testdata" || name == "node_modules" ||
				strings.HasPrefix(name, ".")) {
				return filepath.SkipDir
			}
			if _, err := os.Stat(filepath.Join(path, "go.mod")); err == nil && path != root {
				return filepath.SkipDir // another module
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") {
			return nil
		}
		src, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		fset := token.NewFileSet()
		f, err := parser.ParseFile(fset, rel, src, parser.ParseComments)
		if err != nil {
			return err
		}
		files = append(files, goFile{rel: rel, fset: fset, f: f})
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return files
}

// TestClientImportsNoEngine fails when a file of client imports store or
// tiers: a worker's client speaks the wire formats (block, transfer, the
// gRPC API) and must not pull the storage engine in. deps_test.go checks
// the same through go list, transitively; this names the file.
func TestClientImportsNoEngine(t *testing.T) {
	for _, g := range goFiles(t) {
		if !strings.HasPrefix(g.rel, "client/") {
			continue
		}
		for _, imp := range g.f.Imports {
			p, _ := strconv.Unquote(imp.Path.Value)
			for _, engine := range []string{module + "store", module + "tiers"} {
				if p == engine || strings.HasPrefix(p, engine+"/") {
					t.Errorf("%s imports %s: the client must not import the storage engine", g.rel, p)
				}
			}
		}
	}
}

// TestSentinelErrorsNamePackage fails for an exported package-level error
// variable (Err...) made by errors.New outside tests whose message does
// not begin with its package's name: "store: block not found", so that a user reading a
// wrapped error knows where it came from (STYLE.md).
func TestSentinelErrorsNamePackage(t *testing.T) {
	for _, g := range goFiles(t) {
		if strings.HasSuffix(g.rel, "_test.go") {
			continue
		}
		for _, msg := range sentinelProblems(g) {
			t.Error(msg)
		}
	}
}

func sentinelProblems(g goFile) []string {
	var out []string
	pkg := g.f.Name.Name
	for _, decl := range g.f.Decls {
		gd, ok := decl.(*ast.GenDecl)
		if !ok || gd.Tok != token.VAR {
			continue
		}
		for _, spec := range gd.Specs {
			vs := spec.(*ast.ValueSpec)
			for i, name := range vs.Names {
				if !strings.HasPrefix(name.Name, "Err") || i >= len(vs.Values) {
					continue
				}
				call, ok := vs.Values[i].(*ast.CallExpr)
				if !ok || len(call.Args) != 1 || !isSelector(call.Fun, "errors", "New") {
					continue
				}
				lit, ok := call.Args[0].(*ast.BasicLit)
				if !ok || lit.Kind != token.STRING {
					continue
				}
				msg, _ := strconv.Unquote(lit.Value)
				if !strings.HasPrefix(msg, pkg+": ") {
					out = append(out, fmt.Sprintf("%s: %s = errors.New(%q): a sentinel error's message begins with its package, %q",
						g.fset.Position(lit.Pos()), name.Name, msg, pkg+": "))
				}
			}
		}
	}
	return out
}

func isSelector(e ast.Expr, pkg, name string) bool {
	sel, ok := e.(*ast.SelectorExpr)
	if !ok || sel.Sel.Name != name {
		return false
	}
	id, ok := sel.X.(*ast.Ident)
	return ok && id.Name == pkg
}

// sleepAllowed are the test files that may call time.Sleep, each with how
// many calls and why. Everything else waits on a condition with
// testkit.WaitFor, the one place a test sleeps. A new sleep in a listed
// file raises its count and fails too: move it to WaitFor, or list it with
// its reason.
var sleepAllowed = map[string]struct {
	n   int
	why string
}{
	"transfer/shm_test.go":             {1, "a child process that holds a region until the parent kills it"},
	"transfer/shm_arena_test.go":       {1, "a child process that holds a reservation until the parent kills it"},
	"node/prefill_bench_test.go":       {2, "a benchmark's think time between a client's requests, the load it models, and the gap before a prompt arrives at the second node (1 s or 8 s), what the pacing benchmark measures"},
	"node/batch_bench_test.go":         {1, "a benchmark polling its batch as a client does"},
	"transfer/bench_test.go":           {1, "a benchmark waiting for redis-server's socket (a peer, not kvmesh)"},
	"node/batch_test.go":               {1, "polls the batch API as a client does and fails naming the last status"},
	"node/route_test.go":               {1, "polls the batch API through the router as a client does"},
	"cmd/kvmesh/queue_e2e_test.go":     {1, "polls a batch across a restart as a client does"},
	"cmd/kvmesh/openai_sdk_test.go":    {1, "polls /healthz and fails with the daemons' logs"},
	"cmd/kvmesh/tlsreload_e2e_test.go": {1, "waits for a log line after SIGHUP and fails with the log"},
	"cmd/kvmesh/security_e2e_test.go":  {1, "waits for a token reload and fails with the daemon's log"},
	"cmd/kvmesh/cluster_e2e_test.go":   {5, "process-level polls that fail with the daemons' logs or a lookup stream's errors"},
}

// TestNoSleepInTests fails for a time.Sleep in a test file outside
// internal/testkit and the allowed list: a test waits on a condition with a
// deadline (testkit.WaitFor), never for a guessed time (STYLE.md).
func TestNoSleepInTests(t *testing.T) {
	count := map[string][]string{}
	for _, g := range goFiles(t) {
		if !strings.HasSuffix(g.rel, "_test.go") || strings.HasPrefix(g.rel, "internal/testkit/") {
			continue
		}
		ast.Inspect(g.f, func(n ast.Node) bool {
			if call, ok := n.(*ast.CallExpr); ok && isSelector(call.Fun, "time", "Sleep") {
				count[g.rel] = append(count[g.rel], g.fset.Position(call.Pos()).String())
			}
			return true
		})
	}
	for file, at := range count {
		if allowed := sleepAllowed[file]; len(at) > allowed.n {
			t.Errorf("%s: time.Sleep in a test (%d, %d allowed): wait on a condition with testkit.WaitFor", strings.Join(at, ", "), len(at), allowed.n)
		}
	}
	for file, a := range sleepAllowed {
		if len(count[file]) < a.n {
			t.Errorf("sleepAllowed lists %d sleeps in %s, which has %d: lower the count", a.n, file, len(count[file]))
		}
	}
}

// TestSentinelDetector: the sentinel check flags an unprefixed exported
// sentinel and passes prefixed, unexported and non-errors.New ones.
func TestSentinelDetector(t *testing.T) {
	src := `package store
import "errors"
var (
	ErrGood = errors.New("store: fine")
	ErrBad  = errors.New("block not found")
	errLocal = errors.New("internal")
	ErrWrapped = fmt.Errorf("x: %w", ErrGood)
)
var ErrOther = errors.New("tiers: wrong package")
`
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, "x.go", src, 0)
	if err != nil {
		t.Fatal(err)
	}
	got := sentinelProblems(goFile{rel: "x.go", fset: fset, f: f})
	if len(got) != 2 || !strings.Contains(got[0], "ErrBad") || !strings.Contains(got[1], "ErrOther") {
		t.Fatalf("sentinelProblems = %q, want ErrBad and ErrOther flagged", got)
	}
}
