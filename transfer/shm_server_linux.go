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

	"golang.org/x/sys/unix"

	"github.com/kvmesh/kvmesh/auth"
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
// Each client is served by two goroutines: a reader that handles releases
// and puts at once, and a worker that answers gets in order (and may wait
// for space, which only the reader can free).
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
	s.listeners.init(log, o.MaxClients, s.serveConn)
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

// Stats returns the server's counters: Conns counts clients, RegionUse the
// region bytes their unreleased results hold.
func (s *ShmServer) Stats() Stats { return s.snapshot() }

func (s *ShmServer) serveConn(nc net.Conn) {
	uc := nc.(*net.UnixConn)
	who, err := s.admitPeer(uc)
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
	c, err := s.newShmConn(uc, who)
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
// why in an error frame.
func (s *ShmServer) admitPeer(uc *net.UnixConn) (auth.Principal, error) {
	// The hello is read first, whatever is decided: a client refused
	// before it wrote its hello would see a broken pipe, not the refusal.
	uc.SetDeadline(time.Now().Add(s.opts.HandshakeTimeout))
	defer uc.SetDeadline(time.Time{})
	var hdr [headerLen]byte
	if _, err := io.ReadFull(uc, hdr[:]); err != nil {
		return auth.Principal{}, fmt.Errorf("read hello: %w", err)
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
	who := auth.Open
	if err == nil {
		who, err = checkHello(s.opts.Tokens, table)
	}
	if err != nil {
		sendError(uc, 0, err)
		return who, err
	}
	return who, nil
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

	wmu sync.Mutex // serializes writes to uc
	mu  struct {
		sync.Mutex
		arena *arena
		held  map[uint64][]extent // request id → region space its answer holds
		freed chan struct{}       // closed and replaced whenever space is freed
	}
}

type shmWork struct {
	h    header
	keys []prefixhash.Key
}

// newShmConn creates the client's region and sends it, with the hello
// frame, over uc.
func (s *ShmServer) newShmConn(uc *net.UnixConn, who auth.Principal) (*shmConn, error) {
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
	var enc encoder
	putHello(enc.begin(typeShmHello, 1), hello{regionSize: size, maxPending: s.opts.MaxPending, limits: s.opts.Limits})
	frame := enc.finish(header{typ: typeShmHello, count: 1})
	uc.SetWriteDeadline(time.Now().Add(s.opts.RequestTimeout))
	if _, _, err := uc.WriteMsgUnix(frame, unix.UnixRights(fd), nil); err != nil {
		unix.Munmap(mem)
		return nil, fmt.Errorf("send region: %w", err)
	}
	uc.SetWriteDeadline(time.Time{})
	c := &shmConn{s: s, uc: uc, mem: mem, who: who}
	c.ctx, c.cancel = context.WithCancel(s.ctx)
	c.mu.arena = newArena(size)
	c.mu.held = make(map[uint64][]extent)
	c.mu.freed = make(chan struct{})
	return c, nil
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
	c.mu.Unlock()
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
		case typeGetReq:
			if _, err := requestScope(c.ctx, c.who, &h); err != nil {
				s.stats.unauthorized.Add(1)
				return c.sendError(h.id, err)
			}
			keys := make([]prefixhash.Key, h.count)
			parseKeys(table, keys)
			select {
			case work <- shmWork{h: h, keys: keys}:
			default:
				return c.sendError(h.id, fmt.Errorf("%w: more than MaxPending (%d) requests queued", ErrLimit, s.opts.MaxPending))
			}
		case typeShmRelease:
			release = grow(release, h.count)
			parseIDs(table, release)
			c.free(release)
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

// free gives back the region space of the requests ids.
func (c *shmConn) free(ids []uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	before := c.mu.arena.used
	for _, id := range ids {
		for _, e := range c.mu.held[id] {
			c.mu.arena.release(e.off, e.n)
		}
		delete(c.mu.held, id)
	}
	if freed := before - c.mu.arena.used; freed > 0 {
		c.s.stats.regionUse.Add(-freed)
		close(c.mu.freed)
		c.mu.freed = make(chan struct{})
	}
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
// values that do not fit are marked for the client to ask again.
func (c *shmConn) get(w shmWork) {
	s := c.s
	ctx, cancel := requestDeadline(c.ctx, &w.h, s.opts.RequestTimeout)
	defer cancel()
	ctx, _ = requestScope(ctx, c.who, &w.h) // checked when the request arrived
	n := len(w.keys)
	vals, st := make([][]byte, n), make([]Status, n)
	release := s.src.Acquire(ctx, w.keys, vals, st)
	maxValue, _ := answerLimits(&w.h, &s.opts.Limits)
	var enc encoder
	t := enc.begin(typeShmGetResp, n)
	var held []extent
	var placed int64
	full := false
	for i := range n {
		v := vals[i]
		switch {
		case st[i] != StatusOK:
			if st[i] != StatusMiss {
				st[i] = StatusError
			}
		case len(v) > maxValue || int64(len(v)) > s.opts.RegionSize:
			st[i] = StatusError
		case full:
			st[i] = statusRetry
		default:
			off, ok := c.alloc(ctx, len(v), len(held) == 0)
			if !ok {
				if len(held) == 0 {
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
			copy(c.mem[off:off+int64(len(v))], v)
			if len(v) > 0 {
				held = append(held, extent{off, int64(len(v))})
				placed += alignExtent(int64(len(v)))
			}
			putShmEntry(t, i, StatusOK, len(v), off)
			s.stats.hits.Add(1)
			continue
		}
		putShmEntry(t, i, st[i], 0, 0)
		if st[i] != statusRetry {
			s.stats.misses.Add(1)
		}
	}
	if release != nil {
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
