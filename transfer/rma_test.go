package transfer_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"net"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kvmesh/kvmesh/auth"
	"github.com/kvmesh/kvmesh/internal/testkit"
	"github.com/kvmesh/kvmesh/prefixhash"
	"github.com/kvmesh/kvmesh/transfer"
	"github.com/kvmesh/kvmesh/transfer/fabrictest"
	"github.com/kvmesh/kvmesh/transfer/transporttest"
)

// windowSource serves a transporttest.Store's values from copies in a
// window-sized arena, the way the node serves its DRAM arena in place:
// each Acquire copies a found value into a free slot, pinned until
// release. Values of at most outside bytes stay where they are, outside
// the window (the node's NVMe tier), to take the TCP path.
type windowSource struct {
	*transporttest.Store
	mem     []byte
	slot    int
	outside int

	mu   sync.Mutex
	free []int
}

func newWindowSource(t testing.TB, st *transporttest.Store, slots, slot, outside int) *windowSource {
	mem, err := unix.Mmap(-1, 0, slots*slot, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANON)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Munmap(mem) })
	w := &windowSource{Store: st, mem: mem, slot: slot, outside: outside}
	for i := range slots {
		w.free = append(w.free, i)
	}
	return w
}

func (w *windowSource) Acquire(ctx context.Context, keys []prefixhash.Key, vals [][]byte, st []transfer.Status) func() {
	w.Store.Acquire(ctx, keys, vals, st)
	var taken []int
	w.mu.Lock()
	defer w.mu.Unlock()
	for i, v := range vals {
		if st[i] != transfer.StatusOK || len(v) <= w.outside || len(v) > w.slot || len(w.free) == 0 {
			continue
		}
		s := w.free[len(w.free)-1]
		w.free = w.free[:len(w.free)-1]
		taken = append(taken, s)
		dst := w.mem[s*w.slot : s*w.slot+len(v) : s*w.slot+len(v)]
		copy(dst, v)
		vals[i] = dst
	}
	return func() {
		w.mu.Lock()
		w.free = append(w.free, taken...)
		w.mu.Unlock()
	}
}

// freeSlots returns how many slots no lease pins.
func (w *windowSource) freeSlots() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.free)
}

// rmaBed is one owner (a TCP server with a window over a windowSource) and
// an RMA transport to read it with, over fab.
type rmaBed struct {
	st   *transporttest.Store
	src  *windowSource
	win  *transfer.Window
	srv  *transfer.Server
	addr string
	rma  *transfer.RMA
}

func newRMABed(t *testing.T, fab transfer.Fabric, so *transfer.ServerOptions, ro *transfer.RMAOptions) *rmaBed {
	t.Helper()
	b := &rmaBed{st: transporttest.NewStore()}
	b.src = newWindowSource(t, b.st, 32, 512<<10, 1024)
	var err error
	if b.win, err = transfer.Expose(fab, b.src.mem); err != nil {
		t.Fatal(err)
	}
	var o transfer.ServerOptions
	if so != nil {
		o = *so
	}
	o.Window = b.win
	if b.srv, err = transfer.NewServer(b.src, b.st, &o, quiet); err != nil {
		t.Fatal(err)
	}
	ln, err := b.srv.Listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	b.addr = ln.String()
	var opts transfer.RMAOptions
	if ro != nil {
		opts = *ro
	}
	opts.Logger = quiet
	if opts.LandingBytes == 0 {
		opts.LandingBytes = 8 << 20
	}
	if b.rma, err = transfer.NewRMA(fab, &opts); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		b.srv.Close()
		b.win.Close()
		if held, lost := b.rma.LandingUse(); held == lost {
			b.rma.Close()
		}
	})
	return b
}

func (b *rmaBed) client(t *testing.T) *transfer.RMAClient {
	t.Helper()
	c, err := b.rma.Client(b.addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// fill stores n values of size bytes and returns their keys.
func (b *rmaBed) fill(n, size int) []prefixhash.Key {
	keys := make([]prefixhash.Key, n)
	for i := range keys {
		keys[i] = prefixhash.Key{0xfa, byte(i), byte(size >> 8), byte(size)}
		b.st.Set(keys[i], bytes.Repeat([]byte{byte(i + 1), byte(size)}, size/2))
	}
	return keys
}

// checkGet gets keys through c and checks every value against the store.
func (b *rmaBed) checkGet(t *testing.T, c transfer.Peer, keys []prefixhash.Key) *transfer.Result {
	t.Helper()
	r, err := c.Get(context.Background(), keys)
	if err != nil {
		t.Fatalf("Get: %v", err)
	}
	for i, k := range keys {
		want, ok := b.st.Get(k)
		if ok != (r.Status[i] == transfer.StatusOK) || ok && !bytes.Equal(r.Values[i], want) {
			t.Fatalf("key %d: status %v, %d bytes; the store has %v, %d bytes", i, r.Status[i], len(r.Values[i]), ok, len(want))
		}
	}
	return r
}

// TestConformanceRMA runs the transport suite over the one-sided path with
// the in-process fabric: values in the window are read one-sidedly, small
// ones (outside it) and everything else over TCP.
func TestConformanceRMA(t *testing.T) {
	fab := fabrictest.New("ucx")
	rma, err := transfer.NewRMA(fab, &transfer.RMAOptions{LandingBytes: 4 << 20, Logger: quiet,
		Client: transfer.ClientOptions{Limits: transfer.Limits{MaxBatchBytes: 1 << 20, MaxValueSize: 1 << 20}, MaxConns: 3}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rma.Close() })
	var srv *transfer.Server
	var src *windowSource
	transporttest.Run(t, transporttest.Harness{
		Transport: rma,
		Serve: func(t *testing.T, st *transporttest.Store) string {
			src = newWindowSource(t, st, 16, 512<<10, 1024)
			win, err := transfer.Expose(fab, src.mem)
			if err != nil {
				t.Fatal(err)
			}
			s, err := transfer.NewServer(src, st, &transfer.ServerOptions{Window: win, Limits: transfer.Limits{MaxBatchBytes: 1 << 20, MaxValueSize: 1 << 20}}, quiet)
			if err != nil {
				t.Fatal(err)
			}
			addr, err := s.Listen("127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() {
				s.Close()
				win.Close()
			})
			srv = s
			return addr.String()
		},
		Idle: func() bool {
			held, _ := rma.LandingUse()
			return held == 0 && srv.Stats().Leases == 0 && src.freeSlots() == 16
		},
	})
	if st := rma.Stats(); st.Reads == 0 || st.Fallbacks == 0 {
		t.Errorf("the suite read %d values one-sidedly and %d over TCP: want both paths taken", st.Reads, st.Fallbacks)
	}
}

// TestRMAReadsOneSided: values in the window arrive by one-sided reads
// into the landing region, under a lease the owner ends when the reader
// does; a value outside the window comes over TCP in the same Get.
func TestRMAReadsOneSided(t *testing.T) {
	fab := fabrictest.New("ucx")
	b := newRMABed(t, fab, nil, nil)
	keys := append(b.fill(8, 64<<10), b.fill(1, 100)...)
	c := b.client(t)
	r := b.checkGet(t, c, keys)
	if st := b.rma.Stats(); st.Reads != 8 || st.ReadBytes != 8*64<<10 || st.Fallbacks != 1 {
		t.Errorf("stats %+v: want 8 reads of 512 KiB and 1 fallback", st)
	}
	if fab.Reads() != 8 {
		t.Errorf("the fabric read %d spans, want 8", fab.Reads())
	}
	if held, _ := b.rma.LandingUse(); held != 8*64<<10 {
		t.Errorf("the result holds %d landing bytes, want %d", held, 8*64<<10)
	}
	if s := b.srv.Stats(); s.Leases != 0 || s.LeasesExpired != 0 {
		t.Errorf("server: %d leases open, %d expired after the reads; want the reader to have ended its lease", s.Leases, s.LeasesExpired)
	}
	if c.Path() != "ucx" {
		t.Errorf("Path %q, want ucx", c.Path())
	}
	r.Release()
	if held, _ := b.rma.LandingUse(); held != 0 {
		t.Errorf("%d landing bytes held after Release", held)
	}
	if b.src.freeSlots() != 32 {
		t.Errorf("%d of 32 window slots free after the lease ended", b.src.freeSlots())
	}
}

// TestRMAPeerWithoutWindow: a peer with no window (a build without UCX, or
// a node that did not start it) is read over TCP: no request fails.
func TestRMAPeerWithoutWindow(t *testing.T) {
	fab := fabrictest.New("ucx")
	st := transporttest.NewStore()
	st.Set(prefixhash.Key{1}, bytes.Repeat([]byte{7}, 300<<10))
	srv, err := transfer.NewServer(st, st, nil, quiet)
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	addr, err := srv.Listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	rma, err := transfer.NewRMA(fab, &transfer.RMAOptions{LandingBytes: 1 << 20, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	defer rma.Close()
	c, err := rma.Client(addr.String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	for range 2 {
		r, err := c.Get(context.Background(), []prefixhash.Key{{1}, {2}})
		if err != nil {
			t.Fatal(err)
		}
		if r.Status[0] != transfer.StatusOK || len(r.Values[0]) != 300<<10 || r.Status[1] != transfer.StatusMiss {
			t.Fatalf("got %v, %d bytes; want the value and a miss", r.Status, len(r.Values[0]))
		}
		r.Release()
	}
	if s := rma.Stats(); s.Reads != 0 || s.Fallbacks != 4 {
		t.Errorf("stats %+v: want every key over TCP", s)
	}
	if c.Path() != "tcp" {
		t.Errorf("Path %q, want tcp", c.Path())
	}
}

// TestRMATenantGetsNoWindow: the window reads every tenant's blocks, so a
// tenant's connection is not given it and reads over TCP, confined to its
// own blocks as ever.
func TestRMATenantGetsNoWindow(t *testing.T) {
	fab := fabrictest.New("ucx")
	tokens, err := auth.NewCredentials([]auth.Credential{
		{Sum: sha256.Sum256([]byte("tenant-token")), Principal: auth.Principal{Tenant: "acme", Scopes: auth.Read | auth.Write, Tag: auth.TagOf("acme")}},
	})
	if err != nil {
		t.Fatal(err)
	}
	b := newRMABed(t, fab, &transfer.ServerOptions{Tokens: tokens}, &transfer.RMAOptions{Client: transfer.ClientOptions{Token: "tenant-token"}})
	keys := b.fill(2, 64<<10)
	c := b.client(t)
	r, err := c.Get(context.Background(), keys)
	if err != nil {
		t.Fatal(err)
	}
	r.Release()
	if s := b.rma.Stats(); s.Reads != 0 {
		t.Errorf("a tenant's client read %d values one-sidedly", s.Reads)
	}
	if c.Path() != "tcp" {
		t.Errorf("Path %q, want tcp", c.Path())
	}
}

// TestRMALeaseExpired: an owner reuses a slot whose lease expired while it
// was being read; the reader learns it when it ends the lease, discards
// what it read and asks again over TCP: a miss (the block is gone), never
// the bytes that replaced it.
func TestRMALeaseExpired(t *testing.T) {
	fab := fabrictest.New("ucx")
	b := newRMABed(t, fab, &transfer.ServerOptions{LeaseTimeout: time.Millisecond}, nil)
	keys := b.fill(1, 64<<10)
	c := b.client(t)
	release := fab.Hold()
	type got struct {
		r   *transfer.Result
		err error
	}
	done := make(chan got, 1)
	go func() {
		r, err := c.Get(context.Background(), keys)
		done <- got{r, err}
	}()
	testkit.WaitFor(t, "the read to start", func() bool { return fab.Waiting() == 1 })
	testkit.WaitFor(t, "the lease to expire", func() bool { return b.srv.Stats().LeasesExpired == 1 })
	// The owner evicts the block and reuses its slot.
	b.st.Delete(keys[0])
	for i := range b.src.mem {
		b.src.mem[i] = 0xee
	}
	release()
	g := <-done
	if g.err != nil {
		t.Fatal(g.err)
	}
	defer g.r.Release()
	if g.r.Status[0] != transfer.StatusMiss {
		t.Fatalf("status %v (%d bytes), want a miss", g.r.Status[0], len(g.r.Values[0]))
	}
	if s := b.rma.Stats(); s.Ended != 1 || s.Fallbacks != 1 {
		t.Errorf("stats %+v: want 1 value discarded and asked for again", s)
	}
}

// TestRMAStaleWindow: the owner restarted and registered a new window
// behind the same address; a reader holding the old one learns it from the
// epoch of the next lease answer, reads nothing with what it knew, gets
// over TCP, and reads one-sidedly again from the new window after.
func TestRMAStaleWindow(t *testing.T) {
	fab := fabrictest.New("ucx")
	st := transporttest.NewStore()
	keys := make([]prefixhash.Key, 4)
	for i := range keys {
		keys[i] = prefixhash.Key{0x5a, byte(i)}
		st.Set(keys[i], bytes.Repeat([]byte{byte(i + 1)}, 100<<10))
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	relay := newRelay(ln)
	defer relay.close()
	start := func() (*transfer.Server, *transfer.Window) {
		src := newWindowSource(t, st, 8, 512<<10, 1024)
		win, err := transfer.Expose(fab, src.mem)
		if err != nil {
			t.Fatal(err)
		}
		srv, err := transfer.NewServer(src, st, &transfer.ServerOptions{Window: win}, quiet)
		if err != nil {
			t.Fatal(err)
		}
		go srv.Serve(relay.listener())
		return srv, win
	}
	srv, win := start()
	rma, err := transfer.NewRMA(fab, &transfer.RMAOptions{LandingBytes: 4 << 20, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	defer rma.Close()
	c, err := rma.Client(ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	b := &rmaBed{st: st}
	b.checkGet(t, c, keys).Release()
	// The owner restarts: a new process, a new registration.
	srv.Close()
	win.Close()
	srv, win = start()
	defer func() {
		srv.Close()
		win.Close()
	}()
	b.checkGet(t, c, keys).Release()
	if s := rma.Stats(); s.Stale != 1 || s.Reads != 4 || s.Fallbacks != 4 {
		t.Errorf("stats %+v after the restart: want the stale answer noticed and the keys read over TCP", s)
	}
	b.checkGet(t, c, keys).Release()
	if s := rma.Stats(); s.Reads != 8 {
		t.Errorf("stats %+v: want the new window read one-sidedly", s)
	}
}

// relay hands the connections of one listener to a succession of servers:
// each gets a listener of its own that its Close closes, and the address
// stays the same, as a restarted node's does.
type relay struct {
	ln    net.Listener
	conns chan net.Conn
	wg    sync.WaitGroup
}

func newRelay(ln net.Listener) *relay {
	r := &relay{ln: ln, conns: make(chan net.Conn)}
	r.wg.Go(func() {
		for {
			nc, err := ln.Accept()
			if err != nil {
				return
			}
			r.conns <- nc
		}
	})
	return r
}

func (r *relay) close() {
	r.ln.Close()
	go func() { // a connection accepted but never taken
		for nc := range r.conns {
			nc.Close()
		}
	}()
	r.wg.Wait()
	close(r.conns)
}

func (r *relay) listener() net.Listener {
	return &relayListener{r: r, done: make(chan struct{})}
}

type relayListener struct {
	r    *relay
	once sync.Once
	done chan struct{}
}

func (l *relayListener) Accept() (net.Conn, error) {
	select {
	case nc := <-l.r.conns:
		return nc, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}

func (l *relayListener) Close() error {
	l.once.Do(func() { close(l.done) })
	return nil
}

func (l *relayListener) Addr() net.Addr { return l.r.ln.Addr() }

// TestRMAOwnerGoneMidRead: the owner's memory vanishes while a read is in
// flight (its process died): the read fails, the reader asks over TCP,
// which fails too: an error within the deadline, which callers count as
// misses, never a hang and never bytes.
func TestRMAOwnerGoneMidRead(t *testing.T) {
	fab := fabrictest.New("ucx")
	b := newRMABed(t, fab, nil, nil)
	keys := b.fill(4, 256<<10)
	c := b.client(t)
	release := fab.Hold()
	done := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		r, err := c.Get(ctx, keys)
		if err == nil {
			r.Release()
			err = errors.New("the Get succeeded")
		}
		done <- err
	}()
	testkit.WaitFor(t, "the read to start", func() bool { return fab.Waiting() == 1 })
	b.srv.Close()
	b.win.Close()
	release()
	if err := <-done; err == nil || err.Error() == "the Get succeeded" {
		t.Fatalf("Get from a dead owner: %v, want an error", err)
	}
	if s := b.rma.Stats(); s.Failures != 1 {
		t.Errorf("stats %+v: want the failed read counted", s)
	}
}

// TestRMAAbandonedRead: a read that outlives the caller's deadline is
// given up: Get returns the deadline, the landing space stays the
// fabric's until the read ends, and is free after.
func TestRMAAbandonedRead(t *testing.T) {
	fab := fabrictest.New("ucx")
	b := newRMABed(t, fab, nil, nil)
	keys := b.fill(2, 64<<10)
	c := b.client(t)
	defer fab.Hold()()
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	if _, err := c.Get(ctx, keys); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Get past its deadline: %v, want DeadlineExceeded", err)
	}
	fab.Wait() // the remote was closed: the read ended
	if held, lost := b.rma.LandingUse(); held != 0 || lost != 0 {
		t.Errorf("landing: %d bytes held, %d lost after the read ended", held, lost)
	}
}

// TestRMAFabricConnectFails: a descriptor the fabric cannot use (a worker
// address that does not parse, an unreachable device) makes the peer a TCP
// peer for RMAOptions.Retry: the Get succeeds.
func TestRMAFabricConnectFails(t *testing.T) {
	fab := fabrictest.New("ucx")
	b := newRMABed(t, fab, nil, nil)
	keys := b.fill(3, 64<<10)
	fab.FailConnect(errors.New("worker address does not parse"))
	c := b.client(t)
	b.checkGet(t, c, keys).Release()
	b.checkGet(t, c, keys).Release()
	if s := b.rma.Stats(); s.Reads != 0 || s.Fallbacks != 6 || s.Failures != 1 {
		t.Errorf("stats %+v: want one failed connection, then TCP", s)
	}
	if c.Path() != "tcp" {
		t.Errorf("Path %q, want tcp", c.Path())
	}
}

// TestRMASkipTCPOnly: under --transport auto, a fabric that would reach
// the peer over plain TCP only is not used; one with a shared-memory or
// RDMA lane is.
func TestRMASkipTCPOnly(t *testing.T) {
	for _, tc := range []struct {
		transports []string
		reads      int64
	}{
		{[]string{"tcp/lo"}, 0},
		{[]string{"cma/memory", "posix/memory"}, 2},
		{[]string{"rc_mlx5/mlx5_0:1", "tcp/eth0"}, 2},
	} {
		fab := fabrictest.New("ucx")
		fab.SetTransports(tc.transports)
		b := newRMABed(t, fab, nil, &transfer.RMAOptions{SkipTCPOnly: true})
		keys := b.fill(2, 64<<10)
		b.checkGet(t, b.client(t), keys).Release()
		if s := b.rma.Stats(); s.Reads != tc.reads {
			t.Errorf("fabric over %v: %d one-sided reads, want %d", tc.transports, s.Reads, tc.reads)
		}
	}
}
