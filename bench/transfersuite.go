package bench

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/kvmesh/kvmesh/transfer"
	"github.com/kvmesh/kvmesh/transfer/transfertest"
)

// MooncakeTETCPGBps is the Mooncake Transfer Engine's TCP transport reading
// 1 MiB blocks on loopback, built and run on these machines (DESIGN.md). It
// is a recorded figure, not measured by the bench.
const MooncakeTETCPGBps = 1.44

// TransferOptions configures the transfer suite. Zero fields take the
// defaults documented on each, for a full run or for --quick.
type TransferOptions struct {
	// BlockSizes are the value sizes in bytes. Default 64 KiB, 1 MiB and
	// 4 MiB.
	BlockSizes []int
	// Conns lists the TCP client's connection counts (that many Gets of a
	// batch each, at once). Default 1, 2 and 4; quick 1 and 4.
	Conns []int
	// Batches is the number of timed batches per path and block size.
	// Default 40; quick 8.
	Batches int
	// BatchBytes is what one batch moves. Default 16 MiB.
	BatchBytes int
	// SourceBytes is the distinct memory the values cycle through. Default
	// 64 MiB.
	SourceBytes int
	// TLSBlockSizes are the block sizes at which the TLS paths also run
	// (what TLS costs: the TCP client over mutual TLS 1.3, and a raw TLS
	// stream). Default 1 MiB and 4 MiB; quick 1 MiB. A size not in
	// BlockSizes is ignored.
	TLSBlockSizes []int
	// Transport "ucx" measures the one-sided path instead (issue 36):
	// kvmesh-ucx beside kvmesh-tcp and ucx_perftest -t ucp_get, over each
	// of UCXTransports. Default "tcp": the TCP, shared-memory and TLS
	// paths.
	Transport string
	// UCXTransports are the UCX_TLS values Transport "ucx" runs over.
	// Default tcp and sm.
	UCXTransports []string
	// PerftestIters is how many gets ucx_perftest times per size.
	// Default 2000; quick 300.
	PerftestIters int
}

// EnsureDefaults fills zero fields with their defaults for a full run, or
// for --quick when quick is set.
func (o *TransferOptions) EnsureDefaults(quick bool) {
	if len(o.BlockSizes) == 0 {
		o.BlockSizes = []int{64 << 10, 1 << 20, 4 << 20}
	}
	if len(o.Conns) == 0 {
		o.Conns = pick(quick, []int{1, 2, 4}, []int{1, 4})
	}
	if o.Batches == 0 {
		o.Batches = pick(quick, 40, 8)
	}
	if o.BatchBytes == 0 {
		o.BatchBytes = transfertest.DefaultTestbedBatch
	}
	if o.SourceBytes == 0 {
		o.SourceBytes = transfertest.DefaultTestbedSource
	}
	if o.TLSBlockSizes == nil {
		o.TLSBlockSizes = pick(quick, []int{1 << 20, 4 << 20}, []int{1 << 20})
	}
	if o.Transport == "" {
		o.Transport = "tcp"
	}
	if len(o.UCXTransports) == 0 {
		o.UCXTransports = []string{"tcp", "sm"}
	}
	if o.PerftestIters == 0 {
		o.PerftestIters = pick(quick, 2000, 300)
	}
}

// Validate names the first field that is out of range.
func (o *TransferOptions) Validate() error {
	if o.Transport != "tcp" && o.Transport != "ucx" {
		return fmt.Errorf("bench: transfer: transport %q: want tcp or ucx", o.Transport)
	}
	for _, c := range o.Conns {
		if c < 1 || c > 64 {
			return fmt.Errorf("bench: transfer: conns %d is outside 1..64", c)
		}
	}
	if o.Batches < 1 || o.Batches > 1<<16 {
		return fmt.Errorf("bench: transfer: batches %d is outside 1..65536", o.Batches)
	}
	for _, b := range o.BlockSizes {
		to := transfertest.TestbedOptions{ValueBytes: b, BatchBytes: o.BatchBytes, SourceBytes: o.SourceBytes}
		if err := to.Validate(); err != nil {
			return fmt.Errorf("bench: transfer: %w", err)
		}
	}
	return nil
}

// TransferSuite measures the data plane (package transfer) with the loops
// of its own benchmarks (transfertest.Testbed, transfertest.Interleave): the TCP
// client fetching batches of blocks from a server over loopback, next to a
// raw TCP stream of the same bytes, and the shared-memory client next to
// copy() of the same values, all paths interleaved batch by batch in one
// process so that they share the machine's noise. Each figure is the
// median batch.
type TransferSuite struct {
	Options TransferOptions
}

// Name returns "transfer".
func (s *TransferSuite) Name() string { return "transfer" }

// transferRow is one path at one block size.
type transferRow struct {
	BlockBytes int     `json:"block_bytes"`
	Path       string  `json:"path"`
	Conns      int     `json:"conns"`
	GBps       float64 `json:"gbps"`
	// RatioVsRawTCP is GBps over the raw stream (one connection) in the
	// same run, for the TCP client.
	RatioVsRawTCP *float64 `json:"ratio_vs_raw_tcp,omitempty"`
	// RatioVsMooncakeTETCP is GBps over MooncakeTETCPGBps, for the TCP
	// client at 1 MiB (the size that figure was measured at).
	RatioVsMooncakeTETCP *float64 `json:"ratio_vs_mooncake_te_tcp,omitempty"`
	// RatioVsMemcpy is GBps over copy() of the same values in the same run,
	// for the shared-memory client.
	RatioVsMemcpy *float64 `json:"ratio_vs_memcpy,omitempty"`
	// RatioVsPlain is what TLS leaves of the throughput: kvmesh-tls over
	// kvmesh-tcp (one connection each), raw-tls over raw-tcp.
	RatioVsPlain *float64 `json:"ratio_vs_plain,omitempty"`
	// RatioVsRawTLS is kvmesh-tls over a bare crypto/tls stream of the same
	// bytes: how close the data plane runs to crypto/tls's own ceiling.
	RatioVsRawTLS *float64 `json:"ratio_vs_raw_tls,omitempty"`
	// UCXTLS is the UCX_TLS of the --transport ucx rows.
	UCXTLS string `json:"ucx_tls,omitempty"`
	// RatioVsUCXPerftest is kvmesh-ucx over ucx_perftest -t ucp_get at
	// the same size and UCX_TLS in the same run; RatioVsKvmeshTCP,
	// kvmesh-ucx over kvmesh's TCP path, interleaved with it.
	RatioVsUCXPerftest *float64 `json:"ratio_vs_ucx_perftest,omitempty"`
	RatioVsKvmeshTCP   *float64 `json:"ratio_vs_kvmesh_tcp,omitempty"`
	Batches            int      `json:"batches" table:"-"`
	BatchBytes         int64    `json:"batch_bytes" table:"-"`
	MinBatchS          float64  `json:"min_batch_s" table:"-"`
	MaxBatchS          float64  `json:"max_batch_s" table:"-"`
}

// Run measures.
func (s *TransferSuite) Run(ctx context.Context, env *Env) (*Result, error) {
	o := s.Options
	o.EnsureDefaults(env.Quick)
	if err := o.Validate(); err != nil {
		return nil, err
	}
	res := &Result{Suite: s.Name()}
	bar := env.Progress.Bar(int64(len(o.BlockSizes)*o.Batches), "transfer")
	defer bar.Finish()
	if o.Transport == "ucx" {
		return s.runUCX(ctx, o, res, bar)
	}
	var rows []transferRow
	shmSkipped := false
	var tlsPair *[2]*tls.Config
	if len(o.TLSBlockSizes) > 0 {
		srv, cli, err := benchTLS(env.WorkDir)
		if err != nil {
			return res, err
		}
		tlsPair = &[2]*tls.Config{srv, cli}
	}
	for _, b := range o.BlockSizes {
		bar.Describe("transfer: " + formatBytes(float64(b)))
		var tp *[2]*tls.Config
		if slices.Contains(o.TLSBlockSizes, b) {
			tp = tlsPair
		}
		got, shmErr, err := transferAt(ctx, o, b, tp, bar)
		if err != nil {
			return res, err
		}
		if shmErr != nil && !shmSkipped {
			res.Skip("kvmesh-shm", shmErr)
			shmSkipped = true
		}
		rows = append(rows, got...)
	}
	res.AddTable("transfer", fmt.Sprintf("batches of %s of blocks, client and server in this process on loopback, paths interleaved; "+
		"kvmesh-tcp is transfer.Client.Get from a transfer.Server (N connections: N Gets at once), raw-tcp one Go TCP stream of the same bytes, "+
		"kvmesh-shm transfer.ShmClient.Get, memcpy copy() of the batch's values; kvmesh-tls is kvmesh-tcp over mutual TLS 1.3 (ECDSA P-256 certificates, "+
		"handshakes before the timed batches), raw-tls the raw stream through crypto/tls", formatBytes(float64(o.BatchBytes))), rows)
	for _, r := range rows {
		if r.BlockBytes != 1<<20 || r.Conns != 1 {
			continue
		}
		switch r.Path {
		case "kvmesh-tcp":
			if r.RatioVsRawTCP != nil {
				res.Checks = append(res.Checks, NewCheck("transfer: 1 MiB blocks vs a raw TCP stream", "ratio_vs_raw_tcp", *r.RatioVsRawTCP, ">=", 0.85, BackendKvmesh))
			}
			res.Checks = append(res.Checks, NewCheck("transfer: 1 MiB blocks vs Mooncake TE's TCP transport (1.44 GB/s, recorded)",
				"ratio_vs_mooncake_te_tcp", *r.RatioVsMooncakeTETCP, ">=", 2, BackendKvmesh))
		}
	}
	res.Note("ratio_vs_mooncake_te_tcp divides by a recorded figure (%.2f GB/s: Mooncake's Transfer Engine over TCP, built and run on loopback on this kind of machine), not one measured in this run.", MooncakeTETCPGBps)
	for _, r := range rows {
		if r.Path == "kvmesh-tls" && r.RatioVsPlain != nil && r.RatioVsRawTLS != nil {
			res.Note("TLS at %s: the data plane keeps %.2f of its plain-TCP throughput, at %.2f of a bare crypto/tls stream of the same bytes.",
				formatBytes(float64(r.BlockBytes)), *r.RatioVsPlain, *r.RatioVsRawTLS)
		}
	}
	series := transferSeries(rows)
	if err := SavePlot(env, res, "transfer_throughput_vs_block_size",
		ThroughputPlot(vsTitle("transfer: data plane", series), series...)); err != nil {
		return res, err
	}
	return res, nil
}

// transferAt measures every path at block size b. A shared-memory path
// that cannot run here is left out and its error returned as shmErr.
//
// With tp (server and client TLS configurations), it also measures the TCP
// client over TLS ("tls") and the raw stream over TLS ("rawtls").
func transferAt(ctx context.Context, o TransferOptions, b int, tp *[2]*tls.Config, bar Bar) (rows []transferRow, shmErr, err error) {
	tb, err := transfertest.NewTestbed(transfertest.TestbedOptions{ValueBytes: b, BatchBytes: o.BatchBytes, SourceBytes: o.SourceBytes})
	if err != nil {
		return nil, nil, err
	}
	defer tb.Close()
	raw, err := tb.Raw(true)
	if err != nil {
		return nil, nil, err
	}
	paths := []transfertest.Path{raw}
	conns := map[string]int{raw.Name: 1}
	for _, c := range o.Conns {
		p, err := tb.TCP(c)
		if err != nil {
			return nil, nil, err
		}
		paths = append(paths, p)
		conns[p.Name] = c
	}
	if p, err := tb.Shm(); err == nil {
		paths = append(paths, p)
		conns[p.Name] = 1
	} else if errors.Is(err, transfer.ErrUnsupported) {
		shmErr = fmt.Errorf("%w: %w", ErrMissing, err)
	} else {
		return nil, nil, err
	}
	cp := tb.Copy()
	paths = append(paths, cp)
	conns[cp.Name] = 1
	if tp != nil {
		rawTLS, err := tb.RawTLS(true, tp[0], tp[1])
		if err != nil {
			return nil, nil, err
		}
		tcpTLS, err := tb.TCPWith("tls", 1, &transfer.ServerOptions{TLS: tp[0]}, &transfer.ClientOptions{TLS: tp[1]})
		if err != nil {
			return nil, nil, err
		}
		paths = append(paths, rawTLS, tcpTLS)
		conns[rawTLS.Name], conns[tcpTLS.Name] = 1, 1
	}
	results, err := transfertest.Interleave(ctx, paths, o.Batches, func(int) { bar.Add(1) })
	if err != nil {
		return nil, shmErr, err
	}
	by := map[string]float64{}
	for _, r := range results {
		by[r.Name] = r.MedianGBps
	}
	for _, r := range results {
		row := transferRow{BlockBytes: b, Path: transferPathName(r.Name), Conns: conns[r.Name], GBps: r.MedianGBps,
			Batches: r.Batches, BatchBytes: r.BytesPerMove, MinBatchS: r.MinSeconds, MaxBatchS: r.MaxSeconds}
		switch {
		case strings.HasPrefix(r.Name, "tcp"):
			row.RatioVsRawTCP = Ratio(r.MedianGBps, by["raw"])
			if b == 1<<20 {
				row.RatioVsMooncakeTETCP = Ratio(r.MedianGBps, MooncakeTETCPGBps)
			}
		case r.Name == "shm":
			row.RatioVsMemcpy = Ratio(r.MedianGBps, by["copy"])
		case r.Name == "tls":
			row.RatioVsPlain = Ratio(r.MedianGBps, by["tcp"])
			row.RatioVsRawTLS = Ratio(r.MedianGBps, by["rawtls"])
		case r.Name == "rawtls":
			row.RatioVsPlain = Ratio(r.MedianGBps, by["raw"])
		}
		rows = append(rows, row)
	}
	return rows, shmErr, nil
}

// transferPathName names transfer's paths in the report.
func transferPathName(name string) string {
	switch {
	case name == "raw":
		return "raw-tcp"
	case name == "copy":
		return "memcpy"
	case name == "shm":
		return "kvmesh-shm"
	case name == "tls":
		return "kvmesh-tls"
	case name == "rawtls":
		return "raw-tls"
	case strings.HasPrefix(name, "tcp"):
		return "kvmesh-tcp"
	}
	return name
}

// transferSeries returns one plot series per path and connection count:
// kvmesh solid, the limits dashed.
func transferSeries(rows []transferRow) []Series {
	return GroupSeries(rows, func(r transferRow) (string, bool, bool, float64, float64) {
		name := r.Path
		if r.Path == "kvmesh-tcp" {
			name = fmt.Sprintf("kvmesh-tcp ×%d", r.Conns)
		}
		return name, !strings.HasPrefix(r.Path, "kvmesh"), false, float64(r.BlockBytes), r.GBps
	})
}

// runUCX is Run for Transport "ucx".
func (s *TransferSuite) runUCX(ctx context.Context, o TransferOptions, res *Result, bar Bar) (*Result, error) {
	rows, err := transferUCX(ctx, o, res, bar)
	if len(rows) > 0 {
		res.AddTable("transfer_ucx", fmt.Sprintf("batches of %s of blocks: kvmesh-ucx is transfer.RMAClient.Get (a lease over TCP, then one ucp_get_nbx per block "+
			"from the owner's registered window into a registered landing region, the lease ended), owner and reader two UCX workers of this process; "+
			"kvmesh-tcp transfer.Client.Get of the same blocks, interleaved batch by batch; ucx_perftest -t ucp_get between two processes, same size, "+
			"same UCX_TLS, one get at a time", formatBytes(float64(o.BatchBytes))), rows)
	}
	for _, r := range rows {
		if r.Path == "kvmesh-ucx" && r.BlockBytes == 1<<20 && r.RatioVsUCXPerftest != nil {
			res.Checks = append(res.Checks, NewCheck("transfer: kvmesh-ucx vs ucx_perftest at 1 MiB over UCX_TLS="+r.UCXTLS,
				"ratio_vs_ucx_perftest", *r.RatioVsUCXPerftest, ">=", 0.8, BackendKvmesh))
		}
	}
	res.Note("UCX over tcp emulates one-sided gets with active messages answered by the owner's worker; over sm, UCX 1.13 reads memory it did not " +
		"allocate (a registered DRAM arena) with the same emulation over shared-memory queues, while ucx_perftest's buffers are allocated by UCX " +
		"(sysv/posix segments the reader maps and copies from). RDMA verbs (what UCX is for) never ran here: no RDMA NIC.")
	res.Note("reference, not measured: Mooncake's Transfer Engine reads %d GB/s over RDMA (4 NICs of 200 Gbps, its published figure).", MooncakeRDMAGBps)
	return res, err
}
