package bench

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"time"
)

// A minimal RESP2 client: what the Redis peer needs (SET, GET, PING, INFO),
// one request in flight per connection, values written with one writev and
// read straight into the caller's buffer, so the client costs Redis as
// little as kvmesh's own client costs kvmesh.

// Errors of the RESP client.
var (
	// errRESPProtocol means the server sent bytes that are not a RESP reply
	// this client expects; the connection is out of sync and closed.
	errRESPProtocol = errors.New("bench: resp: protocol error")
	// errRESPNil is a nil bulk reply: GET of a missing key.
	errRESPNil = errors.New("bench: resp: nil reply (missing key)")
)

// respError is an error reply ("-ERR ..."); the connection stays usable.
type respError string

func (e respError) Error() string { return "bench: redis: " + string(e) }

// respConn is one RESP connection, used by one goroutine at a time.
type respConn struct {
	c       net.Conn
	r       *bufio.Reader
	hdr     []byte
	vec     [3][]byte
	maxBulk int
	// err is sticky: after an I/O or protocol error the stream is out of
	// sync and every later call fails with it.
	err         error
	hadDeadline bool
}

var crlf = []byte("\r\n")

// dialRESP connects to the server's unix socket; replies longer than
// maxBulk bytes are refused as protocol errors.
func dialRESP(ctx context.Context, socket string, maxBulk int) (*respConn, error) {
	var d net.Dialer
	c, err := d.DialContext(ctx, "unix", socket)
	if err != nil {
		return nil, err
	}
	return &respConn{c: c, r: bufio.NewReaderSize(c, 64<<10), maxBulk: maxBulk}, nil
}

func (c *respConn) Close() error { return c.c.Close() }

// fail makes err sticky and closes the connection, unless it is an error
// reply, after which the stream is still in sync.
func (c *respConn) fail(err error) error {
	var re respError
	if errors.As(err, &re) || errors.Is(err, errRESPNil) {
		return err
	}
	c.err = err
	c.c.Close()
	return err
}

func (c *respConn) setDeadline(ctx context.Context) {
	if d, ok := ctx.Deadline(); ok {
		c.c.SetDeadline(d)
		c.hadDeadline = true
	} else if c.hadDeadline {
		c.c.SetDeadline(time.Time{})
		c.hadDeadline = false
	}
}

// appendBulk appends s as a RESP bulk string.
func appendBulk(b []byte, s string) []byte {
	b = append(b, '$')
	b = strconv.AppendInt(b, int64(len(s)), 10)
	b = append(b, "\r\n"...)
	b = append(b, s...)
	return append(b, "\r\n"...)
}

// command sends args and, if value is not nil, value as the last argument
// (written from the caller's buffer, not copied), then reads one reply into
// dst.
func (c *respConn) command(ctx context.Context, dst []byte, value []byte, args ...string) (byte, []byte, error) {
	if c.err != nil {
		return 0, dst, c.err
	}
	c.setDeadline(ctx)
	n := len(args)
	if value != nil {
		n++
	}
	h := append(c.hdr[:0], '*')
	h = strconv.AppendInt(h, int64(n), 10)
	h = append(h, "\r\n"...)
	for _, a := range args {
		h = appendBulk(h, a)
	}
	bufs := net.Buffers(c.vec[:0])
	if value != nil {
		h = append(h, '$')
		h = strconv.AppendInt(h, int64(len(value)), 10)
		h = append(h, "\r\n"...)
		bufs = append(bufs, h, value, crlf)
	} else {
		bufs = append(bufs, h)
	}
	c.hdr = h
	if _, err := bufs.WriteTo(c.c); err != nil {
		return 0, dst, c.fail(fmt.Errorf("bench: resp: write: %w", err))
	}
	kind, dst, err := readReply(c.r, dst, c.maxBulk)
	if err != nil {
		return kind, dst, c.fail(err)
	}
	return kind, dst, nil
}

// readReply reads one RESP2 reply that is not an array. For a simple string
// or a bulk string it returns the bytes appended to dst[:0]; for an integer
// its decimal text; an error reply is returned as a respError and a nil bulk
// as errRESPNil. A bulk longer than maxBulk, a malformed line or an array is
// errRESPProtocol: the caller must drop the connection.
func readReply(r *bufio.Reader, dst []byte, maxBulk int) (byte, []byte, error) {
	line, err := r.ReadSlice('\n')
	if err != nil {
		if errors.Is(err, bufio.ErrBufferFull) {
			return 0, dst, fmt.Errorf("%w: reply line longer than %d bytes", errRESPProtocol, r.Size())
		}
		if errors.Is(err, io.EOF) && len(line) > 0 {
			err = io.ErrUnexpectedEOF
		}
		return 0, dst, fmt.Errorf("bench: resp: read: %w", err)
	}
	if len(line) < 3 || line[len(line)-2] != '\r' {
		return 0, dst, fmt.Errorf("%w: line %q does not end in CRLF", errRESPProtocol, line)
	}
	kind, body := line[0], line[1:len(line)-2]
	switch kind {
	case '+', ':':
		return kind, append(dst[:0], body...), nil
	case '-':
		return kind, dst, respError(body)
	case '$':
		n, err := strconv.ParseInt(string(body), 10, 64)
		switch {
		case err != nil:
			return kind, dst, fmt.Errorf("%w: bulk length %q", errRESPProtocol, body)
		case n == -1:
			return kind, dst, errRESPNil
		case n < 0 || n > int64(maxBulk):
			return kind, dst, fmt.Errorf("%w: bulk length %d outside 0..%d", errRESPProtocol, n, maxBulk)
		}
		if int64(cap(dst)) < n+2 {
			dst = make([]byte, n+2)
		}
		dst = dst[:n+2]
		if _, err := io.ReadFull(r, dst); err != nil {
			if errors.Is(err, io.EOF) {
				err = io.ErrUnexpectedEOF
			}
			return kind, dst[:0], fmt.Errorf("bench: resp: read bulk: %w", err)
		}
		if dst[n] != '\r' || dst[n+1] != '\n' {
			return kind, dst[:0], fmt.Errorf("%w: bulk of %d bytes not followed by CRLF", errRESPProtocol, n)
		}
		return kind, dst[:n], nil
	default:
		return kind, dst, fmt.Errorf("%w: unexpected reply type %q", errRESPProtocol, kind)
	}
}
