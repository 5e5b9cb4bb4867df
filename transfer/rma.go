package transfer

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kvmesh/kvmesh/block"
	"github.com/kvmesh/kvmesh/prefixhash"
)

// RMA is the one-sided transport: each peer is an RMAClient, which reads
// the values a peer holds in its Window through a Fabric under leases the
// peer grants (lease.go), into a landing region shared by every peer of
// the transport, and does everything else over the TCP data plane: values
// outside the window (on the peer's NVMe tier), values that find no room
// in the landing region, peers without a window or whose fabric failed,
// part reads, claims, lookups and writes (puts stay two-sided: the owner
// verifies and places what it stores). No request fails for the fabric's
// sake: what it cannot read, TCP gets.
type RMA struct {
	fabric  Fabric
	opts    RMAOptions
	landing *landing
	stats   rmaCounters
}

// RMAOptions configure an RMA transport.
type RMAOptions struct {
	// Client configures each peer's TCP client: lease requests, gets
	// that fall back, writes. Its RequestTimeout bounds a whole Get.
	Client ClientOptions
	// LandingBytes is the size of the registered memory that reads land
	// in, shared by every peer; a Result's values hold their space until
	// Release. A value that finds no room is read over TCP instead. On
	// RDMA the whole region is pinned. Default 256 MiB.
	LandingBytes int64
	// SkipTCPOnly makes a peer whose reads the fabric would carry only
	// over its own TCP transport (UCX's "tcp") a TCP peer: kvmesh's TCP
	// path is faster than a fabric's emulation of one-sided reads over a
	// socket. --transport auto sets it. Default false.
	SkipTCPOnly bool
	// Retry is how long a peer that has no window for this client, whose
	// fabric connection failed, or that SkipTCPOnly ruled out, is read
	// over TCP before the client asks again. Default 30s.
	Retry time.Duration
	// Logger logs each peer's change of path. Default slog.Default().
	Logger *slog.Logger
}

// EnsureDefaults fills zero fields with their defaults.
func (o *RMAOptions) EnsureDefaults() {
	o.Client.EnsureDefaults()
	if o.LandingBytes == 0 {
		o.LandingBytes = 256 << 20
	}
	if o.Retry == 0 {
		o.Retry = 30 * time.Second
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
}

// Validate reports the first field out of range.
func (o *RMAOptions) Validate() error {
	if err := o.Client.Validate(); err != nil {
		return err
	}
	switch {
	case o.LandingBytes < 1<<16 || o.LandingBytes > maxRegionSize || o.LandingBytes%(1<<12) != 0:
		return fmt.Errorf("transfer: RMAOptions.LandingBytes %d must be a multiple of 4KiB in [64KiB, 1TiB]", o.LandingBytes)
	case o.Retry < 0:
		return fmt.Errorf("transfer: RMAOptions.Retry %v must not be negative", o.Retry)
	}
	return nil
}

// RMAStats count what an RMA transport's clients read and how.
type RMAStats struct {
	Reads     int64 // values read one-sidedly through the fabric
	ReadBytes int64 // their bytes
	// Fallbacks are keys asked for with a TCP get: what a lease round did
	// not deliver (outside the window, no landing room, a lease that
	// ended, a failed read), and every key of a peer read over TCP alone;
	// FallbackValues and FallbackBytes, what those gets found.
	Fallbacks, FallbackValues, FallbackBytes int64
	// Ended counts values read under a lease that had ended when the
	// client ended it (read again over TCP); Stale, lease answers from a
	// window other than the one the client knew (the peer restarted);
	// Failures, fabric reads or connections that failed.
	Ended, Stale, Failures int64
}

type rmaCounters struct {
	reads, readBytes, fallbacks, fallbackValues, fallbackBytes, ended, stale, failures atomic.Int64
}

// NewRMA returns the RMA transport over f. It maps and registers the
// landing region at once.
func NewRMA(f Fabric, opts *RMAOptions) (*RMA, error) {
	var o RMAOptions
	if opts != nil {
		o = *opts
	}
	o.EnsureDefaults()
	if err := o.Validate(); err != nil {
		return nil, err
	}
	l, err := newLanding(f, o.LandingBytes)
	if err != nil {
		return nil, err
	}
	return &RMA{fabric: f, opts: o, landing: l}, nil
}

var (
	_ Transport = (*RMA)(nil)
	_ PartPeer  = (*RMAClient)(nil)
)

// Name returns the fabric's name.
func (t *RMA) Name() string { return t.fabric.Name() }

// Dial returns an RMAClient of the peer whose TCP data plane is at addr.
// It connects lazily.
func (t *RMA) Dial(_ context.Context, addr string) (Peer, error) {
	c, err := t.Client(addr)
	if err != nil {
		return nil, err // not a nil *RMAClient in a non-nil Peer
	}
	return c, nil
}

// Client returns an RMAClient of the peer whose TCP data plane is at addr.
func (t *RMA) Client(addr string) (*RMAClient, error) {
	tcp, err := NewClient(addr, &t.opts.Client)
	if err != nil {
		return nil, err
	}
	return &RMAClient{t: t, tcp: tcp}, nil
}

// Stats returns the transport's counters.
func (t *RMA) Stats() RMAStats {
	s := &t.stats
	return RMAStats{Reads: s.reads.Load(), ReadBytes: s.readBytes.Load(), Fallbacks: s.fallbacks.Load(), FallbackValues: s.fallbackValues.Load(), FallbackBytes: s.fallbackBytes.Load(),
		Ended: s.ended.Load(), Stale: s.stale.Load(), Failures: s.failures.Load()}
}

// LandingUse returns the landing region's bytes held by unreleased
// Results, and of those the bytes of reads given up on (a deadline) that
// the fabric has not finished yet.
func (t *RMA) LandingUse() (held, lost int64) {
	t.landing.mu.Lock()
	defer t.landing.mu.Unlock()
	return t.landing.mu.a.used, t.landing.mu.lost
}

// Close deregisters and unmaps the landing region. Every client must be
// closed and every Result released first.
func (t *RMA) Close() error { return t.landing.close() }

// landing is the registered memory reads land in.
type landing struct {
	mem []byte
	reg Region
	mu  struct {
		sync.Mutex
		a    *arena
		lost int64 // bytes of reads given up on that the fabric may still write
	}
}

func newLanding(f Fabric, size int64) (*landing, error) {
	mem, err := unix.Mmap(-1, 0, int(size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANON|unix.MAP_NORESERVE)
	if err != nil {
		return nil, fmt.Errorf("transfer: map the landing region: %w", err)
	}
	reg, err := f.Register(mem)
	if err != nil {
		unix.Munmap(mem)
		return nil, fmt.Errorf("transfer: register the landing region with %s: %w", f.Name(), err)
	}
	l := &landing{mem: mem, reg: reg}
	l.mu.a = newArena(size)
	return l, nil
}

func (l *landing) alloc(n int) (int64, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.mu.a.alloc(int64(n))
}

func (l *landing) free(ext []extent) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, e := range ext {
		l.mu.a.release(e.off, e.n)
	}
}

// quarantine marks ext, allocated, as the fabric's: reads a client gave
// up on may still write it.
func (l *landing) quarantine(ext []extent) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, e := range ext {
		l.mu.lost += e.n
	}
}

// unquarantine frees ext once the fabric is done with it.
func (l *landing) unquarantine(ext []extent) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, e := range ext {
		l.mu.lost -= e.n
		l.mu.a.release(e.off, e.n)
	}
}

func (l *landing) close() error {
	l.mu.Lock()
	used := l.mu.a.used - l.mu.lost
	l.mu.Unlock()
	if used != 0 {
		panic(fmt.Sprintf("transfer: RMA closed with %d landing bytes held by unreleased Results", used))
	}
	err := l.reg.Close()
	if uerr := unix.Munmap(l.mem); err == nil {
		err = uerr
	}
	return err
}

// RMAClient is one peer of an RMA transport. Get reads what the peer's
// window holds one-sidedly and the rest over TCP; everything else goes
// over TCP. Results' values lie in the transport's landing region (and, for
// what TCP fetched, pooled receive buffers) until Release. Safe for
// concurrent use.
type RMAClient struct {
	t   *RMA
	tcp *Client

	mu struct {
		sync.Mutex
		remote    *rmaRemote // nil: none yet, or dropped
		skipUntil time.Time  // read over TCP alone until then
		path      string     // what the last decision was, for the log
	}
}

// rmaRemote is a connected peer window.
type rmaRemote struct {
	r   Remote
	win windowDesc
}

// TCP returns the client's TCP client (which its Close closes).
func (c *RMAClient) TCP() *Client { return c.tcp }

// Close closes the TCP client and the fabric connection. Results already
// returned stay valid until released.
func (c *RMAClient) Close() error {
	c.mu.Lock()
	rr := c.mu.remote
	c.mu.remote = nil
	c.mu.Unlock()
	if rr != nil {
		rr.r.Close()
	}
	return c.tcp.Close()
}

// Put pushes values over TCP (see Client.Put): writes are two-sided.
func (c *RMAClient) Put(ctx context.Context, keys []prefixhash.Key, vals [][]byte) ([]Status, error) {
	return c.tcp.Put(ctx, keys, vals)
}

// GetParts reads parts over TCP (see Client.GetParts): the owner builds
// part records, so they cannot be read in place.
func (c *RMAClient) GetParts(ctx context.Context, keys []prefixhash.Key, parts []block.Part) (*Result, error) {
	return c.tcp.GetParts(ctx, keys, parts)
}

// Claim asks over TCP (see Client.Claim).
func (c *RMAClient) Claim(ctx context.Context, keys []prefixhash.Key, parts []block.Part) ([]block.ClaimStatus, error) {
	return c.tcp.Claim(ctx, keys, parts)
}

// Lookup asks over TCP (see Client.Lookup).
func (c *RMAClient) Lookup(ctx context.Context, runs [][]prefixhash.Key) ([]int, error) {
	return c.tcp.Lookup(ctx, runs)
}

// Path says how Get reads this peer now: the fabric's name, or "tcp".
func (c *RMAClient) Path() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.mu.remote != nil || (c.mu.skipUntil.IsZero() && c.mu.path == "") {
		return c.t.Name()
	}
	return "tcp"
}

// Get fetches keys: one lease round per MaxItems keys reads the values the
// peer holds in its window, then one TCP get fetches whatever the rounds
// did not deliver. Deadline and errors as Client.Get; a fabric failure is
// never an error (TCP reads instead). On error nothing is held.
func (c *RMAClient) Get(ctx context.Context, keys []prefixhash.Key) (*Result, error) {
	ctx, cancel := requestContext(ctx, c.tcp.opts.RequestTimeout)
	defer cancel()
	r := newResult(c, len(keys))
	var again []int // indexes of keys to get over TCP
	use := c.useFabric()
	for lo := 0; lo < len(keys); lo += c.tcp.opts.MaxItems {
		idx := make([]int, min(len(keys)-lo, c.tcp.opts.MaxItems))
		for i := range idx {
			idx[i] = lo + i
		}
		if !use {
			again = append(again, idx...)
			continue
		}
		var retry []int
		var ferr error
		err := c.tcp.do(ctx, func(cc *clientConn) error {
			var err error
			retry, ferr, err = c.leaseRound(ctx, cc, keys, idx, r)
			return err
		})
		if err != nil {
			r.Release()
			return nil, fmt.Errorf("transfer: get %d keys from %s: %w", len(keys), c.tcp.addr, err)
		}
		if ferr != nil {
			use = false // the rest of this Get goes over TCP
		}
		again = append(again, retry...)
	}
	if len(again) > 0 {
		if err := c.getTCP(ctx, keys, again, r); err != nil {
			r.Release()
			return nil, err
		}
	}
	return r, nil
}

// getTCP gets keys[idx] over TCP into r.
func (c *RMAClient) getTCP(ctx context.Context, keys []prefixhash.Key, idx []int, r *Result) error {
	sub := make([]prefixhash.Key, len(idx))
	for i, j := range idx {
		sub[i] = keys[j]
	}
	res, err := c.tcp.Get(ctx, sub)
	if err != nil {
		return err
	}
	found, n := int64(0), int64(0)
	for i, j := range idx {
		r.Status[j], r.Values[j] = res.Status[i], res.Values[i]
		if res.Status[i] == StatusOK {
			found++
			n += int64(len(res.Values[i]))
		}
	}
	r.subs = append(r.subs, res)
	c.t.stats.fallbacks.Add(int64(len(idx)))
	c.t.stats.fallbackValues.Add(found)
	c.t.stats.fallbackBytes.Add(n)
	return nil
}

// useFabric reports whether Get should try the fabric for this peer now.
func (c *RMAClient) useFabric() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.mu.remote != nil || !time.Now().Before(c.mu.skipUntil)
}

// skip makes the peer a TCP peer for Retry, and logs why once.
func (c *RMAClient) skip(why string, err error) {
	c.mu.Lock()
	c.mu.skipUntil = time.Now().Add(c.t.opts.Retry)
	changed := c.mu.path != why
	c.mu.path = why
	c.mu.Unlock()
	if changed {
		c.t.opts.Logger.Info("transfer: reading a peer over TCP", "peer", c.tcp.addr, "fabric", c.t.Name(), "why", why, "err", err, "retry_in", c.t.opts.Retry)
	}
}

// drop forgets rr (when it is still the client's) and closes it.
func (c *RMAClient) drop(rr *rmaRemote) {
	c.mu.Lock()
	mine := c.mu.remote == rr
	if mine {
		c.mu.remote = nil
	}
	c.mu.Unlock()
	if mine {
		rr.r.Close()
	}
}

// remote returns the peer's window, asking for it on cc when the client
// has none. ferr is a reason to read over TCP (no window, a bad
// descriptor, a fabric that cannot connect); err, a broken connection.
func (c *RMAClient) remote(cc *clientConn) (rr *rmaRemote, ferr, err error) {
	c.mu.Lock()
	rr = c.mu.remote
	c.mu.Unlock()
	if rr != nil {
		return rr, nil, nil
	}
	id := c.tcp.nextID.Add(1)
	cc.enc.begin(typeFabricReq, 0)
	if _, err := cc.nc.Write(cc.enc.finish(header{typ: typeFabricReq, id: id})); err != nil {
		return nil, nil, fmt.Errorf("send fabric request: %w", err)
	}
	h, err := cc.readFrame(id, typeFabricResp, &c.tcp.opts.Limits)
	if err != nil {
		return nil, nil, err
	}
	payload := make([]byte, h.payload)
	if _, err := io.ReadFull(cc.br, payload); err != nil {
		return nil, nil, fmt.Errorf("read fabric response: %w", err)
	}
	if len(payload) == 0 {
		ferr = fmt.Errorf("%w: the peer has no window for this client", ErrUnsupported)
		c.skip("no window", ferr)
		return nil, ferr, nil
	}
	win, err := parseWindow(payload)
	if err == nil && win.fabric != c.t.Name() {
		err = fmt.Errorf("%w: the peer's window is on fabric %q, this client's is %q", ErrUnsupported, win.fabric, c.t.Name())
	}
	var r Remote
	if err == nil {
		r, err = c.t.fabric.Connect(win.desc)
	}
	if err != nil {
		c.t.stats.failures.Add(1)
		c.skip("fabric connection failed", err)
		return nil, err, nil
	}
	if c.t.opts.SkipTCPOnly && onlyTCP(r.Transports()) {
		r.Close()
		ferr = fmt.Errorf("%w: the %s fabric would reach the peer only over %s", ErrUnsupported, c.t.Name(), strings.Join(r.Transports(), ","))
		c.skip("fabric is TCP only", ferr)
		return nil, ferr, nil
	}
	rr = &rmaRemote{r: r, win: win}
	c.mu.Lock()
	if c.mu.remote != nil { // another Get connected meanwhile: keep one
		r.Close()
		rr = c.mu.remote
	} else {
		c.mu.remote, c.mu.path = rr, ""
		c.mu.skipUntil = time.Time{}
	}
	c.mu.Unlock()
	return rr, nil, nil
}

// onlyTCP reports whether transports (a Remote's "tl/device" names) are all
// plain TCP, or loopback to the same worker: nothing a one-sided fabric
// does better than kvmesh's own TCP path.
func onlyTCP(transports []string) bool {
	if len(transports) == 0 {
		return false // unknown: trust the fabric
	}
	for _, t := range transports {
		tl, _, _ := strings.Cut(t, "/")
		if tl != "tcp" && tl != "self" {
			return false
		}
	}
	return true
}

// leaseRound reads keys[idx] under one lease on cc and records in r what
// it read; it returns the indexes to get over TCP. ferr is a fabric
// failure (the keys concerned are in retry); err, a failure of cc or of
// the protocol, after which nothing of idx is recorded in r.
func (c *RMAClient) leaseRound(ctx context.Context, cc *clientConn, keys []prefixhash.Key, idx []int, r *Result) (retry []int, ferr, err error) {
	rr, ferr, err := c.remote(cc)
	if rr == nil {
		return idx, ferr, err
	}
	lim := &c.tcp.opts.Limits
	id := c.tcp.nextID.Add(1)
	t := cc.enc.begin(typeLeaseReq, len(idx))
	for i, j := range idx {
		putKeyEntry(t, i, keys[j])
	}
	if _, err := cc.nc.Write(cc.enc.finish(scoped(ctx, header{typ: typeLeaseReq, id: id, count: len(idx), timeout: timeoutMillis(ctx)}))); err != nil {
		return nil, nil, fmt.Errorf("send lease request: %w", err)
	}
	h, err := cc.readFrame(id, typeLeaseResp, lim)
	if err != nil {
		return nil, nil, err
	}
	if h.count != len(idx) {
		return nil, nil, corrupt("%d items in the answer to a lease request of %d keys", h.count, len(idx))
	}
	var p [leasePayload]byte
	if h.payload != leasePayload {
		return nil, nil, corrupt("lease response payload of %d bytes", h.payload)
	}
	if _, err := io.ReadFull(cc.br, p[:]); err != nil {
		return nil, nil, fmt.Errorf("read lease response: %w", err)
	}
	n := len(idx)
	st, lens, offs := make([]Status, n), make([]int, n), make([]uint64, n)
	epoch, _, err := parseLeaseResp(cc.table, p[:], lim, rr.win.size, st, lens, offs)
	if err != nil {
		return nil, nil, err
	}
	granted := slices.ContainsFunc(lens, func(l int) bool { return l > 0 })
	if epoch != rr.win.epoch {
		// Another window (the peer restarted): read nothing with what was
		// learned of the old one.
		c.t.stats.stale.Add(1)
		c.drop(rr)
		if granted {
			if _, err := c.endLease(cc, id); err != nil {
				return nil, nil, err
			}
		}
		return idx, fmt.Errorf("%w: the peer's window changed", ErrUnsupported), nil
	}
	var (
		spans []Span
		at    []int // spans[k] is item at[k]
		ext   []extent
	)
	for i, j := range idx {
		switch {
		case st[i] == statusRetry:
			retry = append(retry, j)
		case st[i] != StatusOK:
		case lens[i] == 0:
		default:
			off, ok := c.t.landing.alloc(lens[i])
			if !ok {
				retry = append(retry, j) // no room to land: TCP
				st[i] = statusRetry
				continue
			}
			dst := c.t.landing.mem[off : off+int64(lens[i]) : off+int64(lens[i])]
			spans = append(spans, Span{Off: offs[i], Dst: dst})
			at = append(at, i)
			ext = append(ext, extent{off, int64(lens[i])})
		}
	}
	var rerr error
	if len(spans) > 0 {
		var abandoned bool
		if abandoned, rerr = c.read(ctx, rr, spans, ext); abandoned {
			return nil, nil, rerr // ext is the fabric's until its reads end
		}
		if rerr != nil {
			c.t.stats.failures.Add(1)
			c.drop(rr)
			c.t.opts.Logger.Warn("transfer: one-sided read failed; reading over TCP", "peer", c.tcp.addr, "fabric", c.t.Name(), "err", rerr)
		}
	}
	held := true
	if granted {
		if held, err = c.endLease(cc, id); err != nil {
			c.t.landing.free(ext)
			return nil, nil, err
		}
	}
	switch {
	case rerr != nil:
		c.t.landing.free(ext)
		for _, i := range at {
			retry = append(retry, idx[i])
		}
		ferr = rerr
		at = nil
	case !held:
		// The lease ended before the reads were confirmed: the slots may
		// have been reused under them.
		c.t.landing.free(ext)
		c.t.stats.ended.Add(int64(len(at)))
		for _, i := range at {
			retry = append(retry, idx[i])
		}
		at = nil
	default:
		r.ext = append(r.ext, ext...)
	}
	bytes := int64(0)
	for _, k := range at {
		st[k] = StatusOK
		bytes += int64(lens[k])
	}
	c.t.stats.reads.Add(int64(len(at)))
	c.t.stats.readBytes.Add(bytes)
	for k, i := range at {
		r.Values[idx[i]] = spans[k].Dst
	}
	for i, j := range idx {
		switch {
		case st[i] == statusRetry:
		case st[i] == StatusOK && lens[i] == 0:
			r.Status[j], r.Values[j] = StatusOK, emptyValue
		case st[i] == StatusOK:
			if r.Values[j] != nil {
				r.Status[j] = StatusOK
			}
		default:
			r.Status[j] = st[i]
		}
	}
	return retry, ferr, nil
}

// read reads spans (landing space ext) through rr and waits for them. When
// ctx ends first, it closes rr and returns abandoned: ext then stays
// allocated until the fabric says the reads ended, and is freed then.
func (c *RMAClient) read(ctx context.Context, rr *rmaRemote, spans []Span, ext []extent) (abandoned bool, err error) {
	const waiting, finished, gaveUp = 0, 1, 2
	var state atomic.Int32
	ch := make(chan error, 1)
	l := c.t.landing
	err = rr.r.Read(l.reg, spans, func(err error) {
		if state.CompareAndSwap(waiting, finished) {
			ch <- err
			return
		}
		l.unquarantine(ext) // given up on: its memory is free only now
	})
	if err != nil {
		return false, err
	}
	select {
	case err := <-ch:
		return false, err
	case <-ctx.Done():
		if !state.CompareAndSwap(waiting, gaveUp) {
			return false, <-ch // done came first after all
		}
		l.quarantine(ext)
		c.t.stats.failures.Add(1)
		c.drop(rr) // stops the reads it can
		return true, ctx.Err()
	}
}

// endLease ends lease id on cc and reports whether the peer still held it.
func (c *RMAClient) endLease(cc *clientConn, id uint64) (bool, error) {
	eid := c.tcp.nextID.Add(1)
	t := cc.enc.begin(typeLeaseEnd, 1)
	putIDEntry(t, 0, id)
	if _, err := cc.nc.Write(cc.enc.finish(header{typ: typeLeaseEnd, id: eid, count: 1})); err != nil {
		return false, fmt.Errorf("send lease end: %w", err)
	}
	h, err := cc.readFrame(eid, typeLeaseEndResp, &c.tcp.opts.Limits)
	if err != nil {
		return false, err
	}
	if h.count != 1 {
		return false, corrupt("%d items in the answer to the end of one lease", h.count)
	}
	var held [1]bool
	if err := parseLeaseEndResp(cc.table, held[:]); err != nil {
		return false, err
	}
	return held[0], nil
}

func (c *RMAClient) release(r *Result) {
	c.t.landing.free(r.ext)
	r.ext = nil
	for _, s := range r.subs {
		s.Release()
	}
	r.subs = nil
}
