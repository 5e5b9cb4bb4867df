package probe_test

import (
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/internal/probe"
	"github.com/kvmesh/kvmesh/internal/probe/probetest"
)

func TestAddr(t *testing.T) {
	s := probetest.Start(t)
	for _, tc := range []struct {
		name, addr string
		want       probe.Protocol
	}{
		{"HTTP/1 server", s.HTTP, probe.HTTP1},
		{"HTTPS server", s.HTTPS, probe.HTTPS},
		{"gRPC server", s.GRPC, probe.GRPC},
		{"hangs up", s.Hangup, probe.Closed},
		{"says nothing", s.Silent, probe.Silent},
		{"nothing listens", probetest.NoOne, probe.Unknown},
	} {
		if got := probe.Addr(tc.addr, 400*time.Millisecond); got != tc.want {
			t.Errorf("%s: %v, want %v", tc.name, got, tc.want)
		}
	}
	if what := probe.NotGossip(s.GRPC); what == "" {
		t.Error("a gRPC port passed for a gossip seed")
	}
	if what := probe.NotGossip(s.Hangup); what != "" {
		t.Errorf("a port that hangs up (a gossip port does) called %q", what)
	}
}
