//go:build linux

package transfer

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/kvmesh/kvmesh/auth"
	"github.com/kvmesh/kvmesh/block"
	"github.com/kvmesh/kvmesh/prefixhash"
)

// ShmServer serves processes on the same host through shared memory. It
// listens on a unix socket; for each client it creates a memfd region
// (RegionSize bytes), sealed against resizing and against new writable
// mappings, maps it, and passes its descriptor to the client (SCM_RIGHTS),
// which maps it read-only. A get request then travels over the socket as a
// frame of keys; the server copies the found values into free space of that
// client's region and answers with (offset, length) per key, so no value
// byte crosses the socket. The space stays taken until the client releases
// the request (Result.Release) or disconnects; when it is full, a request
// waits for space (until its deadline) or, when part of it was already
// placed, is answered in part and the client asks again for the rest.
//
// With an Arena (ShmServerOptions.Arena), a client that is a node-wide
// principal allowed to write also gets a descriptor of the node's DRAM
// arena (writable, and mapped so, when a Reserver is set). Nobody else
// does: whoever holds a descriptor of a memfd can reopen it writable. Its gets are then
// answered in place: a value found in the arena is sent as its arena
// offset, and the request holds a lease on it (the block stays pinned, its
// slot unused by anything else) until the client releases the request or
// LeaseTimeout passes, whichever is first; a value elsewhere (read from
// NVMe) is copied into the region as before. Its puts reserve slots in the
// arena (a reserve request), write the blocks there themselves and commit
// them (a commit request): the server verifies and indexes the slots
// without copying a byte. A reservation not committed within LeaseTimeout,
// released by the client, or whose client disconnects is freed. A tenant's
// client, or a node-wide reader, never gets the arena, which holds every
// tenant's blocks: its gets are copied into its region.
//
// Each client is served by two goroutines: a reader that handles releases,
// puts, reservations and commits at once, and a worker that answers gets
// in order (and may wait for space, which only the reader can free).
type ShmServer struct {
	listeners
	src      Source
	sink     Sink
	opts     ShmServerOptions
	inflight *byteSem
}

// NewShmServer returns a shared-memory server of src and sink (nil: puts
// are refused). opts may be nil for defaults; log may be nil for
// slog.Default().
func NewShmServer(src Source, sink Sink, opts *ShmServerOptions, log *slog.Logger) (*ShmServer, error) {
	var o ShmServerOptions
	if opts != nil {
		o = *opts
	}
	o.EnsureDefaults()
	if err := o.Validate(); err != nil {
		return nil, err
	}
	if src == nil {
		return nil, errors.New("transfer: NewShmServer needs a Source")
	}
	s := &ShmServer{src: src, sink: sink, opts: o, inflight: newByteSem(int64(o.MaxInFlightBytes))}
	s.listeners.init(log, o.MaxClients, o.MaxClientsPerTenant, s.serveConn)
	return s, nil
}

// Listen listens on the unix socket path and serves it in a goroutine that
// Close stops. The socket file must not exist; Close removes it. Access to
// the server is access to the socket file: its permissions (SocketMode, set
// here before any client is served) decide who may read the cache, and
// PeerUIDs and Tokens, when set, narrow it further. A name in the abstract
// namespace ("@name") has no file and no permissions: any process of the
// host's network namespace may connect, so use PeerUIDs or Tokens with it.
func (s *ShmServer) Listen(path string) error {
	ln, err := net.Listen("unix", path)
	if err != nil {
		return fmt.Errorf("transfer: listen: %w", err)
	}
	if !strings.HasPrefix(path, "@") {
		err = os.Chmod(path, s.opts.SocketMode)
	}
	if err != nil {
		ln.Close()
		return fmt.Errorf("transfer: socket mode: %w", err)
	}
	_, err = s.start(ln)
	return err
}

// Close stops listening, disconnects every client (their regions are
// unmapped here; clients keep their own mappings until they release), and
// waits for every goroutine of the server.
func (s *ShmServer) Close() error { return s.close() }

// CloseRevoked disconnects every client whose hello presented a token that
// ShmServerOptions.Tokens no longer holds, or that now authenticates
// another principal, and returns how many: see Server.CloseRevoked. A
// disconnected client's leases end, its reservations are freed and the
// server unmaps its region; what the client mapped stays mapped in its own
// process (the server cannot unmap another process's memory): the copies
// already in its region, and, for a node-wide writer, the arena, whose
// mapping it keeps until it exits.
func (s *ShmServer) CloseRevoked() int { return s.closeRevoked(s.opts.Tokens) }

// Stats returns the server's counters: Conns counts clients, RegionUse the
// region bytes their unreleased results hold.
func (s *ShmServer) Stats() Stats { return s.snapshot() }

func (s *ShmServer) serveConn(nc net.Conn) {
	uc := nc.(*net.UnixConn)
	who, wantArena, err := s.admitPeer(uc)
	if err != nil {
		if errors.Is(err, ErrAuth) {
			s.stats.unauthorized.Add(1)
		} else {
			s.stats.dropped.Add(1)
		}
		if s.ctx.Err() == nil {
			s.log.Warn("transfer: shm client refused", "err", err)
		}
		return
	}
	c, err := s.newShmConn(uc, who, wantArena)
	if err != nil {
		s.stats.dropped.Add(1)
		s.log.Warn("transfer: shm client setup failed", "err", err)
		return
	}
	c.run()
}

// admitPeer decides a new client before it gets a region: it reads its
// hello within HandshakeTimeout, then checks its user id (SO_PEERCRED) when
// PeerUIDs is set and its token when Tokens is. A refused client is told
// why in an error frame. wantArena reports that the hello asked for the
// DRAM arena.
func (s *ShmServer) admitPeer(uc *net.UnixConn) (who auth.Principal, wantArena bool, err error) {
	// The hello is read first, whatever is decided: a client refused
	// before it wrote its hello would see a broken pipe, not the refusal.
	uc.SetDeadline(time.Now().Add(s.opts.HandshakeTimeout))
	defer uc.SetDeadline(time.Time{})
	var hdr [headerLen]byte
	if _, err := io.ReadFull(uc, hdr[:]); err != nil {
		return auth.Principal{}, false, fmt.Errorf("read hello: %w", err)
	}
	h, err := parseHeader(hdr[:], &s.opts.Limits)
	if err == nil && h.typ != typeHello {
		err = corrupt("got %s, want hello", h.typ)
	}
	var table []byte
	if err == nil {
		table, err = readTable(uc, &h, nil)
	}
	if err == nil && len(s.opts.PeerUIDs) > 0 {
		err = checkPeer(uc, s.opts.PeerUIDs)
	}
	who = auth.Open
	if err == nil {
		who, err = checkHello(s.opts.Tokens, table)
	}
	if err == nil {
		err = s.authenticated(uc, who, table)
	}
	if err != nil {
		sendError(uc, 0, err)
		return who, false, err
	}
	return who, h.arena, nil
}

// checkPeer refuses a client whose process runs as a user not in uids.
func checkPeer(uc *net.UnixConn, uids []uint32) error {
	cred, err := peerCred(uc)
	if err != nil {
		return fmt.Errorf("peer credentials: %w", err)
	}
	if !slices.Contains(uids, cred.Uid) {
		return refused("processes of uid %d may not use this server (pid %d)", cred.Uid, cred.Pid)
	}
	return nil
}

// peerCred returns the credentials of the process at the other end of uc,
// as the kernel recorded them when it connected.
func peerCred(uc *net.UnixConn) (*unix.Ucred, error) {
	rc, err := uc.SyscallConn()
	if err != nil {
		return nil, err
	}
	var cred *unix.Ucred
	var cerr error
	if err := rc.Control(func(fd uintptr) {
		cred, cerr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil {
		return nil, err
	}
	return cred, cerr
}

// shmConn is the server side of one client.
type shmConn struct {
	s      *ShmServer
	uc     *net.UnixConn
	mem    []byte         // the region, mapped read-write
	who    auth.Principal // whom the hello authenticated
	ctx    context.Context
	cancel context.CancelFunc

	// shared is the node's arena when this client was given it (nil
	// otherwise); writable when it takes reservations too.
	shared   []byte
	writable bool

	wmu sync.Mutex // serializes writes to uc
	mu  struct {
		sync.Mutex
		arena  *arena
		held   map[uint64][]extent  // request id → region space its answer holds
		freed  chan struct{}        // closed and replaced whenever space is freed
		leases map[uint64]*lease    // request id → the pins of values read in place
		resv   map[uint64]*reserved // reserve request id → its open reservations
	}
}

// lease holds the blocks of a get answered in place, until the client
// releases the request or timer fires.
type lease struct {
	release func()
	timer   *time.Timer
}

// reserved is a reserve request's open reservations (nil where an item got
// none), until the client commits or releases them or their context ends.
type reserved struct {
	items  []Reservation
	ctx    context.Context
	cancel context.CancelFunc
}

type shmWork struct {
	h     header
	keys  []prefixhash.Key
	parts []block.Part // a get-part request's; nil for a get
}

// newShmConn creates the client's region and sends it, with the hello
// frame, over uc.
func (s *ShmServer) newShmConn(uc *net.UnixConn, who auth.Principal, wantArena bool) (*shmConn, error) {
	size := s.opts.RegionSize
	fd, err := unix.MemfdCreate("kvmesh-transfer", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		return nil, fmt.Errorf("memfd_create: %w", err)
	}
	defer unix.Close(fd)
	if err := unix.Ftruncate(fd, size); err != nil {
		return nil, fmt.Errorf("size region: %w", err)
	}
	mem, err := unix.Mmap(fd, 0, int(size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("map region: %w", err)
	}
	// The client may trust the size (no SIGBUS from a shrink) and cannot
	// map the region writable (kernels before 5.1 lack the write seal).
	seals := unix.F_SEAL_SHRINK | unix.F_SEAL_GROW
	if _, err := unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, seals|unix.F_SEAL_FUTURE_WRITE); err != nil {
		if _, err := unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, seals); err != nil {
			unix.Munmap(mem)
			return nil, fmt.Errorf("seal region: %w", err)
		}
	}
	fds := []int{fd}
	hl := hello{regionSize: size, maxPending: s.opts.MaxPending, limits: s.opts.Limits}
	shared, afd, writable, err := s.shareArena(who, wantArena)
	if err != nil {
		unix.Munmap(mem)
		return nil, err
	}
	if afd >= 0 {
		defer unix.Close(afd)
		fds = append(fds, afd)
		hl.arena = arenaShared
		if writable {
			hl.arena |= arenaWritable
		}
	}
	var enc encoder
	putHello(enc.begin(typeShmHello, 1), hl)
	frame := enc.finish(header{typ: typeShmHello, count: 1})
	uc.SetWriteDeadline(time.Now().Add(s.opts.RequestTimeout))
	if _, _, err := uc.WriteMsgUnix(frame, unix.UnixRights(fds...), nil); err != nil {
		unix.Munmap(mem)
		return nil, fmt.Errorf("send region: %w", err)
	}
	uc.SetWriteDeadline(time.Time{})
	c := &shmConn{s: s, uc: uc, mem: mem, who: who, shared: shared, writable: writable}
	c.mu.leases = make(map[uint64]*lease)
	c.mu.resv = make(map[uint64]*reserved)
	c.ctx, c.cancel = context.WithCancel(s.ctx)
	c.mu.arena = newArena(size)
	c.mu.held = make(map[uint64][]extent)
	c.mu.freed = make(chan struct{})
	return c, nil
}

// shareArena returns the arena and a descriptor of it to send to a client
// that is who: none (fd -1) to a client that did not ask, to a tenant, to
// a node-wide principal that may not write, or without an Arena; the
// memfd's own to a node-wide writer, writable when reservations are served.
// A returned descriptor is the caller's to close.
//
// Read access is no reason to get it: a memfd's inode is mode 0777, so a
// process holding any descriptor of it, even one opened O_RDONLY, reopens
// /proc/self/fd/N O_RDWR and maps it writable, and the arena holds every
// tenant's blocks. Sealing it against writes (F_SEAL_FUTURE_WRITE) would
// stop that, but would stop the writers' reservations too. So the arena is
// a writer's privilege, and everyone else reads copies in their own region,
// which is sealed against writes.
func (s *ShmServer) shareArena(who auth.Principal, asked bool) (mem []byte, fd int, writable bool, err error) {
	if !asked || s.opts.Arena == nil || who.Scoped() || !who.Can(auth.Read|auth.Write) {
		return nil, -1, false, nil
	}
	mem, afd := s.opts.Arena.Arena()
	if mem == nil || afd < 0 {
		return nil, -1, false, nil // closed: copies, as without one
	}
	fd, err = unix.Dup(afd)
	if err != nil {
		return nil, -1, false, fmt.Errorf("dup arena: %w", err)
	}
	return mem, fd, s.opts.Reserver != nil, nil
}

// inArena returns the offset of v in the shared arena, and whether v lies
// in it.
func (c *shmConn) inArena(v []byte) (int64, bool) {
	if c.shared == nil || len(v) == 0 {
		return 0, false
	}
	base := uintptr(unsafe.Pointer(unsafe.SliceData(c.shared)))
	p := uintptr(unsafe.Pointer(unsafe.SliceData(v)))
	if p < base || p-base > uintptr(len(c.shared)) || uintptr(len(v)) > uintptr(len(c.shared))-(p-base) {
		return 0, false
	}
	return int64(p - base), true
}

// run serves the client until it disconnects or breaks the protocol, then
// frees its region.
func (c *shmConn) run() {
	work := make(chan shmWork, c.s.opts.MaxPending)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for w := range work {
			if c.ctx.Err() == nil {
				c.get(w)
			}
		}
	}()
	err := c.readLoop(work)
	c.cancel()
	close(work)
	<-done
	if err != nil && c.s.ctx.Err() == nil {
		c.s.stats.dropped.Add(1)
		c.s.log.Warn("transfer: dropping shm client", "err", err)
	}
	c.mu.Lock()
	c.s.stats.regionUse.Add(-c.mu.arena.used)
	leases, resv := c.mu.leases, c.mu.resv
	c.mu.leases, c.mu.resv = nil, nil
	c.mu.Unlock()
	// The client is gone: its leases end and its reservations are freed.
	for _, l := range leases {
		c.endLease(l, false)
	}
	for _, r := range resv {
		c.abort(r)
	}
	if err := unix.Munmap(c.mem); err != nil {
		panic(fmt.Sprintf("transfer: unmap shm region: %v", err))
	}
}

// readLoop reads the client's frames: gets go to the worker, releases and
// puts are handled here. It returns nil when the client disconnects.
func (c *shmConn) readLoop(work chan<- shmWork) error {
	s := c.s
	br := bufio.NewReaderSize(c.uc, 64<<10)
	var (
		hdr     [headerLen]byte
		table   []byte
		enc     encoder
		sc      scratch
		release []uint64
	)
	for {
		if _, err := io.ReadFull(br, hdr[:]); err != nil {
			if errors.Is(err, io.EOF) || errors.Is(err, net.ErrClosed) || errors.Is(err, syscall.ECONNRESET) {
				return nil
			}
			return err
		}
		h, err := parseHeader(hdr[:], &s.opts.Limits)
		if err != nil {
			return c.sendError(0, err)
		}
		if table, err = readTable(br, &h, table); err != nil {
			return c.sendError(h.id, err)
		}
		switch h.typ {
		case typeGetReq, typeGetPartReq:
			if _, err := requestScope(c.ctx, c.who, &h); err != nil {
				s.stats.unauthorized.Add(1)
				return c.sendError(h.id, err)
			}
			w := shmWork{h: h, keys: make([]prefixhash.Key, h.count)}
			if h.typ == typeGetPartReq {
				w.parts = make([]block.Part, h.count)
				parsePartReq(table, w.keys, w.parts)
			} else {
				parseKeys(table, w.keys)
			}
			select {
			case work <- w:
			default:
				return c.sendError(h.id, fmt.Errorf("%w: more than MaxPending (%d) requests queued", ErrLimit, s.opts.MaxPending))
			}
		case typeShmRelease:
			release = grow(release, h.count)
			parseIDs(table, release)
			c.free(release)
		case typeShmReserveReq:
			ctx, err := requestScope(c.ctx, c.who, &h)
			if err != nil {
				s.stats.unauthorized.Add(1)
				return c.sendError(h.id, err)
			}
			if !c.writable {
				return c.sendError(h.id, fmt.Errorf("%w: reservations need the writable arena, which this client was not given", ErrUnsupported))
			}
			if err := c.reserve(ctx, &h, table); err != nil {
				return err
			}
			s.stats.requests.Add(1)
		case typeShmCommitReq:
			var id [1]uint64
			parseIDs(table, id[:])
			if err := c.commit(h.id, id[0]); err != nil {
				return err
			}
			s.stats.requests.Add(1)
		case typeClaimReq:
			ctx, cancel := requestDeadline(c.ctx, &h, s.opts.RequestTimeout)
			ctx, err := requestScope(ctx, c.who, &h)
			if err != nil {
				cancel()
				s.stats.unauthorized.Add(1)
				return c.sendError(h.id, err)
			}
			frame, err := serveClaim(ctx, &h, table, s.sink, &sc, &enc)
			cancel()
			sc.trim()
			if err != nil {
				return c.sendError(h.id, err)
			}
			if err := c.write(frame); err != nil {
				return err
			}
			s.stats.requests.Add(1)
		case typePutReq, typePublishReq:
			ctx, cancel := requestDeadline(c.ctx, &h, s.opts.RequestTimeout)
			ctx, err := requestScope(ctx, c.who, &h)
			if err != nil {
				cancel()
				s.stats.unauthorized.Add(1)
				return c.sendError(h.id, err)
			}
			dl, _ := ctx.Deadline()
			pr := payloadReader{br: br, conn: c.uc, timeout: s.opts.RequestTimeout, deadline: dl}
			frame, err := servePut(ctx, &pr, &h, table, &s.opts.Limits, s.inflight, s.sink, &sc, &enc, &s.stats)
			cancel()
			c.uc.SetReadDeadline(time.Time{})
			sc.trim()
			if err != nil {
				return c.sendError(h.id, err)
			}
			if err := c.write(frame); err != nil {
				return err
			}
			s.stats.requests.Add(1)
		default:
			return c.sendError(h.id, corrupt("unexpected %s frame", h.typ))
		}
	}
}

func (c *shmConn) write(frame []byte) error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	c.uc.SetWriteDeadline(time.Now().Add(c.s.opts.RequestTimeout))
	_, err := c.uc.Write(frame)
	return err
}

func (c *shmConn) sendError(id uint64, err error) error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	return sendError(c.uc, id, err)
}

// free gives back the region space and the leases of the requests ids, and
// aborts the reservations of reserve requests among them.
func (c *shmConn) free(ids []uint64) {
	var leases []*lease
	var resv []*reserved
	c.mu.Lock()
	before := c.mu.arena.used
	for _, id := range ids {
		for _, e := range c.mu.held[id] {
			c.mu.arena.release(e.off, e.n)
		}
		delete(c.mu.held, id)
		if l, ok := c.mu.leases[id]; ok {
			leases = append(leases, l)
			delete(c.mu.leases, id)
		}
		if r, ok := c.mu.resv[id]; ok {
			resv = append(resv, r)
			delete(c.mu.resv, id)
		}
	}
	if freed := before - c.mu.arena.used; freed > 0 {
		c.s.stats.regionUse.Add(-freed)
		close(c.mu.freed)
		c.mu.freed = make(chan struct{})
	}
	c.mu.Unlock()
	for _, l := range leases {
		c.endLease(l, false)
	}
	for _, r := range resv {
		c.abort(r)
	}
}

// lease keeps release (the pins of request id's values, read in place)
// until the client releases id or LeaseTimeout passes.
func (c *shmConn) lease(id uint64, release func()) {
	l := &lease{release: release}
	c.mu.Lock()
	if c.mu.leases == nil { // torn down meanwhile
		c.mu.Unlock()
		release()
		return
	}
	c.mu.leases[id] = l
	c.s.stats.leases.Add(1)
	// Under the lock, so that expire finds the lease whole.
	l.timer = time.AfterFunc(c.s.opts.LeaseTimeout, func() { c.expire(id, l) })
	c.mu.Unlock()
}

// expire ends lease l of request id at LeaseTimeout, unless the client
// released it first.
func (c *shmConn) expire(id uint64, l *lease) {
	c.mu.Lock()
	if c.mu.leases[id] != l {
		c.mu.Unlock()
		return
	}
	delete(c.mu.leases, id)
	c.mu.Unlock()
	c.endLease(l, true)
}

// endLease unpins a lease taken out of c.mu.leases.
func (c *shmConn) endLease(l *lease, expired bool) {
	l.timer.Stop()
	l.release()
	c.s.stats.leases.Add(-1)
	if expired {
		c.s.stats.leasesExpired.Add(1)
	}
}

// reserve answers a reserve request: a slot in the arena per item, which
// the client fills and then commits. An item that gets none (no room, or a
// value over a limit) is answered StatusMiss or StatusError: the client
// sends it another way. The reservations end with LeaseTimeout, the
// client's release of the request, or the connection.
func (c *shmConn) reserve(ctx context.Context, h *header, table []byte) error {
	s := c.s
	items := make([]reserveItem, h.count)
	if err := parseReserve(table, &s.opts.Limits, items); err != nil {
		return c.sendError(h.id, err)
	}
	r := &reserved{items: make([]Reservation, len(items))}
	r.ctx, r.cancel = context.WithTimeout(ctx, s.opts.LeaseTimeout)
	var enc encoder
	t := enc.begin(typeShmGetResp, len(items))
	open := 0
	for i, it := range items {
		res, err := s.opts.Reserver.Reserve(r.ctx, it.key, it.parent, it.chunk, it.n)
		if err != nil {
			st := StatusMiss
			if errors.Is(err, ErrLimit) {
				st = StatusError
			}
			putShmEntry(t, i, st, 0, 0)
			continue
		}
		off, ok := c.inArena(res.Buf())
		if !ok || len(res.Buf()) != it.n {
			res.Abort() // not where the client can write it
			putShmEntry(t, i, StatusError, 0, 0)
			continue
		}
		r.items[i] = res
		open++
		putShmEntry(t, i, StatusOK, it.n, arenaOff(off))
	}
	if open > 0 {
		s.stats.reservations.Add(int64(open))
		c.mu.Lock()
		c.mu.resv[h.id] = r
		c.mu.Unlock()
		// A reservation the client never commits nor releases ends with
		// its context: forget it then.
		context.AfterFunc(r.ctx, func() {
			c.mu.Lock()
			mine := c.mu.resv[h.id] == r
			if mine {
				delete(c.mu.resv, h.id)
			}
			c.mu.Unlock()
			if mine {
				c.abort(r)
			}
		})
	} else {
		r.cancel()
	}
	return c.write(enc.finish(header{typ: typeShmGetResp, id: h.id, count: len(items)}))
}

// abort frees the open reservations of r, taken out of c.mu.resv.
func (c *shmConn) abort(r *reserved) {
	n := int64(0)
	for _, res := range r.items {
		if res != nil {
			res.Abort()
			n++
		}
	}
	r.cancel()
	c.s.stats.reservations.Add(-n)
	c.s.stats.reservationsAborted.Add(n)
}

// commit answers a commit request (id) for the reserve request rid: each
// filled slot is verified and stored in place (and, with a chunk key,
// published). A reservation that ended (timeout, release) is a miss.
func (c *shmConn) commit(id, rid uint64) error {
	s := c.s
	c.mu.Lock()
	r, ok := c.mu.resv[rid]
	delete(c.mu.resv, rid)
	c.mu.Unlock()
	var enc encoder
	if !ok {
		return c.sendError(id, fmt.Errorf("%w: commit of reservation %d, which is not open (ended after %v, released, or never made)",
			ErrLimit, rid, s.opts.LeaseTimeout))
	}
	defer r.cancel()
	st := make([]Status, len(r.items))
	n := int64(0)
	for i, res := range r.items {
		if res == nil {
			continue
		}
		n++
		size := len(res.Buf())
		if err := res.Commit(); err != nil {
			switch {
			case errors.Is(err, ErrConflict):
				st[i] = StatusConflict
			case errors.Is(err, ErrCorrupt) || errors.Is(err, ErrLimit):
				st[i] = StatusError
			}
			continue
		}
		st[i] = StatusOK
		s.stats.puts.Add(1)
		s.stats.bytesIn.Add(int64(size))
	}
	s.stats.reservations.Add(-n)
	t := enc.begin(typePutResp, len(st))
	for i, x := range st {
		putStatusEntry(t, i, x, 0)
	}
	return c.write(enc.finish(header{typ: typePutResp, id: id, count: len(st)}))
}

// alloc takes n bytes of the region. With wait, it waits for space until
// ctx is done; without, it fails at once when there is none.
func (c *shmConn) alloc(ctx context.Context, n int, wait bool) (int64, bool) {
	for {
		c.mu.Lock()
		off, ok := c.mu.arena.alloc(int64(n))
		freed := c.mu.freed
		c.mu.Unlock()
		if ok || !wait {
			return off, ok
		}
		select {
		case <-freed:
		case <-ctx.Done():
			return 0, false
		}
	}
}

// get answers one get request: found values are copied into the region.
// A request waits for space only while none of its values is placed, so
// two requests never wait on each other's space; once one is placed, the
// values that do not fit are marked for the client to ask again. A
// get-part request's records are built straight into the region from the
// whole blocks; a whole range is the stored block, answered as a get's.
func (c *shmConn) get(w shmWork) {
	s := c.s
	ctx, cancel := requestDeadline(c.ctx, &w.h, s.opts.RequestTimeout)
	defer cancel()
	ctx, _ = requestScope(ctx, c.who, &w.h) // checked when the request arrived
	n := len(w.keys)
	vals, st := make([][]byte, n), make([]Status, n)
	release := s.src.Acquire(ctx, w.keys, vals, st)
	lens := make([]int, n)
	sizeValues(vals, st, w.parts, lens)
	maxValue, _ := answerLimits(&w.h, &s.opts.Limits)
	var enc encoder
	t := enc.begin(typeShmGetResp, n)
	var held []extent
	var placed int64
	full, leased := false, false
	for i := range n {
		v, size := vals[i], lens[i]
		stored := w.parts == nil || asStored(size, v)
		if st[i] == StatusOK && size <= maxValue && stored {
			if off, ok := c.inArena(v); ok {
				putShmEntry(t, i, StatusOK, len(v), arenaOff(off))
				leased = true
				s.stats.hits.Add(1)
				s.stats.bytesOut.Add(int64(len(v)))
				continue
			}
		}
		switch {
		case st[i] != StatusOK:
			if st[i] != StatusMiss {
				st[i] = StatusError
			}
		case size > maxValue || int64(size) > s.opts.RegionSize:
			st[i] = StatusError
		case full:
			st[i] = statusRetry
		default:
			off, ok := c.alloc(ctx, size, len(held) == 0 && !leased)
			if !ok {
				if len(held) == 0 && !leased {
					// Waited the whole deadline and placed nothing.
					if release != nil {
						release()
					}
					c.sendError(w.h.id, fmt.Errorf("%w: no room in the %d-byte shared region before the deadline (%d bytes held by unreleased results)",
						ErrLimit, s.opts.RegionSize, c.used()))
					return
				}
				full = true
				st[i] = statusRetry
				break
			}
			dst := c.mem[off : off+int64(size) : off+int64(size)]
			if stored {
				copy(dst, v)
			} else if err := putRecord(dst, v, w.parts[i]); err != nil {
				c.mu.Lock()
				c.mu.arena.release(off, int64(size))
				c.mu.Unlock()
				st[i] = StatusError
				break
			}
			if size > 0 {
				held = append(held, extent{off, int64(size)})
				placed += alignExtent(int64(size))
			}
			putShmEntry(t, i, StatusOK, size, off)
			s.stats.hits.Add(1)
			continue
		}
		putShmEntry(t, i, st[i], 0, 0)
		if st[i] != statusRetry {
			s.stats.misses.Add(1)
		}
	}
	switch {
	case release == nil:
	case leased:
		c.lease(w.h.id, release)
	default:
		release()
	}
	if len(held) > 0 {
		c.mu.Lock()
		c.mu.held[w.h.id] = append(c.mu.held[w.h.id], held...)
		c.mu.Unlock()
		s.stats.regionUse.Add(placed)
		s.stats.bytesOut.Add(placed)
	}
	// Answer even if the requester gave up meanwhile: its reader releases
	// the space. Only a client that stops reading altogether times out.
	if err := c.write(enc.finish(header{typ: typeShmGetResp, id: w.h.id, count: n})); err != nil {
		c.uc.Close() // the reader sees it and tears the client down
		return
	}
	s.stats.requests.Add(1)
}

func (c *shmConn) used() int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.mu.arena.used
}

// arenaOff marks an arena offset for a shmGetResp entry.
func arenaOff(off int64) int64 { return int64(uint64(off) | inArena) }
