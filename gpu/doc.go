// Package gpu is how kvmesh reaches a GPU without making its binary depend
// on one.
//
// Two features use a GPU: the HBM tier (serve --hbm, tiers.NewHBM over Open's
// device) and the prefill engine's device backend (serve --backend cuda and
// bench prefill --backend cuda, prefill.NewDevice over OpenBLAS's device,
// whose matrix products run on cuBLAS). Both consume the interfaces of the
// leaf gpu/gpumem; gpu/gputest implements them in host memory for the
// tests of the default build.
//
// The CUDA code (gpu/cudadev) uses gorgonia.org/cu, whose package init calls
// cuInit and exits the process when that fails. A Go package's init runs
// whenever the package is linked, so a binary that linked cu would die at
// start on every host without a GPU (and would not even load without
// libcuda.so.1), including `kvmesh version` and every test binary. So no
// kvmesh binary links cu. A cuda build is two files built from the same
// source and toolchain:
//
//	go build -tags cuda ./cmd/kvmesh                                  # kvmesh
//	go build -tags cuda -buildmode=plugin -o kvmesh-cuda.so ./cmd/kvmesh-cuda
//
// kvmesh built with -tags cuda uses cgo only to dlopen libcuda.so.1 and ask
// the driver how many devices there are (Probe). Only when a GPU feature is
// asked for (serve --hbm, --backend cuda) and a device is present does Open load
// kvmesh-cuda.so with the standard plugin package; cu's init then runs, and
// succeeds. On any other host the binary runs every CPU feature and says why
// the GPU ones are off (Status, printed by `kvmesh version`). The default
// build has no cgo: Probe and Open return ErrNoCUDA.
//
// The price of the plugin: kvmesh and kvmesh-cuda.so must come from one
// build (same module versions, toolchain and flags), or plugin.Open refuses
// the pair with an error that says so; CI builds both and loads a stand-in
// plugin through the same code to prove the pair links. To keep that pair
// small, the plugin imports of kvmesh only the leaf gpu/gpumem, where the
// interfaces it implements are declared (not tiers, with pebble behind it). A separate
// kvmesh-gpu binary would avoid that, but it would still exit at start
// without a device, which is what this package exists to prevent.
//
// What is verified where: CI compiles and vets all of it against Debian's
// CUDA 11.8 toolkit on machines without a GPU. Nothing of gpu/cudadev has
// run on a GPU yet; the tests that exercise it (cuda_test.go: HBM round
// trips, cuBLAS products against gonum's, the device backend's logits against
// the CPU backend's) skip, saying so, where Probe finds no device.
package gpu
