package transfer

import (
	"context"
	"encoding/binary"
	"fmt"
	"net"
	"sync"
	"time"

	"github.com/kvmesh/kvmesh/auth"
)

// The lease protocol (issue 36): how a reader reads a peer's blocks
// one-sidedly, through a Fabric, without ever reading a slot that the owner
// has reused. Over a TCP data-plane connection:
//
//  1. fabric request → fabric response: the owner's Window descriptor
//     (fabric, epoch, size, the fabric's own descriptor), once per peer;
//     empty when the owner has no window or the client may not have it.
//  2. lease request (keys) → lease response: per key, a grant (offset and
//     length in the window: the owner pins the block), a miss, an error,
//     or "elsewhere" (statusRetry: the value is not in the window, say on
//     NVMe; the reader gets it with a get); then the window's epoch and
//     the lease's duration. The reader checks every grant against the
//     window's size and the epoch against the descriptor it holds.
//  3. the reader reads the granted spans through the fabric into its own
//     registered memory (Landing).
//  4. lease end (the lease request's id) → lease end response: OK when the
//     lease was still held, so every byte was read while the block was
//     pinned; a miss when it had ended (it expired, or the owner dropped
//     it): the reader discards what it read and gets those keys again.
//
// A lease lasts at most ServerOptions.LeaseTimeout and the lease request's
// own deadline, and ends with its connection. Only a node-wide principal
// that may read and write (a node of the cluster) gets the window: its
// remote key reads every tenant's blocks, past the per-block checks of the
// data plane. Step 4 makes a reused slot a miss, never wrong bytes, even
// before the store verifies each block's checksums (which it does on every
// path).

// leasePayload is the size of a lease response's payload.
const leasePayload = 16

// maxGrantsPerConn bounds the leases a connection may hold at once. A
// client ends its lease before it sends its next request on the
// connection, so it holds one.
const maxGrantsPerConn = 16

// grant is one lease of a connection: the pins of a lease request's values.
type grant struct {
	release func()
	timer   *time.Timer
}

// grants are a connection's open leases.
type grants struct {
	mu struct {
		sync.Mutex
		m      map[uint64]*grant
		closed bool
	}
}

// windowAllowed reports whether who may have the server's window.
func windowAllowed(who auth.Principal) bool {
	return !who.Scoped() && who.Can(auth.Read) && who.Can(auth.Write)
}

// open reports how many leases are open.
func (g *grants) open() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return len(g.mu.m)
}

// add holds release under lease id for d, counted in st.
func (g *grants) add(id uint64, release func(), d time.Duration, st *counters) {
	l := &grant{release: release}
	g.mu.Lock()
	if g.mu.closed {
		g.mu.Unlock()
		release()
		return
	}
	if g.mu.m == nil {
		g.mu.m = make(map[uint64]*grant)
	}
	if old := g.mu.m[id]; old != nil { // a client reusing an id ends its old lease
		old.timer.Stop()
		defer g.finish(old, st, false)
	}
	g.mu.m[id] = l
	st.leases.Add(1)
	// Under the lock, so that the timer finds the lease whole.
	l.timer = time.AfterFunc(d, func() {
		g.mu.Lock()
		mine := g.mu.m[id] == l
		if mine {
			delete(g.mu.m, id)
		}
		g.mu.Unlock()
		if mine {
			g.finish(l, st, true)
		}
	})
	g.mu.Unlock()
}

// end ends lease id and reports whether it was still held.
func (g *grants) end(id uint64, st *counters) bool {
	g.mu.Lock()
	l := g.mu.m[id]
	delete(g.mu.m, id)
	g.mu.Unlock()
	if l == nil {
		return false
	}
	l.timer.Stop()
	g.finish(l, st, false)
	return true
}

// close ends every lease: the connection is gone.
func (g *grants) close(st *counters) {
	g.mu.Lock()
	all := g.mu.m
	g.mu.m, g.mu.closed = nil, true
	g.mu.Unlock()
	for _, l := range all {
		l.timer.Stop()
		g.finish(l, st, false)
	}
}

func (g *grants) finish(l *grant, st *counters, expired bool) {
	if l.release != nil {
		l.release()
	}
	st.leases.Add(-1)
	if expired {
		st.leasesExpired.Add(1)
	}
}

// serveFabric answers a fabric request with the server's window, or with
// nothing when it has none for this client.
func (sc *serverConn) serveFabric(h *header) error {
	var desc []byte
	if w := sc.s.opts.Window; w != nil && windowAllowed(sc.who) {
		desc = w.desc
	}
	sc.enc.begin(typeFabricResp, 0)
	bufs := net.Buffers{sc.enc.finish(header{typ: typeFabricResp, id: h.id, payload: len(desc)}), desc}
	_, err := bufs.WriteTo(sc.nc)
	return err
}

// serveLease answers a lease request: each value the Source holds in the
// window is granted (its offset and length), pinned until the client ends
// the lease, the lease expires or the connection ends; a value elsewhere is
// answered statusRetry, for the client to get.
func (sc *serverConn) serveLease(ctx context.Context, h *header) error {
	s := sc.s
	w := s.opts.Window
	if w == nil || !windowAllowed(sc.who) {
		return fmt.Errorf("%w: this server grants this client no leases (ask for its window first)", ErrUnsupported)
	}
	if sc.grants.open() >= maxGrantsPerConn {
		return fmt.Errorf("%w: more than %d leases open on one connection", ErrLimit, maxGrantsPerConn)
	}
	d := s.opts.LeaseTimeout
	if dl, ok := ctx.Deadline(); ok {
		if d = min(d, time.Until(dl)); d <= 0 {
			return fmt.Errorf("lease request past its deadline: %w", context.DeadlineExceeded)
		}
	}
	n := h.count
	sc.size(n)
	parseKeys(sc.table, sc.keys)
	release := s.src.Acquire(ctx, sc.keys, sc.vals, sc.st)
	t := sc.enc.begin(typeLeaseResp, n)
	granted := 0
	for i := range n {
		st, v := sc.st[i], sc.vals[i]
		switch {
		case st != StatusOK:
			if st != StatusMiss {
				st = StatusError
			}
			putShmEntry(t, i, st, 0, 0)
			s.stats.misses.Add(1)
			continue
		case len(v) > s.opts.MaxValueSize:
			putShmEntry(t, i, StatusError, 0, 0)
			s.stats.misses.Add(1)
			continue
		case len(v) == 0:
			putShmEntry(t, i, StatusOK, 0, 0)
			s.stats.hits.Add(1)
		default:
			off, ok := w.offset(v)
			if !ok {
				putShmEntry(t, i, statusRetry, 0, 0) // elsewhere: the client gets it
				continue
			}
			putShmEntry(t, i, StatusOK, len(v), off)
			granted++
			s.stats.granted.Add(1)
			s.stats.grantedBytes.Add(int64(len(v)))
		}
	}
	clear(sc.vals)
	switch {
	case granted > 0:
		// Held before the answer leaves: the lease runs from here, later
		// than the client can think it began.
		sc.grants.add(h.id, release, d, &s.stats)
	case release != nil:
		release()
	}
	var p [leasePayload]byte
	binary.LittleEndian.PutUint64(p[0:], w.epoch)
	binary.LittleEndian.PutUint32(p[8:], uint32(min(max(d.Milliseconds(), 0), 1<<32-1)))
	bufs := net.Buffers{sc.enc.finish(header{typ: typeLeaseResp, id: h.id, count: n, payload: leasePayload}), p[:]}
	_, err := bufs.WriteTo(sc.nc)
	return err
}

// serveLeaseEnd ends the leases the client names and answers, for each,
// whether it was still held.
func (sc *serverConn) serveLeaseEnd(h *header) error {
	ids := make([]uint64, h.count)
	parseIDs(sc.table, ids)
	t := sc.enc.begin(typeLeaseEndResp, len(ids))
	for i, id := range ids {
		st := StatusMiss
		if sc.grants.end(id, &sc.s.stats) {
			st = StatusOK
		}
		putStatusEntry(t, i, st, 0)
	}
	_, err := sc.nc.Write(sc.enc.finish(header{typ: typeLeaseEndResp, id: h.id, count: len(ids)}))
	return err
}

// parseLeaseResp decodes a lease response: its table (as shmGetResp's,
// offsets checked against the window of windowSize bytes) and its payload,
// the window's epoch and the lease's duration.
func parseLeaseResp(table, payload []byte, lim *Limits, windowSize uint64, st []Status, lens []int, offs []uint64) (epoch uint64, d time.Duration, err error) {
	if len(payload) != leasePayload {
		return 0, 0, corrupt("lease response payload of %d bytes", len(payload))
	}
	if binary.LittleEndian.Uint32(payload[12:]) != 0 {
		return 0, 0, corrupt("lease response reserved bytes are not zero")
	}
	for i := range st {
		e := table[i*shmRespEntry:]
		s, n, err := parseItem(e, i, lim)
		if err != nil {
			return 0, 0, err
		}
		off := binary.LittleEndian.Uint64(e[8:])
		switch {
		case s != StatusOK && off != 0:
			return 0, 0, corrupt("item %d has status %s and an offset", i, s)
		case off > windowSize || uint64(n) > windowSize-off:
			return 0, 0, corrupt("item %d at [%d, +%d) is outside the %d-byte window", i, off, n, windowSize)
		}
		st[i], lens[i], offs[i] = s, n, off
	}
	return binary.LittleEndian.Uint64(payload[0:]), time.Duration(binary.LittleEndian.Uint32(payload[8:])) * time.Millisecond, nil
}

// parseLeaseEndResp decodes a lease end response into held.
func parseLeaseEndResp(table []byte, held []bool) error {
	for i := range held {
		e := table[i*getRespEntry:]
		if e[1]|e[2]|e[3]|e[4]|e[5]|e[6]|e[7] != 0 {
			return corrupt("lease end status %d has non-zero reserved bytes", i)
		}
		switch Status(e[0]) {
		case StatusOK:
			held[i] = true
		case StatusMiss:
			held[i] = false
		default:
			return corrupt("lease end status %d of item %d", e[0], i)
		}
	}
	return nil
}
