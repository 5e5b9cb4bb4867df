package node

import (
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// pythonWithGRPC returns a Python interpreter that can import grpc, or
// skips the test saying how to get one.
func pythonWithGRPC(t *testing.T) string {
	t.Helper()
	for _, py := range []string{"python3", "/usr/bin/python3"} {
		path, err := exec.LookPath(py)
		if err != nil {
			continue
		}
		if exec.Command(path, "-c", "import grpc, google.protobuf").Run() == nil {
			return path
		}
	}
	t.Skip("no python3 with grpcio on PATH or at /usr/bin/python3: apt-get install python3-grpcio (.ci/run does)")
	return ""
}

// TestPythonClient runs clients/python/example.py against a node: it puts
// blocks, looks the prompt up and reads the blocks back.
func TestPythonClient(t *testing.T) {
	py := pythonWithGRPC(t)
	tn := startNode(t, func(o *Options) { o.Limits.MaxBlockBytes = 1 << 20 })
	out, err := exec.Command(py, filepath.Join("..", "clients", "python", "example.py"), "--addr", tn.GRPCAddr()).CombinedOutput()
	if err != nil {
		t.Fatalf("example.py: %v\n%s", err, out)
	}
	for _, want := range []string{"stored 2 blocks of 8192 bytes", "cached 32 of 45 tokens (2 blocks, first on " + tn.ID() + ")", "read back 32 tokens through gRPC: KV matches"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("example.py output lacks %q:\n%s", want, out)
		}
	}
}
