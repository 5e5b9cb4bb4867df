package main

import (
	"bytes"
	"strings"
	"testing"

	"github.com/kvmesh/kvmesh/gpu"
)

// TestServeHBMRefused: serve --hbm fails at once with one line that names the
// flag and the reason: no CUDA in this build, or no device on this host.
// Nothing is opened or bound first.
func TestServeHBMRefused(t *testing.T) {
	_, perr := gpu.Probe()
	if perr == nil {
		t.Skip("this host has a CUDA device: serve --hbm may start here (gpu's device tests exercise it)")
	}
	want := perr.Error()
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

// TestServeBackendCUDARefused: serve --backend cuda on a host without CUDA
// or a device fails at once with one line that names the flag and the
// reason; an unknown backend is refused naming the flag.
func TestServeBackendCUDARefused(t *testing.T) {
	_, perr := gpu.Probe()
	if perr == nil {
		t.Skip("this host has a CUDA device: --backend cuda may start here (gpu's device tests exercise it)")
	}
	dir := t.TempDir()
	addrs := []string{"--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0", "--data-addr", "127.0.0.1:0", "--gossip-addr", "127.0.0.1:0"}
	var stdout, stderr bytes.Buffer
	code := run(append([]string{"serve", "--backend", "cuda", "--data-dir", dir}, addrs...), &stdout, &stderr)
	lines := strings.Split(strings.TrimSpace(stderr.String()), "\n")
	if code != 1 || len(lines) != 1 || !strings.Contains(lines[0], "--backend (or KVMESH_BACKEND): ") || !strings.Contains(lines[0], perr.Error()) {
		t.Fatalf("serve --backend cuda: exit %d, stderr %q; want exit 1 and one line naming --backend and %q", code, stderr.String(), perr)
	}
	if stdout.Len() != 0 {
		t.Fatalf("serve --backend cuda printed %q before failing", stdout.String())
	}
	stderr.Reset()
	if code := run(append([]string{"serve", "--backend", "tpu", "--data-dir", dir}, addrs...), &stdout, &stderr); code != 1 || !strings.Contains(stderr.String(), "--backend") || !strings.Contains(stderr.String(), `"tpu"`) {
		t.Fatalf("serve --backend tpu: exit %d, stderr %q; want exit 1 naming --backend", code, stderr.String())
	}
}

// TestBenchPrefillCUDARefused: bench prefill --backend cuda without CUDA or
// a device fails before measuring anything, saying why.
func TestBenchPrefillCUDARefused(t *testing.T) {
	_, perr := gpu.Probe()
	if perr == nil {
		t.Skip("this host has a CUDA device: bench prefill --backend cuda measures it")
	}
	var stdout, stderr bytes.Buffer
	if code := run([]string{"bench", "prefill", "--quick", "--backend", "cuda"}, &stdout, &stderr); code != 1 ||
		!strings.Contains(stderr.String(), "--backend cuda: "+perr.Error()) || stdout.Len() != 0 {
		t.Fatalf("bench prefill --backend cuda: exit %d, stdout %q, stderr %q; want exit 1 and %q", code, stdout.String(), stderr.String(), perr)
	}
	stderr.Reset()
	if code := run([]string{"bench", "prefill", "--backend", "tpu"}, &stdout, &stderr); code != 1 || !strings.Contains(stderr.String(), `--backend "tpu"`) {
		t.Fatalf("bench prefill --backend tpu: exit %d, stderr %q", code, stderr.String())
	}
}
