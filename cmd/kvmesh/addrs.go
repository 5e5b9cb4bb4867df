package main

import (
	"fmt"
	"net"
	"net/url"
	"strings"
	"time"

	"github.com/kvmesh/kvmesh/internal/probe"
)

// checkHostPort refuses what a flag that wants HOST:PORT cannot dial: a
// URL (http://127.0.0.1:7600, which gRPC would take for a host named
// "http"), or no port.
func checkHostPort(flag, addr string) error {
	if strings.Contains(addr, "://") {
		hp := addr
		if u, err := url.Parse(addr); err == nil && u.Host != "" {
			hp = u.Host
		}
		return fmt.Errorf("%s %q is a URL; it wants HOST:PORT, without a scheme: %s %s", flag, addr, flag, hp)
	}
	if _, _, err := net.SplitHostPort(addr); err != nil {
		return fmt.Errorf("%s %q: want HOST:PORT, such as 127.0.0.1:7600", flag, addr)
	}
	return nil
}

// wrongServer says what answers at addr when a gRPC call to it failed and
// what answers is not a kvmesh node's gRPC API, or "" when it cannot tell.
func wrongServer(addr string, tls bool) string {
	const want = "kvmesh commands want the node's gRPC address (its --grpc-addr, port 7600 by default)"
	switch probe.Addr(addr, time.Second) {
	case probe.HTTP1:
		return fmt.Sprintf("the server at %s speaks HTTP/1, not gRPC: it looks like a node's HTTP port (--http-addr, 7601 by default); %s", addr, want)
	case probe.HTTPS:
		return fmt.Sprintf("the server at %s speaks HTTPS, not gRPC: it looks like a node's HTTP port (--http-addr, 7601 by default); %s", addr, want)
	case probe.Closed:
		if tls {
			return ""
		}
		return fmt.Sprintf("the server at %s closed the connection: if it is a node's gRPC port with TLS, pass --tls-ca CA (or --tls); "+
			"if it is its data-plane (7602) or gossip (7603) port, %s", addr, want)
	}
	return ""
}
