package transfer

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/kvmesh/kvmesh/block"
	"github.com/kvmesh/kvmesh/prefixhash"
)

// Client is the TCP data-plane client of one peer. It keeps a pool of up to
// MaxConns connections, each carrying one request at a time; concurrent
// requests use different connections. A connection whose request failed or
// was abandoned (context done, deadline passed) is closed, never reused, so a
// late or partial response can never be read as the answer to the next
// request. A Client is safe for concurrent use.
type Client struct {
	addr     string
	opts     ClientOptions
	tls      *tls.Config // opts.TLS prepared for addr; nil: plain TCP
	inflight *byteSem
	slots    chan struct{} // one token per connection in use
	done     chan struct{} // closed by Close
	nextID   atomic.Uint64

	mu struct {
		sync.Mutex
		idle   []*clientConn
		conns  map[*clientConn]struct{}
		closed bool
	}
}

// NewClient returns a client of the data-plane server at addr (host:port).
// It connects lazily, on the first request. opts may be nil for defaults.
func NewClient(addr string, opts *ClientOptions) (*Client, error) {
	var o ClientOptions
	if opts != nil {
		o = *opts
	}
	o.EnsureDefaults()
	if err := o.Validate(); err != nil {
		return nil, err
	}
	c := &Client{
		addr:     addr,
		opts:     o,
		tls:      prepareTLS(o.TLS, addr),
		inflight: newByteSem(int64(o.MaxInFlightBytes)),
		slots:    make(chan struct{}, o.MaxConns),
		done:     make(chan struct{}),
	}
	c.mu.conns = make(map[*clientConn]struct{})
	return c, nil
}

// TCP is the TCP Transport.
type TCP struct{ Options *ClientOptions }

// Name returns "tcp".
func (TCP) Name() string { return "tcp" }

// Dial returns a Client of addr. It does not connect until the first request.
func (t TCP) Dial(_ context.Context, addr string) (Peer, error) {
	c, err := NewClient(addr, t.Options)
	if err != nil {
		return nil, err // not a nil *Client in a non-nil Peer
	}
	return c, nil
}

// Close closes every connection, interrupting requests in flight, which
// return errors. Results already returned stay valid until released.
func (c *Client) Close() error {
	c.mu.Lock()
	if c.mu.closed {
		c.mu.Unlock()
		return nil
	}
	c.mu.closed = true
	close(c.done)
	conns := make([]*clientConn, 0, len(c.mu.conns))
	for cc := range c.mu.conns {
		conns = append(conns, cc)
	}
	c.mu.idle = nil
	c.mu.Unlock()
	for _, cc := range conns {
		cc.raw.Close()
	}
	return nil
}

// Get fetches keys from the peer: batches of at most MaxItems keys per
// request, and as many requests as the server needs to stay within
// MaxBatchBytes per response. The Result's values live in pooled buffers
// until Release. On error nothing is held.
func (c *Client) Get(ctx context.Context, keys []prefixhash.Key) (*Result, error) {
	return c.get(ctx, keys, nil)
}

// get is Get, or GetParts when parts is not nil.
func (c *Client) get(ctx context.Context, keys []prefixhash.Key, parts []block.Part) (*Result, error) {
	ctx, cancel := requestContext(ctx, c.opts.RequestTimeout)
	defer cancel()
	r := newResult(c, len(keys))
	err := getRounds(len(keys), c.opts.MaxItems, func(idx []int) (retry []int, err error) {
		err = c.do(ctx, func(cc *clientConn) error {
			var err error
			retry, err = cc.get(ctx, c, keys, parts, idx, r)
			return err
		})
		return retry, err
	})
	if err != nil {
		r.Release()
		what := "keys"
		if parts != nil {
			what = "parts"
		}
		return nil, fmt.Errorf("transfer: get %d %s from %s: %w", len(keys), what, c.addr, err)
	}
	return r, nil
}

// Put pushes vals[i] under keys[i], in as many requests as MaxItems and
// MaxBatchBytes require, and returns each item's status. vals are sent
// straight from the caller's memory and only read during the call. A value
// over MaxValueSize fails the whole call with ErrLimit before anything is
// sent.
func (c *Client) Put(ctx context.Context, keys []prefixhash.Key, vals [][]byte) ([]Status, error) {
	return c.put(ctx, puts{keys: keys, vals: vals})
}

// PutPublish is Put of blocks this client produced: the server stores them
// and queues each it stored for the owners of chunkKeys[i] (see Publisher),
// in the same round trip. Value i is heads[i] followed by vals[i] (heads may
// be nil: vals alone), so that a block's header and payload need not be
// copied together; both are only read during the call. A server that takes
// no publish requests answers with an error wrapping ErrRemote.
func (c *Client) PutPublish(ctx context.Context, keys, chunkKeys []prefixhash.Key, heads, vals [][]byte) ([]Status, error) {
	p := puts{keys: keys, chunkKeys: chunkKeys, heads: heads, vals: vals}
	if err := p.checkPublish(); err != nil {
		return nil, err
	}
	return c.put(ctx, p)
}

// put sends p as put requests, or publish requests.
func (c *Client) put(ctx context.Context, p puts) ([]Status, error) {
	ctx, cancel := requestContext(ctx, c.opts.RequestTimeout)
	defer cancel()
	st, err := putFrames(&p, &c.opts.Limits, func(lo, hi, bytes int, st []Status) error {
		if err := c.inflight.acquire(ctx, int64(bytes)); err != nil {
			return fmt.Errorf("waiting for in-flight room: %w", err)
		}
		defer c.inflight.release(int64(bytes))
		return c.do(ctx, func(cc *clientConn) error {
			return cc.put(ctx, c, p.sub(lo, hi), bytes, st)
		})
	})
	if err != nil {
		return nil, fmt.Errorf("transfer: put %d values to %s: %w", len(p.keys), c.addr, err)
	}
	return st, nil
}

func (c *Client) release(r *Result) {
	for _, b := range r.bufs {
		putBuffer(b)
	}
	r.bufs = nil
	if r.held > 0 {
		c.inflight.release(r.held)
		r.held = 0
	}
}

// do runs fn on a pooled connection under ctx: ctx's deadline becomes the
// connection's and ctx's cancellation interrupts its I/O. A connection that
// saw an error or an interruption is closed. A request that failed on a
// reused connection before any response byte arrived (the server closed it
// while idle) is retried on another, at most MaxConns times: gets and puts
// are idempotent.
func (c *Client) do(ctx context.Context, fn func(*clientConn) error) error {
	for attempt := 0; ; attempt++ {
		cc, err := c.checkout(ctx)
		if err != nil {
			return err
		}
		if dl, ok := ctx.Deadline(); ok {
			cc.raw.SetDeadline(dl)
		} else {
			cc.raw.SetDeadline(time.Time{})
		}
		stop := context.AfterFunc(ctx, func() { cc.raw.SetDeadline(aLongTimeAgo) })
		cc.answered = false
		err = fn(cc)
		interrupted := !stop()
		if err == nil && !interrupted {
			c.checkin(cc)
			return nil
		}
		c.discard(cc)
		switch {
		case err == nil:
			return nil
		case ctx.Err() != nil:
			return fmt.Errorf("%w (%w)", ctx.Err(), err)
		case errors.Is(err, os.ErrDeadlineExceeded) || pastDeadline(ctx):
			// The server gives up at the same deadline and may close
			// first: that is still this request's deadline passing.
			return fmt.Errorf("%w (%w)", context.DeadlineExceeded, err)
		case cc.reused && !cc.answered && attempt < c.opts.MaxConns && staleConnError(err):
			continue // every idle connection may be stale (the server restarted)
		}
		return err
	}
}

var aLongTimeAgo = time.Unix(1, 0)

func pastDeadline(ctx context.Context) bool {
	dl, ok := ctx.Deadline()
	return ok && !time.Now().Before(dl)
}

// staleConnError reports whether err is how a connection the server closed
// while it was idle in the pool fails its next request.
func staleConnError(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE)
}

func (c *Client) checkout(ctx context.Context) (*clientConn, error) {
	select {
	case c.slots <- struct{}{}:
	case <-ctx.Done():
		return nil, fmt.Errorf("waiting for a connection: %w", ctx.Err())
	case <-c.done:
		return nil, ErrClosed
	}
	now := time.Now()
	c.mu.Lock()
	if c.mu.closed {
		c.mu.Unlock()
		<-c.slots
		return nil, ErrClosed
	}
	for len(c.mu.idle) > 0 {
		cc := c.mu.idle[len(c.mu.idle)-1]
		c.mu.idle = c.mu.idle[:len(c.mu.idle)-1]
		if now.Sub(cc.lastUsed) <= c.opts.MaxIdle {
			c.mu.Unlock()
			cc.reused = true
			return cc, nil
		}
		delete(c.mu.conns, cc)
		cc.raw.Close()
	}
	c.mu.Unlock()

	cc, err := c.dial(ctx)
	if err != nil {
		<-c.slots
		return nil, err
	}
	c.mu.Lock()
	if c.mu.closed {
		c.mu.Unlock()
		cc.raw.Close()
		<-c.slots
		return nil, ErrClosed
	}
	c.mu.conns[cc] = struct{}{}
	c.mu.Unlock()
	return cc, nil
}

// dial opens a connection within DialTimeout (and ctx): TCP, the TLS
// handshake when the client has TLS, and the hello, whose answer says the
// server accepts this client.
func (c *Client) dial(ctx context.Context) (*clientConn, error) {
	ctx, cancel := context.WithTimeout(ctx, c.opts.DialTimeout)
	defer cancel()
	var d net.Dialer
	raw, err := d.DialContext(ctx, "tcp", c.addr)
	if err != nil {
		return nil, fmt.Errorf("dial: %w", err)
	}
	cc := &clientConn{raw: raw, nc: raw}
	if err := cc.open(ctx, c.tls, c.opts.Token, &c.opts.Limits); err != nil {
		raw.Close()
		switch {
		case errors.Is(err, ErrAuth):
		case ctx.Err() != nil:
			err = fmt.Errorf("%w (%w)", ctx.Err(), err)
		case errors.Is(err, os.ErrDeadlineExceeded):
			// The socket's deadline, set from ctx's, fired first.
			err = fmt.Errorf("%w (%w)", context.DeadlineExceeded, err)
		}
		return nil, fmt.Errorf("open connection: %w", err)
	}
	return cc, nil
}

// open runs the TLS handshake (cfg non-nil) and the hello exchange on a new
// connection under ctx, and leaves it with no deadline.
func (cc *clientConn) open(ctx context.Context, cfg *tls.Config, token string, lim *Limits) error {
	dl, _ := ctx.Deadline()
	cc.raw.SetDeadline(dl)
	stop := context.AfterFunc(ctx, func() { cc.raw.SetDeadline(aLongTimeAgo) })
	defer stop()
	if cfg != nil {
		tc := tls.Client(cc.raw, cfg)
		if err := tc.HandshakeContext(ctx); err != nil {
			return fmt.Errorf("TLS handshake: %w", tlsError(err))
		}
		cc.nc = tc
	}
	cc.br = bufio.NewReaderSize(cc.nc, 64<<10)
	if _, err := cc.nc.Write(helloFrame(&cc.enc, token)); err != nil {
		return fmt.Errorf("send hello: %w", tlsError(err))
	}
	if _, err := cc.readFrame(0, typeHelloAck, lim); err != nil {
		return fmt.Errorf("hello: %w", tlsError(err))
	}
	cc.raw.SetDeadline(time.Time{})
	return nil
}

func (c *Client) checkin(cc *clientConn) {
	cc.lastUsed = time.Now()
	c.mu.Lock()
	if c.mu.closed {
		c.mu.Unlock()
		cc.raw.Close()
	} else {
		c.mu.idle = append(c.mu.idle, cc)
		c.mu.Unlock()
	}
	<-c.slots
}

func (c *Client) discard(cc *clientConn) {
	cc.raw.Close()
	c.mu.Lock()
	delete(c.mu.conns, cc)
	c.mu.Unlock()
	<-c.slots
}

// clientConn is one pooled connection. Only the request holding it (between
// checkout and checkin/discard) touches it.
type clientConn struct {
	raw      net.Conn // the TCP connection; closing it never blocks
	nc       net.Conn // raw, or the TLS connection over it
	br       *bufio.Reader
	enc      encoder
	hdr      [headerLen]byte
	table    []byte
	bufs     net.Buffers
	st       []Status
	lens     []int
	lastUsed time.Time
	reused   bool // came from the pool
	answered bool // a response header arrived for the current request
}

// readFrame reads a response header and its item table, checks they answer
// request id with a frame of type want, and returns the header; the table
// is in cc.table. An error frame from the peer becomes an ErrRemote error.
func (cc *clientConn) readFrame(id uint64, want frameType, lim *Limits) (header, error) {
	if _, err := io.ReadFull(cc.br, cc.hdr[:]); err != nil {
		return header{}, fmt.Errorf("read response: %w", err)
	}
	cc.answered = true
	h, err := parseHeader(cc.hdr[:], lim)
	if err != nil {
		return h, err
	}
	if cc.table, err = readTable(cc.br, &h, cc.table); err != nil {
		return h, err
	}
	if h.typ == typeError {
		return h, remoteError(cc.br, &h)
	}
	if h.id != id || h.typ != want {
		return h, corrupt("got %s for request %d, want %s for request %d", h.typ, h.id, want, id)
	}
	return h, nil
}

// get sends one get request for keys[idx[i]] (a get-part request for
// parts[idx[i]] of them, when parts is not nil) and reads the answer into
// r. It returns the indices the server asked to be requested again.
func (cc *clientConn) get(ctx context.Context, c *Client, keys []prefixhash.Key, parts []block.Part, idx []int, r *Result) ([]int, error) {
	id := c.nextID.Add(1)
	if _, err := cc.nc.Write(requestFrame(ctx, &cc.enc, id, keys, parts, idx, &c.opts.Limits)); err != nil {
		return nil, fmt.Errorf("send request: %w", err)
	}
	h, err := cc.readFrame(id, typeGetResp, &c.opts.Limits)
	if err != nil {
		return nil, err
	}
	if h.count != len(idx) {
		return nil, corrupt("%d items in the answer to %d keys", h.count, len(idx))
	}
	cc.st, cc.lens = grow(cc.st, h.count), grow(cc.lens, h.count)
	if err := parseGetResp(cc.table, &h, &c.opts.Limits, cc.st, cc.lens); err != nil {
		return nil, err
	}
	var buf []byte
	if h.payload > 0 {
		// The first answer of a Get waits for room. Later ones (the Get
		// is larger than one frame) take it at once: a Get holding bytes
		// and waiting for more could deadlock with another doing the
		// same. So a Get larger than MaxBatchBytes may exceed the budget
		// by its own size.
		if r.held == 0 {
			if err := c.inflight.acquire(ctx, int64(h.payload)); err != nil {
				return nil, fmt.Errorf("waiting for in-flight room: %w", err)
			}
		} else {
			c.inflight.force(int64(h.payload))
		}
		r.held += int64(h.payload)
		b := getBuffer(h.payload)
		r.bufs = append(r.bufs, b)
		buf = b.b
		if _, err := io.ReadFull(cc.br, buf); err != nil {
			return nil, fmt.Errorf("read values: %w", err)
		}
	}
	off := 0 // values lie in buf in table order; fillResult asks in that order
	return fillResult(r, idx, cc.st, func(i int) []byte {
		n := cc.lens[i]
		if n == 0 {
			return emptyValue
		}
		v := buf[off : off+n : off+n]
		off += alignUp(n)
		return v
	}), nil
}

// put sends one put frame, values written from the caller's memory by one
// vectored write, and reads the statuses into st.
func (cc *clientConn) put(ctx context.Context, c *Client, p puts, bytes int, st []Status) error {
	id := c.nextID.Add(1)
	cc.bufs = appendPut(ctx, &cc.enc, cc.bufs[:0], id, &p, bytes)
	bufs := cc.bufs // WriteTo consumes its receiver
	if _, err := bufs.WriteTo(cc.nc); err != nil {
		return fmt.Errorf("send values: %w", err)
	}
	clear(cc.bufs) // drop references to the caller's values
	h, err := cc.readFrame(id, typePutResp, &c.opts.Limits)
	if err != nil {
		return err
	}
	if h.count != len(st) {
		return corrupt("%d statuses in the answer to a put of %d", h.count, len(st))
	}
	return parsePutResp(cc.table, st)
}

// emptyValue is the value of a found 0-byte value: empty, not nil.
var emptyValue = make([]byte, 0)
