package lint

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// pickerName matches the names port pickers go by: "free" or "pick", then
// "port" or "addr", in any case, with or without an underscore, maybe after
// "get" or "find". It is built from pieces so that this file does not
// match itself.
var pickerName = regexp.MustCompile(`(?i)\b(get_?|find_?)?(` + "fr" + `ee|pi` + `ck)_?(port|addr)s?\b`)

// TestNoPortPickers fails, naming the file and line, for every Go, shell or
// Python file of the repository that finds a "free" port by listening and
// closing: a function named like a port picker, or a listener on port 0
// whose address is read and that is closed without ever serving (the
// port's number goes elsewhere, to be bound again by someone else).
// Bind port 0 and pass the listener, or start the process with port 0 and
// read back what it bound (kvmesh serve --ready-file).
func TestNoPortPickers(t *testing.T) {
	root := repoRoot(t)
	var found []string
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if name := d.Name(); path != root && (name == ".git" || name == "testdata" || name == "node_modules") {
				return filepath.SkipDir
			}
			return nil
		}
		if !d.Type().IsRegular() {
			return nil
		}
		ext := filepath.Ext(path)
		if ext != ".go" && ext != ".sh" && ext != ".py" && ext != "" {
			return nil
		}
		src, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		if ext == "" {
			// A script without an extension (.ci/run) is known by its #! line.
			first, _, _ := strings.Cut(string(src), "\n")
			if !strings.HasPrefix(first, "#!") || !strings.Contains(first, "sh") && !strings.Contains(first, "python") {
				return nil
			}
			rel += " (script)"
		}
		found = append(found, problems(rel, src)...)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range found {
		t.Errorf("%s", p)
	}
}

// problems returns one line per port picker in the file name holding src.
func problems(name string, src []byte) []string {
	var out []string
	for i, line := range strings.Split(string(src), "\n") {
		if m := pickerName.FindString(line); m != "" {
			out = append(out, name+":"+strconv.Itoa(i+1)+": "+m+": a port picker (listen on port 0, close, reuse the number) races; bind port 0 and pass the listener, or read back what the process bound")
		}
	}
	if filepath.Ext(name) == ".go" {
		out = append(out, goListenClose(name, src)...)
	} else {
		out = append(out, scriptListenClose(name, src)...)
	}
	return out
}

// goListenClose finds, in every function of a Go file, a listener bound to
// port 0 that is only ever asked its address and closed: never accepted on,
// served, passed, returned or stored.
func goListenClose(name string, src []byte) []string {
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, name, src, parser.SkipObjectResolution)
	if err != nil {
		return nil // not Go this test can read; the build reports it
	}
	var out []string
	seen := map[token.Pos]bool{} // a listener of a closure is in its function's body too
	ast.Inspect(f, func(n ast.Node) bool {
		var body *ast.BlockStmt
		switch fn := n.(type) {
		case *ast.FuncDecl:
			body = fn.Body
		case *ast.FuncLit:
			body = fn.Body
		}
		if body == nil {
			return true
		}
		for _, lis := range portZeroListeners(body) {
			addr, closed, other := uses(body, lis.name)
			if addr && closed && !other && !seen[lis.pos] {
				seen[lis.pos] = true
				out = append(out, fset.Position(lis.pos).String()+": listener "+lis.name+
					" on port 0 is closed after its address is read: the port is handed on and races; pass the listener itself")
			}
		}
		return true
	})
	return out
}

type listener struct {
	name string
	pos  token.Pos
}

// portZeroListeners returns the variables of body assigned a listener
// bound to port 0: x, err := net.Listen("tcp", "127.0.0.1:0") (and
// ListenPacket, ListenConfig.Listen, ListenTCP with a TCPAddr of no port).
func portZeroListeners(body *ast.BlockStmt) []listener {
	var out []listener
	ast.Inspect(body, func(n ast.Node) bool {
		as, ok := n.(*ast.AssignStmt)
		if !ok || len(as.Rhs) != 1 || len(as.Lhs) == 0 {
			return true
		}
		call, ok := as.Rhs[0].(*ast.CallExpr)
		if !ok {
			return true
		}
		sel, ok := call.Fun.(*ast.SelectorExpr)
		if !ok || !strings.HasPrefix(sel.Sel.Name, "Listen") {
			return true
		}
		id, ok := as.Lhs[0].(*ast.Ident)
		if !ok || id.Name == "_" {
			return true
		}
		for _, arg := range call.Args {
			if portZero(arg) {
				out = append(out, listener{id.Name, as.Pos()})
				break
			}
		}
		return true
	})
	return out
}

func portZero(e ast.Expr) bool {
	switch a := e.(type) {
	case *ast.BasicLit:
		s, err := strconv.Unquote(a.Value)
		return err == nil && strings.HasSuffix(s, ":0")
	case *ast.UnaryExpr: // &net.TCPAddr{IP: ...} without a Port
		if cl, ok := a.X.(*ast.CompositeLit); ok {
			if sel, ok := cl.Type.(*ast.SelectorExpr); ok && strings.HasSuffix(sel.Sel.Name, "Addr") {
				for _, el := range cl.Elts {
					if kv, ok := el.(*ast.KeyValueExpr); ok {
						if k, ok := kv.Key.(*ast.Ident); ok && k.Name == "Port" {
							return false
						}
					}
				}
				return true
			}
		}
	}
	return false
}

// uses reports how body uses the variable name: x.Addr(), x.Close(), and
// anything else (x.Accept(), Serve(x), return x, s.l = x...).
func uses(body *ast.BlockStmt, name string) (addr, closed, other bool) {
	method := map[*ast.Ident]bool{} // idents that are the X of x.Addr or x.Close
	ast.Inspect(body, func(n ast.Node) bool {
		sel, ok := n.(*ast.SelectorExpr)
		if !ok {
			return true
		}
		if id, ok := sel.X.(*ast.Ident); ok && id.Name == name {
			switch sel.Sel.Name {
			case "Addr":
				addr, method[id] = true, true
			case "Close":
				closed, method[id] = true, true
			}
		}
		return true
	})
	ast.Inspect(body, func(n ast.Node) bool {
		switch x := n.(type) {
		case *ast.AssignStmt:
			// The assignment that made the listener is not a use; one that
			// copies it elsewhere is.
			for _, r := range x.Rhs {
				ast.Inspect(r, func(n ast.Node) bool { return visitIdent(n, name, method, &other) })
			}
			return false
		case *ast.Ident:
			visitIdent(x, name, method, &other)
		}
		return true
	})
	return addr, closed, other
}

func visitIdent(n ast.Node, name string, method map[*ast.Ident]bool, other *bool) bool {
	if id, ok := n.(*ast.Ident); ok && id.Name == name && !method[id] {
		*other = true
	}
	return true
}

// scriptListenClose finds, in a shell or Python file, a socket bound to
// port 0 whose name is read back (getsockname) and that never accepts: the
// script hands the number on.
func scriptListenClose(name string, src []byte) []string {
	s := string(src)
	bind0 := regexp.MustCompile(`bind\(\s*\(\s*['"][^'"]*['"]\s*,\s*0\s*\)\s*\)`)
	loc := bind0.FindStringIndex(s)
	if loc == nil || !strings.Contains(s, "getsockname") || strings.Contains(s, ".accept(") || strings.Contains(s, "serve_forever") {
		return nil
	}
	line := strings.Count(s[:loc[0]], "\n") + 1
	return []string{name + ":" + strconv.Itoa(line) + ": socket bound to port 0 whose port is read and handed on; let the server bind port 0 and report it"}
}

// repoRoot is the directory of the module's go.mod.
func repoRoot(t *testing.T) string {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatal("no go.mod above the test's directory")
		}
		dir = parent
	}
}

// TestPortPickerDetector pins what the check flags and what it leaves
// alone, on small files.
func TestPortPickerDetector(t *testing.T) {
	picker := "fr" + "eePort" // not spelled out, or this file would match
	for _, tc := range []struct {
		name, src string
		flagged   bool
	}{
		{"picker.go", "package p\nfunc " + picker + "() int { return 0 }\n", true},
		{"closed.go", `package p
import "net"
func f() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}`, true},
		{"closedlater.go", `package p
import ("net"; "os/exec")
func f() {
	l, _ := net.Listen("tcp", ":0")
	port := l.Addr().String()
	l.Close()
	exec.Command("server", "--addr", port).Run()
}`, true},
		{"served.go", `package p
import ("net"; "net/http")
func f() string {
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	go http.Serve(ln, nil)
	defer ln.Close()
	return ln.Addr().String()
}`, false},
		{"accepted.go", `package p
import "net"
func f() string {
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	go func() { c, _ := ln.Accept(); c.Close() }()
	defer ln.Close()
	return ln.Addr().String()
}`, false},
		{"fixed.go", `package p
import "net"
func f() string {
	ln, _ := net.Listen("tcp", "127.0.0.1:7600")
	defer ln.Close()
	return ln.Addr().String()
}`, false},
		{"pick.py", "import socket\ns = socket.socket()\ns.bind(('127.0.0.1', 0))\nport = s.getsockname()[1]\ns.close()\n", true},
		{"serve.py", "import socket\ns = socket.socket()\ns.bind(('', 0))\nport = s.getsockname()[1]\ns.listen()\nc, _ = s.accept()\n", false},
		{"pick.sh", "PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind((\"\", 0)); print(s.getsockname()[1])')\n", true},
		{"ready.sh", "kvmesh serve --grpc-addr 127.0.0.1:0 --ready-file /tmp/r\n", false},
	} {
		if got := len(problems(tc.name, []byte(tc.src))) > 0; got != tc.flagged {
			t.Errorf("%s: flagged %v, want %v: %v", tc.name, got, tc.flagged, problems(tc.name, []byte(tc.src)))
		}
	}
}
