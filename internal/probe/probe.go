// Package probe tells what protocol a TCP address answers in, so that an
// error can say what is wrong ("that is the node's HTTP port, not its gRPC
// one") instead of what a library saw ("http2: frame too large", "invalid
// msgType (0)"). It is for error paths: it costs a connection and up to
// its timeout.
package probe

import (
	"bytes"
	"io"
	"net"
	"time"
)

// Protocol is what an address answered in.
type Protocol int

// What Addr finds.
const (
	// Unknown: no connection (nothing listens, or the timeout passed
	// before it connected), or an answer it does not recognise.
	Unknown Protocol = iota
	// GRPC: a cleartext HTTP/2 server, which speaks first (its SETTINGS
	// frame): a gRPC port.
	GRPC
	// HTTP1: an HTTP/1 server (a node's HTTP port).
	HTTP1
	// HTTPS: an HTTP server over TLS, which answered a cleartext request
	// with its complaint about it.
	HTTPS
	// Closed: it closed the connection on a cleartext request it did not
	// understand: a TLS server (a gRPC port with TLS), a gossip port
	// (memberlist) or a data-plane port.
	Closed
	// Silent: it accepted the connection and said nothing within the
	// timeout.
	Silent
)

func (p Protocol) String() string {
	return [...]string{"unknown", "gRPC", "HTTP/1", "HTTPS", "closed", "silent"}[p]
}

// Addr connects to addr and tells what it answers in, within about
// timeout.
func Addr(addr string, timeout time.Duration) Protocol {
	c, err := net.DialTimeout("tcp", addr, timeout)
	if err != nil {
		return Unknown
	}
	defer c.Close()
	buf := make([]byte, 64)
	// An HTTP/2 server writes its SETTINGS frame first: 9 bytes of
	// header, type 0x4 in the fourth.
	_ = c.SetReadDeadline(time.Now().Add(timeout / 2))
	if n, _ := io.ReadAtLeast(c, buf, 9); n >= 9 && buf[3] == 0x4 {
		return GRPC
	}
	_ = c.SetDeadline(time.Now().Add(timeout / 2))
	if _, err := c.Write([]byte("HEAD / HTTP/1.0\r\n\r\n")); err != nil {
		return Closed
	}
	// Up to 256 bytes, or what comes before the server closes or the
	// timeout passes.
	buf = make([]byte, 256)
	n, err := io.ReadFull(c, buf)
	switch {
	case n >= 5 && bytes.HasPrefix(buf, []byte("HTTP/")):
		// Go's HTTPS server answers a cleartext request in cleartext,
		// saying so.
		if bytes.Contains(buf[:n], []byte("HTTPS")) {
			return HTTPS
		}
		return HTTP1
	case n == 0 && isTimeout(err):
		return Silent
	case n == 0:
		return Closed
	}
	return Unknown
}

func isTimeout(err error) bool {
	ne, ok := err.(net.Error)
	return ok && ne.Timeout()
}

// NotGossip says what a join seed is when it answers as something other
// than a gossip port ("gRPC: it looks like a node's --grpc-addr"), or ""
// when it does not, or cannot tell: call it once a join found no member.
func NotGossip(seed string) string {
	switch Addr(seed, time.Second) {
	case GRPC:
		return "gRPC: it looks like a node's --grpc-addr"
	case HTTP1, HTTPS:
		return "HTTP: it looks like a node's --http-addr, or a router's"
	}
	return ""
}
