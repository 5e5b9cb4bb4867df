//go:build linux

package transfer

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kvmesh/kvmesh/block"
	"github.com/kvmesh/kvmesh/internal/prefault"
	"github.com/kvmesh/kvmesh/prefixhash"
)

// ShmClient reads values from a ShmServer on the same host through the
// shared region the server gave it. Result values are slices of that
// mapping, valid until Release; each Release gives the space back to the
// server. Requests are pipelined over one unix socket. A ShmClient is safe
// for concurrent use.
//
// When the server shares its DRAM arena with this client (a node-wide
// principal; see ShmServer), found values are slices of the arena itself:
// no byte is copied on either side. The server then holds a lease on them
// (their slots are not reused) until Release, or until its LeaseTimeout
// (default 30s) passes: a Result must be released before that, and its
// values not read after. With a writable arena, Put and PutPublish write
// each value once, straight into a slot the server reserved, and have the
// server commit it.
type ShmClient struct {
	opts   ShmClientOptions
	uc     *net.UnixConn
	mem    []byte // the region, mapped read-only
	arena  []byte // the server's arena, or nil; mapped read-only unless arenaW
	arenaW bool
	slots  chan struct{}
	nextID atomic.Uint64
	done   chan struct{} // closed when the reader exits
	err    error         // why the reader exited; set before done closes

	wmu  sync.Mutex // serializes writes to uc; guards enc, bufs and rel
	enc  encoder
	bufs net.Buffers
	// rel holds the request ids of released Results not yet told to the
	// server: they go ahead of the next request, in the same write, or
	// when rel.timer fires (releaseDelay), whichever comes first. One
	// write and one server wakeup per Get instead of two.
	rel struct {
		ids   []uint64
		enc   encoder
		bufs  net.Buffers
		timer *time.Timer
		armed bool
	}

	mu struct {
		sync.Mutex
		waiters  map[uint64]chan shmReply
		closed   bool
		results  int // unreleased results; the mapping outlives Close until 0
		unmapped bool
	}
}

type shmReply struct {
	h     header
	table []byte
	err   error
}

// Shm is the same-host shared-memory Transport.
type Shm struct{ Options *ShmClientOptions }

// Name returns "shm".
func (Shm) Name() string { return "shm" }

// Dial connects to the ShmServer listening on the unix socket path.
func (t Shm) Dial(ctx context.Context, path string) (Peer, error) {
	c, err := DialShm(ctx, path, t.Options)
	if err != nil {
		return nil, err // not a nil *ShmClient in a non-nil Peer
	}
	return c, nil
}

// DialShm connects to the ShmServer listening on the unix socket path and
// maps the region it sends. opts may be nil for defaults.
func DialShm(ctx context.Context, path string, opts *ShmClientOptions) (*ShmClient, error) {
	var o ShmClientOptions
	if opts != nil {
		o = *opts
	}
	o.EnsureDefaults()
	if err := o.Validate(); err != nil {
		return nil, err
	}
	ctx, cancel := requestContext(ctx, o.DialTimeout)
	defer cancel()
	var d net.Dialer
	nc, err := d.DialContext(ctx, "unix", path)
	if err != nil {
		return nil, fmt.Errorf("transfer: shm dial: %w", err)
	}
	uc := nc.(*net.UnixConn)
	hl, mem, arena, err := receiveRegion(ctx, uc, o.Token, &o.Limits)
	if err != nil {
		uc.Close()
		return nil, fmt.Errorf("transfer: shm dial %s: %w", path, err)
	}
	o.Limits = tighter(o.Limits, hl.limits)
	c := &ShmClient{opts: o, uc: uc, mem: mem, arena: arena, arenaW: hl.arena&arenaWritable != 0,
		slots: make(chan struct{}, hl.maxPending), done: make(chan struct{})}
	c.mu.waiters = make(map[uint64]chan shmReply)
	go c.readLoop()
	return c, nil
}

// receiveRegion sends the client's hello (with token), reads the server's
// hello frame and the region's descriptor (and the arena's, when the hello
// says one follows), checks the region and maps it read-only, and maps the
// arena (writable when the hello says so). A server that refused the
// client answers with an error frame instead, returned as an ErrAuth or
// ErrRemote error.
func receiveRegion(ctx context.Context, uc *net.UnixConn, token string, lim *Limits) (hl hello, mem, arena []byte, err error) {
	hl, mem, fds, err := receiveHello(ctx, uc, token, lim)
	defer func() {
		for _, fd := range fds {
			unix.Close(fd)
		}
	}()
	if err != nil {
		return hl, nil, nil, err
	}
	if hl.arena&arenaShared == 0 {
		return hl, mem, nil, nil
	}
	arena, err = mapArena(fds[1], hl.arena&arenaWritable != 0)
	if err != nil {
		unix.Munmap(mem)
		return hl, nil, nil, err
	}
	return hl, mem, arena, nil
}

// mapArena maps the server's arena from its descriptor.
func mapArena(fd int, writable bool) ([]byte, error) {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, fmt.Errorf("stat arena: %w", err)
	}
	seals, err := unix.FcntlInt(uintptr(fd), unix.F_GET_SEALS, 0)
	switch {
	case err != nil:
		return nil, fmt.Errorf("arena seals: %w", err)
	case st.Size <= 0 || st.Size%valueAlign != 0:
		return nil, corrupt("arena of %d bytes", st.Size)
	case seals&unix.F_SEAL_SHRINK == 0:
		return nil, corrupt("arena is not sealed against shrinking")
	}
	prot := unix.PROT_READ
	if writable {
		prot |= unix.PROT_WRITE
	}
	arena, err := unix.Mmap(fd, 0, int(st.Size), prot, unix.MAP_SHARED|unix.MAP_NORESERVE)
	if err != nil {
		return nil, fmt.Errorf("map arena: %w", err)
	}
	return arena, nil
}

// receiveHello does receiveRegion's exchange; the caller closes fds.
func receiveHello(ctx context.Context, uc *net.UnixConn, token string, lim *Limits) (hello, []byte, []int, error) {
	dl, _ := ctx.Deadline()
	uc.SetDeadline(dl)
	defer uc.SetDeadline(time.Time{})
	stop := context.AfterFunc(ctx, func() { uc.SetDeadline(aLongTimeAgo) })
	defer stop()
	var enc encoder
	copy(enc.begin(typeHello, len(token)), token)
	if _, err := uc.Write(enc.finish(header{typ: typeHello, count: len(token), arena: true})); err != nil {
		return hello{}, nil, nil, fmt.Errorf("send hello: %w", err)
	}
	buf := make([]byte, headerLen+helloEntry)
	oob := make([]byte, unix.CmsgSpace(4*4))
	n, oobn, flags, _, err := uc.ReadMsgUnix(buf, oob)
	var fds []int
	if oobn > 0 {
		msgs, perr := unix.ParseSocketControlMessage(oob[:oobn])
		for i := range msgs {
			if got, err := unix.ParseUnixRights(&msgs[i]); err == nil {
				fds = append(fds, got...)
			} else if perr == nil {
				perr = err
			}
		}
		if err == nil {
			err = perr
		}
	}
	switch {
	case err != nil:
		return hello{}, nil, fds, fmt.Errorf("receive region: %w", err)
	case n == 0:
		return hello{}, nil, fds, fmt.Errorf("receive region: server closed the connection (over MaxClients?): %w", io.EOF)
	case flags&unix.MSG_CTRUNC != 0 || len(fds) > 2:
		return hello{}, nil, fds, corrupt("hello came with %d descriptors", len(fds))
	}
	if n < headerLen {
		if _, err := io.ReadFull(uc, buf[n:headerLen]); err != nil {
			return hello{}, nil, fds, fmt.Errorf("receive region: %w", err)
		}
		n = headerLen
	}
	h, err := parseHeader(buf[:headerLen], lim)
	if err != nil {
		return hello{}, nil, fds, err
	}
	if h.typ == typeError {
		// Refused: the message follows, partly read already.
		return hello{}, nil, fds, remoteError(io.MultiReader(bytes.NewReader(buf[headerLen:n]), uc), &h)
	}
	if h.typ != typeShmHello || len(fds) < 1 {
		return hello{}, nil, fds, corrupt("got %s with %d descriptors, want shm hello with the region", h.typ, len(fds))
	}
	if _, err := io.ReadFull(uc, buf[n:]); err != nil {
		return hello{}, nil, fds, fmt.Errorf("receive region: %w", err)
	}
	if err := checkTable(&h, buf[headerLen:]); err != nil {
		return hello{}, nil, fds, err
	}
	hl, err := parseHello(buf[headerLen:])
	if err != nil {
		return hello{}, nil, fds, err
	}
	if want := 1 + int(hl.arena&arenaShared); len(fds) != want {
		return hello{}, nil, fds, corrupt("shm hello with %d descriptors, want %d", len(fds), want)
	}
	fd := fds[0]
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return hello{}, nil, fds, fmt.Errorf("stat region: %w", err)
	}
	seals, err := unix.FcntlInt(uintptr(fd), unix.F_GET_SEALS, 0)
	switch {
	case err != nil:
		return hello{}, nil, fds, fmt.Errorf("region seals: %w", err)
	case st.Size != hl.regionSize:
		return hello{}, nil, fds, corrupt("region is %d bytes, hello says %d", st.Size, hl.regionSize)
	case seals&unix.F_SEAL_SHRINK == 0:
		return hello{}, nil, fds, corrupt("region is not sealed against shrinking")
	}
	mem, err := unix.Mmap(fd, 0, int(hl.regionSize), unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		return hello{}, nil, fds, fmt.Errorf("map region: %w", err)
	}
	return hl, mem, fds, nil
}

// InPlace reports whether the server shares its DRAM arena with this
// client: found values are then read in place (see ShmClient), and a reader
// that wants a piece of a value does better to cut it from the value than
// to have the server copy it out.
func (c *ShmClient) InPlace() bool { return c.arena != nil }

// Close disconnects from the server; requests in flight fail with
// ErrClosed. The region stays mapped until every Result is released.
func (c *ShmClient) Close() error {
	c.mu.Lock()
	if c.mu.closed {
		c.mu.Unlock()
		return nil
	}
	c.mu.closed = true
	c.mu.Unlock()
	c.wmu.Lock()
	if c.rel.timer != nil {
		c.rel.timer.Stop() // the server frees what the closed connection held
	}
	c.wmu.Unlock()
	c.uc.Close()
	<-c.done
	c.mu.Lock()
	c.unmapLocked()
	c.mu.Unlock()
	return nil
}

func (c *ShmClient) unmapLocked() {
	if c.mu.closed && c.mu.results == 0 && !c.mu.unmapped {
		c.mu.unmapped = true
		if err := unix.Munmap(c.mem); err != nil {
			panic(fmt.Sprintf("transfer: unmap shm region: %v", err))
		}
		if c.arena != nil {
			if err := unix.Munmap(c.arena); err != nil {
				panic(fmt.Sprintf("transfer: unmap shared arena: %v", err))
			}
		}
	}
}

// readLoop owns reading from the socket: it hands each answer to the
// request waiting for it, and releases at once the region space of answers
// nobody waits for any more. It exits, failing every waiter, when the
// socket breaks or a frame is bad.
func (c *ShmClient) readLoop() {
	err := c.readFrames()
	c.uc.Close()
	c.mu.Lock()
	if c.mu.closed {
		err = ErrClosed
	}
	c.err = err
	for id, ch := range c.mu.waiters {
		if ch != nil {
			ch <- shmReply{err: err}
		}
		delete(c.mu.waiters, id)
	}
	c.mu.Unlock()
	close(c.done)
}

func (c *ShmClient) readFrames() error {
	br := bufio.NewReaderSize(c.uc, 64<<10)
	var hdr [headerLen]byte
	for {
		if _, err := io.ReadFull(br, hdr[:]); err != nil {
			return fmt.Errorf("transfer: shm read: %w", err)
		}
		h, err := parseHeader(hdr[:], &c.opts.Limits)
		if err != nil {
			return err
		}
		table, err := readTable(br, &h, nil)
		if err != nil {
			return err
		}
		rep := shmReply{h: h, table: table}
		switch h.typ {
		case typeShmGetResp, typePutResp, typeClaimResp:
		case typeError:
			rep.err = remoteError(br, &h)
			if h.id == 0 {
				return rep.err
			}
		default:
			return corrupt("unexpected %s frame", h.typ)
		}
		c.mu.Lock()
		ch, ok := c.mu.waiters[h.id]
		delete(c.mu.waiters, h.id)
		c.mu.Unlock()
		if !ok {
			return corrupt("answer to request %d, which is not outstanding", h.id)
		}
		<-c.slots
		switch {
		case ch != nil:
			ch <- rep
		case h.typ == typeShmGetResp:
			// Abandoned by its requester: give the space back now.
			c.sendRelease([]uint64{h.id})
		}
	}
}

// roundTrip sends a request frame (built by fill under the write lock) and
// waits for its answer. An abandoned request's answer is released by the
// reader when it arrives.
func (c *ShmClient) roundTrip(ctx context.Context, fill func(id uint64) net.Buffers) (shmReply, error) {
	select {
	case c.slots <- struct{}{}:
	case <-ctx.Done():
		return shmReply{}, fmt.Errorf("waiting to send: %w", ctx.Err())
	case <-c.done:
		return shmReply{}, c.err
	}
	id := c.nextID.Add(1)
	ch := make(chan shmReply, 1)
	c.mu.Lock()
	if c.mu.closed {
		c.mu.Unlock()
		<-c.slots
		return shmReply{}, ErrClosed
	}
	c.mu.waiters[id] = ch
	c.mu.Unlock()

	c.wmu.Lock()
	dl, _ := ctx.Deadline()
	c.uc.SetWriteDeadline(dl)
	bufs := c.withReleases(fill(id))
	n, err := bufs.WriteTo(c.uc)
	clear(c.bufs)
	clear(c.rel.bufs)
	if err == nil || n > 0 {
		c.rel.ids = c.rel.ids[:0] // sent (or the stream is unusable)
	}
	c.wmu.Unlock()
	if err != nil {
		if n > 0 {
			c.uc.Close() // a partial frame: the stream is unusable
		}
		// The reader may have taken the answer (an error frame the
		// server sent before it closed) and with it the slot.
		c.mu.Lock()
		_, mine := c.mu.waiters[id]
		delete(c.mu.waiters, id)
		c.mu.Unlock()
		if mine {
			<-c.slots
		}
		if ctx.Err() != nil {
			err = fmt.Errorf("%w (%w)", ctx.Err(), err)
		}
		return shmReply{}, fmt.Errorf("send request: %w", err)
	}

	select {
	case rep := <-ch:
		return rep, rep.err
	case <-ctx.Done():
	}
	c.mu.Lock()
	_, waiting := c.mu.waiters[id]
	if waiting {
		c.mu.waiters[id] = nil // abandoned: the reader releases its answer
	}
	c.mu.Unlock()
	if !waiting {
		// The answer arrived as we gave up.
		if rep := <-ch; rep.err == nil && rep.h.typ == typeShmGetResp {
			c.sendRelease([]uint64{id})
		}
	}
	return shmReply{}, ctx.Err()
}

// Get fetches keys. The Result's values are slices of the shared region,
// valid until Release (which also gives the space back to the server), even
// if the client or server closes meanwhile. On error nothing is held.
func (c *ShmClient) Get(ctx context.Context, keys []prefixhash.Key) (*Result, error) {
	return c.get(ctx, keys, nil)
}

// GetParts is Client.GetParts through the shared region: the server builds
// each part record straight into it.
func (c *ShmClient) GetParts(ctx context.Context, keys []prefixhash.Key, parts []block.Part) (*Result, error) {
	if err := checkParts(keys, parts); err != nil {
		return nil, err
	}
	return c.get(ctx, keys, parts)
}

// Claim is Client.Claim through the unix socket.
func (c *ShmClient) Claim(ctx context.Context, keys []prefixhash.Key, parts []block.Part) ([]block.ClaimStatus, error) {
	ctx, cancel := requestContext(ctx, c.opts.RequestTimeout)
	defer cancel()
	st, err := claimRounds(keys, parts, c.opts.MaxItems, func(idx []int, st []block.ClaimStatus) error {
		rep, err := c.roundTrip(ctx, func(id uint64) net.Buffers {
			c.bufs = append(c.bufs[:0], partFrame(ctx, &c.enc, typeClaimReq, id, keys, parts, idx, &c.opts.Limits))
			return c.bufs
		})
		if err != nil {
			return err
		}
		if rep.h.typ != typeClaimResp || rep.h.count != len(idx) {
			return corrupt("got %s of %d items for %d claims", rep.h.typ, rep.h.count, len(idx))
		}
		return parseClaimResp(rep.table, st)
	})
	if err != nil {
		if errors.Is(err, ErrCorrupt) {
			c.uc.Close()
		}
		return nil, fmt.Errorf("transfer: shm claim %d parts: %w", len(keys), err)
	}
	return st, nil
}

// get is Get, or GetParts when parts is not nil.
func (c *ShmClient) get(ctx context.Context, keys []prefixhash.Key, parts []block.Part) (*Result, error) {
	c.mu.Lock()
	if c.mu.closed {
		c.mu.Unlock()
		return nil, ErrClosed
	}
	c.mu.results++
	c.mu.Unlock()
	ctx, cancel := requestContext(ctx, c.opts.RequestTimeout)
	defer cancel()
	r := newResult(c, len(keys))
	var st []Status
	var lens []int
	var offs []uint64
	err := getRounds(len(keys), c.opts.MaxItems, func(idx []int) ([]int, error) {
		rep, err := c.roundTrip(ctx, func(id uint64) net.Buffers {
			c.bufs = append(c.bufs[:0], requestFrame(ctx, &c.enc, id, keys, parts, idx, &c.opts.Limits))
			return c.bufs
		})
		if err != nil {
			return nil, err
		}
		r.ids = append(r.ids, rep.h.id)
		st, lens, offs = grow(st, len(idx)), grow(lens, len(idx)), grow(offs, len(idx))
		if rep.h.typ != typeShmGetResp || rep.h.count != len(idx) {
			return nil, corrupt("got %s of %d items for %d keys", rep.h.typ, rep.h.count, len(idx))
		}
		if err := parseShmResp(rep.table, &c.opts.Limits, int64(len(c.mem)), int64(len(c.arena)), st, lens, offs); err != nil {
			return nil, err
		}
		return fillResult(r, idx, st, func(i int) []byte {
			m, off := c.mem, offs[i]
			if off&inArena != 0 {
				m, off = c.arena, off&^inArena
			}
			end := off + uint64(lens[i])
			return m[off:end:end]
		}), nil
	})
	if err != nil {
		r.Release()
		if errors.Is(err, ErrCorrupt) {
			c.uc.Close()
		}
		what := "keys"
		if parts != nil {
			what = "parts"
		}
		return nil, fmt.Errorf("transfer: shm get %d %s: %w", len(keys), what, err)
	}
	return r, nil
}

// Put pushes vals[i] under keys[i]. The values travel inline over the unix
// socket (one copy into the kernel and one out), in as many frames as
// MaxItems and MaxBatchBytes require; vals are only read during the call.
func (c *ShmClient) Put(ctx context.Context, keys []prefixhash.Key, vals [][]byte) ([]Status, error) {
	return c.put(ctx, puts{keys: keys, vals: vals})
}

// PutPublish is Client.PutPublish through the unix socket.
func (c *ShmClient) PutPublish(ctx context.Context, keys, chunkKeys []prefixhash.Key, heads, vals [][]byte) ([]Status, error) {
	p := puts{keys: keys, chunkKeys: chunkKeys, heads: heads, vals: vals}
	if err := p.checkPublish(); err != nil {
		return nil, err
	}
	return c.put(ctx, p)
}

// put sends p as put requests, or publish requests; with a writable
// arena, it writes the values into reserved slots instead, and sends only
// those that got none.
func (c *ShmClient) put(ctx context.Context, p puts) ([]Status, error) {
	ctx, cancel := requestContext(ctx, c.opts.RequestTimeout)
	defer cancel()
	if !c.arenaW {
		return c.putInline(ctx, p)
	}
	st, err := putFrames(&p, &c.opts.Limits, func(lo, hi, _ int, st []Status) error {
		return c.putReserved(ctx, &p, lo, hi, st)
	})
	if err != nil {
		return nil, fmt.Errorf("transfer: shm put %d values: %w", len(p.keys), err)
	}
	var rest []int
	for i, s := range st {
		if s == statusRetry {
			rest = append(rest, i)
		}
	}
	if len(rest) == 0 {
		return st, nil
	}
	q := p.pick(rest)
	sub, err := c.putInline(ctx, q)
	if err != nil {
		return nil, err
	}
	for j, i := range rest {
		st[i] = sub[j]
	}
	return st, nil
}

// putReserved stores items [lo, hi) of p through the arena: one round trip
// reserves a slot per item, the values are written into them here, and a
// second round trip commits them. st gets each item's status; statusRetry
// for one that got no slot (the server had no room), which the caller
// sends inline. If the commit cannot be sent or answered, the reservations
// are released, so the server frees their slots at once.
func (c *ShmClient) putReserved(ctx context.Context, p *puts, lo, hi int, st []Status) error {
	n := hi - lo
	rep, err := c.roundTrip(ctx, func(id uint64) net.Buffers {
		t := c.enc.begin(typeShmReserveReq, n)
		for j := range n {
			var chunk prefixhash.Key
			if p.chunkKeys != nil {
				chunk = p.chunkKeys[lo+j]
			}
			putReserveEntry(t, j, p.keys[lo+j], prefixhash.Key{}, chunk, p.valueLen(lo+j))
		}
		h := scoped(ctx, header{typ: typeShmReserveReq, id: id, count: n, timeout: timeoutMillis(ctx)})
		c.bufs = append(c.bufs[:0], c.enc.finish(h))
		return c.bufs
	})
	if err != nil {
		return err
	}
	rid := rep.h.id
	if rep.h.typ != typeShmGetResp || rep.h.count != n {
		return corrupt("got %s of %d items for a reservation of %d", rep.h.typ, rep.h.count, n)
	}
	rst, lens, offs := make([]Status, n), make([]int, n), make([]uint64, n)
	if err := parseShmResp(rep.table, &c.opts.Limits, int64(len(c.mem)), int64(len(c.arena)), rst, lens, offs); err != nil {
		c.sendRelease([]uint64{rid})
		return err
	}
	reserved := 0
	for j := range n {
		i := lo + j
		if rst[j] != StatusOK || offs[j]&inArena == 0 || lens[j] != p.valueLen(i) {
			st[j] = statusRetry
			continue
		}
		dst := c.arena[offs[j]&^inArena:][:lens[j]]
		prefault.Write(dst)
		if p.heads != nil {
			dst = dst[copy(dst, p.heads[i]):]
		}
		copy(dst, p.vals[i])
		reserved++
	}
	if reserved == 0 {
		return nil
	}
	rep, err = c.roundTrip(ctx, func(id uint64) net.Buffers {
		putIDEntry(c.enc.begin(typeShmCommitReq, 1), 0, rid)
		c.bufs = append(c.bufs[:0], c.enc.finish(header{typ: typeShmCommitReq, id: id, count: 1}))
		return c.bufs
	})
	if err != nil {
		c.sendRelease([]uint64{rid}) // frees the slots if the commit never ran
		return err
	}
	if rep.h.typ != typePutResp || rep.h.count != n {
		return corrupt("got %s of %d items for a commit of %d", rep.h.typ, rep.h.count, n)
	}
	cst := make([]Status, n)
	if err := parsePutResp(rep.table, cst); err != nil {
		return err
	}
	for j := range n {
		if st[j] != statusRetry {
			st[j] = cst[j]
		}
	}
	return nil
}

// putInline sends p as put requests, or publish requests, values inline.
func (c *ShmClient) putInline(ctx context.Context, p puts) ([]Status, error) {
	st, err := putFrames(&p, &c.opts.Limits, func(lo, hi, bytes int, st []Status) error {
		rep, err := c.roundTrip(ctx, func(id uint64) net.Buffers {
			q := p.sub(lo, hi)
			c.bufs = appendPut(ctx, &c.enc, c.bufs[:0], id, &q, bytes)
			return c.bufs
		})
		if err != nil {
			return err
		}
		if rep.h.typ != typePutResp || rep.h.count != hi-lo {
			return corrupt("got %s of %d items for a put of %d", rep.h.typ, rep.h.count, hi-lo)
		}
		return parsePutResp(rep.table, st)
	})
	if err != nil {
		return nil, fmt.Errorf("transfer: shm put %d values: %w", len(p.keys), err)
	}
	return st, nil
}

// releaseDelay bounds how long a released Result's ids wait for a request
// to go ahead of before they are sent alone.
const releaseDelay = time.Millisecond

func (c *ShmClient) release(r *Result) {
	c.wmu.Lock()
	c.rel.ids = append(c.rel.ids, r.ids...)
	r.ids = nil
	if len(c.rel.ids) >= c.opts.MaxItems {
		c.flushReleasesLocked()
	} else if !c.rel.armed && len(c.rel.ids) > 0 {
		c.rel.armed = true
		if c.rel.timer == nil {
			c.rel.timer = time.AfterFunc(releaseDelay, c.flushReleases)
		} else {
			c.rel.timer.Reset(releaseDelay)
		}
	}
	c.wmu.Unlock()
	c.mu.Lock()
	c.mu.results--
	c.unmapLocked()
	c.mu.Unlock()
}

// withReleases returns the request frames bufs, preceded by a release
// frame of the pending released ids; the caller empties c.rel.ids once it
// wrote them. c.wmu is held.
func (c *ShmClient) withReleases(bufs net.Buffers) net.Buffers {
	ids := c.rel.ids
	if len(ids) == 0 {
		return bufs
	}
	if len(ids) > c.opts.MaxItems {
		c.flushReleasesLocked()
		return bufs
	}
	t := c.rel.enc.begin(typeShmRelease, len(ids))
	for i, id := range ids {
		putIDEntry(t, i, id)
	}
	c.rel.bufs = append(append(c.rel.bufs[:0], c.rel.enc.finish(header{typ: typeShmRelease, count: len(ids)})), bufs...)
	return c.rel.bufs
}

// flushReleases sends the pending released ids, if a request has not
// taken them meanwhile.
func (c *ShmClient) flushReleases() {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	c.rel.armed = false
	c.flushReleasesLocked()
}

// flushReleasesLocked sends the pending released ids, in frames of at most
// MaxItems. c.wmu is held.
func (c *ShmClient) flushReleasesLocked() {
	for ids := c.rel.ids; len(ids) > 0; {
		n := min(len(ids), c.opts.MaxItems)
		c.sendReleaseLocked(ids[:n])
		ids = ids[n:]
	}
	c.rel.ids = c.rel.ids[:0]
}

// sendRelease tells the server it may reuse the space of requests ids. If
// the connection is gone, so is the server's side of the region: there is
// nothing to give back.
func (c *ShmClient) sendRelease(ids []uint64) {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	c.sendReleaseLocked(ids)
}

// sendReleaseLocked is sendRelease with c.wmu held.
func (c *ShmClient) sendReleaseLocked(ids []uint64) {
	t := c.enc.begin(typeShmRelease, len(ids))
	for i, id := range ids {
		putIDEntry(t, i, id)
	}
	c.uc.SetWriteDeadline(time.Now().Add(c.opts.RequestTimeout))
	if _, err := c.uc.Write(c.enc.finish(header{typ: typeShmRelease, count: len(ids)})); err != nil {
		c.uc.Close()
	}
}
