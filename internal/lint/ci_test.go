package lint

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"
)

// ciScripts are the scripts CI runs (.ci/run runs .ci/cuda) that name
// tests, benchmarks or fuzz targets.
var ciScripts = []string{".ci/run", ".ci/cuda"}

// fuzzExcluded are the Fuzz targets deliberately left out of .ci/run's fuzz
// smoke, "dir.FuzzName" to why; fuzzExcludedCount is how many there are, so
// that an exclusion is a change of two lines a reviewer sees.
var fuzzExcluded = map[string]string{}

const fuzzExcludedCount = 0

// fuzzLine is one target of .ci/run's fuzz smoke: fuzz NAME ./DIR/ BUDGET.
var fuzzLine = regexp.MustCompile(`^fuzz (Fuzz\w+) (\./\S+) (\d+x)$`)

// TestCIFuzzList fails when .ci/run's fuzz smoke misses a Fuzz function of
// the tree (one not in fuzzExcluded), or names one that is not in the
// package it gives: go test then fuzzes nothing and passes ("no fuzz tests
// to fuzz"), as FuzzDecode did for months after it moved from store to
// block.
func TestCIFuzzList(t *testing.T) {
	if len(fuzzExcluded) != fuzzExcludedCount {
		t.Fatalf("fuzzExcluded has %d entries, fuzzExcludedCount says %d", len(fuzzExcluded), fuzzExcludedCount)
	}
	root := repoRoot(t)
	listed := map[string]bool{}
	for _, l := range scriptLines(t, ".ci/run") {
		m := fuzzLine.FindStringSubmatch(l.text)
		if m == nil {
			continue
		}
		dir := cleanDir(m[2])
		name := dir + "." + m[1]
		if listed[name] {
			t.Errorf(".ci/run:%d lists %s twice", l.n, name)
		}
		listed[name] = true
		if !slices.Contains(testFuncs(t, root, dir), m[1]) {
			t.Errorf(".ci/run:%d fuzzes %s in ./%s/, which has no such function: go test would fuzz nothing and pass", l.n, m[1], dir)
		}
		if _, ok := fuzzExcluded[name]; ok {
			t.Errorf(".ci/run:%d fuzzes %s, which fuzzExcluded says is left out", l.n, name)
		}
	}
	if len(listed) == 0 {
		t.Fatal(".ci/run lists no fuzz target: the pattern fuzzLine no longer matches its lines")
	}
	all := fuzzTargets(t)
	for _, name := range all {
		_, excluded := fuzzExcluded[name]
		if !listed[name] && !excluded {
			t.Errorf("%s is in no fuzz list: add `fuzz %s ./%s/ <budget>` to .ci/run (or to fuzzExcluded, with the reason)",
				name, path.Ext(name)[1:], strings.TrimSuffix(name, path.Ext(name)))
		}
	}
	for name := range fuzzExcluded {
		if !slices.Contains(all, name) {
			t.Errorf("fuzzExcluded names %s, which is not in the tree", name)
		}
	}
}

// TestCINamedTestsExist fails when a go test command of CI's scripts names
// its tests (-run, -bench) with a pattern that matches no function of a
// package it gives: the step would run nothing and pass. Such commands run
// through .ci/named, which fails on go test's "no tests to run"; this test
// checks they do.
func TestCINamedTestsExist(t *testing.T) {
	root := repoRoot(t)
	checked := 0
	for _, script := range ciScripts {
		for _, l := range scriptLines(t, script) {
			args := shellWords(l.text)
			i := slices.Index(args, "go")
			if i < 0 || i+1 >= len(args) || args[i+1] != "test" {
				continue
			}
			runPat, benchPat := flagValue(args, "-run"), flagValue(args, "-bench")
			if slices.Contains(args, "-fuzz") || (runPat == "" && benchPat == "") {
				continue // the fuzz helper (TestCIFuzzList), or a whole package's tests
			}
			if i == 0 || args[i-1] != ".ci/named" {
				t.Errorf("%s:%d runs tests by name without .ci/named, so a name that matches nothing passes: %s", script, l.n, l.text)
			}
			var dirs []string
			for _, a := range args[i+2:] {
				if strings.HasPrefix(a, "./") {
					if strings.HasSuffix(a, "/...") {
						t.Errorf("%s:%d names tests in %s: give the packages one by one, so that each can be checked", script, l.n, a)
						continue
					}
					dirs = append(dirs, cleanDir(a))
				}
			}
			if len(dirs) == 0 {
				t.Errorf("%s:%d names tests but no package (./dir/): %s", script, l.n, l.text)
			}
			for _, dir := range dirs {
				funcs := testFuncs(t, root, dir)
				for _, p := range []struct {
					flag, pat string
					prefixes  []string
				}{{"-run", runPat, []string{"Test", "Example", "Fuzz"}}, {"-bench", benchPat, []string{"Benchmark"}}} {
					if p.pat == "" || p.pat == "^$" {
						continue
					}
					checked++
					if !matchesAny(t, p.pat, funcs, p.prefixes) {
						t.Errorf("%s:%d: %s %q matches no %s function of ./%s/: the step would run nothing",
							script, l.n, p.flag, p.pat, strings.Join(p.prefixes, "/"), dir)
					}
				}
			}
		}
	}
	if checked == 0 {
		t.Fatal("no named test found in CI's scripts: the parser no longer sees their go test lines")
	}
}

// matchesAny reports whether the top level of a go test -run or -bench
// pattern (the part before the first slash, which names subtests) matches
// a function of funcs that has one of prefixes.
func matchesAny(t *testing.T, pat string, funcs, prefixes []string) bool {
	top, _, _ := strings.Cut(pat, "/")
	re, err := regexp.Compile(top)
	if err != nil {
		t.Errorf("pattern %q: %v", pat, err)
		return true
	}
	for _, f := range funcs {
		for _, p := range prefixes {
			if strings.HasPrefix(f, p) && re.MatchString(f) {
				return true
			}
		}
	}
	return false
}

// fuzzTargets returns every Fuzz function of the module's tests, as
// "dir.FuzzName", sorted.
func fuzzTargets(t *testing.T) []string {
	var out []string
	for _, g := range goFiles(t) {
		if !strings.HasSuffix(g.rel, "_test.go") {
			continue
		}
		for _, d := range g.f.Decls {
			if fd, ok := d.(*ast.FuncDecl); ok && fd.Recv == nil && isTestFunc(fd, "Fuzz") {
				out = append(out, path.Dir(g.rel)+"."+fd.Name.Name)
			}
		}
	}
	sort.Strings(out)
	return out
}

// isTestFunc reports whether fd is a go test function of kind prefix:
// Fuzz, Test or Benchmark followed by nothing or a non-lowercase letter.
func isTestFunc(fd *ast.FuncDecl, prefix string) bool {
	name := fd.Name.Name
	if !strings.HasPrefix(name, prefix) {
		return false
	}
	rest := name[len(prefix):]
	return rest == "" || !(rest[0] >= 'a' && rest[0] <= 'z')
}

// testFuncs returns the names of the top-level functions of the _test.go
// files in dir (relative to root), whatever their build tags.
func testFuncs(t *testing.T, root, dir string) []string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(root, filepath.FromSlash(dir), "*_test.go"))
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, f := range files {
		pf, err := parser.ParseFile(token.NewFileSet(), f, nil, parser.SkipObjectResolution)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range pf.Decls {
			if fd, ok := d.(*ast.FuncDecl); ok && fd.Recv == nil {
				out = append(out, fd.Name.Name)
			}
		}
	}
	return out
}

// scriptLine is one logical line of a shell script (continuations joined).
type scriptLine struct {
	n    int // its first line's number
	text string
}

// scriptLines returns the lines of the script at rel (from the repository
// root), comments and blank lines left out, continued lines joined.
func scriptLines(t *testing.T, rel string) []scriptLine {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(repoRoot(t), filepath.FromSlash(rel)))
	if err != nil {
		t.Fatal(err)
	}
	var out []scriptLine
	var cur strings.Builder
	start := 0
	for i, l := range strings.Split(string(b), "\n") {
		if cur.Len() == 0 {
			start = i + 1
		}
		if s := strings.TrimSpace(l); cur.Len() == 0 && (s == "" || strings.HasPrefix(s, "#")) {
			continue
		}
		if strings.HasSuffix(l, "\\") {
			cur.WriteString(strings.TrimSuffix(l, "\\"))
			continue
		}
		cur.WriteString(l)
		out = append(out, scriptLine{start, strings.TrimSpace(cur.String())})
		cur.Reset()
	}
	return out
}

// shellWords splits a line of shell into words, quotes removed, enough for
// CI's go test commands: single and double quotes, no expansions. It stops
// at a pipe, a redirection's target is a word like any other.
func shellWords(s string) []string {
	var words []string
	var w strings.Builder
	in, quote := false, byte(0)
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case quote != 0:
			if c == quote {
				quote = 0
			} else {
				w.WriteByte(c)
			}
		case c == '\'' || c == '"':
			quote, in = c, true
		case c == ' ' || c == '\t' || c == '|' || c == ';' || c == '&':
			if in {
				words = append(words, w.String())
				w.Reset()
				in = false
			}
			if c != ' ' && c != '\t' {
				return words
			}
		default:
			w.WriteByte(c)
			in = true
		}
	}
	if in {
		words = append(words, w.String())
	}
	return words
}

// flagValue returns the value of go test flag name in args (-name v or
// -name=v), "" when absent.
func flagValue(args []string, name string) string {
	for i, a := range args {
		if a == name && i+1 < len(args) {
			return args[i+1]
		}
		if v, ok := strings.CutPrefix(a, name+"="); ok {
			return v
		}
	}
	return ""
}

// cleanDir turns a go test package argument (./store/) into a directory
// relative to the repository root (store).
func cleanDir(arg string) string {
	return path.Clean(strings.TrimPrefix(arg, "./"))
}
