package transfer

import (
	"os"
	"path/filepath"
	"strings"

	"github.com/Mellanox/rdmamap"
)

// Device is an RDMA device of this host, as the node advertises it in its
// membership metadata.
type Device struct {
	Name    string   `json:"name"`              // e.g. "mlx5_0"
	Ports   []string `json:"ports,omitempty"`   // port numbers, e.g. "1"
	Netdevs []string `json:"netdevs,omitempty"` // network interfaces bound to it, e.g. "ens1f0"
	Node    string   `json:"node,omitempty"`    // node GUID, as sysfs spells it
}

// RDMADevices lists the RDMA devices of this host (sysfs, through rdmamap).
// A host without any — every machine kvmesh runs on today — gets an empty
// list and no error: RDMA is an optional fast path, its absence is not a
// fault.
func RDMADevices() ([]Device, error) {
	devs := []Device{}
	for _, name := range rdmamap.GetRdmaDeviceList() {
		d := Device{Name: name, Ports: rdmamap.GetPorts(name)}
		if guid, err := os.ReadFile(filepath.Join(rdmamap.RdmaClassDir, name, rdmamap.RdmaNodeGuidFile)); err == nil {
			d.Node = strings.TrimSpace(string(guid))
		}
		d.Netdevs = netdevsOf(name)
		devs = append(devs, d)
	}
	return devs, nil
}

// netdevsOf returns the network interfaces whose RDMA device is dev.
func netdevsOf(dev string) []string {
	ifaces, err := os.ReadDir("/sys/class/net")
	if err != nil {
		return nil
	}
	var out []string
	for _, ifc := range ifaces {
		if d, err := rdmamap.GetRdmaDeviceForNetdevice(ifc.Name()); err == nil && d == dev {
			out = append(out, ifc.Name())
		}
	}
	return out
}
