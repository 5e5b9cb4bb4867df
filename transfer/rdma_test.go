package transfer

import (
	"os"
	"testing"
)

// No machine here has an RDMA NIC: discovery must say so with an empty
// list, not an error.
func TestRDMADevices(t *testing.T) {
	devs, err := RDMADevices()
	if err != nil {
		t.Fatalf("RDMADevices: %v", err)
	}
	if devs == nil {
		t.Fatal("RDMADevices returned nil; want an empty list")
	}
	if _, err := os.Stat("/sys/class/infiniband"); os.IsNotExist(err) && len(devs) != 0 {
		t.Fatalf("no /sys/class/infiniband, yet %d devices", len(devs))
	}
	for _, d := range devs {
		if d.Name == "" {
			t.Fatalf("device without a name: %+v", d)
		}
	}
}
