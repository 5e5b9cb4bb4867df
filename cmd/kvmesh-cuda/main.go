//go:build cuda

// Command kvmesh-cuda is the CUDA half of a kvmesh built with -tags cuda,
// built as a plugin from the same source and toolchain:
//
//	go build -tags cuda -buildmode=plugin -o kvmesh-cuda.so ./cmd/kvmesh-cuda
//
// Package gpu loads it only after the driver reported a device, because
// loading it runs gorgonia.org/cu's init, which exits the process on a host
// without one. Built as an ordinary program it does nothing.
package main

import (
	"github.com/kvmesh/kvmesh/gpu/cudadev"
	"github.com/kvmesh/kvmesh/gpu/gpumem"
)

// Open is the symbol package gpu looks up.
func Open(ordinal int) (gpumem.Device, error) {
	d, err := cudadev.Open(ordinal)
	if err != nil {
		return nil, err
	}
	return d, nil
}

func main() {}
