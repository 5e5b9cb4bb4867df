package transfer

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"time"

	"github.com/kvmesh/kvmesh/auth"
)

// listeners is what both servers share: listeners, an accept loop per
// listener, a goroutine per admitted connection, what each connection
// authenticated as, and a Close that stops them all and waits for them.
type listeners struct {
	log      *slog.Logger
	maxConns int
	handle   func(net.Conn)  // serves one connection; the caller closes it after
	ctx      context.Context // canceled by Close
	cancel   context.CancelFunc
	wg       sync.WaitGroup // accept loops and connection goroutines
	stats    counters

	mu struct {
		sync.Mutex
		lns    map[net.Listener]struct{}
		conns  map[net.Conn]*connState
		closed bool
	}
}

// connState is what the server knows of one open connection.
type connState struct {
	// authed is set once the connection's hello was accepted (or, on a
	// server that asks for no token, once its first frame was read).
	authed bool
	who    auth.Principal
	// sum is the SHA-256 of the token the hello presented, when it
	// presented one: the token itself is never kept.
	sum   [sha256.Size]byte
	token bool
}

func (l *listeners) init(log *slog.Logger, maxConns int, handle func(net.Conn)) {
	if log == nil {
		log = slog.Default()
	}
	l.log, l.maxConns, l.handle = log, maxConns, handle
	l.ctx, l.cancel = context.WithCancel(context.Background())
	l.mu.lns = make(map[net.Listener]struct{})
	l.mu.conns = make(map[net.Conn]*connState)
}

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

// admit tracks nc, or closes it when the server is closed or full.
func (l *listeners) admit(nc net.Conn) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.mu.closed || len(l.mu.conns) >= l.maxConns {
		nc.Close()
		l.stats.refused.Add(1)
		return false
	}
	l.mu.conns[nc] = &connState{}
	l.stats.conns.Add(1)
	return true
}

// authenticated records whom nc's hello authenticated, with the token it
// presented (nil: none), so that closeRevoked can find it.
func (l *listeners) authenticated(nc net.Conn, who auth.Principal, token []byte) {
	l.mu.Lock()
	defer l.mu.Unlock()
	st := l.mu.conns[nc]
	if st == nil {
		return
	}
	st.authed, st.who = true, who
	if len(token) > 0 {
		st.sum, st.token = sha256.Sum256(token), true
	}
}

func (l *listeners) forget(nc net.Conn) {
	nc.Close()
	l.mu.Lock()
	delete(l.mu.conns, nc)
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
