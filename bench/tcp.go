package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// TCPOptions configures the raw TCP stream.
type TCPOptions struct {
	// Conns is the number of parallel streams. Default 1.
	Conns int
	// WriteBytes is the size of each write and of the reader's buffer.
	// Default 1 MiB.
	WriteBytes int
	// Duration is how long the writers write. Default 2s.
	Duration time.Duration
}

// TCPResult is the raw TCP limit: what plain net.Conn writes and reads of
// WriteBytes move on loopback, with nothing else on the path.
type TCPResult struct {
	Conns      int     `json:"conns"`
	WriteBytes int     `json:"write_bytes"`
	Bytes      int64   `json:"bytes" table:"wide"`
	Seconds    float64 `json:"seconds" table:"wide"`
	GBps       float64 `json:"gbps"`
}

// RawTCP streams bytes from o.Conns writers to as many readers over
// 127.0.0.1 for o.Duration and returns the bytes received per second (GB/s
// of 10^9 bytes): the ceiling of any TCP data plane on this host.
func RawTCP(ctx context.Context, o TCPOptions) (TCPResult, error) {
	if o.Conns == 0 {
		o.Conns = 1
	}
	if o.WriteBytes == 0 {
		o.WriteBytes = 1 << 20
	}
	if o.Duration <= 0 {
		o.Duration = 2 * time.Second
	}
	if o.Conns < 1 || o.Conns > 1024 {
		return TCPResult{}, fmt.Errorf("bench: raw tcp: conns %d is outside 1..1024", o.Conns)
	}
	if o.WriteBytes < 1 {
		return TCPResult{}, fmt.Errorf("bench: raw tcp: write_bytes %d must be positive", o.WriteBytes)
	}
	var lc net.ListenConfig
	ln, err := lc.Listen(ctx, "tcp", "127.0.0.1:0")
	if err != nil {
		return TCPResult{}, fmt.Errorf("bench: raw tcp: %w", err)
	}
	defer ln.Close()

	st := &tcpStream{o: o}
	st.wg.Add(1)
	go st.accept(ln)
	var d net.Dialer
	conns := make([]net.Conn, 0, o.Conns)
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	for range o.Conns {
		c, err := d.DialContext(ctx, "tcp", ln.Addr().String())
		if err != nil {
			ln.Close()
			st.wg.Wait()
			return TCPResult{}, fmt.Errorf("bench: raw tcp: dial: %w", err)
		}
		conns = append(conns, c)
	}
	start := time.Now()
	deadline := start.Add(o.Duration)
	for _, c := range conns {
		st.wg.Add(1)
		go st.write(ctx, c, deadline)
	}
	st.wg.Wait()
	sec := time.Since(start).Seconds()
	if err := ctx.Err(); err != nil {
		return TCPResult{}, err
	}
	if st.firstErr != nil {
		return TCPResult{}, st.firstErr
	}
	n := st.received.Load()
	return TCPResult{Conns: o.Conns, WriteBytes: o.WriteBytes, Bytes: n, Seconds: sec, GBps: float64(n) / sec / 1e9}, nil
}

// tcpStream is a RawTCP run: its writers and readers, the bytes received
// and the first error, which stops them all.
type tcpStream struct {
	o        TCPOptions
	received atomic.Int64
	stop     atomic.Bool
	wg       sync.WaitGroup
	errMu    sync.Mutex
	firstErr error // guarded by errMu until wg is done
}

func (st *tcpStream) fail(err error) {
	st.errMu.Lock()
	if st.firstErr == nil {
		st.firstErr = err
	}
	st.errMu.Unlock()
	st.stop.Store(true)
}

// accept accepts o.Conns connections and reads each to EOF.
func (st *tcpStream) accept(ln net.Listener) {
	defer st.wg.Done()
	for range st.o.Conns {
		c, err := ln.Accept()
		if err != nil {
			st.fail(fmt.Errorf("bench: raw tcp: accept: %w", err))
			return
		}
		st.wg.Add(1)
		go st.read(c)
	}
}

// read counts what arrives on c until EOF.
func (st *tcpStream) read(c net.Conn) {
	defer st.wg.Done()
	defer c.Close()
	buf := make([]byte, st.o.WriteBytes)
	for {
		n, err := c.Read(buf)
		st.received.Add(int64(n))
		if errors.Is(err, io.EOF) {
			return
		}
		if err != nil {
			st.fail(fmt.Errorf("bench: raw tcp: read: %w", err))
			return
		}
	}
}

// write writes to c until the deadline, then closes its write side.
func (st *tcpStream) write(ctx context.Context, c net.Conn, deadline time.Time) {
	defer st.wg.Done()
	defer c.(*net.TCPConn).CloseWrite()
	buf := make([]byte, st.o.WriteBytes)
	// At least one write each, so that a writer scheduled after the
	// deadline (a busy machine, a short run) still measures.
	for {
		if _, err := c.Write(buf); err != nil {
			st.fail(fmt.Errorf("bench: raw tcp: write: %w", err))
			return
		}
		if st.stop.Load() || ctx.Err() != nil || !time.Now().Before(deadline) {
			return
		}
	}
}
