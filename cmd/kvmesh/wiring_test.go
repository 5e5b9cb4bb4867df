package main

import (
	"bytes"
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kvmesh/kvmesh/internal/probe/probetest"
)

// TestWiringErrors: the common wiring mistakes get one line that says what
// is actually wrong and what to do: a URL where HOST:PORT is wanted, a
// gRPC client pointed at an HTTP or HTTPS port or at a port that hangs up,
// a gossip seed that is a gRPC or HTTP port (serve and route).
func TestWiringErrors(t *testing.T) {
	srv := probetest.Start(t)
	httpAddr, httpsAddr, grpcAddr := srv.HTTP, srv.HTTPS, srv.GRPC
	port0 := []string{"--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0", "--data-addr", "127.0.0.1:0", "--gossip-addr", "127.0.0.1:0"}
	serve := func(join string) []string {
		return append([]string{"serve", "--data-dir", filepath.Join(t.TempDir(), "d"), "--join", join, "--dram", "64MiB", "--nvme", "64MiB"}, port0...)
	}

	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"a URL for --addr", []string{"inspect", "stats", "--addr", "http://127.0.0.1:7600"},
			`--addr "http://127.0.0.1:7600" is a URL; it wants HOST:PORT, without a scheme: --addr 127.0.0.1:7600`},
		{"no port", []string{"inspect", "members", "--addr", "localhost"}, `--addr "localhost": want HOST:PORT`},
		{"a URL for health", []string{"health", "--addr", "https://node:7600"}, "is a URL; it wants HOST:PORT"},
		{"the HTTP port", []string{"inspect", "stats", "--addr", httpAddr, "--timeout", "3s"},
			"speaks HTTP/1, not gRPC: it looks like a node's HTTP port (--http-addr, 7601 by default); kvmesh commands want the node's gRPC address"},
		{"an HTTPS port", []string{"prefill", "--text", "hi", "--addr", httpsAddr, "--timeout", "3s"}, "speaks HTTPS, not gRPC"},
		{"a port that hangs up", []string{"inspect", "stats", "--addr", srv.Hangup, "--timeout", "3s"},
			"closed the connection: if it is a node's gRPC port with TLS, pass --tls-ca CA (or --tls); if it is its data-plane (7602) or gossip (7603) port"},
		{"a URL to join", serve("http://127.0.0.1:7603"), `--join (or KVMESH_JOIN): seed 1, "http://127.0.0.1:7603", is a URL`},
		{"join a gRPC port", serve(grpcAddr),
			fmt.Sprintf("--join (or KVMESH_JOIN): %s answers gRPC: it looks like a node's --grpc-addr; join takes the members' gossip addresses", grpcAddr)},
		{"join an HTTP port", serve(httpAddr), fmt.Sprintf("%s answers HTTP: it looks like a node's --http-addr", httpAddr)},
		{"route joins a gRPC port", []string{"route", "--http-addr", "127.0.0.1:0", "--join", grpcAddr}, grpcAddr + " answers gRPC"},
		{"route joins a URL", []string{"route", "--http-addr", "127.0.0.1:0", "--join", "http://node:7603"}, "--join \"http://node:7603\" is a URL"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			code := run(tc.args, &stdout, &stderr)
			// The error is the last line (serve and route log above it).
			lines := strings.Split(strings.TrimSpace(stderr.String()), "\n")
			msg := lines[len(lines)-1]
			if code != 1 || !strings.HasPrefix(msg, "kvmesh: ") || !strings.Contains(msg, tc.want) {
				t.Errorf("kvmesh %s: exit %d,\n%s\nwant exit 1 and one line with %q", strings.Join(tc.args, " "), code, msg, tc.want)
			}
		})
	}
}

// TestServeDataDirInUse: a second kvmesh serve on a running node's data dir
// says which process holds it, and what to do.
func TestServeDataDirInUse(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the kvmesh binary")
	}
	dir := t.TempDir()
	d := startDaemon(t, dir)
	var stdout, stderr bytes.Buffer
	code := run([]string{"serve", "--data-dir", dir, "--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0",
		"--data-addr", "127.0.0.1:0", "--gossip-addr", "127.0.0.1:0"}, &stdout, &stderr)
	lines := strings.Split(strings.TrimSpace(stderr.String()), "\n")
	want := fmt.Sprintf("kvmesh: --data-dir (or KVMESH_DATA_DIR): %s is in use by process %d (another kvmesh serve?); stop it, or give this node a data dir of its own", dir, d.cmd.Process.Pid)
	if code != 1 || lines[len(lines)-1] != want {
		t.Errorf("a second serve on the data dir: exit %d,\n%s\nwant the last line %q", code, stderr.String(), want)
	}
}
