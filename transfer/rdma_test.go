package transfer

import (
	"errors"
	"net"
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

// TestUCXNetDevice: the data plane's interface maps to its RDMA device and
// port, --rdma-device overrides it, and a host without RDMA leaves UCX its
// own choice.
func TestUCXNetDevice(t *testing.T) {
	h := rdmaHost{
		devices: func() []string { return []string{"mlx5_0", "mlx5_1"} },
		ports: func(dev string) []string {
			if dev == "mlx5_1" {
				return []string{"1", "2"}
			}
			return []string{"1"}
		},
		deviceOf: func(netdev string) (string, error) {
			if netdev == "ens1f0" {
				return "mlx5_1", nil
			}
			return "", errors.New("no RDMA device")
		},
		interfaceFor: func(ip net.IP) (string, bool) {
			switch ip.String() {
			case "10.0.0.5":
				return "ens1f0", true
			case "192.168.1.9":
				return "eth0", true
			}
			return "", false
		},
	}
	for _, tc := range []struct {
		host, flag, want string
		err              bool
	}{
		{host: "10.0.0.5", want: "mlx5_1:1"},
		{host: "192.168.1.9", want: ""},
		{host: "0.0.0.0", want: ""},
		{host: "10.9.9.9", want: ""},
		{host: "10.0.0.5", flag: "mlx5_0", want: "mlx5_0:1"},
		{host: "10.0.0.5", flag: "mlx5_1:2", want: "mlx5_1:2"},
		{host: "10.0.0.5", flag: "mlx5_1:3", err: true},
		{host: "10.0.0.5", flag: "bnxt_re0", err: true},
	} {
		got, err := h.netDevice(tc.host, tc.flag)
		if got != tc.want || (err != nil) != tc.err {
			t.Errorf("data host %s, --rdma-device %q: %q, %v; want %q (error %v)", tc.host, tc.flag, got, err, tc.want, tc.err)
		}
	}
}
