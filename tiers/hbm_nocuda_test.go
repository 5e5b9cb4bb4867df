//go:build !cuda

package tiers

import (
	"errors"
	"testing"
)

func TestNewHBMWithoutCUDA(t *testing.T) {
	h, err := NewHBM(HBMOptions{Capacity: 1 << 30})
	if !errors.Is(err, ErrNoCUDA) || h != nil {
		t.Fatalf("NewHBM without cuda = %v, %v; want nil, ErrNoCUDA", h, err)
	}
}
