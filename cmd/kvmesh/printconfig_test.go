package main

import (
	"bytes"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/spf13/cobra"

	"github.com/kvmesh/kvmesh/node"
)

// printConfigOut runs kvmesh serve --print-config with args and env and
// returns what it printed; it fails the test if the node would have run.
func printConfigOut(t *testing.T, env map[string]string, args ...string) (string, error) {
	t.Helper()
	for k, v := range env {
		t.Setenv(k, v)
	}
	c := newServeCmd(func(*cobra.Command, node.Options, *slog.Logger) error {
		t.Error("--print-config ran the node")
		return nil
	})
	var out bytes.Buffer
	c.SetArgs(append([]string{"--print-config"}, args...))
	c.SetOut(&out)
	c.SetErr(new(bytes.Buffer))
	c.SilenceErrors, c.SilenceUsage = true, true
	err := c.Execute()
	return out.String(), err
}

// TestPrintConfig checks that each value is shown with its source, and that
// the output is a config file that gives the same options.
func TestPrintConfig(t *testing.T) {
	cfg := filepath.Join(t.TempDir(), "kvmesh.yaml")
	os.WriteFile(cfg, []byte("dram: 2GiB\nnvme: 20GiB\njoin: [10.0.0.1:7603, 10.0.0.2:7603]\nshm-socket: \"off\"\n"), 0o644)
	out, err := printConfigOut(t, map[string]string{"KVMESH_NVME": "30GiB", "KVMESH_CONFIG": cfg}, "--grpc-addr", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		`dram: "2GiB" # config file ` + cfg + `: dram`,
		`nvme: "30GiB" # env KVMESH_NVME`,
		`grpc-addr: "127.0.0.1:0" # flag --grpc-addr`,
		`http-addr: "127.0.0.1:7601" # default`,
		`join: ["10.0.0.1:7603", "10.0.0.2:7603"] # config file`,
		`shm-socket: "off" # config file`,
	} {
		// Keys are padded to one column: compare with single spaces.
		if !strings.Contains(strings.Join(strings.Fields(out), " "), want) {
			t.Errorf("--print-config lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "print-config:") || strings.Contains(out, "\nconfig:") {
		t.Errorf("--print-config prints itself or --config:\n%s", out)
	}

	// Read back as the only source, the output gives the same options.
	again := filepath.Join(t.TempDir(), "again.yaml")
	os.WriteFile(again, []byte(out), 0o644)
	first, err := serveOptions(t, map[string]string{"KVMESH_CONFIG": cfg}, "--grpc-addr", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Setenv("KVMESH_NVME", "")
	os.Unsetenv("KVMESH_NVME")
	t.Setenv("KVMESH_CONFIG", again)
	second, err := serveOptions(t, nil)
	if err != nil {
		t.Fatalf("serve --config <--print-config's output>: %v", err)
	}
	if first.Tiers.DRAMBytes != second.Tiers.DRAMBytes || second.Tiers.NVMeBytes != 30<<30 || strings.Join(first.Cluster.Join, ",") != strings.Join(second.Cluster.Join, ",") ||
		first.Listen.GRPCAddr != second.Listen.GRPCAddr || first.Listen.ShmSocket != second.Listen.ShmSocket || first.Limits.RequestTimeout != second.Limits.RequestTimeout {
		t.Errorf("options from the printed config differ:\n%+v\n%+v", first, second)
	}
}

// A configuration that serve refuses is refused by --print-config too,
// with the same message.
func TestPrintConfigRefuses(t *testing.T) {
	_, err := printConfigOut(t, map[string]string{"KVMESH_REPLICAS": "9"})
	if err == nil || !strings.Contains(err.Error(), "KVMESH_REPLICAS") {
		t.Errorf("--print-config with KVMESH_REPLICAS=9: %v; want a refusal naming KVMESH_REPLICAS", err)
	}
}
