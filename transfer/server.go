package transfer

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"github.com/kvmesh/kvmesh/auth"
	"io"
	"log/slog"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvmesh/kvmesh/block"
	"github.com/kvmesh/kvmesh/prefixhash"
)

// Server serves the data plane over TCP: get requests from a Source, put
// requests into a Sink. Each connection is served by one goroutine, one
// request at a time. A frame that fails its checks or breaks a limit is
// answered with an error frame and its connection closed; other connections
// are unaffected.
type Server struct {
	listeners
	src      Source
	sink     Sink
	opts     ServerOptions
	tls      *tls.Config // opts.TLS prepared; nil: plain TCP
	inflight *byteSem
}

// Stats are a server's counters since it started.
type Stats struct {
	Conns        int64 // connections (clients, for ShmServer) open now
	Refused      int64 // connections refused: server closed, or a hello over MaxConns or a tenant's share
	Evicted      int64 // connections closed in their handshake to make room for newer ones
	Unauthorized int64 // connections refused before serving: TLS failed, token missing or wrong, peer uid not allowed
	Revoked      int64 // connections closed by CloseRevoked: their token was dropped or changed
	Requests     int64 // requests served
	Dropped      int64 // connections dropped for a bad frame, a limit or an I/O error
	Hits         int64 // values sent
	Misses       int64 // keys asked for and not sent (miss or error)
	BytesOut     int64 // value bytes sent
	Puts         int64 // values received in puts
	BytesIn      int64 // value bytes received in puts
	Lookups      int64 // lookup requests answered
	RegionUse    int64 // ShmServer: bytes of all regions held by unreleased results
	// ShmServer with an Arena, Server with a Window: requests whose
	// values clients read in place or one-sidedly (their blocks pinned)
	// now, and those the server ended at LeaseTimeout; reserved slots
	// open now, and those ended unfilled (LeaseTimeout, abort, or the
	// client gone).
	Leases, LeasesExpired             int64
	Reservations, ReservationsAborted int64
	// Server with a Window: values granted to readers one-sidedly (lease
	// requests), and their bytes; not in Hits and BytesOut.
	Granted, GrantedBytes int64
}

type counters struct {
	conns, refused, unauthorized, requests, dropped, hits, misses, bytesOut, puts, bytesIn, regionUse, lookups atomic.Int64
	leases, leasesExpired, reservations, reservationsAborted, revoked, evicted                                 atomic.Int64
	granted, grantedBytes                                                                                      atomic.Int64
}

func (l *listeners) snapshot() Stats {
	c := &l.stats
	return Stats{
		Conns: c.conns.Load(), Refused: c.refused.Load(), Unauthorized: c.unauthorized.Load(), Revoked: c.revoked.Load(), Evicted: c.evicted.Load(),
		Requests: c.requests.Load(), Dropped: c.dropped.Load(),
		Hits: c.hits.Load(), Misses: c.misses.Load(), BytesOut: c.bytesOut.Load(),
		Puts: c.puts.Load(), BytesIn: c.bytesIn.Load(), RegionUse: c.regionUse.Load(), Lookups: c.lookups.Load(),
		Leases: c.leases.Load(), LeasesExpired: c.leasesExpired.Load(),
		Reservations: c.reservations.Load(), ReservationsAborted: c.reservationsAborted.Load(),
		Granted: c.granted.Load(), GrantedBytes: c.grantedBytes.Load(),
	}
}

// NewServer returns a server of src and sink. sink may be nil: puts are
// then refused. opts may be nil for defaults; log may be nil for
// slog.Default().
func NewServer(src Source, sink Sink, opts *ServerOptions, log *slog.Logger) (*Server, error) {
	var o ServerOptions
	if opts != nil {
		o = *opts
	}
	o.EnsureDefaults()
	if err := o.Validate(); err != nil {
		return nil, err
	}
	if src == nil {
		return nil, errors.New("transfer: NewServer needs a Source")
	}
	s := &Server{src: src, sink: sink, opts: o, tls: prepareTLS(o.TLS, ""), inflight: newByteSem(int64(o.MaxInFlightBytes))}
	s.listeners.init(log, o.MaxConns, o.MaxConnsPerTenant, s.serveConn)
	return s, nil
}

// Listen listens on addr (host:port; port 0 picks one) and serves it in a
// goroutine that Close stops. It returns the address listened on.
func (s *Server) Listen(addr string) (net.Addr, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("transfer: listen: %w", err)
	}
	return s.start(ln)
}

// Serve accepts connections on ln until Close, then returns ErrClosed. Close
// closes ln. ln is a plain listener: the server adds TLS itself when
// ServerOptions.TLS is set.
func (s *Server) Serve(ln net.Listener) error { return s.serve(ln) }

// Stats returns the server's counters.
func (s *Server) Stats() Stats { return s.snapshot() }

// Close stops the listeners, closes every connection (requests in flight
// fail on their clients), cancels the contexts passed to the Source and
// Sink, and waits for every goroutine of the server.
func (s *Server) Close() error { return s.close() }

// CloseRevoked closes every connection whose hello presented a token that
// ServerOptions.Tokens no longer holds, or that now authenticates another
// principal (other scopes, another tenant), and returns how many it
// closed: call it after changing the tokens (Tokens.Set), so that a
// revoked credential stops working at once rather than when its
// connections idle out. Requests in flight on them fail.
func (s *Server) CloseRevoked() int { return s.closeRevoked(s.opts.Tokens) }

// scratch holds the per-connection slices a server reuses between requests.
type scratch struct {
	keys   []prefixhash.Key
	chunks []prefixhash.Key // chunk keys of a publish request
	vals   [][]byte
	st     []Status
	lens   []int
	parts  []block.Part // get-part and claim requests
}

func (sc *scratch) size(n int) {
	sc.keys, sc.chunks, sc.vals, sc.st, sc.lens = grow(sc.keys, n), grow(sc.chunks, n), grow(sc.vals, n), grow(sc.st, n), grow(sc.lens, n)
	clear(sc.vals)
	clear(sc.st)
}

// What a connection keeps between requests: scratch for keepItems items
// and table and frame buffers of keepBytes. A larger request's buffers go
// to bigBufs when it is done (TCP), or are dropped (shared memory), so
// that an idle connection holds little beyond its 64 KiB read buffer,
// whatever it asked before.
const (
	keepItems = 128
	keepBytes = 16 << 10
)

// trim drops slices grown past keepItems.
func (sc *scratch) trim() {
	if cap(sc.keys) > keepItems || cap(sc.chunks) > keepItems || cap(sc.vals) > keepItems || cap(sc.lens) > keepItems || cap(sc.parts) > keepItems {
		*sc = scratch{}
	}
}

// itemCost is what serving a request costs the server per key or item,
// beside its item table: the scratch slices (a key, a chunk key, a value
// slice, a status, a length, a part) and an entry of the answer's table.
const itemCost = 2*prefixhash.KeySize + 24 + 1 + 8 + 32 + getRespEntry

// requestCost is the memory a request of header h is charged once its table
// has arrived: the table, the scratch and the answer's table. A put's
// values are charged as they arrive (servePut).
func requestCost(h *header) int64 {
	return int64(headerLen + h.tableLen() + h.count*itemCost)
}

// tablePiece is how much of an item table the server reserves and reads at
// a time.
const tablePiece = 64 << 10

// readTable reads the item table of request h as it arrives, each piece
// (tablePiece) charged to the in-flight budget once its first byte is there,
// then charges the request's scratch: a sender that stops holds what it
// sent, not what it declared, until ReadTimeout drops it. It returns what it
// charged, to give back when the request is done, failed or not.
func (sc *serverConn) readTable(ctx context.Context, h *header, pr *payloadReader) (held int64, err error) {
	sem := sc.s.inflight
	charge := func(n int) error {
		got, err := reserve(ctx, sem, min(int64(n), sem.size-held))
		held += got
		return err
	}
	n := h.tableLen()
	t := sc.table[:0]
	for len(t) < n {
		if err := pr.wait(); err != nil {
			return held, fmt.Errorf("read %s table: %w", h.typ, err)
		}
		piece := min(n-len(t), tablePiece)
		if err := charge(piece); err != nil {
			return held, err
		}
		t = slices.Grow(t, piece)[:len(t)+piece]
		pr.progress()
		if _, err := io.ReadFull(pr.br, t[len(t)-piece:]); err != nil {
			return held, fmt.Errorf("read %s table: %w", h.typ, err)
		}
	}
	sc.table = t
	if err := checkTable(h, t); err != nil {
		return held, err
	}
	return held, charge(int(requestCost(h)) - n)
}

// reserve takes n bytes of sem for a request, waiting until ctx is done,
// and returns how much it took (n, clamped to the budget).
func reserve(ctx context.Context, sem *byteSem, n int64) (int64, error) {
	n = min(n, sem.size)
	if n <= 0 {
		return 0, nil
	}
	if err := sem.acquire(ctx, n); err != nil {
		return 0, fmt.Errorf("%w: server busy: no room for %d bytes in its in-flight budget (MaxInFlightBytes %d) before the deadline (%w)",
			ErrLimit, n, sem.size, err)
	}
	return n, nil
}

type serverConn struct {
	s   *Server
	raw net.Conn // the accepted connection, under nc's TLS when there is one
	nc  net.Conn
	br  *bufio.Reader
	hdr [headerLen]byte
	who auth.Principal // whom the hello authenticated
	// base is the server's context carrying who, made once per connection
	// rather than once per request.
	base context.Context
	connBufs
	grants grants // leases on values in the server's Window (lease.go)
}

// connBufs are the buffers a connection's requests grow: kept between
// requests while small, lent to bigBufs after a large request.
type connBufs struct {
	table []byte
	enc   encoder
	bufs  net.Buffers
	scratch
}

func (b *connBufs) big() bool {
	s := &b.scratch
	return cap(b.table) > keepBytes || cap(b.enc.b) > keepBytes || cap(b.bufs) > keepItems ||
		cap(s.keys) > keepItems || cap(s.chunks) > keepItems || cap(s.vals) > keepItems || cap(s.lens) > keepItems || cap(s.parts) > keepItems
}

// bigBufs holds the buffers of large requests between them, shared by all
// connections, so that an idle connection holds none and a busy server
// allocates them once. It holds no more than were in use at once (bounded
// by MaxInFlightBytes), and empties itself over two GCs when unused.
var bigBufs sync.Pool // *connBufs

// serveConn serves one connection: TLS handshake (when configured), the
// hello, then requests until the client hangs up, idles out or breaks the
// protocol. raw is the accepted connection, which the caller closes.
func (s *Server) serveConn(raw net.Conn) {
	raw.SetDeadline(time.Now().Add(s.opts.HandshakeTimeout))
	nc, ok := s.handshake(raw)
	if !ok {
		return
	}
	sc := &serverConn{s: s, raw: raw, nc: nc, br: bufio.NewReaderSize(nc, 64<<10), who: auth.Open}
	if !sc.opening() {
		return
	}
	defer sc.grants.close(&s.stats)
	for {
		nc.SetDeadline(time.Now().Add(s.opts.IdleTimeout))
		if _, err := io.ReadFull(sc.br, sc.hdr[:]); err != nil {
			if !errors.Is(err, io.EOF) && s.ctx.Err() == nil {
				s.stats.dropped.Add(1)
				s.log.Debug("transfer: connection idle or broken", "peer", nc.RemoteAddr(), "err", err)
			}
			return
		}
		err := sc.serve()
		sc.trim()
		if err != nil {
			s.dropLog(nc, err)
			return
		}
		s.stats.requests.Add(1)
	}
}

// trim drops the buffers the last request grew past what an idle
// connection keeps.
func (sc *serverConn) trim() {
	if sc.connBufs.big() {
		b := new(connBufs)
		*b = sc.connBufs
		bigBufs.Put(b)
		sc.connBufs = connBufs{}
	}
}

// borrow takes pooled buffers for request h, when it is a large one.
func (sc *serverConn) borrow(h *header) {
	if h.count <= keepItems && h.tableLen() <= keepBytes {
		return
	}
	if b, ok := bigBufs.Get().(*connBufs); ok {
		sc.connBufs = *b
	}
}

// handshake runs the TLS handshake on raw, when the server has TLS, and
// returns the connection to serve. A plain client that sent a frame where a
// TLS handshake belongs is told, in a plain error frame, that TLS is
// required. A connection closed before it sent anything (a TCP health
// check) is not counted as refused.
func (s *Server) handshake(raw net.Conn) (net.Conn, bool) {
	if s.tls == nil {
		return raw, true
	}
	tc := tls.Server(raw, s.tls)
	err := tc.HandshakeContext(s.ctx)
	switch {
	case err == nil:
		return tc, true
	case s.ctx.Err() != nil:
		return nil, false
	case errors.Is(err, io.EOF):
		s.log.Debug("transfer: connection closed before its TLS handshake", "peer", raw.RemoteAddr())
		return nil, false
	}
	s.stats.unauthorized.Add(1)
	var rhe tls.RecordHeaderError
	if errors.As(err, &rhe) && rhe.Conn != nil && looksLikeFrame(rhe.RecordHeader[:]) {
		sendError(rhe.Conn, 0, refused("this server requires TLS and the client connected without it"))
	}
	s.log.Warn("transfer: TLS handshake failed", "peer", raw.RemoteAddr(), "err", err)
	lingerClose(raw)
	return nil, false
}

// opening reads the connection's first frame, within what is left of
// HandshakeTimeout. A hello is checked (its token, when the server requires
// one) and answered; any other frame is refused when a token is required,
// and served as the first request otherwise. It reports whether to serve
// the connection on.
func (sc *serverConn) opening() bool {
	s := sc.s
	if _, err := io.ReadFull(sc.br, sc.hdr[:]); err != nil {
		if !errors.Is(err, io.EOF) && s.ctx.Err() == nil {
			s.stats.dropped.Add(1)
			s.log.Debug("transfer: connection closed before its first frame", "peer", sc.nc.RemoteAddr(), "err", err)
		}
		return false
	}
	h, err := parseHeader(sc.hdr[:], &s.opts.Limits)
	switch {
	case err != nil && looksLikeTLS(sc.hdr[:]):
		err = refused("this server speaks plain TCP and the client started a TLS handshake")
	case err != nil:
		// Answered as the protocol error it is, below.
	case h.typ == typeHello:
		if sc.table, err = readTable(sc.br, &h, sc.table); err == nil {
			sc.who, err = checkHello(s.opts.Tokens, sc.table)
		}
		if err == nil {
			err = s.authenticated(sc.raw, sc.who, sc.table)
		}
		if err == nil {
			sc.enc.begin(typeHelloAck, 0)
			_, err = sc.nc.Write(sc.enc.finish(header{typ: typeHelloAck, id: h.id}))
			if err == nil {
				return true
			}
		}
	case s.opts.Tokens != nil:
		err = refused("this server requires a bearer token: the connection must open with a hello")
	default:
		// A client that skipped the hello, served without one.
		if err = s.authenticated(sc.raw, sc.who, nil); err != nil {
			break
		}
		err := sc.serve()
		sc.trim()
		if err != nil {
			s.dropLog(sc.nc, err)
			return false
		}
		s.stats.requests.Add(1)
		return true
	}
	if errors.Is(err, ErrAuth) {
		s.stats.unauthorized.Add(1)
		s.log.Warn("transfer: connection refused", "peer", sc.nc.RemoteAddr(), "err", err)
	} else {
		s.dropLog(sc.nc, err)
	}
	sendError(sc.nc, h.id, err)
	lingerClose(sc.nc)
	return false
}

func (s *Server) dropLog(nc net.Conn, err error) {
	s.stats.dropped.Add(1)
	if s.ctx.Err() == nil {
		s.log.Warn("transfer: dropping connection", "peer", nc.RemoteAddr(), "err", err)
	}
}

// serve serves the request whose header is in sc.hdr.
func (sc *serverConn) serve() error {
	s := sc.s
	h, err := parseHeader(sc.hdr[:], &s.opts.Limits)
	if err != nil {
		return sendError(sc.nc, 0, err)
	}
	if sc.base == nil {
		sc.base = auth.WithPrincipal(s.ctx, sc.who) // the hello, if any, came first
	}
	ctx, cancel := requestDeadline(sc.base, &h, s.opts.RequestTimeout)
	defer cancel()
	dl, _ := ctx.Deadline()
	sc.nc.SetDeadline(dl)
	pr := payloadReader{br: sc.br, conn: sc.nc, timeout: s.opts.ReadTimeout, deadline: dl}
	sc.borrow(&h)
	held, err := sc.readTable(ctx, &h, &pr)
	defer s.inflight.release(held)
	if err != nil {
		return sendError(sc.nc, h.id, err)
	}
	if h.typ.isRequest() {
		if err = checkScope(sc.who, &h); err != nil {
			s.stats.unauthorized.Add(1)
			return sendError(sc.nc, h.id, err)
		}
		ctx = confine(ctx, sc.who, &h)
	}
	switch h.typ {
	case typeGetReq, typeGetPartReq:
		err = sc.get(ctx, &h)
	case typeClaimReq:
		var frame []byte
		frame, err = serveClaim(ctx, &h, sc.table, s.sink, &sc.scratch, &sc.enc)
		if err == nil {
			_, err = sc.nc.Write(frame)
		}
	case typePutReq, typePublishReq:
		var frame []byte
		frame, err = servePut(ctx, &pr, &h, sc.table, &s.opts.Limits, s.inflight, s.sink, &sc.scratch, &sc.enc, &s.stats)
		if err == nil {
			_, err = sc.nc.Write(frame)
		}
	case typeLookupReq:
		err = sc.lookup(ctx, &h)
	case typeFabricReq:
		err = sc.serveFabric(&h)
	case typeLeaseReq:
		err = sc.serveLease(ctx, &h)
	case typeLeaseEnd:
		err = sc.serveLeaseEnd(&h)
	default:
		err = corrupt("unexpected %s frame", h.typ)
	}
	if err != nil {
		return sendError(sc.nc, h.id, err)
	}
	return nil
}

// requestDeadline bounds a request by the server's timeout and the one the
// client announced, whichever is shorter.
func requestDeadline(parent context.Context, h *header, timeout time.Duration) (context.Context, context.CancelFunc) {
	if h.timeout > 0 {
		timeout = min(timeout, time.Duration(h.timeout)*time.Millisecond)
	}
	return context.WithTimeout(parent, timeout)
}

// sendError answers a request that broke the protocol or a limit with an
// error frame (best effort: the connection is closed next) and returns err.
// I/O errors are not answered: the connection is already unusable.
func sendError(nc net.Conn, id uint64, err error) error {
	msg, class := err.Error(), classRequest
	var ae *authError
	switch {
	case errors.As(err, &ae):
		msg, class = ae.reason, classAuth
	case !errors.Is(err, ErrCorrupt) && !errors.Is(err, ErrLimit) && !errors.Is(err, ErrUnsupported):
		return err
	}
	if len(msg) > maxErrorMsg {
		msg = msg[:maxErrorMsg]
	}
	var enc encoder
	enc.begin(typeError, 0)
	frame := enc.finish(header{typ: typeError, id: id, payload: len(msg), class: class})
	nc.SetWriteDeadline(time.Now().Add(time.Second))
	bufs := net.Buffers{frame, []byte(msg)}
	bufs.WriteTo(nc)
	return err
}

// get answers a get request: values are acquired from the Source and written
// from its memory, after the header and table, by one vectored write
// (writev); nothing is copied into a frame buffer. When the values exceed
// MaxBatchBytes, the excess is marked for the client to ask again. A
// get-part request is answered the same way with the part records built,
// in one pooled buffer charged to the in-flight budget, from the whole
// blocks, which are released as soon as the records are built (a whole
// range is sent as stored, as a get's value is).
func (sc *serverConn) get(ctx context.Context, h *header) error {
	s := sc.s
	n := h.count
	sc.size(n)
	var parts []block.Part
	if h.typ == typeGetPartReq {
		sc.parts = grow(sc.parts, n)
		parts = sc.parts
		parsePartReq(sc.table, sc.keys, parts)
	} else {
		parseKeys(sc.table, sc.keys)
	}
	release := s.src.Acquire(ctx, sc.keys, sc.vals, sc.st)
	defer func() {
		if release != nil {
			release()
		}
	}()
	sizeValues(sc.vals, sc.st, parts, sc.lens)
	maxValue, maxBatch := answerLimits(h, &s.opts.Limits)
	t := sc.enc.begin(typeGetResp, n)
	total, sent := 0, false
	for i := range n {
		st, size := sc.st[i], sc.lens[i]
		switch {
		case st != StatusOK:
			if st != StatusMiss {
				st = StatusError
			}
		case size > maxValue:
			st = StatusError
		case sent && total+alignUp(size) > maxBatch:
			st = statusRetry
		default:
			total += alignUp(size)
			sent = true
			putStatusEntry(t, i, st, size)
			s.stats.hits.Add(1)
			continue
		}
		sc.st[i] = st
		putStatusEntry(t, i, st, 0)
		if st != statusRetry {
			s.stats.misses.Add(1)
		}
	}
	if parts != nil {
		built := 0 // bytes of the records to build: all but the whole ranges
		for i := range n {
			if sc.st[i] == StatusOK && !asStored(sc.lens[i], sc.vals[i]) {
				built += alignUp(sc.lens[i])
			}
		}
		if built > 0 {
			held, err := reserve(ctx, s.inflight, int64(built))
			if err != nil {
				return err
			}
			defer s.inflight.release(held)
			buf := getBuffer(built)
			defer putBuffer(buf)
			off := 0
			for i := range n {
				if sc.st[i] != StatusOK || asStored(sc.lens[i], sc.vals[i]) {
					continue
				}
				rec := buf.b[off : off+sc.lens[i] : off+sc.lens[i]]
				if err := putRecord(rec, sc.vals[i], parts[i]); err != nil {
					return err
				}
				sc.vals[i] = rec
				off += alignUp(sc.lens[i])
			}
		}
		if built == total && release != nil {
			release() // every value sent is a record built here
			release = nil
		}
	}
	bufs := append(sc.bufs[:0], nil)
	for i := range n {
		if sc.st[i] == StatusOK {
			bufs = appendValues(bufs, sc.vals[i:i+1])
		}
	}
	bufs[0] = sc.enc.finish(header{typ: typeGetResp, id: h.id, count: n, payload: total})
	sc.bufs = bufs
	_, err := bufs.WriteTo(sc.nc)
	clear(sc.bufs) // drop references to the source's memory before release
	clear(sc.vals)
	if err != nil {
		return fmt.Errorf("send values: %w", err)
	}
	s.stats.bytesOut.Add(int64(total))
	return nil
}

// putSegment is how many value bytes of a put the server reserves, reads
// and stores at a time: consecutive values up to this size, or one larger
// value.
const putSegment = 4 << 20

// A payloadReader reads a request's bytes as they arrive, dropping a sender
// that stops: each wait for more bytes ends after timeout, and all of them
// at deadline (the request's).
type payloadReader struct {
	br       *bufio.Reader
	conn     interface{ SetReadDeadline(time.Time) error }
	timeout  time.Duration
	deadline time.Time
}

// progress gives the sender timeout (within the request's deadline) to
// send its next bytes.
func (pr *payloadReader) progress() {
	dl := time.Now().Add(pr.timeout)
	if !pr.deadline.IsZero() && pr.deadline.Before(dl) {
		dl = pr.deadline
	}
	pr.conn.SetReadDeadline(dl)
}

// wait waits for the next byte, without reading it.
func (pr *payloadReader) wait() error {
	pr.progress()
	_, err := pr.br.Peek(1)
	return err
}

// read fills b, a MiB at a time, each within timeout.
func (pr *payloadReader) read(b []byte) error {
	for len(b) > 0 {
		n := min(len(b), 1<<20)
		pr.progress()
		if _, err := io.ReadFull(pr.br, b[:n]); err != nil {
			return err
		}
		b = b[n:]
	}
	return nil
}

// servePut reads a put or publish request's values (after its table) and
// hands them to sink one segment (putSegment) at a time, as they arrive:
// each segment is reserved in sem once its first byte has come, read into a
// pooled buffer, stored, and given back, so a put holds at most one segment
// and a put that stops sending holds none (it is dropped after pr's
// timeout). It returns the response frame, valid until enc's next use. It
// is shared by the TCP and shared-memory servers.
func servePut(ctx context.Context, pr *payloadReader, h *header, table []byte, lim *Limits, sem *byteSem, sink Sink, sc *scratch, enc *encoder, stats *counters) ([]byte, error) {
	if sink == nil {
		return nil, fmt.Errorf("%w: this server accepts no puts", ErrUnsupported)
	}
	pub, ok := sink.(Publisher)
	if h.typ == typePublishReq && !ok {
		return nil, fmt.Errorf("%w: this server accepts no publish requests", ErrUnsupported)
	}
	n := h.count
	sc.size(n)
	if err := parsePutReq(table, h, lim, sc.keys, sc.chunks, sc.lens); err != nil {
		return nil, err
	}
	store := func(lo, hi int) {
		if h.typ == typePublishReq {
			pub.PutPublish(ctx, sc.keys[lo:hi], sc.chunks[lo:hi], sc.vals[lo:hi], sc.st[lo:hi])
		} else {
			sink.Put(ctx, sc.keys[lo:hi], sc.vals[lo:hi], sc.st[lo:hi])
		}
		clear(sc.vals[lo:hi])
	}
	for lo := 0; lo < n; {
		hi, size := lo, 0
		for hi < n && (hi == lo || size+alignUp(sc.lens[hi]) <= putSegment) {
			size += alignUp(sc.lens[hi])
			hi++
		}
		if err := putSegmentOf(ctx, pr, sem, sc, lo, hi, size, store); err != nil {
			return nil, err
		}
		lo = hi
	}
	t := enc.begin(typePutResp, n)
	for i, st := range sc.st[:n] {
		if st > StatusError && st != StatusConflict {
			st = StatusError
		}
		putStatusEntry(t, i, st, 0)
	}
	stats.puts.Add(int64(n))
	stats.bytesIn.Add(int64(h.payload))
	return enc.finish(header{typ: typePutResp, id: h.id, count: n}), nil
}

// putSegmentOf reads the values lo..hi of a put, size bytes padded, and
// stores them.
func putSegmentOf(ctx context.Context, pr *payloadReader, sem *byteSem, sc *scratch, lo, hi, size int, store func(lo, hi int)) error {
	if size == 0 {
		for i := lo; i < hi; i++ {
			sc.vals[i] = []byte{}
		}
		store(lo, hi)
		return nil
	}
	if err := pr.wait(); err != nil {
		return fmt.Errorf("read values: %w", err)
	}
	held, err := reserve(ctx, sem, int64(size))
	if err != nil {
		return err
	}
	defer sem.release(held)
	buf := getBuffer(size)
	defer putBuffer(buf)
	if err := pr.read(buf.b); err != nil {
		return fmt.Errorf("read values: %w", err)
	}
	off := 0
	for i := lo; i < hi; i++ {
		l := sc.lens[i]
		sc.vals[i] = buf.b[off : off+l : off+l]
		off += alignUp(l)
	}
	store(lo, hi)
	return nil
}
