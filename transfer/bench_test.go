//go:build linux

package transfer

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
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/prefixhash"
)

// The transfer benchmarks. Each path moves batches of benchBatch bytes: a
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
	benchBatch  = 16 << 20
	benchSource = 64 << 20
)

var benchSizes = []struct {
	name string
	n    int
}{{"64KiB", 64 << 10}, {"1MiB", 1 << 20}, {"4MiB", 4 << 20}}

// benchData fills a source with benchSource bytes of values of size n.
func benchData(n int) (*memSource, []prefixhash.Key, [][]byte) {
	src := newMemSource()
	keys := make([]prefixhash.Key, benchSource/n)
	vals := make([][]byte, len(keys))
	for i := range keys {
		keys[i], vals[i] = testKey(i), testValue(i, n)
		src.set(keys[i], vals[i])
	}
	return src, keys, vals
}

// A mover moves batch i (bytes bytes) per call; it is safe for concurrent
// calls when the path is.
type mover struct {
	name  string
	bytes int64
	batch func(i int) error
}

func window[T any](s []T, i, per int) []T {
	lo := i * per % len(s)
	return s[lo : lo+per]
}

func getMover(name string, keys []prefixhash.Key, per int, p Peer) mover {
	return mover{name: name, bytes: benchBatch, batch: func(i int) error {
		k := window(keys, i, per)
		r, err := p.Get(context.Background(), k)
		if err != nil {
			return err
		}
		defer r.Release()
		if r.Hits() != len(k) {
			return fmt.Errorf("%d hits of %d", r.Hits(), len(k))
		}
		return nil
	}}
}

func tcpMover(b *testing.B, src *memSource, keys []prefixhash.Key, per int) mover {
	return tcpWith(b, "tcp", src, keys, per, 1, nil)
}

// tcpParallel moves conns batches at once over conns connections.
func tcpParallel(b *testing.B, src *memSource, keys []prefixhash.Key, per, conns int) mover {
	return tcpWith(b, fmt.Sprintf("tcp%d", conns), src, keys, per, conns, nil)
}

// tcpWith moves conns batches at once over conns connections of a client
// and server that use TLS when tp is not nil.
func tcpWith(b *testing.B, name string, src *memSource, keys []prefixhash.Key, per, conns int, tp *tlsPair) mover {
	so, co := &ServerOptions{}, &ClientOptions{MaxConns: conns}
	if tp != nil {
		so.TLS, co.TLS = tp.server, tp.client
	}
	_, addr := startServer(b, src, so)
	m := getMover(name, keys, per, newClient(b, addr, co))
	if conns == 1 {
		return m
	}
	return mover{name: name, bytes: int64(conns) * benchBatch, batch: func(i int) error {
		var wg sync.WaitGroup
		errs := make([]error, conns)
		for c := range conns {
			wg.Add(1)
			go func() {
				defer wg.Done()
				errs[c] = m.batch(i*conns + c)
			}()
		}
		wg.Wait()
		for _, err := range errs {
			if err != nil {
				return err
			}
		}
		return nil
	}}
}

func shmMover(b *testing.B, src *memSource, keys []prefixhash.Key, per int) mover {
	_, path := startShm(b, src, nil)
	return getMover("shm", keys, per, dialShm(b, path, nil))
}

// rawMover is the ceiling: one loopback connection, a writer writing the
// values (concatenated into one large buffer) in batches in a loop, a reader
// reading benchBatch bytes per batch into a buffer. Free-running, the writer streams ahead of the reader (steady
// state). Gated, it writes one batch when the reader starts one: in
// BenchmarkVersus a free writer would fill the socket's buffers (up to
// tcp_rmem's 32 MiB here) while the other paths run, and the raw batch
// would be timed as a copy out of the kernel. With tp, the connection is
// TLS (crypto/tls's own ceiling: one Write of 16 MiB, one ReadFull).
func rawMover(b *testing.B, vals [][]byte, gated bool, tp *tlsPair) mover {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	name := "raw"
	if tp != nil {
		name = "rawtls"
	}
	big := slices.Concat(vals...) // the same bytes, one large buffer
	start := make(chan struct{}, 1)
	if !gated {
		close(start)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		nc, err := ln.Accept()
		ln.Close()
		if err != nil {
			return
		}
		defer nc.Close()
		if tp != nil {
			nc = tls.Server(nc, prepareTLS(tp.server, ""))
		}
		for off := 0; ; off = (off + benchBatch) % len(big) {
			if _, ok := <-start; !ok && gated {
				return
			}
			if _, err := nc.Write(big[off : off+benchBatch]); err != nil {
				return // the reader hung up
			}
		}
	}()
	nc, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		b.Fatal(err)
	}
	if tp != nil {
		nc = tls.Client(nc, prepareTLS(tp.client, ln.Addr().String()))
	}
	b.Cleanup(func() {
		nc.Close()
		if gated {
			close(start)
		}
		<-done
	})
	buf := make([]byte, benchBatch)
	return mover{name: name, bytes: benchBatch, batch: func(int) error {
		if gated {
			start <- struct{}{}
		}
		_, err := io.ReadFull(nc, buf)
		return err
	}}
}

// copyMover is what the shared-memory server does per batch, alone.
func copyMover(vals [][]byte, per, size int) mover {
	dst := make([]byte, benchBatch)
	return mover{name: "copy", bytes: benchBatch, batch: func(i int) error {
		for j, v := range window(vals, i, per) {
			copy(dst[j*size:], v)
		}
		return nil
	}}
}

func BenchmarkTCPGet(b *testing.B) {
	for _, size := range benchSizes {
		src, keys, _ := benchData(size.n)
		for _, conns := range []int{1, 2, 4} {
			b.Run(fmt.Sprintf("size=%s/conns=%d", size.name, conns), func(b *testing.B) {
				runMover(b, tcpParallel(b, src, keys, benchBatch/size.n, conns))
			})
		}
	}
}

func BenchmarkRawTCP(b *testing.B) {
	for _, size := range benchSizes {
		b.Run("size="+size.name, func(b *testing.B) {
			_, _, vals := benchData(size.n)
			runMover(b, rawMover(b, vals, false, nil))
		})
	}
}

func BenchmarkShmGet(b *testing.B) {
	for _, size := range benchSizes {
		b.Run("size="+size.name, func(b *testing.B) {
			src, keys, _ := benchData(size.n)
			runMover(b, shmMover(b, src, keys, benchBatch/size.n))
		})
	}
}

func BenchmarkCopy(b *testing.B) {
	for _, size := range benchSizes {
		b.Run("size="+size.name, func(b *testing.B) {
			_, _, vals := benchData(size.n)
			runMover(b, copyMover(vals, benchBatch/size.n, size.n))
		})
	}
}

func BenchmarkRedisGet(b *testing.B) {
	for _, size := range benchSizes {
		b.Run("size="+size.name, func(b *testing.B) {
			_, _, vals := benchData(size.n)
			runMover(b, redisMover(b, vals, benchBatch/size.n))
		})
	}
}

func runMover(b *testing.B, m mover) {
	if err := m.batch(0); err != nil { // warm up: connections, pools, pages
		b.Fatal(err)
	}
	b.SetBytes(m.bytes)
	b.ResetTimer()
	for i := range b.N {
		if err := m.batch(i + 1); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkVersus interleaves every path batch by batch and reports GB/s
// per path (of its median batch) and the target ratios: tcp/raw (≥ 0.85), tcp/mooncake (the
// Mooncake TE TCP figure of 1.44 GB/s, ≥ 2), shm/redis (≥ 4).
func BenchmarkVersus(b *testing.B) {
	for _, size := range benchSizes {
		b.Run("size="+size.name, func(b *testing.B) {
			src, keys, vals := benchData(size.n)
			per := benchBatch / size.n
			movers := []mover{
				rawMover(b, vals, true, nil),
				tcpMover(b, src, keys, per),
				tcpParallel(b, src, keys, per, 2),
				tcpParallel(b, src, keys, per, 4),
				shmMover(b, src, keys, per),
				copyMover(vals, per, size.n),
			}
			if _, err := exec.LookPath("redis-server"); err == nil {
				movers = append(movers, redisMover(b, vals, per))
			}
			gbps := interleave(b, movers)
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

// interleave runs b.N rounds of every mover's batch, in an order rotated
// each round so that no path always follows the same one, and reports (and
// returns) each path's GB/s of its median batch: one stall of the shared
// machine must not decide a path's figure.
func interleave(b *testing.B, movers []mover) map[string]float64 {
	spent := make([][]time.Duration, len(movers))
	for _, m := range movers {
		if err := m.batch(0); err != nil {
			b.Fatalf("%s: %v", m.name, err)
		}
	}
	b.ResetTimer()
	for i := range b.N {
		for k := range movers {
			j := (i + k) % len(movers)
			t0 := time.Now()
			if err := movers[j].batch(i + 1); err != nil {
				b.Fatalf("%s: %v", movers[j].name, err)
			}
			spent[j] = append(spent[j], time.Since(t0))
		}
	}
	b.StopTimer()
	gbps := map[string]float64{}
	for j, m := range movers {
		slices.Sort(spent[j])
		gbps[m.name] = float64(m.bytes) / spent[j][len(spent[j])/2].Seconds() / 1e9
		b.ReportMetric(gbps[m.name], m.name+"_GB/s")
	}
	return gbps
}

// tlsPair is the server and client TLS configurations of a benchmark.
type tlsPair struct{ server, client *tls.Config }

func benchTLS(b *testing.B) *tlsPair {
	p := newPKI(b)
	srv, cli, err := LoadTLS(TLSFiles{Cert: p.nodeCert, Key: p.nodeKey, CA: p.a.File, ClientAuth: true})
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
			src, keys, vals := benchData(size.n)
			per := benchBatch / size.n
			gbps := interleave(b, []mover{
				rawMover(b, vals, true, nil),
				rawMover(b, vals, true, tp),
				tcpWith(b, "tcp", src, keys, per, 1, nil),
				tcpWith(b, "tls", src, keys, per, 1, tp),
				tcpWith(b, "tls2", src, keys, per, 2, tp),
			})
			b.ReportMetric(gbps["tls"]/gbps["tcp"], "tls/tcp")
			b.ReportMetric(gbps["tls"]/gbps["rawtls"], "tls/rawtls")
			b.ReportMetric(gbps["rawtls"]/gbps["raw"], "rawtls/raw")
		})
	}
}

// redisMover runs a private redis-server (no persistence) on a free port,
// stores vals under k0, k1, ..., and moves a batch by pipelining its GETs on
// one connection and reading each reply into a buffer with a minimal RESP
// reader. It skips the benchmark when redis-server is not installed.
func redisMover(b *testing.B, vals [][]byte, per int) mover {
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
	return mover{name: "redis", bytes: benchBatch, batch: func(i int) error {
		lo := i * per % len(vals)
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
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	port := strconv.Itoa(ln.Addr().(*net.TCPAddr).Port)
	ln.Close()
	dir := b.TempDir()
	cmd := exec.Command(bin, "--port", port, "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
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
		if nc, err = net.Dial("tcp", "127.0.0.1:"+port); err == nil {
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
