//go:build linux

package transfer_test

import (
	"bufio"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/transfer"
	"github.com/kvmesh/kvmesh/transfer/certtest"
	"github.com/kvmesh/kvmesh/transfer/transfertest"
)

// The transfer benchmarks, over the measurement loops of transfertest
// (Testbed, Path, Interleave), which `kvmesh bench transfer` runs too. Each
// path moves batches of benchBatch bytes: a
// Get of benchBatch/size keys (TCP, shared memory), benchBatch bytes through
// one socket (raw TCP), copy() of the batch's values (memcpy), or the batch's
// GETs pipelined on one connection (Redis). Values cycle through
// benchSource bytes of distinct memory, for every path alike.
//
// BenchmarkVersus runs all paths interleaved, batch by batch, in one
// process, so that they share the machine's noise, and reports each path's
// GB/s (median batch) and the ratios the targets are stated in:
//
//	go test -run '^$' -bench Versus -benchtime 20x -count 5 ./transfer/
//
// The per-path benchmarks (TCPGet, RawTCP, ShmGet, Copy, RedisGet) measure
// one path at a time, TCPGet with 1, 2 and 4 connections and as many
// concurrent callers.
const (
	benchBatch  = transfertest.DefaultTestbedBatch
	benchSource = transfertest.DefaultTestbedSource
)

var benchSizes = []struct {
	name string
	n    int
}{{"64KiB", 64 << 10}, {"1MiB", 1 << 20}, {"4MiB", 4 << 20}}

// testbed returns a Testbed of values of size n (transfertest: the loops
// `kvmesh bench transfer` runs too), closed when b ends.
func testbed(b *testing.B, n int) *transfertest.Testbed {
	tb, err := transfertest.NewTestbed(transfertest.TestbedOptions{ValueBytes: n, BatchBytes: benchBatch, SourceBytes: benchSource})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { tb.Close() })
	return tb
}

// must fails b when a testbed could not build a path: must(b)(tb.TCP(1)).
func must(b *testing.B) func(transfertest.Path, error) transfertest.Path {
	return func(p transfertest.Path, err error) transfertest.Path {
		if err != nil {
			b.Fatal(err)
		}
		return p
	}
}

func BenchmarkTCPGet(b *testing.B) {
	for _, size := range benchSizes {
		tb := testbed(b, size.n)
		for _, conns := range []int{1, 2, 4} {
			b.Run(fmt.Sprintf("size=%s/conns=%d", size.name, conns), func(b *testing.B) {
				runPath(b, must(b)(tb.TCP(conns)))
			})
		}
	}
}

func BenchmarkRawTCP(b *testing.B) {
	for _, size := range benchSizes {
		b.Run("size="+size.name, func(b *testing.B) {
			runPath(b, must(b)(testbed(b, size.n).Raw(false)))
		})
	}
}

func BenchmarkShmGet(b *testing.B) {
	for _, size := range benchSizes {
		b.Run("size="+size.name, func(b *testing.B) {
			runPath(b, must(b)(testbed(b, size.n).Shm()))
		})
	}
}

func BenchmarkCopy(b *testing.B) {
	for _, size := range benchSizes {
		b.Run("size="+size.name, func(b *testing.B) {
			runPath(b, testbed(b, size.n).Copy())
		})
	}
}

func BenchmarkRedisGet(b *testing.B) {
	for _, size := range benchSizes {
		b.Run("size="+size.name, func(b *testing.B) {
			runPath(b, redisPath(b, testbed(b, size.n)))
		})
	}
}

func runPath(b *testing.B, p transfertest.Path) {
	ctx := context.Background()
	if err := p.Move(ctx, 0); err != nil { // warm up: connections, pools, pages
		b.Fatal(err)
	}
	b.SetBytes(p.Bytes)
	b.ResetTimer()
	for i := range b.N {
		if err := p.Move(ctx, i+1); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkVersus interleaves every path batch by batch (Interleave) and
// reports GB/s per path (of its median batch) and the target ratios:
// tcp/raw (≥ 0.85), tcp/mooncake (the Mooncake TE TCP figure of 1.44 GB/s,
// ≥ 2), shm/redis (≥ 4).
func BenchmarkVersus(b *testing.B) {
	for _, size := range benchSizes {
		b.Run("size="+size.name, func(b *testing.B) {
			tb := testbed(b, size.n)
			paths := []transfertest.Path{
				must(b)(tb.Raw(true)),
				must(b)(tb.TCP(1)),
				must(b)(tb.TCP(2)),
				must(b)(tb.TCP(4)),
				must(b)(tb.Shm()),
				tb.Copy(),
			}
			if _, err := exec.LookPath("redis-server"); err == nil {
				paths = append(paths, redisPath(b, tb))
			}
			gbps := interleave(b, paths)
			b.ReportMetric(gbps["tcp"]/gbps["raw"], "tcp/raw")
			b.ReportMetric(gbps["tcp"]/1.44, "tcp/mooncake")
			b.ReportMetric(gbps["shm"]/gbps["copy"], "shm/copy")
			if r := gbps["redis"]; r > 0 {
				b.ReportMetric(gbps["shm"]/r, "shm/redis")
				b.ReportMetric(gbps["tcp"]/r, "tcp/redis")
			}
		})
	}
}

// tlsPair is the server and client TLS configurations of a benchmark.
type tlsPair struct{ server, client *tls.Config }

func benchTLS(b *testing.B) *tlsPair {
	dir := b.TempDir()
	ca := certtest.NewCA(b, dir, "a")
	cert, key := ca.Issue(b, dir, "node", "127.0.0.1", "localhost")
	srv, cli, err := transfer.LoadTLS(transfer.TLSFiles{Cert: cert, Key: key, CA: ca.File, ClientAuth: true})
	if err != nil {
		b.Fatal(err)
	}
	return &tlsPair{srv, cli}
}

// BenchmarkTLS is the throughput cost of TLS on the data plane: Get of
// 1 MiB and 4 MiB values over plain TCP (tcp) and over mutual TLS 1.3
// (tls, and tls2 with two connections at once), beside a plain and a TLS
// stream of the same bytes (raw, rawtls: crypto/tls's own ceiling), all
// interleaved batch by batch as in BenchmarkVersus:
//
//	go test -run '^$' -bench TLS -benchtime 20x -count 5 ./transfer/
//
// It reports each path's GB/s and tls/tcp (what TLS costs the data plane),
// tls/rawtls (how close the data plane runs to crypto/tls's stream) and
// rawtls/raw (what TLS costs a bare stream).
func BenchmarkTLS(b *testing.B) {
	tp := benchTLS(b)
	for _, size := range benchSizes[1:] {
		b.Run("size="+size.name, func(b *testing.B) {
			tb := testbed(b, size.n)
			so := &transfer.ServerOptions{TLS: tp.server}
			co := &transfer.ClientOptions{TLS: tp.client}
			gbps := interleave(b, []transfertest.Path{
				must(b)(tb.Raw(true)),
				must(b)(tb.RawTLS(true, tp.server, tp.client)),
				must(b)(tb.TCP(1)),
				must(b)(tb.TCPWith("tls", 1, so, co)),
				must(b)(tb.TCPWith("tls2", 2, so, co)),
			})
			b.ReportMetric(gbps["tls"]/gbps["tcp"], "tls/tcp")
			b.ReportMetric(gbps["tls"]/gbps["rawtls"], "tls/rawtls")
			b.ReportMetric(gbps["rawtls"]/gbps["raw"], "rawtls/raw")
		})
	}
}

// interleave runs b.N rounds of every path (Interleave) and reports (and
// returns) each path's GB/s of its median batch.
func interleave(b *testing.B, paths []transfertest.Path) map[string]float64 {
	b.ResetTimer()
	res, err := transfertest.Interleave(context.Background(), paths, b.N, nil)
	if err != nil {
		b.Fatal(err)
	}
	b.StopTimer()
	gbps := map[string]float64{}
	for _, r := range res {
		gbps[r.Name] = r.MedianGBps
		b.ReportMetric(r.MedianGBps, r.Name+"_GB/s")
	}
	return gbps
}

// redisPath runs a private redis-server (no persistence) on a unix socket,
// stores the testbed's values under k0, k1, ..., and moves a batch by
// pipelining its GETs on one connection and reading each reply into a
// buffer with a minimal RESP reader. It skips the benchmark when
// redis-server is not installed.
func redisPath(b *testing.B, tb *transfertest.Testbed) transfertest.Path {
	vals, per := tb.Values(), tb.PerBatch()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		b.Skip("redis-server not installed")
	}
	rc := startRedis(b, bin)
	for i, v := range vals {
		rc.send([]byte("SET"), redisKey(i), v)
		if _, err := rc.reply(nil); err != nil {
			b.Fatalf("SET: %v", err)
		}
	}
	size := len(vals[0])
	buf := make([]byte, size)
	return transfertest.Path{Name: "redis", Bytes: int64(per * size), Move: func(_ context.Context, i int) error {
		lo := i * per % (len(vals) - len(vals)%per)
		for j := lo; j < lo+per; j++ {
			rc.send(getCmd, redisKey(j))
		}
		for range per {
			n, err := rc.reply(buf)
			if err != nil || n != size {
				return fmt.Errorf("redis GET: %d bytes, %v", n, err)
			}
		}
		return nil
	}}
}

func redisKey(i int) []byte { return []byte("k" + strconv.Itoa(i)) }

var getCmd = []byte("GET")

type redisConn struct {
	bw *bufio.Writer
	br *bufio.Reader
}

func startRedis(b *testing.B, bin string) *redisConn {
	// A unix socket, and no TCP port (--port 0): redis-server cannot report
	// a port it picked, and one found free beforehand may be taken by
	// another process before the server binds it. The directory is short,
	// for the socket path's 107 bytes.
	dir, err := os.MkdirTemp("", "kvredis-")
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { os.RemoveAll(dir) })
	sock := filepath.Join(dir, "redis.sock")
	cmd := exec.Command(bin, "--port", "0", "--unixsocket", sock, "--unixsocketperm", "700", "--save", "", "--appendonly", "no",
		"--dir", dir, "--logfile", filepath.Join(dir, "redis.log"))
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		cmd.Process.Signal(os.Interrupt)
		cmd.Wait()
	})
	var nc net.Conn
	deadline := time.Now().Add(10 * time.Second)
	for {
		if nc, err = net.Dial("unix", sock); err == nil {
			break
		}
		if time.Now().After(deadline) {
			b.Fatalf("redis-server did not come up: %v", err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	b.Cleanup(func() { nc.Close() })
	return &redisConn{bw: bufio.NewWriterSize(nc, 64<<10), br: bufio.NewReaderSize(nc, 64<<10)}
}

func (c *redisConn) send(args ...[]byte) {
	fmt.Fprintf(c.bw, "*%d\r\n", len(args))
	for _, a := range args {
		fmt.Fprintf(c.bw, "$%d\r\n", len(a))
		c.bw.Write(a)
		c.bw.WriteString("\r\n")
	}
}

// reply flushes what was sent and reads one reply; a bulk string is read
// into buf and its length returned.
func (c *redisConn) reply(buf []byte) (int, error) {
	if c.bw.Buffered() > 0 {
		if err := c.bw.Flush(); err != nil {
			return 0, err
		}
	}
	line, err := c.br.ReadSlice('\n')
	if err != nil {
		return 0, err
	}
	if len(line) < 3 {
		return 0, fmt.Errorf("short reply %q", line)
	}
	switch line[0] {
	case '+':
		return 0, nil
	case '$':
		n, err := strconv.Atoi(string(line[1 : len(line)-2]))
		if err != nil || n < 0 || n > len(buf) {
			return 0, fmt.Errorf("bulk reply %q", line)
		}
		if _, err := io.ReadFull(c.br, buf[:n]); err != nil {
			return 0, err
		}
		if _, err := c.br.Discard(2); err != nil {
			return 0, err
		}
		return n, nil
	}
	return 0, fmt.Errorf("reply %q", line)
}
