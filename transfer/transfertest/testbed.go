// Package transfertest is the measurement harness of the data plane, shared
// by the transfer package's benchmarks and by `kvmesh bench transfer`
// (package bench), so that both measure the same thing the same way. It is
// test support: the node and the client do not link it.
package transfertest

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/kvmesh/kvmesh/prefixhash"
	"github.com/kvmesh/kvmesh/transfer"
	"github.com/kvmesh/kvmesh/transfer/internal/pattern"
)

// A Testbed holds values in memory and builds Paths over them: the TCP
// client against a Server, the shared-memory client against a ShmServer, a
// raw loopback TCP stream of the same bytes (the ceiling of any TCP data
// plane) and copy() of the same values (what the shared-memory server does
// per batch, alone). Interleave runs paths batch by batch, rotating, so that
// they share the machine's noise, and reports each path's median batch.

// Testbed defaults.
const (
	DefaultTestbedBatch  = 16 << 20
	DefaultTestbedSource = 64 << 20
)

// TestbedOptions configure a Testbed.
type TestbedOptions struct {
	// ValueBytes is the size of every value. Required.
	ValueBytes int
	// BatchBytes is what one batch moves: a Get of BatchBytes/ValueBytes
	// keys, or BatchBytes through a raw socket. Default 16 MiB; at least
	// ValueBytes.
	BatchBytes int
	// SourceBytes is the distinct memory the values cycle through, so that
	// batches do not re-read one cached buffer. Default 64 MiB; at least
	// BatchBytes.
	SourceBytes int
}

// EnsureDefaults fills zero fields with their defaults.
func (o *TestbedOptions) EnsureDefaults() {
	if o.BatchBytes == 0 {
		o.BatchBytes = max(DefaultTestbedBatch, o.ValueBytes)
	}
	if o.SourceBytes == 0 {
		o.SourceBytes = max(DefaultTestbedSource, o.BatchBytes)
	}
}

// Validate reports the first field out of range.
func (o *TestbedOptions) Validate() error {
	switch {
	case o.ValueBytes < 1 || o.ValueBytes > transfer.DefaultMaxValueSize:
		return fmt.Errorf("transfertest: TestbedOptions.ValueBytes %d out of [1, %d]", o.ValueBytes, transfer.DefaultMaxValueSize)
	case o.BatchBytes < o.ValueBytes || o.BatchBytes > 1<<30:
		return fmt.Errorf("transfertest: TestbedOptions.BatchBytes %d out of [ValueBytes, 1GiB]", o.BatchBytes)
	case o.SourceBytes < o.BatchBytes || o.SourceBytes > 16<<30:
		return fmt.Errorf("transfertest: TestbedOptions.SourceBytes %d out of [BatchBytes, 16GiB]", o.SourceBytes)
	}
	return nil
}

// Testbed is a set of values in memory and the servers, clients and
// sockets of the Paths built over them. Close releases all of them. Its
// methods are not safe for concurrent use; the Paths they return are safe
// for concurrent Moves where the path says so.
type Testbed struct {
	opts    TestbedOptions
	per     int // values per batch
	keys    []prefixhash.Key
	vals    [][]byte
	src     testbedSource
	dir     string // unix sockets
	closers []func() error
}

// NewTestbed makes SourceBytes/ValueBytes values of ValueBytes bytes each,
// of pseudo-random content.
func NewTestbed(o TestbedOptions) (*Testbed, error) {
	o.EnsureDefaults()
	if err := o.Validate(); err != nil {
		return nil, err
	}
	n := o.SourceBytes / o.ValueBytes
	tb := &Testbed{opts: o, per: o.BatchBytes / o.ValueBytes, keys: make([]prefixhash.Key, n), vals: make([][]byte, n),
		src: make(testbedSource, n)}
	for i := range n {
		tb.keys[i], tb.vals[i] = pattern.Key(i), pattern.Value(i, o.ValueBytes)
		tb.src[tb.keys[i]] = tb.vals[i]
	}
	return tb, nil
}

// Values returns the testbed's values, in key order. They are the
// testbed's: read them, never modify them.
func (tb *Testbed) Values() [][]byte { return tb.vals }

// Source returns the testbed's values as a read-only Source (a Sink that
// stores nothing), for servers a caller builds itself.
func (tb *Testbed) Source() transfer.Source { return tb.src }

// PerBatch returns the number of values one batch moves.
func (tb *Testbed) PerBatch() int { return tb.per }

// Window returns the values of batch i, a sub-slice of Values.
func (tb *Testbed) Window(i int) [][]byte { return window(tb.vals, i, tb.per) }

func (tb *Testbed) windowKeys(i int) []prefixhash.Key { return window(tb.keys, i, tb.per) }

func window[T any](s []T, i, per int) []T {
	lo := i * per % (len(s) - len(s)%per)
	return s[lo : lo+per]
}

// Close stops every server and client the testbed started, in reverse
// order, and returns the first error.
func (tb *Testbed) Close() error {
	var errs []error
	for i := len(tb.closers) - 1; i >= 0; i-- {
		errs = append(errs, tb.closers[i]())
	}
	tb.closers = nil
	if tb.dir != "" {
		errs = append(errs, os.RemoveAll(tb.dir))
		tb.dir = ""
	}
	return errors.Join(errs...)
}

func (tb *Testbed) onClose(f func() error) { tb.closers = append(tb.closers, f) }

// A Path moves one batch per call of Move. Bytes is what one call moves.
type Path struct {
	Name  string
	Bytes int64
	// Move moves batch i: the testbed's window i for the paths it builds.
	Move func(ctx context.Context, i int) error
}

// getPath moves a batch as one Get of the window's keys through p and
// checks that every key was found.
func (tb *Testbed) getPath(name string, p transfer.Peer) Path {
	return Path{Name: name, Bytes: int64(tb.per) * int64(tb.opts.ValueBytes), Move: func(ctx context.Context, i int) error {
		k := tb.windowKeys(i)
		r, err := p.Get(ctx, k)
		if err != nil {
			return err
		}
		defer r.Release()
		if r.Hits() != len(k) {
			return fmt.Errorf("transfertest: %d hits of %d", r.Hits(), len(k))
		}
		return nil
	}}
}

var quietLogger = slog.New(slog.DiscardHandler)

// TCP returns the TCP path: a Server over the values on 127.0.0.1 and a
// Client of conns connections to it. A batch is conns Gets of a window
// each, issued at once, so Bytes is conns windows. Name is "tcp" for one
// connection and "tcpN" for N.
func (tb *Testbed) TCP(conns int) (Path, error) {
	name := "tcp"
	if conns > 1 {
		name = fmt.Sprintf("tcp%d", conns)
	}
	return tb.TCPWith(name, conns, nil, nil)
}

// TCPWith is TCP named name, with server and client options so and co (nil:
// defaults; co.MaxConns is set to conns), e.g. TLS on both ends.
func (tb *Testbed) TCPWith(name string, conns int, so *transfer.ServerOptions, co *transfer.ClientOptions) (Path, error) {
	if conns < 1 {
		return Path{}, fmt.Errorf("transfertest: conns %d must be at least 1", conns)
	}
	if co == nil {
		co = &transfer.ClientOptions{}
	}
	cc := *co
	cc.MaxConns = conns
	addr, err := tb.serve(tb.src, so)
	if err != nil {
		return Path{}, err
	}
	c, err := transfer.NewClient(addr, &cc)
	if err != nil {
		return Path{}, err
	}
	tb.onClose(c.Close)
	one := tb.getPath(name, c)
	if conns == 1 {
		return one, nil
	}
	return Path{Name: name, Bytes: int64(conns) * one.Bytes, Move: func(ctx context.Context, i int) error {
		var wg sync.WaitGroup
		errs := make([]error, conns)
		for c := range conns {
			wg.Go(func() { errs[c] = one.Move(ctx, i*conns+c) })
		}
		wg.Wait()
		return errors.Join(errs...)
	}}, nil
}

// serve starts a TCP Server of src on 127.0.0.1, which Close stops, and
// returns its address.
func (tb *Testbed) serve(src testbedSource, so *transfer.ServerOptions) (string, error) {
	srv, err := transfer.NewServer(src, src, so, quietLogger)
	if err != nil {
		return "", err
	}
	addr, err := srv.Listen("127.0.0.1:0")
	if err != nil {
		srv.Close()
		return "", err
	}
	tb.onClose(srv.Close)
	return addr.String(), nil
}

// Shm returns the shared-memory path, "shm": a ShmServer over the values
// on a unix socket in a temporary directory and a ShmClient of it. Off
// Linux the error wraps ErrUnsupported.
func (tb *Testbed) Shm() (Path, error) {
	srv, err := transfer.NewShmServer(tb.src, tb.src, nil, quietLogger)
	if err != nil {
		return Path{}, err
	}
	if tb.dir == "" {
		if tb.dir, err = os.MkdirTemp("", "kvmesh-testbed-"); err != nil {
			srv.Close()
			return Path{}, fmt.Errorf("transfertest: %w", err)
		}
	}
	path := filepath.Join(tb.dir, fmt.Sprintf("shm%d.sock", len(tb.closers)))
	if err := srv.Listen(path); err != nil {
		srv.Close()
		return Path{}, err
	}
	tb.onClose(srv.Close)
	c, err := transfer.DialShm(context.Background(), path, nil)
	if err != nil {
		return Path{}, err
	}
	tb.onClose(c.Close)
	return tb.getPath("shm", c), nil
}

// Raw returns the ceiling of a TCP data plane, "raw": one loopback
// connection, a writer writing the values (concatenated into one large
// buffer) in batches in a loop, and a reader reading BatchBytes per Move
// into a buffer. Free-running (gated false), the writer streams ahead of
// the reader (steady state). Gated, it writes one batch when the reader
// starts one: run beside other paths (Interleave), a free writer would fill
// the socket's buffers (up to tcp_rmem, tens of MiB) while they run, and
// the raw batch would be timed as a copy out of the kernel. Moves must not
// run concurrently.
func (tb *Testbed) Raw(gated bool) (Path, error) { return tb.RawTLS(gated, nil, nil) }

// RawTLS is Raw over TLS when server and client are set (crypto/tls's own
// ceiling: one Write of a batch, one ReadFull), named "rawtls".
func (tb *Testbed) RawTLS(gated bool, server, client *tls.Config) (Path, error) {
	name := "raw"
	if server != nil {
		name = "rawtls"
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return Path{}, fmt.Errorf("transfertest: %w", err)
	}
	big := slices.Concat(tb.vals...) // the same bytes, one large buffer
	batch := tb.per * tb.opts.ValueBytes
	big = big[:len(big)-len(big)%batch]
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
		if server != nil {
			nc = tls.Server(nc, tlsConfig(server, ""))
		}
		for off := 0; ; off = (off + batch) % len(big) {
			if _, ok := <-start; !ok && gated {
				return
			}
			if _, err := nc.Write(big[off : off+batch]); err != nil {
				return // the reader hung up
			}
		}
	}()
	nc, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		ln.Close()
		<-done
		return Path{}, fmt.Errorf("transfertest: %w", err)
	}
	if client != nil {
		nc = tls.Client(nc, tlsConfig(client, "127.0.0.1"))
	}
	tb.onClose(func() error {
		err := nc.Close()
		if gated {
			close(start)
		}
		<-done
		return err
	})
	buf := make([]byte, batch)
	return Path{Name: name, Bytes: int64(batch), Move: func(ctx context.Context, _ int) error {
		if gated {
			start <- struct{}{}
		}
		if d, ok := ctx.Deadline(); ok {
			nc.SetReadDeadline(d)
		}
		_, err := io.ReadFull(nc, buf)
		return err
	}}, nil
}

// Copy returns "copy": copy() of a batch's values into one buffer, what
// the shared-memory server does per batch, alone. Moves must not run
// concurrently.
func (tb *Testbed) Copy() Path {
	size := tb.opts.ValueBytes
	dst := make([]byte, tb.per*size)
	return Path{Name: "copy", Bytes: int64(len(dst)), Move: func(_ context.Context, i int) error {
		for j, v := range tb.Window(i) {
			copy(dst[j*size:], v)
		}
		return nil
	}}
}

// PathResult is what Interleave measured of one path. GBps is of the
// median batch (10^9 bytes per second), so that one stall of a shared
// machine does not decide a path's figure.
type PathResult struct {
	Name         string
	Batches      int
	BytesPerMove int64
	MedianGBps   float64
	MinSeconds   float64
	MaxSeconds   float64
}

// Interleave moves batches batches through every path, batch by batch,
// rotating the order (no path always follows the same one), after one
// untimed warm-up batch each (connections, pools, pages). after, if not
// nil, is called after every round. It returns one result per path, in
// the order given.
func Interleave(ctx context.Context, paths []Path, batches int, after func(round int)) ([]PathResult, error) {
	if batches < 1 {
		return nil, fmt.Errorf("transfertest: interleave: batches %d must be at least 1", batches)
	}
	for _, p := range paths {
		if err := p.Move(ctx, 0); err != nil {
			return nil, fmt.Errorf("transfertest: interleave: %s: warm-up: %w", p.Name, err)
		}
	}
	spent := make([][]time.Duration, len(paths))
	for i := range batches {
		for k := range paths {
			j := (i + k) % len(paths)
			if err := ctx.Err(); err != nil {
				return nil, err
			}
			t0 := time.Now()
			if err := paths[j].Move(ctx, i+1); err != nil {
				return nil, fmt.Errorf("transfertest: interleave: %s: %w", paths[j].Name, err)
			}
			spent[j] = append(spent[j], time.Since(t0))
		}
		if after != nil {
			after(i)
		}
	}
	out := make([]PathResult, len(paths))
	for j, p := range paths {
		s := spent[j]
		slices.Sort(s)
		out[j] = PathResult{Name: p.Name, Batches: len(s), BytesPerMove: p.Bytes,
			MedianGBps: float64(p.Bytes) / s[len(s)/2].Seconds() / 1e9,
			MinSeconds: s[0].Seconds(), MaxSeconds: s[len(s)-1].Seconds()}
	}
	return out, nil
}

// testbedSource serves a fixed map of values; it is read-only after
// NewTestbed, so concurrent Acquires need no lock. As a Sink it stores
// nothing.
type testbedSource map[prefixhash.Key][]byte

func (s testbedSource) Acquire(_ context.Context, keys []prefixhash.Key, vals [][]byte, st []transfer.Status) func() {
	for i, k := range keys {
		if v, ok := s[k]; ok {
			vals[i], st[i] = v, transfer.StatusOK
		}
	}
	return nil
}

func (s testbedSource) Put(_ context.Context, _ []prefixhash.Key, _ [][]byte, _ []transfer.Status) {}

// tlsConfig is cfg as the data plane sets it up (TLS 1.3 only, no dynamic
// record sizing), so that the raw TLS ceiling runs the configuration the
// data plane runs; serverName fills an empty ServerName.
func tlsConfig(cfg *tls.Config, serverName string) *tls.Config {
	c := cfg.Clone()
	c.MinVersion, c.DynamicRecordSizingDisabled = tls.VersionTLS13, true
	if c.ServerName == "" {
		c.ServerName = serverName
	}
	return c
}
