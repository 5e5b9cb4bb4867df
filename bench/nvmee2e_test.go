package bench

import (
	"context"
	"errors"
	"testing"
	"time"
)

// TestNVMeEndToEnd runs the end-to-end row's load (puts, then Gets of whole
// prompts with every byte checked) against an in-process node, and checks
// that a cluster given with --addr is skipped, not measured.
func TestNVMeEndToEnd(t *testing.T) {
	addr := inProcessNode(t)
	o := NVMeOptions{DataBytes: 32 << 20, ReadTime: 50 * time.Millisecond}
	gbps, err := nvmeEndToEndAt(context.Background(), addr, o)
	if err != nil || gbps <= 0 {
		t.Fatalf("%v GB/s, %v", gbps, err)
	}
	if _, err := nvmeEndToEnd(context.Background(), &Env{Addrs: []string{addr}}, o); !errors.Is(err, ErrMissing) {
		t.Fatalf("with --addr: %v, want ErrMissing", err)
	}
	if _, err := nvmeEndToEnd(context.Background(), &Env{}, o); !errors.Is(err, ErrNoBinary) {
		t.Fatalf("without a binary: %v, want ErrNoBinary", err)
	}
}
