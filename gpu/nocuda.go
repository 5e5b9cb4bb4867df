//go:build !cuda

package gpu

// Probe returns ErrNoCUDA: this build has no CUDA.
func Probe() (Info, error) { return Info{}, ErrNoCUDA }

func load(string) (openFunc, error) { return nil, ErrNoCUDA }
