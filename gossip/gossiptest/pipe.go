package gossiptest

import (
	"io"
	"net"
	"os"
	"sync"
	"time"
)

// pipe is one end of a simulated stream: what one end writes becomes
// readable at the other a one-way latency later. Writes never block (the
// streams memberlist opens carry a push-pull's state, then close).
type pipe struct {
	in, out *half
	from    *Transport // the writer's node, for counting and the partition check
	to      *Transport
	delay   time.Duration

	mu struct {
		sync.Mutex
		readDeadline time.Time
	}
}

// half is one direction of a stream.
type half struct {
	mu     sync.Mutex
	chunks []chunk
	closed bool          // the writer closed: EOF once drained
	gone   bool          // the reader closed: reads fail
	notify chan struct{} // a token on every change
}

type chunk struct {
	b  []byte
	at time.Time // readable from
}

func newHalf() *half { return &half{notify: make(chan struct{}, 1)} }

func (h *half) signal() {
	select {
	case h.notify <- struct{}{}:
	default:
	}
}

// newPipe returns the dialer's end and the acceptor's end of a stream
// between a and b.
func newPipe(a, b *Transport, delay time.Duration) (*pipe, *pipe) {
	ab, ba := newHalf(), newHalf()
	return &pipe{in: ba, out: ab, from: a, to: b, delay: delay},
		&pipe{in: ab, out: ba, from: b, to: a, delay: delay}
}

func (p *pipe) Read(b []byte) (int, error) {
	h := p.in
	for {
		p.mu.Lock()
		deadline := p.mu.readDeadline
		p.mu.Unlock()
		now := time.Now()
		if !deadline.IsZero() && !now.Before(deadline) {
			return 0, os.ErrDeadlineExceeded
		}
		h.mu.Lock()
		if h.gone {
			h.mu.Unlock()
			return 0, net.ErrClosed
		}
		var wait time.Duration = -1
		if len(h.chunks) > 0 {
			c := &h.chunks[0]
			if !now.Before(c.at) {
				n := copy(b, c.b)
				c.b = c.b[n:]
				if len(c.b) == 0 {
					h.chunks[0] = chunk{}
					h.chunks = h.chunks[1:]
				}
				h.mu.Unlock()
				return n, nil
			}
			wait = c.at.Sub(now)
		} else if h.closed {
			h.mu.Unlock()
			return 0, io.EOF
		}
		h.mu.Unlock()
		if !deadline.IsZero() && (wait < 0 || deadline.Sub(now) < wait) {
			wait = deadline.Sub(now)
		}
		if wait < 0 {
			wait = time.Hour
		}
		t := time.NewTimer(wait)
		select {
		case <-h.notify:
		case <-t.C:
		}
		t.Stop()
	}
}

func (p *pipe) Write(b []byte) (int, error) {
	h := p.out
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed || h.gone {
		return 0, net.ErrClosed
	}
	p.from.c.streamBytes.Add(uint64(len(b)))
	p.from.net.mu.Lock()
	up := p.from.net.linkedLocked(p.from.name, p.to.name)
	p.from.net.mu.Unlock()
	if !up {
		return len(b), nil // lost across a cut: the reader times out
	}
	at := time.Now().Add(p.delay)
	if n := len(h.chunks); n > 0 && h.chunks[n-1].at.After(at) {
		at = h.chunks[n-1].at // in order
	}
	h.chunks = append(h.chunks, chunk{b: append([]byte(nil), b...), at: at})
	h.signal()
	return len(b), nil
}

// Close ends both directions at this end: the peer reads EOF once it has
// read what was written, and this end's reads fail.
func (p *pipe) Close() error {
	for _, h := range []*half{p.out, p.in} {
		h.mu.Lock()
		if h == p.out {
			h.closed = true
		} else {
			h.gone = true
		}
		h.mu.Unlock()
		h.signal()
	}
	return nil
}

func (p *pipe) LocalAddr() net.Addr  { return &net.TCPAddr{IP: p.from.addr.IP, Port: p.from.addr.Port} }
func (p *pipe) RemoteAddr() net.Addr { return &net.TCPAddr{IP: p.to.addr.IP, Port: p.to.addr.Port} }

func (p *pipe) SetDeadline(t time.Time) error { return p.SetReadDeadline(t) }

func (p *pipe) SetReadDeadline(t time.Time) error {
	p.mu.Lock()
	p.mu.readDeadline = t
	p.mu.Unlock()
	p.in.signal()
	return nil
}

// SetWriteDeadline is accepted and ignored: writes never block.
func (p *pipe) SetWriteDeadline(time.Time) error { return nil }

var _ net.Conn = (*pipe)(nil)
