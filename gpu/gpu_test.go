package gpu

import (
	"errors"
	"strings"
	"testing"
)

func TestOpenNegativeOrdinal(t *testing.T) {
	if _, err := Open(-1, Options{}); err == nil || !strings.Contains(err.Error(), "negative") {
		t.Fatalf("Open(-1) = %v, want an error about the ordinal", err)
	}
}

// TestNoGPU: on a host without a GPU (every CI machine), in either build,
// Open refuses with ErrNoCUDA or ErrNoDevice, never loading the plugin, and
// Status says the GPU features are off and why.
func TestNoGPU(t *testing.T) {
	if _, err := Probe(); err == nil {
		t.Skip("this host has a CUDA device; gpu_cuda_test.go exercises it")
	}
	_, err := Open(0, Options{Plugin: "/nonexistent/kvmesh-cuda.so"})
	if !errors.Is(err, ErrNoCUDA) && !errors.Is(err, ErrNoDevice) {
		t.Fatalf("Open without a GPU = %v, want ErrNoCUDA or ErrNoDevice", err)
	}
	if s := Status(); !strings.HasPrefix(s, "GPU features off: ") || !strings.Contains(s, "CUDA") {
		t.Fatalf("Status() = %q, want the GPU features off and why", s)
	}
}

func TestPluginDefault(t *testing.T) {
	t.Setenv("KVMESH_CUDA_PLUGIN", "/opt/x.so")
	o := Options{}
	o.EnsureDefaults()
	if o.Plugin != "/opt/x.so" {
		t.Fatalf("Plugin = %q, want $KVMESH_CUDA_PLUGIN", o.Plugin)
	}
	t.Setenv("KVMESH_CUDA_PLUGIN", "")
	o = Options{}
	o.EnsureDefaults()
	if !strings.HasSuffix(o.Plugin, "/"+PluginName) {
		t.Fatalf("Plugin = %q, want %s beside the executable", o.Plugin, PluginName)
	}
}
