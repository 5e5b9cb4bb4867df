package bench

import (
	"bytes"
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// notTables are the struct types with JSON fields that are never a table's
// rows: the report's own shape and the formats read from peers.
var notTables = map[string]bool{"Result": true, "Table": true, "Skip": true, "Check": true, "Report": true, "Machine": true,
	"fioOutput": true, "fioStat": true, "traceLine": true, "serveUsage": true,
	"TierCounts": true}

// parseBench parses the package's non-test files.
func parseBench(t *testing.T) (*token.FileSet, []*ast.File) {
	t.Helper()
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	var parsed []*ast.File
	for _, file := range files {
		if strings.HasSuffix(file, "_test.go") {
			continue
		}
		af, err := parser.ParseFile(fset, file, nil, parser.SkipObjectResolution)
		if err != nil {
			t.Fatal(err)
		}
		parsed = append(parsed, af)
	}
	return fset, parsed
}

// benchStructs calls f for every struct type declared in the package's
// non-test files (at top level or in a function).
func benchStructs(t *testing.T, f func(name string, st *ast.StructType)) {
	t.Helper()
	_, files := parseBench(t)
	for _, af := range files {
		ast.Inspect(af, func(n ast.Node) bool {
			if ts, ok := n.(*ast.TypeSpec); ok {
				if st, ok := ts.Type.(*ast.StructType); ok {
					f(ts.Name.Name, st)
				}
			}
			return true
		})
	}
}

// TestColumnsExplained: every column a table can show (a field with a JSON
// name and no table:"-") has an explanation, which the table prints once.
func TestColumnsExplained(t *testing.T) {
	checked := 0
	benchStructs(t, func(name string, st *ast.StructType) {
		if notTables[name] {
			return
		}
		for _, fld := range st.Fields.List {
			if fld.Tag == nil {
				continue
			}
			raw, _ := strconv.Unquote(fld.Tag.Value)
			tag := reflect.StructTag(raw)
			json, _, _ := strings.Cut(tag.Get("json"), ",")
			if json == "" || json == "-" || tag.Get("table") == "-" {
				continue
			}
			checked++
			if ColumnHelp(json) == "" {
				t.Errorf("column %s (%s) has no explanation in columnHelp", json, name)
			}
		}
	})
	if checked < 100 {
		t.Fatalf("checked %d columns; the parse found too few", checked)
	}
}

// TestWideAndExplained: the default table leaves out the wide columns and
// the nonzero ones that are zero everywhere, -o wide shows them, and each
// column shown is explained once, under the first table that shows it.
func TestWideAndExplained(t *testing.T) {
	rows := []KVResult{{Target: "kvmesh-tcp", Op: "get", ValueBytes: 1 << 20, Concurrency: 4, Ops: 7, GBps: 1}}
	res := &Result{Suite: "s"}
	res.AddTable("a", "first", rows)
	res.AddTable("b", "second", rows)
	rep := &Report{Results: []*Result{res}}
	var def, wide bytes.Buffer
	if err := WriteTable(&def, rep); err != nil {
		t.Fatal(err)
	}
	if err := WriteWide(&wide, rep); err != nil {
		t.Fatal(err)
	}
	header := regexp.MustCompile(`(?m)^  target .*$`)
	d, w := header.FindString(def.String()), header.FindString(wide.String())
	for _, col := range []string{"ops_per_s", "errors"} {
		if strings.Contains(d, col) {
			t.Errorf("the default table shows %s: %s", col, d)
		}
		if !strings.Contains(w, col) {
			t.Errorf("the wide table lacks %s: %s", col, w)
		}
	}
	if !strings.Contains(d, "gbps") {
		t.Errorf("the default table lacks gbps: %s", d)
	}
	if n := len(regexp.MustCompile(`\n +gbps +`+regexp.QuoteMeta(ColumnHelp("gbps"))).FindAllString(def.String(), -1)); n != 1 {
		t.Errorf("gbps explained %d times; want once:\n%s", n, def.String())
	}
	rows[0].Errors = 1
	def.Reset()
	if err := WriteTable(&def, &Report{Results: []*Result{{Suite: "s", Tables: []Table{{Rows: rows}}}}}); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(header.FindString(def.String()), "errors") {
		t.Errorf("the default table hides errors that happened:\n%s", def.String())
	}
}

// TestNoInternalWording: what the bench prints (notes, checks, skips,
// table titles) and kvmesh bench's help name no issue, design file or
// function of this package.
func TestNoInternalWording(t *testing.T) {
	idents := map[string]bool{}
	fset, parsed := parseBench(t)
	for _, af := range parsed {
		for _, d := range af.Decls {
			if fd, ok := d.(*ast.FuncDecl); ok && fd.Name.IsExported() && fd.Recv == nil {
				idents[fd.Name.Name] = true
			}
		}
	}
	internal := regexp.MustCompile(`\b[Ii]ssue\b|\bDESIGN\b`)
	check := func(where, s string) {
		if m := internal.FindString(s); m != "" {
			t.Errorf("%s: %q says %q", where, s, m)
		}
		for _, w := range regexp.MustCompile(`[A-Z][a-z]+[A-Z]\w*`).FindAllString(s, -1) {
			if idents[w] {
				t.Errorf("%s: %q names the function %s", where, s, w)
			}
		}
	}
	for _, af := range parsed {
		ast.Inspect(af, func(n ast.Node) bool {
			call, ok := n.(*ast.CallExpr)
			if !ok {
				return true
			}
			var name string
			switch fn := call.Fun.(type) {
			case *ast.SelectorExpr:
				name = fn.Sel.Name
			case *ast.Ident:
				name = fn.Name
			}
			switch name {
			case "Note", "Skip", "AddTable", "Describe", "NewCheck":
			default:
				return true
			}
			ast.Inspect(call, func(n ast.Node) bool {
				if lit, ok := n.(*ast.BasicLit); ok && lit.Kind == token.STRING {
					s, _ := strconv.Unquote(lit.Value)
					check(fset.Position(lit.Pos()).String(), s)
				}
				return true
			})
			return true
		})
	}
}
