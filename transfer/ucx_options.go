package transfer

import (
	"errors"
	"slices"
	"strings"
)

// ErrNoFabric means a one-sided fabric cannot run here: this build has
// none (UCX needs -tags ucx), or its library is missing or failed to start.
// A node on --transport auto reads over TCP then; on --transport ucx it
// refuses to start.
var ErrNoFabric = errors.New("transfer: fabric unavailable")

// UCXOptions configure NewUCX. UCX's own environment (UCX_TLS,
// UCX_NET_DEVICES and every other UCX_ variable) applies as UCX documents
// it; these fields, when set, take precedence over it.
type UCXOptions struct {
	// Library is the UCP library loaded at start. Default "libucp.so.0"
	// (Debian's libucx0).
	Library string
	// TLS is the transports UCX may use, in UCX_TLS's syntax ("tcp",
	// "sm", "rc,sm,self"). Default "": UCX_TLS, or UCX's choice.
	TLS string
	// NetDevices is the network devices UCX may use, in
	// UCX_NET_DEVICES's syntax ("mlx5_0:1", "eth0"). Default "":
	// UCX_NET_DEVICES, or every device.
	NetDevices string
}

// UCXInfo describes a started UCX fabric.
type UCXInfo struct {
	// Transports are the "tl/device" resources UCX opened, such as
	// "tcp/eth0", "posix/memory", "cma/memory", "rc_mlx5/mlx5_0:1".
	Transports []string
	// Version is the UCX library's ("1.13.1").
	Version string
	// CUDA reports that UCX can register CUDA memory (GPUDirect RDMA when
	// the NIC and driver allow): an HBM tier's memory could be a window.
	CUDA bool
}

// parseUCXResources returns the "tl/device" names of the resource lines
// of ucp_context_print_info's text ("#  resource 0 : md 0 dev 0 flags --
// posix/memory"), in order, without duplicates.
func parseUCXResources(info string) []string {
	var out []string
	for _, line := range strings.Split(info, "\n") {
		if !strings.Contains(line, "resource") {
			continue
		}
		_, name, ok := strings.Cut(line, "--")
		if name = strings.TrimSpace(name); !ok || !strings.Contains(name, "/") || strings.ContainsAny(name, " \t") {
			continue
		}
		if !slices.Contains(out, name) {
			out = append(out, name)
		}
	}
	return out
}

// parseUCXLanes returns the "tl/device" of each lane of ucp_ep_print_info's
// text ("#   lane[0]:  3:cma/memory.0 md[3] ..."), in order, without
// duplicates.
func parseUCXLanes(info string) []string {
	var out []string
	for _, line := range strings.Split(info, "\n") {
		_, rest, ok := strings.Cut(line, "lane[")
		if !ok {
			continue
		}
		_, rest, ok = strings.Cut(rest, ":")
		if !ok {
			continue
		}
		f := strings.Fields(rest)
		if len(f) == 0 {
			continue
		}
		name := f[0]
		if _, after, ok := strings.Cut(name, ":"); ok { // "3:cma/memory.0": resource index
			name = after
		}
		if i := strings.LastIndexByte(name, '.'); i > strings.IndexByte(name, '/') && i > 0 { // ".0": path index
			name = name[:i]
		}
		if strings.Contains(name, "/") && !slices.Contains(out, name) {
			out = append(out, name)
		}
	}
	return out
}

// Network reports whether UCX opened a network transport (tcp, verbs),
// whose endpoints detect a dead peer; UCX's shared-memory transports do
// not.
func (i UCXInfo) Network() bool {
	return slices.ContainsFunc(i.Transports, func(t string) bool { return !sharedMemoryTransport(t) })
}

// sharedMemoryTransport reports whether t ("tl/device") is one of UCX's
// same-host transports (self, sysv, posix, cma, knem, xpmem: device
// "memory"), which have no peer failure detection.
func sharedMemoryTransport(t string) bool {
	_, dev, _ := strings.Cut(t, "/")
	return strings.HasPrefix(dev, "memory")
}
