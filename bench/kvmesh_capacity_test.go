package bench

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestKvmeshClusterCapacity: the nodes a trace replay starts are bounded to
// the spec's capacity in blocks across DRAM and NVMe (--max-blocks), not
// only sized in DRAM for it. A stand-in binary records its arguments and
// exits; what kvmesh serve does with the flag is TestServeMaxBlocks's.
func TestKvmeshClusterCapacity(t *testing.T) {
	dir := t.TempDir()
	record := filepath.Join(dir, "args")
	bin := filepath.Join(dir, "kvmesh")
	script := "#!/bin/sh\necho \"$@\" >> " + record + "\nexit 3\n"
	if err := os.WriteFile(bin, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	env := &Env{Binary: bin, WorkDir: t.TempDir()}
	spec := ClusterSpec{Nodes: 1, CapacityBlocks: 1234, BlockBytes: 4096, LocalOnly: true, Namespace: TraceNamespace()}
	if _, err := KvmeshCluster(env)(context.Background(), spec); err == nil {
		t.Fatal("a node that exits at once started")
	}
	args, err := os.ReadFile(record)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(args), " --max-blocks 1234") {
		t.Fatalf("kvmesh serve ran with %q: want --max-blocks 1234", args)
	}
}
