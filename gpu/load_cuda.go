//go:build cuda

package gpu

import (
	"fmt"
	"plugin"
)

// load opens the CUDA plugin at path and returns its Open. Loading runs the
// plugin's package inits, cu's cuInit among them: callers probe first.
func load(path string) (openFunc, error) {
	p, err := plugin.Open(path)
	if err != nil {
		return nil, fmt.Errorf("gpu: load the CUDA plugin %s (build it with go build -tags cuda -buildmode=plugin -o %s ./cmd/kvmesh-cuda, from the same source and toolchain as this binary, or name it with $KVMESH_CUDA_PLUGIN): %w", path, PluginName, err)
	}
	sym, err := p.Lookup("Open")
	if err != nil {
		return nil, fmt.Errorf("gpu: CUDA plugin %s: %w", path, err)
	}
	open, ok := sym.(openFunc)
	if !ok {
		return nil, fmt.Errorf("gpu: CUDA plugin %s: Open is a %T, want %T", path, sym, openFunc(nil))
	}
	return open, nil
}
