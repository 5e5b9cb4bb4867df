//go:build cuda

package gpu

/*
#cgo LDFLAGS: -ldl
#include <dlfcn.h>
#include <stddef.h>

typedef int (*cuInit_t)(unsigned int);
typedef int (*cuCount_t)(int *);
typedef int (*cuErrName_t)(int, const char **);

// probe asks the driver, loaded at run time so that the binary does not
// need it to start, how many devices it has. It returns -1 if libcuda
// cannot be loaded (dlerror in *msg), else the CUresult of the first call
// that failed (its name in *msg) or 0.
static int probe(int *count, int *version, const char **msg) {
	void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
	if (lib == NULL) {
		*msg = dlerror();
		return -1;
	}
	cuInit_t init = (cuInit_t)dlsym(lib, "cuInit");
	cuCount_t count_fn = (cuCount_t)dlsym(lib, "cuDeviceGetCount");
	cuCount_t version_fn = (cuCount_t)dlsym(lib, "cuDriverGetVersion");
	cuErrName_t name = (cuErrName_t)dlsym(lib, "cuGetErrorName");
	if (init == NULL || count_fn == NULL || version_fn == NULL) {
		*msg = "libcuda.so.1 lacks cuInit, cuDeviceGetCount or cuDriverGetVersion";
		return -1;
	}
	int r = version_fn(version);
	if (r == 0) r = init(0);
	if (r == 0) r = count_fn(count);
	if (r != 0 && name != NULL) name(r, msg);
	return r;
}
*/
import "C"

import (
	"fmt"
	"sync"
)

var probed = sync.OnceValues(func() (Info, error) {
	var count, version C.int
	var msg *C.char
	r := C.probe(&count, &version, &msg)
	switch {
	case r == -1:
		return Info{}, fmt.Errorf("%w: the CUDA driver cannot be loaded: %s", ErrNoDevice, C.GoString(msg))
	case r != 0:
		name := fmt.Sprintf("CUresult %d", int(r))
		if msg != nil {
			name = C.GoString(msg)
		}
		return Info{Driver: int(version)}, fmt.Errorf("%w: the CUDA driver (API %d.%d) says %s", ErrNoDevice, version/1000, version%1000/10, name)
	case count == 0:
		return Info{Driver: int(version)}, fmt.Errorf("%w: the CUDA driver found none", ErrNoDevice)
	}
	return Info{Devices: int(count), Driver: int(version)}, nil
})

// Probe loads the CUDA driver (libcuda.so.1) if it is installed and reports
// its devices; ErrNoDevice, with the driver's reason, when there are none.
// The answer is computed once per process.
func Probe() (Info, error) { return probed() }
