package node

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"strings"

	"github.com/kvmesh/kvmesh/transfer"
)

// The values of Options.Transport.
const (
	TransportAuto = "auto"
	TransportTCP  = "tcp"
	TransportUCX  = "ucx"
)

// fabric is what a node runs for one-sided reads (issue 36): UCX, its DRAM
// arena registered as the data plane's window, and the RMA transport its
// peers' clients read through. A node on TCP has none (nil fields) and
// says "tcp".
type fabric struct {
	fab    transfer.Fabric // UCX
	stop   func() error    // stops fab
	window *transfer.Window
	rma    *transfer.RMA
	desc   string // for members: "tcp", or "ucx 1.13.1 tcp/eth0,cma/memory"
}

// startUCX starts UCX. The node's tests replace it with an in-process
// fabric (transfer/fabrictest), to run the node's wiring without UCX.
var startUCX = func(o *transfer.UCXOptions) (transfer.Fabric, transfer.UCXInfo, func() error, error) {
	u, err := transfer.NewUCX(o)
	if err != nil {
		return nil, transfer.UCXInfo{}, nil, err
	}
	return u, u.Info(), u.Close, nil
}

// fabricChoice is what startFabric decides before it starts anything: run
// UCX or not, and why not.
func fabricChoice(mode string, tls bool, arena []byte) (start bool, why string) {
	switch {
	case mode == TransportTCP:
		return false, "--transport tcp"
	case tls:
		return false, "TLS is on and UCX moves bytes unencrypted"
	case len(arena) == 0:
		return false, "the node has no DRAM arena to expose"
	}
	return true, ""
}

// startFabric starts UCX for a node on Transport auto or ucx. Under auto,
// a UCX that cannot start leaves the node on TCP with a log line; under
// ucx it is an error naming what is missing. dataHost is the data plane's
// host (for the RDMA device); arena the DRAM tier's memory.
func startFabric(opts Options, dataHost string, arena []byte, client transfer.ClientOptions, log *slog.Logger) (*fabric, error) {
	f := &fabric{desc: TransportTCP}
	start, why := fabricChoice(opts.Cluster.Transport, opts.Security.TLS != nil, arena)
	if !start {
		if opts.Cluster.Transport == TransportUCX {
			return nil, &OptionError{Field: "Transport", Msg: "ucx: " + why}
		}
		if opts.Cluster.Transport == TransportAuto {
			log.Info("reading other nodes over TCP", "transport", opts.Cluster.Transport, "why", why)
		}
		return f, nil
	}
	uo := transfer.UCXOptions{}
	if os.Getenv("UCX_NET_DEVICES") == "" {
		dev, err := transfer.UCXNetDevice(dataHost, opts.Cluster.RDMADevice)
		if err != nil {
			return nil, &OptionError{Field: "RDMADevice", Msg: err.Error()}
		}
		uo.NetDevices = dev
	}
	u, info, stop, err := startUCX(&uo)
	if err != nil {
		if opts.Cluster.Transport == TransportAuto && errors.Is(err, transfer.ErrNoFabric) {
			log.Info("reading other nodes over TCP: UCX is not available", "transport", opts.Cluster.Transport, "err", err)
			return f, nil
		}
		return nil, fmt.Errorf("node: option Cluster.Transport %s: %w", opts.Cluster.Transport, err)
	}
	f.fab, f.stop = u, stop
	if f.window, err = transfer.Expose(u, arena); err != nil {
		f.close()
		return nil, fmt.Errorf("node: register the DRAM arena with UCX: %w", err)
	}
	ro := &transfer.RMAOptions{Client: client, SkipTCPOnly: opts.Cluster.Transport == TransportAuto, Logger: log}
	if f.rma, err = transfer.NewRMA(u, ro); err != nil {
		f.close()
		return nil, fmt.Errorf("node: UCX transport: %w", err)
	}
	f.desc = fmt.Sprintf("ucx %s %s", info.Version, strings.Join(info.Transports, ","))
	log.Info("UCX started: other nodes' DRAM blocks are read one-sidedly", "transport", opts.Cluster.Transport, "ucx", info.Version,
		"ucx_transports", info.Transports, "net_devices", envOr(uo.NetDevices, "UCX_NET_DEVICES"), "cuda_memory", info.CUDA)
	return f, nil
}

func envOr(v, name string) string {
	if v != "" {
		return v
	}
	return os.Getenv(name)
}

// close stops the fabric: the RMA transport (every peer's client closed
// and every Result released first), the window (the data plane's server
// closed first), then UCX, before the arena is unmapped: no read of the
// arena is served after.
func (f *fabric) close() {
	if f == nil {
		return
	}
	if f.rma != nil {
		if held, lost := f.rma.LandingUse(); held == lost {
			f.rma.Close()
		}
		f.rma = nil
	}
	if f.window != nil {
		f.window.Close()
		f.window = nil
	}
	if f.stop != nil {
		f.stop()
		f.fab, f.stop = nil, nil
	}
}

// dataHost is the host of a data-plane address.
func dataHost(addr string) string {
	h, _, _ := net.SplitHostPort(addr)
	return h
}
