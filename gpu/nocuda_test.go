//go:build !cuda

package gpu

import (
	"errors"
	"strings"
	"testing"
)

func TestWithoutCUDA(t *testing.T) {
	if _, err := Probe(); !errors.Is(err, ErrNoCUDA) {
		t.Fatalf("Probe() = %v, want ErrNoCUDA", err)
	}
	if _, err := Open(0, Options{}); !errors.Is(err, ErrNoCUDA) {
		t.Fatalf("Open(0) = %v, want ErrNoCUDA", err)
	}
	if s := Status(); !strings.Contains(s, "built without CUDA") {
		t.Fatalf("Status() = %q, want it to say the build has no CUDA", s)
	}
}
