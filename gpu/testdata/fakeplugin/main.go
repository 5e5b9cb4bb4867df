// Command fakeplugin stands in for cmd/kvmesh-cuda in tests on hosts without
// a GPU: a plugin with the same exported Open, which links tiers as the real
// one does but not gorgonia.org/cu, so that loading it proves a kvmesh and a
// plugin from one build fit together.
package main

import (
	"fmt"

	"github.com/kvmesh/kvmesh/gpu/gpumem"
)

// Open fails, naming the ordinal, so the caller sees the call went through.
func Open(ordinal int) (gpumem.Device, error) {
	return nil, fmt.Errorf("fakeplugin: no device %d here", ordinal)
}

func main() {}
