package transfer

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"sync"
	"time"

	"github.com/kvmesh/kvmesh/auth"
)

// listeners is what both servers share: listeners, an accept loop per
// listener, a goroutine per admitted connection, what each connection
// authenticated as, and a Close that stops them all and waits for them.
//
// Slots. A connection is pending from its accept until its hello is
// accepted (or, on a server that asks for no token, its first frame is
// read), then authenticated. At most maxConns connections are
// authenticated, at most maxPerTenant of them a tenant's; a hello past
// either is refused with a limit error. Pending connections have slots of
// their own, maxPending, and when those are full a new connection evicts
// the oldest pending one: sockets that never authenticate (a flood of
// them) hold no slot a credentialed client needs, and a legitimate client
// is evicted only if maxPending newer connections arrive during its own
// handshake, which takes a round trip or two.
type listeners struct {
	log          *slog.Logger
	maxConns     int
	maxPending   int
	maxPerTenant int
	handle       func(net.Conn)  // serves one connection; the caller closes it after
	ctx          context.Context // canceled by Close
	cancel       context.CancelFunc
	wg           sync.WaitGroup // accept loops and connection goroutines
	stats        counters

	mu struct {
		sync.Mutex
		lns     map[net.Listener]struct{}
		conns   map[net.Conn]*connState
		pending int            // connections not yet authenticated nor evicted
		authed  int            // authenticated connections
		tenants map[string]int // authenticated connections per tenant
		order   []net.Conn     // accepted connections, oldest first: the eviction order (see evictOldestPendingLocked)
		closed  bool
	}
}

// connState is what the server knows of one open connection.
type connState struct {
	evicted bool // closed while pending, to make room
	// authed is set once the connection's hello was accepted (or, on a
	// server that asks for no token, once its first frame was read).
	authed bool
	who    auth.Principal
	// sum is the SHA-256 of the token the hello presented, when it
	// presented one: the token itself is never kept.
	sum   [sha256.Size]byte
	token bool
}

func (l *listeners) init(log *slog.Logger, maxConns, maxPerTenant int, handle func(net.Conn)) {
	if log == nil {
		log = slog.Default()
	}
	l.log, l.maxConns, l.maxPerTenant, l.handle = log, maxConns, maxPerTenant, handle
	l.maxPending = pendingSlots(maxConns)
	l.ctx, l.cancel = context.WithCancel(context.Background())
	l.mu.lns = make(map[net.Listener]struct{})
	l.mu.conns = make(map[net.Conn]*connState)
	l.mu.tenants = make(map[string]int)
}

// pendingSlots is how many connections may be in their handshake at once
// beside maxConns authenticated ones: a quarter as many, at least 16.
func pendingSlots(maxConns int) int { return max(16, maxConns/4) }

// start serves ln in a goroutine that close stops.
func (l *listeners) start(ln net.Listener) (net.Addr, error) {
	if !l.track(ln) {
		ln.Close()
		return nil, ErrClosed
	}
	l.wg.Add(1)
	go func() {
		defer l.wg.Done()
		l.acceptLoop(ln)
	}()
	return ln.Addr(), nil
}

func (l *listeners) serve(ln net.Listener) error {
	if !l.track(ln) {
		ln.Close()
		return ErrClosed
	}
	return l.acceptLoop(ln)
}

func (l *listeners) track(ln net.Listener) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.mu.closed {
		return false
	}
	l.mu.lns[ln] = struct{}{}
	return true
}

// acceptLoop accepts on ln and starts a goroutine per connection until ln
// fails for good. Transient errors (out of file descriptors) back off
// instead of spinning. It returns ErrClosed after Close.
func (l *listeners) acceptLoop(ln net.Listener) error {
	var delay time.Duration
	for {
		nc, err := ln.Accept()
		if err != nil {
			if l.ctx.Err() != nil {
				return ErrClosed
			}
			if errors.Is(err, net.ErrClosed) {
				return fmt.Errorf("transfer: accept: %w", err)
			}
			delay = min(max(2*delay, 5*time.Millisecond), time.Second)
			l.log.Warn("transfer: accept failed; retrying", "addr", ln.Addr(), "err", err, "retry_in", delay)
			t := time.NewTimer(delay)
			select {
			case <-t.C:
			case <-l.ctx.Done():
				t.Stop()
				return ErrClosed
			}
			continue
		}
		delay = 0
		if l.admit(nc) {
			l.wg.Add(1)
			go func() {
				defer l.wg.Done()
				defer l.forget(nc)
				l.handle(nc)
			}()
		}
	}
}

// admit tracks nc as pending, evicting the oldest pending connection when
// their slots are full, or closes it when the server is closed.
func (l *listeners) admit(nc net.Conn) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.mu.closed {
		nc.Close()
		l.stats.refused.Add(1)
		return false
	}
	if l.mu.pending >= l.maxPending {
		l.evictOldestPendingLocked()
	}
	l.mu.conns[nc] = &connState{}
	if len(l.mu.order) >= 2*(l.maxConns+l.maxPending) {
		l.mu.order = slices.DeleteFunc(l.mu.order, func(nc net.Conn) bool {
			st := l.mu.conns[nc]
			return st == nil || st.authed || st.evicted
		})
	}
	l.mu.order = append(l.mu.order, nc)
	l.mu.pending++
	l.stats.conns.Add(1)
	return true
}

// evictOldestPendingLocked closes the pending connection accepted first.
// order holds the connections in accept order; those no longer pending
// (authenticated, evicted, gone) are skipped as they come to its front
// (admit compacts it when it holds many more than can be open), so an
// eviction costs O(1) amortized: a flood does not make each accept scan
// every connection under the lock.
func (l *listeners) evictOldestPendingLocked() {
	for len(l.mu.order) > 0 {
		nc := l.mu.order[0]
		l.mu.order[0] = nil
		l.mu.order = l.mu.order[1:]
		if st := l.mu.conns[nc]; st != nil && !st.authed && !st.evicted {
			st.evicted = true
			l.mu.pending--
			nc.Close()
			l.stats.evicted.Add(1)
			return
		}
	}
}

// authenticated records whom nc's hello authenticated, with the token it
// presented (nil: none), so that closeRevoked can find it, and moves it to
// the authenticated slots. It returns an ErrLimit error, and changes
// nothing, when those are full (MaxConns, or the tenant's share), and
// ErrClosed when nc was evicted meanwhile.
func (l *listeners) authenticated(nc net.Conn, who auth.Principal, token []byte) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	st := l.mu.conns[nc]
	switch {
	case st == nil || st.evicted:
		return ErrClosed
	case st.authed:
		return nil
	case l.mu.authed >= l.maxConns:
		l.stats.refused.Add(1)
		return fmt.Errorf("%w: server full: %d connections are open, its limit", ErrLimit, l.mu.authed)
	case who.Scoped() && l.mu.tenants[who.Tenant] >= l.maxPerTenant:
		l.stats.refused.Add(1)
		return fmt.Errorf("%w: tenant %s has %d connections open, its limit on this server", ErrLimit, who.Tenant, l.mu.tenants[who.Tenant])
	}
	st.authed, st.who = true, who
	if len(token) > 0 {
		st.sum, st.token = sha256.Sum256(token), true
	}
	l.mu.pending--
	l.mu.authed++
	if who.Scoped() {
		l.mu.tenants[who.Tenant]++
	}
	return nil
}

func (l *listeners) forget(nc net.Conn) {
	nc.Close()
	l.mu.Lock()
	if st := l.mu.conns[nc]; st != nil {
		switch {
		case st.authed:
			l.mu.authed--
			if st.who.Scoped() {
				if l.mu.tenants[st.who.Tenant]--; l.mu.tenants[st.who.Tenant] == 0 {
					delete(l.mu.tenants, st.who.Tenant)
				}
			}
		case !st.evicted:
			l.mu.pending--
		}
		delete(l.mu.conns, nc)
	}
	l.mu.Unlock()
	l.stats.conns.Add(-1)
}

// closeRevoked closes every connection whose token tokens no longer
// accepts, or no longer maps to the principal it authenticated (scopes or
// tenant changed), and returns how many it closed. Their goroutines end
// as after any broken connection: requests in flight fail, pins, leases
// and reservations are released.
func (l *listeners) closeRevoked(tokens *auth.Tokens) int {
	if tokens == nil {
		return 0
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for nc, st := range l.mu.conns {
		if !st.token {
			continue
		}
		if p, ok := tokens.LookupSum(st.sum); ok && p == st.who {
			continue
		}
		nc.Close()
		st.token = false // closed once
		n++
	}
	l.stats.revoked.Add(int64(n))
	return n
}

func (l *listeners) close() error {
	l.mu.Lock()
	if l.mu.closed {
		l.mu.Unlock()
		return nil
	}
	l.mu.closed = true
	for ln := range l.mu.lns {
		ln.Close()
	}
	for nc := range l.mu.conns {
		nc.Close()
	}
	l.mu.Unlock()
	l.cancel()
	l.wg.Wait()
	return nil
}
