package transfer

import (
	"fmt"
	"net"
	"slices"
	"strings"

	"github.com/Mellanox/rdmamap"
)

// UCXNetDevice returns what a node hands UCX as UCX_NET_DEVICES: the RDMA
// device and port ("mlx5_0:1") that carry its data plane. rdmaDevice, when
// set ("mlx5_0", or "mlx5_0:1" with the port), names it; else it is the
// RDMA device bound to the network interface that holds dataHost, the
// data plane's IP (rdmamap). It returns "" (UCX's own choice) when the
// data plane listens on every interface or its interface has no RDMA
// device, and an error for an rdmaDevice the host does not have.
func UCXNetDevice(dataHost, rdmaDevice string) (string, error) {
	return sysRDMA.netDevice(dataHost, rdmaDevice)
}

// rdmaHost is how UCXNetDevice sees the host: rdmamap and the network
// interfaces, replaced in tests.
type rdmaHost struct {
	devices      func() []string
	ports        func(dev string) []string
	deviceOf     func(netdev string) (string, error)
	interfaceFor func(ip net.IP) (string, bool)
}

var sysRDMA = rdmaHost{
	devices:  rdmamap.GetRdmaDeviceList,
	ports:    rdmamap.GetPorts,
	deviceOf: rdmamap.GetRdmaDeviceForNetdevice,
	interfaceFor: func(ip net.IP) (string, bool) {
		ifaces, err := net.Interfaces()
		if err != nil {
			return "", false
		}
		for _, ifc := range ifaces {
			addrs, err := ifc.Addrs()
			if err != nil {
				continue
			}
			for _, a := range addrs {
				if n, ok := a.(*net.IPNet); ok && n.IP.Equal(ip) {
					return ifc.Name, true
				}
			}
		}
		return "", false
	},
}

func (h rdmaHost) netDevice(dataHost, rdmaDevice string) (string, error) {
	if rdmaDevice != "" {
		dev, port, hasPort := strings.Cut(rdmaDevice, ":")
		if !slices.Contains(h.devices(), dev) {
			return "", fmt.Errorf("transfer: RDMA device %q: this host has %v", dev, h.devices())
		}
		ports := h.ports(dev)
		switch {
		case hasPort && !slices.Contains(ports, port):
			return "", fmt.Errorf("transfer: RDMA device %s has no port %s (ports %v)", dev, port, ports)
		case hasPort:
			return rdmaDevice, nil
		case len(ports) == 0:
			return "", fmt.Errorf("transfer: RDMA device %s has no port", dev)
		}
		return dev + ":" + ports[0], nil
	}
	ip := net.ParseIP(dataHost)
	if ip == nil || ip.IsUnspecified() {
		return "", nil
	}
	ifc, ok := h.interfaceFor(ip)
	if !ok {
		return "", nil
	}
	dev, err := h.deviceOf(ifc)
	if err != nil || dev == "" {
		return "", nil // an interface without RDMA: UCX's choice (tcp)
	}
	if ports := h.ports(dev); len(ports) > 0 {
		return dev + ":" + ports[0], nil
	}
	return "", nil
}
