package bench

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"time"

	"github.com/kvmesh/kvmesh/transfer"
	"github.com/kvmesh/kvmesh/transfer/transfertest"
)

// MooncakeRDMAGBps is the Mooncake Transfer Engine's published RDMA
// figure (87 GB/s over 4×200 Gbps NICs; 190 GB/s over 8×400 Gbps): what
// the hardware UCX's verbs transport is for reaches. A recorded figure,
// never measured here: no machine here has an RDMA NIC.
const MooncakeRDMAGBps = 87

// transferUCX measures the one-sided path (kvmesh-ucx: an RMAClient reading
// a window through UCX, owner and reader two UCX workers of this process)
// beside kvmesh's TCP path at each block size, interleaved, and
// ucx_perftest's ucp_get between two processes at the same size over the
// same UCX_TLS, for each of o.UCXTransports.
func transferUCX(ctx context.Context, o TransferOptions, res *Result, bar Bar) ([]transferRow, error) {
	var rows []transferRow
	for _, tls := range o.UCXTransports {
		owner, err := transfer.NewUCX(&transfer.UCXOptions{TLS: tls})
		if err != nil {
			res.Skip("kvmesh-ucx ("+tls+")", fmt.Errorf("%w: %w", ErrMissing, err))
			continue
		}
		reader, err := transfer.NewUCX(&transfer.UCXOptions{TLS: tls})
		if err != nil {
			owner.Close()
			return rows, err
		}
		got, err := transferUCXAt(ctx, o, tls, owner, reader, res, bar)
		reader.Close()
		owner.Close()
		if err != nil {
			return rows, err
		}
		rows = append(rows, got...)
	}
	return rows, nil
}

func transferUCXAt(ctx context.Context, o TransferOptions, tls string, owner, reader *transfer.UCX, res *Result, bar Bar) ([]transferRow, error) {
	var rows []transferRow
	for _, b := range o.BlockSizes {
		bar.Describe(fmt.Sprintf("transfer: ucx %s %s", tls, formatBytes(float64(b))))
		tb, err := transfertest.NewTestbed(transfertest.TestbedOptions{ValueBytes: b, BatchBytes: o.BatchBytes, SourceBytes: o.SourceBytes})
		if err != nil {
			return rows, err
		}
		ucx, err := tb.RMA("ucx", owner, reader)
		if err != nil {
			tb.Close()
			return rows, fmt.Errorf("bench: transfer: the UCX path over %s: %w", tls, err)
		}
		tcp, err := tb.TCP(1)
		if err != nil {
			tb.Close()
			return rows, err
		}
		results, err := transfertest.Interleave(ctx, []transfertest.Path{ucx, tcp}, o.Batches, func(int) { bar.Add(1) })
		tb.Close()
		if err != nil {
			return rows, err
		}
		by := map[string]transfertest.PathResult{}
		for _, r := range results {
			by[r.Name] = r
		}
		perf, perr := ucxPerftest(ctx, tls, b, o.PerftestIters)
		if perr != nil {
			res.Skip(fmt.Sprintf("ucx_perftest (%s, %s)", tls, formatBytes(float64(b))), perr)
		}
		u, t := by["ucx"], by["tcp"]
		row := transferRow{BlockBytes: b, Path: "kvmesh-ucx", UCXTLS: tls, Conns: 1, GBps: u.MedianGBps, RatioVsKvmeshTCP: Ratio(u.MedianGBps, t.MedianGBps),
			Batches: u.Batches, BatchBytes: u.BytesPerMove, MinBatchS: u.MinSeconds, MaxBatchS: u.MaxSeconds}
		if perr == nil {
			row.RatioVsUCXPerftest = Ratio(u.MedianGBps, perf)
		}
		rows = append(rows, row, transferRow{BlockBytes: b, Path: "kvmesh-tcp", UCXTLS: tls, Conns: 1, GBps: t.MedianGBps,
			Batches: t.Batches, BatchBytes: t.BytesPerMove, MinBatchS: t.MinSeconds, MaxBatchS: t.MaxSeconds})
		if perr == nil {
			rows = append(rows, transferRow{BlockBytes: b, Path: "ucx_perftest", UCXTLS: tls, Conns: 1, GBps: perf, Batches: o.PerftestIters, BatchBytes: int64(b)})
		}
	}
	return rows, nil
}

// ucxPerftest runs Debian's ucx_perftest -t ucp_get, server and client two
// processes of this host, over UCX_TLS=tls, iters gets of size bytes each,
// and returns the client's overall bandwidth in GB/s. The server takes a
// fixed port (ucx_perftest cannot report one it picked): a port in use is
// retried with the next.
func ucxPerftest(ctx context.Context, tls string, size, iters int) (float64, error) {
	bin, err := exec.LookPath("ucx_perftest")
	if err != nil {
		return 0, fmt.Errorf("%w: ucx_perftest (Debian's ucx-utils): %w", ErrMissing, err)
	}
	args := []string{"-t", "ucp_get", "-s", strconv.Itoa(size), "-n", strconv.Itoa(iters), "-w", strconv.Itoa(max(iters/10, 1)), "-f"}
	env := append(os.Environ(), "UCX_TLS="+tls)
	var lastErr error
	for attempt := range 8 {
		port := strconv.Itoa(13337 + 7*attempt + os.Getpid()%97)
		sctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
		srv := exec.CommandContext(sctx, bin, append([]string{"-p", port}, args...)...)
		srv.Env = env
		var sout bytes.Buffer
		srv.Stdout, srv.Stderr = &sout, &sout
		if err := srv.Start(); err != nil {
			cancel()
			return 0, err
		}
		exited := make(chan error, 1)
		go func() { exited <- srv.Wait() }()
		gbps, err := perftestClient(sctx, bin, port, args, env, exited)
		if err != nil {
			srv.Process.Kill()
		}
		<-exited
		cancel()
		switch {
		case err == nil:
			return gbps, nil
		case strings.Contains(sout.String(), "Address already in use"):
			lastErr = errors.New("ucx_perftest: its port was in use")
			continue
		}
		return 0, fmt.Errorf("ucx_perftest over UCX_TLS=%s: %w\nserver: %s", tls, err, sout.String())
	}
	return 0, lastErr
}

// perftestClient runs the client until the server accepts it (a refused
// connection is retried while the server lives) and parses its figure.
func perftestClient(ctx context.Context, bin, port string, args, env []string, serverExited <-chan error) (float64, error) {
	for {
		cmd := exec.CommandContext(ctx, bin, append([]string{"127.0.0.1", "-p", port}, args...)...)
		cmd.Env = env
		out, err := cmd.CombinedOutput()
		if err == nil {
			return parsePerftest(string(out))
		}
		if !strings.Contains(string(out), "Connection refused") {
			return 0, fmt.Errorf("client: %w: %s", err, out)
		}
		select {
		case err := <-serverExited:
			return 0, fmt.Errorf("the server exited (%v) before it accepted the client", err)
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// parsePerftest reads the overall bandwidth off ucx_perftest -f's final
// line ("iters lat50 lat_avg lat_overall bw_avg bw_overall rate_avg
// rate_overall", bandwidth in MB/s of 2^20 bytes) and returns it in GB/s.
func parsePerftest(out string) (float64, error) {
	lines := strings.Split(strings.TrimSpace(out), "\n")
	for i := len(lines) - 1; i >= 0; i-- {
		f := strings.Fields(lines[i])
		if len(f) != 8 {
			continue
		}
		mbs, err := strconv.ParseFloat(f[5], 64)
		if err != nil {
			continue
		}
		return mbs * (1 << 20) / 1e9, nil
	}
	return 0, fmt.Errorf("no figure in ucx_perftest's output: %q", out)
}
