package transfer_test

import (
	"io"
	"log/slog"
	"path/filepath"
	"runtime"
	"testing"

	"github.com/kvmesh/kvmesh/transfer"
	"github.com/kvmesh/kvmesh/transfer/transporttest"
)

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// TestConformanceTCP runs the transport suite over TCP, with two clients'
// worth of connections and an in-flight budget small enough to bind.
func TestConformanceTCP(t *testing.T) {
	lim := transfer.Limits{MaxBatchBytes: 1 << 20, MaxValueSize: 1 << 20}
	transporttest.Run(t, transporttest.Harness{
		Transport: transfer.TCP{Options: &transfer.ClientOptions{Limits: lim, MaxConns: 3, MaxInFlightBytes: 2 << 20}},
		Serve: func(t *testing.T, st *transporttest.Store) string {
			s, err := transfer.NewServer(st, st, &transfer.ServerOptions{Limits: lim}, quiet)
			if err != nil {
				t.Fatal(err)
			}
			addr, err := s.Listen("127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { s.Close() })
			return addr.String()
		},
	})
}

// TestConformanceShm runs the transport suite over shared memory, with a
// region small enough that requests wait for space.
func TestConformanceShm(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("the shared-memory transport is Linux-only")
	}
	var srv *transfer.ShmServer
	transporttest.Run(t, transporttest.Harness{
		Transport: transfer.Shm{},
		Serve: func(t *testing.T, st *transporttest.Store) string {
			s, err := transfer.NewShmServer(st, st, &transfer.ShmServerOptions{RegionSize: 4 << 20, MaxPending: 4}, quiet)
			if err != nil {
				t.Fatal(err)
			}
			path := filepath.Join(t.TempDir(), "data.sock")
			if err := s.Listen(path); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { s.Close() })
			srv = s
			return path
		},
		Idle: func() bool { return srv.Stats().RegionUse == 0 },
	})
}
