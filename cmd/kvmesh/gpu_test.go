package main

import (
	"bytes"
	"strings"
	"testing"

	"github.com/kvmesh/kvmesh/gpu"
)

// TestServeHBMRefused: serve --hbm fails at once with one line that names the
// flag and the reason: no CUDA in this build, no device on this host, or (on
// a GPU host) that the store does not place blocks in HBM yet. Nothing is
// opened or bound first.
func TestServeHBMRefused(t *testing.T) {
	var want string
	if _, err := gpu.Probe(); err != nil {
		want = err.Error()
	} else {
		want = "does not place blocks in HBM yet"
	}
	dir := t.TempDir()
	var stdout, stderr bytes.Buffer
	code := run([]string{"serve", "--hbm", "1GiB", "--gpu", "0", "--data-dir", dir,
		"--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0", "--data-addr", "127.0.0.1:0", "--gossip-addr", "127.0.0.1:0"}, &stdout, &stderr)
	lines := strings.Split(strings.TrimSpace(stderr.String()), "\n")
	if code != 1 || len(lines) != 1 || !strings.Contains(lines[0], "--hbm (or KVMESH_HBM): ") || !strings.Contains(lines[0], want) {
		t.Fatalf("serve --hbm: exit %d, stderr %q; want exit 1 and one line naming --hbm and %q", code, stderr.String(), want)
	}
	if stdout.Len() != 0 {
		t.Fatalf("serve --hbm printed %q before failing", stdout.String())
	}
	for _, args := range [][]string{{"--hbm", "-1"}, {"--gpu", "-2"}} {
		stderr.Reset()
		if code := run(append([]string{"serve", "--data-dir", dir}, args...), &stdout, &stderr); code != 1 || !strings.Contains(stderr.String(), args[0]) {
			t.Errorf("serve %v: exit %d, stderr %q; want exit 1 naming %s", args, code, stderr.String(), args[0])
		}
	}
}

// TestVersionGPU: version says whether the GPU features are on, and why not.
func TestVersionGPU(t *testing.T) {
	var stdout bytes.Buffer
	if code := run([]string{"version"}, &stdout, &stdout); code != 0 {
		t.Fatalf("version: exit %d", code)
	}
	lines := strings.Split(strings.TrimSpace(stdout.String()), "\n")
	if len(lines) != 2 || lines[1] != gpu.Status() {
		t.Fatalf("version printed %q; want the version and %q", stdout.String(), gpu.Status())
	}
}
