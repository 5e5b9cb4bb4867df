//go:build ucx && linux && cgo

package transfer

import (
	"errors"
	"testing"

	"golang.org/x/sys/unix"
)

// TestUCXRefusesForeignDescriptors: UCX aborts the process on a worker
// address it cannot parse, so Connect hands it nothing but what an owner
// of the same UCX version packed: a descriptor of another version, or one
// that does not parse, is an error, and the process lives on.
func TestUCXRefusesForeignDescriptors(t *testing.T) {
	u, err := NewUCX(&UCXOptions{TLS: "tcp"})
	if err != nil {
		t.Fatal(err)
	}
	defer u.Close()
	mem, err := unix.Mmap(-1, 0, 1<<16, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANON)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(mem)
	reg, err := u.Register(mem)
	if err != nil {
		t.Fatal(err)
	}
	defer reg.Close()
	d, err := parseUCXDesc(reg.Descriptor())
	if err != nil {
		t.Fatal(err)
	}
	other := d
	other.version ^= 1 << 8 // another minor version
	other.worker = []byte("garbage that UCX would assert on")
	if _, err := u.Connect(encodeUCXDesc(other)); !errors.Is(err, ErrUnsupported) {
		t.Errorf("a descriptor of UCX %s: %v, want ErrUnsupported", ucxVersionString(other.version), err)
	}
	if _, err := u.Connect(reg.Descriptor()[:20]); !errors.Is(err, ErrCorrupt) {
		t.Errorf("a truncated descriptor: %v, want ErrCorrupt", err)
	}
	r, err := u.Connect(reg.Descriptor())
	if err != nil {
		t.Fatalf("the region's own descriptor: %v", err)
	}
	r.Close()
}
