package transfer

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/internal/invariants"
	"github.com/kvmesh/kvmesh/internal/testkit"
	"github.com/kvmesh/kvmesh/prefixhash"
)

var quietLog = slog.New(slog.DiscardHandler)

func startServer(t testing.TB, src *memSource, opts *ServerOptions) (*Server, string) {
	t.Helper()
	var sink Sink
	if src != nil {
		sink = src
	}
	s, err := NewServer(src, sink, opts, quietLog)
	if err != nil {
		t.Fatal(err)
	}
	addr, err := s.Listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s, addr.String()
}

func newClient(t testing.TB, addr string, opts *ClientOptions) *Client {
	t.Helper()
	c, err := NewClient(addr, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// fill stores values of the given sizes under keys 0..len(sizes)-1; a
// negative size leaves the key missing.
func fill(src *memSource, sizes []int) []prefixhash.Key {
	keys := make([]prefixhash.Key, len(sizes))
	for i, n := range sizes {
		keys[i] = testKey(i)
		if n >= 0 {
			src.set(keys[i], testValue(i, n))
		}
	}
	return keys
}

// roundTripCases are the batches both transports must round-trip: value
// sizes per key, -1 for a missing key. The many-item batch is split by the
// clients (MaxItems 512).
func roundTripCases() []struct {
	name  string
	sizes []int
} {
	many := make([]int, 5000)
	for i := range many {
		many[i] = []int{-1, 0, 1, 63, 64, 65, 1000}[i%7]
	}
	return []struct {
		name  string
		sizes []int
	}{
		{"empty batch", nil},
		{"one hit", []int{100}},
		{"one miss", []int{-1}},
		{"hits and misses", []int{10, -1, 4096, -1, -1, 1 << 20, 3}},
		{"zero-byte values", []int{0, 0, -1, 0}},
		{"large values", []int{16 << 20, -1, 9<<20 + 7, 1}},
		{"many items", many},
	}
}

func TestRoundTrip(t *testing.T) {
	for _, tc := range roundTripCases() {
		t.Run(tc.name, func(t *testing.T) {
			src := newMemSource()
			_, addr := startServer(t, src, nil)
			c := newClient(t, addr, &ClientOptions{Limits: Limits{MaxItems: 512}})
			keys := fill(src, tc.sizes)
			r, err := c.Get(context.Background(), keys)
			if err != nil {
				t.Fatal(err)
			}
			checkResult(t, src, keys, r)
			r.Release()
		})
	}
}

// A response over the server's MaxBatchBytes is cut; the client asks again
// for the rest and the caller sees one complete Result.
func TestGetSplitByBatchBytes(t *testing.T) {
	lim := Limits{MaxValueSize: 256 << 10, MaxBatchBytes: 256 << 10}
	src := newMemSource()
	srv, addr := startServer(t, src, &ServerOptions{Limits: lim})
	c := newClient(t, addr, &ClientOptions{Limits: lim})
	keys := fill(src, []int{100 << 10, 100 << 10, -1, 100 << 10, 256 << 10, 0, 1})
	r, err := c.Get(context.Background(), keys)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Release()
	checkResult(t, src, keys, r)
	// The server counts a request after writing its answer.
	testkit.WaitFor(t, "the batch to take at least 3 requests", func() bool { return srv.Stats().Requests >= 3 })
}

func TestPutRoundTrip(t *testing.T) {
	src := newMemSource()
	_, addr := startServer(t, src, nil)
	lim := Limits{MaxItems: 3, MaxValueSize: 1 << 20, MaxBatchBytes: 1 << 20}
	c := newClient(t, addr, &ClientOptions{Limits: lim})
	sizes := []int{0, 1, 1 << 20, 500 << 10, 500 << 10, 600 << 10, 7, 64, 65}
	keys := make([]prefixhash.Key, len(sizes))
	vals := make([][]byte, len(sizes))
	for i, n := range sizes {
		keys[i], vals[i] = testKey(i), testValue(i, n)
	}
	st, err := c.Put(context.Background(), keys, vals)
	if err != nil {
		t.Fatal(err)
	}
	for i := range st {
		if st[i] != StatusOK {
			t.Fatalf("put %d: status %s", i, st[i])
		}
		if got, _ := src.get(keys[i]); !bytes.Equal(got, vals[i]) {
			t.Fatalf("value %d stored as %d bytes, want %d", i, len(got), len(vals[i]))
		}
	}
	r, err := c.Get(context.Background(), keys)
	if err != nil {
		t.Fatal(err)
	}
	checkResult(t, src, keys, r)
	r.Release()
}

// Closing the server while a request is being served fails the request on
// the client, well before its deadline.
func TestServerClosedMidRequest(t *testing.T) {
	src := newMemSource()
	srv, addr := startServer(t, src, nil)
	keys := fill(src, []int{10, 20})
	src.setBlock(keys[1])
	c := newClient(t, addr, &ClientOptions{RequestTimeout: time.Minute})
	errc := make(chan error, 1)
	go func() {
		_, err := c.Get(context.Background(), keys)
		errc <- err
	}()
	<-src.entered
	within(t, 10*time.Second, func() { srv.Close() })
	within(t, 10*time.Second, func() {
		if err := <-errc; err == nil || errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("Get during Close returned %v, want a connection error", err)
		}
	})
}

// A peer that accepts and never answers (partitioned, or hung) costs the
// caller its deadline, not a hang.
func TestBlackHolePeer(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	var held []net.Conn
	var mu sync.Mutex
	go func() {
		for {
			nc, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			held = append(held, nc)
			mu.Unlock()
		}
	}()
	defer func() {
		mu.Lock()
		for _, nc := range held {
			nc.Close()
		}
		mu.Unlock()
	}()
	c := newClient(t, ln.Addr().String(), &ClientOptions{RequestTimeout: 50 * time.Millisecond})
	within(t, 10*time.Second, func() {
		_, err := c.Get(context.Background(), []prefixhash.Key{testKey(1)})
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("Get from a silent peer: %v, want DeadlineExceeded", err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		go cancel()
		_, err = c.Put(ctx, []prefixhash.Key{testKey(1)}, [][]byte{{1}})
		if !errors.Is(err, context.Canceled) {
			t.Errorf("canceled Put to a silent peer: %v, want Canceled", err)
		}
	})
	// A peer that is not there at all.
	c2 := newClient(t, "127.0.0.1:1", &ClientOptions{RequestTimeout: time.Second})
	if _, err := c2.Get(context.Background(), []prefixhash.Key{testKey(1)}); err == nil {
		t.Fatal("Get from a closed port succeeded")
	}
}

// A slow Source makes one request miss its deadline; the server learns the
// deadline from the request and stops; later requests through the same
// pool are answered correctly (the abandoned connection was not reused).
func TestSlowSourceDeadline(t *testing.T) {
	src := newMemSource()
	srv, addr := startServer(t, src, nil)
	keys := fill(src, []int{1000, 2000, 3000})
	slow := testKey(99)
	src.set(slow, testValue(99, 5000))
	src.setBlock(slow)
	c := newClient(t, addr, &ClientOptions{MaxConns: 1, RequestTimeout: 100 * time.Millisecond})
	within(t, 10*time.Second, func() {
		_, err := c.Get(context.Background(), []prefixhash.Key{keys[0], slow})
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("Get of a slow key: %v, want DeadlineExceeded", err)
		}
	})
	// The server gave up too: the Source saw its context end.
	within(t, 10*time.Second, func() { <-src.ctxDone })
	for range 5 {
		r, err := c.Get(context.Background(), keys)
		if err != nil {
			t.Fatal(err)
		}
		checkResult(t, src, keys, r)
		r.Release()
	}
	testkit.WaitFor(t, "the abandoned connection to close", func() bool { return srv.Stats().Conns == 1 })
}

// writeRaw sends bytes on a fresh connection and returns everything the
// server answers before closing it.
func writeRaw(t *testing.T, addr string, b []byte) []byte {
	t.Helper()
	nc, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	nc.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := nc.Write(b); err != nil {
		t.Fatal(err)
	}
	if tc, ok := nc.(*net.TCPConn); ok {
		tc.CloseWrite()
	}
	out, err := io.ReadAll(nc)
	if err != nil && !errors.Is(err, net.ErrClosed) && !strings.Contains(err.Error(), "reset") {
		t.Fatalf("reading the server's answer: %v", err)
	}
	return out
}

// errorFrame decodes an error frame and returns its message.
func errorFrame(t *testing.T, b []byte) string {
	t.Helper()
	lim := Limits{}
	lim.EnsureDefaults()
	h, err := parseHeader(b, &lim)
	if err != nil || h.typ != typeError || len(b) != headerLen+h.payload {
		t.Fatalf("answer is not one error frame (%d bytes, %v, %s)", len(b), err, h.typ)
	}
	return string(b[headerLen:])
}

func getFrame(id uint64, keys ...prefixhash.Key) []byte {
	var enc encoder
	tb := enc.begin(typeGetReq, len(keys))
	for i, k := range keys {
		putKeyEntry(tb, i, k)
	}
	return bytes.Clone(enc.finish(header{typ: typeGetReq, id: id, count: len(keys)}))
}

// Bad frames get an error frame naming the problem and their connection is
// dropped; the server goes on serving everyone else.
func TestCorruptFrames(t *testing.T) {
	src := newMemSource()
	srv, addr := startServer(t, src, nil)
	keys := fill(src, []int{100, 200})
	good := newClient(t, addr, nil)

	flip := func(b []byte, i int) []byte { b = bytes.Clone(b); b[i] ^= 0x40; return b }
	req := getFrame(7, keys...)
	for _, tc := range []struct {
		name, want string
		frame      []byte
	}{
		{"bad magic", "bad magic", flip(req, 0)},
		{"bad version", "wire version", flip(req, 4)},
		{"header bit flip", "header checksum", flip(req, 17)},
		{"table bit flip", "table checksum", flip(req, headerLen+3)},
		{"response type sent to server", "unexpected", func() []byte {
			var enc encoder
			enc.begin(typePutResp, 0)
			return bytes.Clone(enc.finish(header{typ: typePutResp, id: 1}))
		}()},
		{"garbage", "corrupt", bytes.Repeat([]byte{0xff}, 100)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			msg := errorFrame(t, writeRaw(t, addr, tc.frame))
			if !strings.Contains(msg, tc.want) {
				t.Fatalf("error message %q does not mention %q", msg, tc.want)
			}
			r, err := good.Get(context.Background(), keys)
			if err != nil {
				t.Fatalf("server stopped serving others: %v", err)
			}
			checkResult(t, src, keys, r)
			r.Release()
		})
	}
	// A frame cut short: the server waits for the rest until the client
	// gives up, then drops the connection without answering.
	if out := writeRaw(t, addr, req[:headerLen+5]); len(out) != 0 {
		t.Fatalf("truncated frame got a %d-byte answer", len(out))
	}
	if out := writeRaw(t, addr, req[:20]); len(out) != 0 {
		t.Fatalf("truncated header got a %d-byte answer", len(out))
	}
	testkit.WaitFor(t, "bad connections to be dropped", func() bool { return srv.Stats().Dropped >= 8 })
}

func helloAck(id uint64) []byte {
	var enc encoder
	enc.begin(typeHelloAck, 0)
	return bytes.Clone(enc.finish(header{typ: typeHelloAck, id: id}))
}

// fakeServer acknowledges each connection's hello and answers every other
// frame with answer(request header id, conn).
func fakeServer(t *testing.T, answer func(id uint64, nc net.Conn)) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	t.Cleanup(func() { ln.Close(); wg.Wait() })
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			nc, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer nc.Close()
				nc.SetDeadline(time.Now().Add(10 * time.Second))
				lim := Limits{}
				lim.EnsureDefaults()
				for {
					var hdr [headerLen]byte
					if _, err := io.ReadFull(nc, hdr[:]); err != nil {
						return
					}
					h, err := parseHeader(hdr[:], &lim)
					if err != nil {
						return
					}
					if _, err := io.CopyN(io.Discard, nc, int64(h.tableLen()+h.payload)); err != nil {
						return
					}
					if h.typ == typeHello {
						nc.Write(helloAck(h.id))
						continue
					}
					answer(h.id, nc)
				}
			}()
		}
	}()
	return ln.Addr().String()
}

// getResponse encodes a getResp frame answering id with vals (nil = miss).
func getResponse(id uint64, vals ...[]byte) []byte {
	var enc encoder
	tb := enc.begin(typeGetResp, len(vals))
	total := 0
	var payload []byte
	for i, v := range vals {
		if v == nil {
			putStatusEntry(tb, i, StatusMiss, 0)
			continue
		}
		putStatusEntry(tb, i, StatusOK, len(v))
		total += alignUp(len(v))
		payload = append(payload, v...)
		payload = append(payload, make([]byte, alignUp(len(v))-len(v))...)
	}
	return append(bytes.Clone(enc.finish(header{typ: typeGetResp, id: id, count: len(vals), payload: total})), payload...)
}

// The client rejects bad answers with a clear error, drops the connection,
// and its next request (on a new connection) is answered correctly.
func TestClientRejectsBadResponses(t *testing.T) {
	val := testValue(1, 1000)
	for _, tc := range []struct {
		name   string
		mangle func(b []byte) []byte
		want   error
	}{
		{"table bit flip", func(b []byte) []byte { b[headerLen] ^= 1; return b }, ErrCorrupt},
		{"header bit flip", func(b []byte) []byte { b[9] ^= 1; return b }, ErrCorrupt},
		{"wrong request id", func([]byte) []byte { return getResponse(12345, nil) }, ErrCorrupt},
		{"truncated values", func(b []byte) []byte { return b[:len(b)-100] }, io.ErrUnexpectedEOF},
		{"truncated table", func(b []byte) []byte { return b[:headerLen+3] }, io.ErrUnexpectedEOF},
		{"value over MaxValueSize", func([]byte) []byte {
			return nil // replaced below
		}, ErrLimit},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var mu sync.Mutex
			calls := 0
			addr := fakeServer(t, func(id uint64, nc net.Conn) {
				mu.Lock()
				calls++
				first := calls == 1
				mu.Unlock()
				resp := getResponse(id, val)
				if first {
					if tc.want == ErrLimit {
						resp = getResponse(id, make([]byte, 2000))
					} else {
						resp = tc.mangle(resp)
					}
					nc.Write(resp)
					if tc.want == io.ErrUnexpectedEOF {
						nc.Close()
					}
					return
				}
				nc.Write(resp)
			})
			c := newClient(t, addr, &ClientOptions{MaxConns: 1, Limits: Limits{MaxValueSize: 1024}})
			_, err := c.Get(context.Background(), []prefixhash.Key{testKey(1)})
			if !errors.Is(err, tc.want) {
				t.Fatalf("bad answer gave %v, want %v", err, tc.want)
			}
			r, err := c.Get(context.Background(), []prefixhash.Key{testKey(1)})
			if err != nil {
				t.Fatalf("request after a bad answer: %v", err)
			}
			if !bytes.Equal(r.Values[0], val) {
				t.Fatal("request after a bad answer got the wrong value")
			}
			r.Release()
		})
	}
}

// Limits hold against a hostile client: the server answers with an error
// frame before allocating anything, and clients check their own side.
func TestLimits(t *testing.T) {
	lim := Limits{MaxItems: 10, MaxValueSize: 1000, MaxBatchBytes: 4096}
	src := newMemSource()
	_, addr := startServer(t, src, &ServerOptions{Limits: lim})

	many := make([]prefixhash.Key, 11)
	msg := errorFrame(t, writeRaw(t, addr, getFrame(1, many...)))
	if !strings.Contains(msg, "MaxItems") {
		t.Fatalf("too many keys: %q", msg)
	}

	var enc encoder
	tb := enc.begin(typePutReq, 1)
	putPutEntry(tb, 0, testKey(1), 1<<30)
	msg = errorFrame(t, writeRaw(t, addr, enc.finish(header{typ: typePutReq, id: 2, count: 1, payload: 1 << 30})))
	if !strings.Contains(msg, "MaxBatchBytes") {
		t.Fatalf("huge put: %q", msg)
	}
	tb = enc.begin(typePutReq, 1)
	putPutEntry(tb, 0, testKey(1), 2000)
	msg = errorFrame(t, writeRaw(t, addr, enc.finish(header{typ: typePutReq, id: 3, count: 1, payload: 2048})))
	if !strings.Contains(msg, "MaxValueSize") {
		t.Fatalf("value over the limit: %q", msg)
	}

	// The client refuses to send a value over its limit.
	c := newClient(t, addr, &ClientOptions{Limits: lim})
	if _, err := c.Put(context.Background(), []prefixhash.Key{testKey(1)}, [][]byte{make([]byte, 1001)}); !errors.Is(err, ErrLimit) {
		t.Fatalf("put over MaxValueSize: %v, want ErrLimit", err)
	}
	// A stored value over the server's limit is an error item, not a
	// broken connection.
	src.set(testKey(5), make([]byte, 1001))
	src.set(testKey(6), make([]byte, 10))
	r, err := c.Get(context.Background(), []prefixhash.Key{testKey(5), testKey(6)})
	if err != nil {
		t.Fatal(err)
	}
	if r.Status[0] != StatusError || r.Status[1] != StatusOK {
		t.Fatalf("statuses %v, want [error ok]", r.Status)
	}
	r.Release()
	// Keys beyond MaxItems are split by the client.
	r, err = c.Get(context.Background(), fill(src, make([]int, 25)))
	if err != nil || r.Hits() != 25 {
		t.Fatalf("25 keys with MaxItems 10: %v, %d hits", err, r.Hits())
	}
	r.Release()
}

// Unreleased results hold the client's in-flight budget: further gets wait
// for it (and give up with their context), and go on once it is released.
func TestInFlightBound(t *testing.T) {
	lim := Limits{MaxValueSize: 1 << 20, MaxBatchBytes: 1 << 20}
	src := newMemSource()
	_, addr := startServer(t, src, nil)
	keys := fill(src, []int{1 << 20, 1 << 20})
	c := newClient(t, addr, &ClientOptions{Limits: lim, MaxInFlightBytes: 1 << 20})
	r1, err := c.Get(context.Background(), keys[:1])
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if _, err := c.Get(ctx, keys[1:]); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("get over the in-flight budget: %v, want DeadlineExceeded", err)
	}
	done := make(chan error, 1)
	go func() {
		r2, err := c.Get(context.Background(), keys[1:])
		if err == nil {
			checkResult(t, src, keys[1:], r2)
			r2.Release()
		}
		done <- err
	}()
	r1.Release()
	within(t, 10*time.Second, func() {
		if err := <-done; err != nil {
			t.Errorf("get after release: %v", err)
		}
	})
}

// A pooled connection the server closed while idle is replaced
// transparently, over plain TCP and over TLS.
func TestStaleConnectionRetried(t *testing.T) {
	p := newPKI(t)
	srvTLS, cliTLS := loadTLS(t, TLSFiles{Cert: p.nodeCert, Key: p.nodeKey, CA: p.a.File})
	for _, useTLS := range []bool{false, true} {
		so, co := &ServerOptions{IdleTimeout: 20 * time.Millisecond}, &ClientOptions{MaxConns: 1}
		if useTLS {
			so.TLS, co.TLS = srvTLS, cliTLS
		}
		src := newMemSource()
		srv, addr := startServer(t, src, so)
		keys := fill(src, []int{10})
		c := newClient(t, addr, co)
		for range 3 {
			r, err := c.Get(context.Background(), keys)
			if err != nil {
				t.Fatalf("TLS %v: %v", useTLS, err)
			}
			checkResult(t, src, keys, r)
			r.Release()
			testkit.WaitFor(t, "the server to close the idle connection", func() bool { return srv.Stats().Conns == 0 })
		}
	}
}

func TestPutWithoutSink(t *testing.T) {
	s, err := NewServer(newMemSource(), nil, nil, quietLog)
	if err != nil {
		t.Fatal(err)
	}
	addr, err := s.Listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	c := newClient(t, addr.String(), nil)
	_, err = c.Put(context.Background(), []prefixhash.Key{testKey(1)}, [][]byte{{1, 2, 3}})
	if !errors.Is(err, ErrRemote) || !strings.Contains(err.Error(), "accepts no puts") {
		t.Fatalf("put to a server without a sink: %v", err)
	}
}

func TestClientClose(t *testing.T) {
	src := newMemSource()
	_, addr := startServer(t, src, nil)
	keys := fill(src, []int{10})
	c := newClient(t, addr, nil)
	r, err := c.Get(context.Background(), keys)
	if err != nil {
		t.Fatal(err)
	}
	c.Close()
	checkResult(t, src, keys, r) // still valid after Close
	r.Release()
	if _, err := c.Get(context.Background(), keys); !errors.Is(err, ErrClosed) {
		t.Fatalf("get after Close: %v, want ErrClosed", err)
	}
}

func TestOptionsValidate(t *testing.T) {
	for _, tc := range []struct {
		opts  ClientOptions
		field string
	}{
		{ClientOptions{Limits: Limits{MaxItems: -1}}, "MaxItems"},
		{ClientOptions{Limits: Limits{MaxValueSize: 1 << 20, MaxBatchBytes: 1000}}, "MaxBatchBytes"},
		{ClientOptions{MaxConns: -2}, "MaxConns"},
		{ClientOptions{Limits: Limits{MaxBatchBytes: 1 << 20}, MaxInFlightBytes: 1000}, "MaxInFlightBytes"},
	} {
		_, err := NewClient("x:1", &tc.opts)
		if err == nil || !strings.Contains(err.Error(), tc.field) {
			t.Errorf("%+v: error %v does not name %s", tc.opts, err, tc.field)
		}
	}
	if _, err := NewServer(newMemSource(), nil, &ServerOptions{RequestTimeout: -1}, nil); err == nil || !strings.Contains(err.Error(), "RequestTimeout") {
		t.Errorf("negative RequestTimeout: %v", err)
	}
	if _, err := NewShmServer(newMemSource(), nil, &ShmServerOptions{RegionSize: 1000}, nil); err == nil || !strings.Contains(err.Error(), "RegionSize") {
		t.Errorf("odd RegionSize: %v", err)
	}
}

// A 64 KiB GET over TCP allocates a small, constant number of objects,
// client and server together, whatever the caller's context: no context
// of its own when the caller's deadline comes first, no per-request scope
// context on the server (the connection's carries its principal).
func TestGetAllocsConstant(t *testing.T) {
	if testing.Short() {
		t.Skip("counts allocations of many requests")
	}
	if invariants.Enabled {
		// The race detector drops sync.Pool items at random, and the
		// invariants build tracks every Result for leaks (an allocation
		// each): the budget is a production build's.
		t.Skip("allocation budget of a production build; this build has the race detector or the invariants checks")
	}
	src := newMemSource()
	_, addr := startServer(t, src, nil)
	c := newClient(t, addr, nil)
	keys := fill(src, []int{64 << 10})
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	get := func() {
		r, err := c.Get(ctx, keys)
		if err != nil {
			t.Fatal(err)
		}
		r.Release()
	}
	get() // warm: the connection and its buffers
	// A budget, not a benchmark: 23 per GET before the server kept
	// one context per connection and the client used the caller's deadline;
	// 14 after, and room for a stray one.
	const budget = 16
	n := testing.AllocsPerRun(200, get)
	t.Logf("%.1f allocations per 64 KiB GET", n)
	if n > budget {
		t.Errorf("%.1f allocations per 64 KiB GET, want at most %d", n, budget)
	}
}
