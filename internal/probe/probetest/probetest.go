// Package probetest starts, for tests, one server of each kind package
// probe tells apart, on loopback ports: what a client pointed at the wrong
// port meets.
package probetest

import (
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// Servers are the addresses (host:port) of the servers Start started.
type Servers struct {
	HTTP   string // an HTTP/1 server
	HTTPS  string // an HTTP server over TLS
	GRPC   string // a cleartext gRPC server (health service)
	Hangup string // accepts, then closes at once
	Silent string // accepts, reads, and never answers
}

// NoOne is an address nothing listens on (port 1).
const NoOne = "127.0.0.1:1"

// Start starts the servers; the test's cleanup stops them.
func Start(t testing.TB) Servers {
	t.Helper()
	hs := httptest.NewServer(http.NotFoundHandler())
	t.Cleanup(hs.Close)
	tls := httptest.NewTLSServer(http.NotFoundHandler())
	t.Cleanup(tls.Close)
	gs := grpc.NewServer()
	healthpb.RegisterHealthServer(gs, health.NewServer())
	gl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go gs.Serve(gl)
	t.Cleanup(gs.Stop)
	return Servers{
		HTTP: hs.Listener.Addr().String(), HTTPS: tls.Listener.Addr().String(), GRPC: gl.Addr().String(),
		Hangup: serve(t, func(c net.Conn) {}),
		Silent: serve(t, func(c net.Conn) { io.Copy(io.Discard, c) }), // until the client hangs up
	}
}

// serve runs each connection through f, then closes it.
func serve(t testing.TB, f func(net.Conn)) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				f(c)
				c.Close()
			}()
		}
	}()
	return ln.Addr().String()
}
