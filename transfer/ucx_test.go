//go:build ucx && linux && cgo

package transfer_test

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/internal/testkit"
	"github.com/kvmesh/kvmesh/prefixhash"
	"github.com/kvmesh/kvmesh/transfer"
	"github.com/kvmesh/kvmesh/transfer/transporttest"
)

// ucxTransports are the UCX transports the tests run over: what every CI
// machine has. RDMA verbs and CUDA memory have never run here.
var ucxTransports = []string{"tcp", "sm"}

func newUCX(t testing.TB, tls string) *transfer.UCX {
	t.Helper()
	u, err := transfer.NewUCX(&transfer.UCXOptions{TLS: tls})
	if err != nil {
		t.Fatalf("NewUCX(UCX_TLS=%s): %v", tls, err)
	}
	t.Cleanup(func() { u.Close() })
	return u
}

// TestConformanceUCX runs the transport suite over UCX, owner and reader
// being two UCX workers of this process, over each transport.
func TestConformanceUCX(t *testing.T) {
	for _, tls := range ucxTransports {
		t.Run(tls, func(t *testing.T) {
			owner, reader := newUCX(t, tls), newUCX(t, tls)
			lim := transfer.Limits{MaxBatchBytes: 1 << 20, MaxValueSize: 1 << 20}
			rma, err := transfer.NewRMA(reader, &transfer.RMAOptions{LandingBytes: 4 << 20, Logger: quiet, Client: transfer.ClientOptions{Limits: lim, MaxConns: 3}})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { rma.Close() })
			var srv *transfer.Server
			var src *windowSource
			transporttest.Run(t, transporttest.Harness{
				Transport: rma,
				Serve: func(t *testing.T, st *transporttest.Store) string {
					src = newWindowSource(t, st, 16, 512<<10, 1024)
					win, err := transfer.Expose(owner, src.mem)
					if err != nil {
						t.Fatal(err)
					}
					s, err := transfer.NewServer(src, st, &transfer.ServerOptions{Window: win, Limits: lim}, quiet)
					if err != nil {
						t.Fatal(err)
					}
					addr, err := s.Listen("127.0.0.1:0")
					if err != nil {
						t.Fatal(err)
					}
					t.Cleanup(func() {
						s.Close()
						win.Close()
					})
					srv = s
					return addr.String()
				},
				Idle: func() bool {
					held, _ := rma.LandingUse()
					return held == 0 && srv.Stats().Leases == 0 && src.freeSlots() == 16
				},
			})
			if st := rma.Stats(); st.Reads == 0 || st.Failures != 0 {
				t.Errorf("UCX_TLS=%s: %d values read one-sidedly, %d failures; want reads and no failure", tls, st.Reads, st.Failures)
			}
		})
	}
}

// ownerEnv makes the test binary an owner process (ucxOwner) for
// TestUCXOwnerKilledMidGet; its value is UCX_TLS.
const ownerEnv = "KVMESH_TEST_UCX_OWNER"

// ownerValue is value i of the owner process, which its reader checks.
func ownerValue(i int) []byte { return bytes.Repeat([]byte{byte(i), byte(i >> 8), 0x5c, 0xa3}, 1<<18) }

func ownerKey(i int) prefixhash.Key { return prefixhash.Key{0x0c, byte(i), byte(i >> 8)} }

const ownerValues = 48

// ucxOwner serves ownerValues 1 MiB values from a UCX window and prints
// its address, then waits to be killed.
func ucxOwner(t *testing.T, tls string) {
	st := transporttest.NewStore()
	for i := range ownerValues {
		st.Set(ownerKey(i), ownerValue(i))
	}
	src := newWindowSource(t, st, 64, 1<<20, 0)
	win, err := transfer.Expose(newUCX(t, tls), src.mem)
	if err != nil {
		t.Fatal(err)
	}
	srv, err := transfer.NewServer(src, st, &transfer.ServerOptions{Window: win}, quiet)
	if err != nil {
		t.Fatal(err)
	}
	addr, err := srv.Listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	fmt.Printf("OWNER %s\n", addr)
	select {}
}

// TestUCXOwnerKilledMidGet: the owner is killed (SIGKILL) while a large
// get reads from it over UCX: the get ends within its deadline, with an
// error (counted as misses) or with every byte right, never with wrong
// bytes and never hanging.
func TestUCXOwnerKilledMidGet(t *testing.T) {
	if tls := os.Getenv(ownerEnv); tls != "" {
		ucxOwner(t, tls)
		return
	}
	for _, tls := range ucxTransports {
		t.Run(tls, func(t *testing.T) {
			cmd := exec.Command(os.Args[0], "-test.run=^TestUCXOwnerKilledMidGet$", "-test.count=1")
			cmd.Env = append(os.Environ(), ownerEnv+"="+tls)
			cmd.Stderr = os.Stderr
			out, err := cmd.StdoutPipe()
			if err != nil {
				t.Fatal(err)
			}
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			defer cmd.Wait()
			defer cmd.Process.Kill()
			sc := bufio.NewScanner(out)
			addr := ""
			for addr == "" && sc.Scan() {
				addr, _ = strings.CutPrefix(sc.Text(), "OWNER ")
			}
			if addr == "" {
				t.Fatalf("the owner process printed no address (%v)", sc.Err())
			}
			rma, err := transfer.NewRMA(newUCX(t, tls), &transfer.RMAOptions{LandingBytes: 64 << 20, Logger: quiet})
			if err != nil {
				t.Fatal(err)
			}
			defer func() {
				if held, lost := rma.LandingUse(); held == lost {
					rma.Close()
				}
			}()
			c, err := rma.Client(addr)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			keys := make([]prefixhash.Key, ownerValues)
			for i := range keys {
				keys[i] = ownerKey(i)
			}
			check := func(r *transfer.Result) {
				t.Helper()
				for i := range r.Status {
					if r.Status[i] == transfer.StatusOK && !bytes.Equal(r.Values[i], ownerValue(i)) {
						t.Fatalf("value %d: %d wrong bytes", i, len(r.Values[i]))
					}
				}
			}
			r, err := c.Get(context.Background(), keys[:2])
			if err != nil {
				t.Fatal(err)
			}
			check(r)
			r.Release()
			if rma.Stats().Reads != 2 {
				t.Fatalf("stats %+v: the owner's values were not read one-sidedly", rma.Stats())
			}
			type got struct {
				r   *transfer.Result
				err error
			}
			done := make(chan got, 1)
			go func() {
				// Over shared memory UCX cannot tell that the owner died:
				// the deadline ends the get.
				ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
				defer cancel()
				r, err := c.Get(ctx, keys)
				done <- got{r, err}
			}()
			testkit.WaitFor(t, "the reads to start", func() bool { held, _ := rma.LandingUse(); return held > 0 })
			cmd.Process.Kill()
			g := <-done
			if g.err == nil {
				check(g.r) // finished before the kill landed: every byte right
				g.r.Release()
			}
			t.Logf("UCX_TLS=%s: get during the kill: %v; stats %+v", tls, g.err, rma.Stats())
		})
	}
}

// TestUCXStaleWindow: the owner restarted (a new UCX worker, a new
// registration) behind the same address; the reader's endpoint and remote
// key belong to the old one. The next lease answer's epoch tells: the
// reader reads nothing with them, gets over TCP, and reads the new window
// one-sidedly after.
func TestUCXStaleWindow(t *testing.T) {
	for _, tls := range ucxTransports {
		t.Run(tls, func(t *testing.T) {
			st := transporttest.NewStore()
			keys := make([]prefixhash.Key, 4)
			for i := range keys {
				keys[i] = ownerKey(i)
				st.Set(keys[i], ownerValue(i)[:100<<10])
			}
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			relay := newRelay(ln)
			defer relay.close()
			start := func() func() {
				u, err := transfer.NewUCX(&transfer.UCXOptions{TLS: tls})
				if err != nil {
					t.Fatal(err)
				}
				src := newWindowSource(t, st, 8, 512<<10, 1024)
				win, err := transfer.Expose(u, src.mem)
				if err != nil {
					t.Fatal(err)
				}
				srv, err := transfer.NewServer(src, st, &transfer.ServerOptions{Window: win}, quiet)
				if err != nil {
					t.Fatal(err)
				}
				go srv.Serve(relay.listener())
				return func() {
					srv.Close()
					win.Close()
					u.Close()
				}
			}
			stop := start()
			rma, err := transfer.NewRMA(newUCX(t, tls), &transfer.RMAOptions{LandingBytes: 4 << 20, Logger: quiet})
			if err != nil {
				t.Fatal(err)
			}
			defer rma.Close()
			c, err := rma.Client(relay.ln.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			b := &rmaBed{st: st}
			b.checkGet(t, c, keys).Release()
			stop()
			defer start()()
			b.checkGet(t, c, keys).Release()
			b.checkGet(t, c, keys).Release()
			if s := rma.Stats(); s.Stale != 1 || s.Reads != 8 || s.Fallbacks != 4 {
				t.Errorf("stats %+v: want 4 reads, the stale window noticed and read over TCP, 4 reads of the new one", s)
			}
		})
	}
}

// TestUCXMissingLibrary: a ucx build on a host without UCX starts, and
// NewUCX names the library it could not load (the node then reads over
// TCP under --transport auto, and refuses to start under ucx).
func TestUCXMissingLibrary(t *testing.T) {
	_, err := transfer.NewUCX(&transfer.UCXOptions{Library: "libucp-kvmesh-absent.so.0"})
	if !errors.Is(err, transfer.ErrNoFabric) || !strings.Contains(err.Error(), "libucp-kvmesh-absent.so.0") {
		t.Fatalf("NewUCX of a missing library: %v, want ErrNoFabric naming it", err)
	}
}

// TestUCXLeavesSignalsToGo: with UCX loaded, SIGHUP still reaches the Go
// program (the node reloads its certificate and tokens on it; UCX would
// take it as its debug signal).
func TestUCXLeavesSignalsToGo(t *testing.T) {
	newUCX(t, "tcp")
	ch := make(chan os.Signal, 1)
	signal.Notify(ch, syscall.SIGHUP)
	defer signal.Stop(ch)
	if err := syscall.Kill(os.Getpid(), syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	select {
	case <-ch:
	case <-time.After(10 * time.Second):
		t.Fatal("SIGHUP never reached Go with UCX loaded")
	}
}
