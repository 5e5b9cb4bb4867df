//go:build linux

package transfer

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/auth"
	"github.com/kvmesh/kvmesh/internal/testkit"
	"github.com/kvmesh/kvmesh/prefixhash"
)

func startShm(t testing.TB, src *memSource, opts *ShmServerOptions) (*ShmServer, string) {
	t.Helper()
	s, err := NewShmServer(src, src, opts, quietLog)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "data.sock")
	if err := s.Listen(path); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s, path
}

func dialShm(t testing.TB, path string, opts *ShmClientOptions) *ShmClient {
	t.Helper()
	c, err := DialShm(context.Background(), path, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func TestShmRoundTrip(t *testing.T) {
	for _, tc := range roundTripCases() {
		t.Run(tc.name, func(t *testing.T) {
			src := newMemSource()
			srv, path := startShm(t, src, &ShmServerOptions{RegionSize: 64 << 20})
			c := dialShm(t, path, &ShmClientOptions{Limits: Limits{MaxItems: 512}})
			keys := fill(src, tc.sizes)
			r, err := c.Get(context.Background(), keys)
			if err != nil {
				t.Fatal(err)
			}
			checkResult(t, src, keys, r)
			r.Release()
			testkit.WaitFor(t, "the region to be released", func() bool { return srv.Stats().RegionUse == 0 })
		})
	}
}

// Released space is reused: many gets through a region that holds one
// answer at a time.
func TestShmReleaseReusesSpace(t *testing.T) {
	src := newMemSource()
	srv, path := startShm(t, src, &ShmServerOptions{RegionSize: 1 << 20})
	keys := fill(src, []int{600 << 10, 300 << 10, 1 << 20})
	c := dialShm(t, path, nil)
	for i := range 30 {
		k := keys[i%len(keys) : i%len(keys)+1]
		r, err := c.Get(context.Background(), k)
		if err != nil {
			t.Fatalf("get %d: %v", i, err)
		}
		checkResult(t, src, k, r)
		r.Release()
	}
	testkit.WaitFor(t, "the region to be released", func() bool { return srv.Stats().RegionUse == 0 })
}

// A get that does not fit next to unreleased results is answered in part,
// then waits for space for the rest, and completes once space is released.
func TestShmSplitAndWait(t *testing.T) {
	src := newMemSource()
	srv, path := startShm(t, src, &ShmServerOptions{RegionSize: 1 << 20})
	keys := fill(src, []int{600 << 10, 300 << 10, 300 << 10})
	c := dialShm(t, path, nil)
	held, err := c.Get(context.Background(), keys[:1])
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		r, err := c.Get(context.Background(), keys[1:])
		if err == nil {
			checkResult(t, src, keys[1:], r)
			r.Release()
		}
		done <- err
	}()
	// The first value fits beside the held one, the second must wait.
	testkit.WaitFor(t, "the partial answer", func() bool { return srv.Stats().RegionUse == (600+300)<<10 })
	held.Release()
	within(t, 10*time.Second, func() {
		if err := <-done; err != nil {
			t.Errorf("get after space was released: %v", err)
		}
	})

	// What can never fit fails within its deadline, holding nothing.
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	big := fill(src, []int{600 << 10, 600 << 10})
	if _, err := c.Get(ctx, big); err == nil {
		t.Fatal("a get larger than the region succeeded")
	}
	testkit.WaitFor(t, "the region to be released", func() bool { return srv.Stats().RegionUse == 0 })
	// A value larger than the region is an error item.
	src.set(testKey(50), make([]byte, 2<<20))
	r, err := c.Get(context.Background(), []prefixhash.Key{testKey(50), keys[1]})
	if err != nil {
		t.Fatal(err)
	}
	if r.Status[0] != StatusError || r.Status[1] != StatusOK {
		t.Fatalf("statuses %v, want [error ok]", r.Status)
	}
	r.Release()
}

// A request abandoned by its caller has its answer released when it
// arrives: the space does not leak.
func TestShmAbandonedRequest(t *testing.T) {
	src := newMemSource()
	srv, path := startShm(t, src, nil)
	keys := fill(src, []int{1000, 2000})
	src.setBlock(keys[1])
	c := dialShm(t, path, nil)
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() {
		_, err := c.Get(ctx, keys)
		errc <- err
	}()
	<-src.entered
	cancel()
	if err := <-errc; !errors.Is(err, context.Canceled) {
		t.Fatalf("canceled get: %v", err)
	}
	close(src.unblock) // the server answers now, to nobody
	testkit.WaitFor(t, "the abandoned answer to be released", func() bool {
		st := srv.Stats()
		return st.Requests == 1 && st.RegionUse == 0
	})
	r, err := c.Get(context.Background(), keys[:1])
	if err != nil {
		t.Fatal(err)
	}
	checkResult(t, src, keys[:1], r)
	r.Release()
}

func TestShmPut(t *testing.T) {
	src := newMemSource()
	_, path := startShm(t, src, nil)
	c := dialShm(t, path, &ShmClientOptions{Limits: Limits{MaxItems: 2}})
	sizes := []int{0, 1, 1 << 20, 65, 64}
	keys := make([]prefixhash.Key, len(sizes))
	vals := make([][]byte, len(sizes))
	for i, n := range sizes {
		keys[i], vals[i] = testKey(i), testValue(i, n)
	}
	st, err := c.Put(context.Background(), keys, vals)
	if err != nil {
		t.Fatal(err)
	}
	for i := range keys {
		if got, _ := src.get(keys[i]); st[i] != StatusOK || !bytes.Equal(got, vals[i]) {
			t.Fatalf("put %d: status %s, stored %d bytes of %d", i, st[i], len(got), len(vals[i]))
		}
	}
}

// Results stay readable after the server goes away (the client's mapping
// is its own); further requests fail cleanly.
func TestShmServerClose(t *testing.T) {
	src := newMemSource()
	srv, path := startShm(t, src, nil)
	keys := fill(src, []int{5000})
	c := dialShm(t, path, nil)
	r, err := c.Get(context.Background(), keys)
	if err != nil {
		t.Fatal(err)
	}
	within(t, 10*time.Second, func() { srv.Close() })
	checkResult(t, src, keys, r)
	within(t, 10*time.Second, func() {
		if _, err := c.Get(context.Background(), keys); err == nil {
			t.Error("get from a closed server succeeded")
		}
	})
	c.Close()
	checkResult(t, src, keys, r) // still mapped: not released yet
	r.Release()
	if _, err := c.Get(context.Background(), keys); !errors.Is(err, ErrClosed) {
		t.Fatalf("get after Close: %v", err)
	}
}

// The client adopts the server's tighter limits from the hello: batches are
// split to fit them instead of being refused.
func TestShmAdoptsServerLimits(t *testing.T) {
	src := newMemSource()
	_, path := startShm(t, src, &ShmServerOptions{Limits: Limits{MaxItems: 10, MaxValueSize: 4096, MaxBatchBytes: 8192}})
	c := dialShm(t, path, nil)
	keys := fill(src, make([]int, 25))
	r, err := c.Get(context.Background(), keys)
	if err != nil || r.Hits() != 25 {
		t.Fatalf("25 keys, server MaxItems 10: %v", err)
	}
	r.Release()
	vals := make([][]byte, 25)
	for i := range vals {
		vals[i] = make([]byte, 3000)
	}
	if _, err := c.Put(context.Background(), keys, vals); err != nil {
		t.Fatalf("put split to the server's MaxBatchBytes: %v", err)
	}
	if _, err := c.Put(context.Background(), keys[:1], [][]byte{make([]byte, 5000)}); !errors.Is(err, ErrLimit) {
		t.Fatalf("put over the server's MaxValueSize: %v", err)
	}
}

func TestShmMaxClients(t *testing.T) {
	src := newMemSource()
	_, path := startShm(t, src, &ShmServerOptions{MaxClients: 1})
	dialShm(t, path, nil)
	if _, err := DialShm(context.Background(), path, nil); err == nil {
		t.Fatal("second client over MaxClients was accepted")
	}
}

// A client process that dies (kill -9) while holding results gives its
// whole region back.
func TestShmClientDeath(t *testing.T) {
	if os.Getenv("KVMESH_SHM_CHILD") != "" {
		shmChild()
		return
	}
	src := newMemSource()
	srv, path := startShm(t, src, nil)
	fill(src, []int{1 << 20, 3 << 20, -1})
	cmd := exec.Command(os.Args[0], "-test.run=^TestShmClientDeath$")
	cmd.Env = append(os.Environ(), "KVMESH_SHM_CHILD="+path)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Wait()
	defer cmd.Process.Kill()
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil || line != "holding\n" {
		t.Fatalf("child said %q, %v", line, err)
	}
	if st := srv.Stats(); st.Conns != 1 || st.RegionUse != 4<<20 {
		t.Fatalf("while the child holds its results: %+v", st)
	}
	cmd.Process.Kill()
	testkit.WaitFor(t, "the dead client's region to be freed", func() bool {
		st := srv.Stats()
		return st.Conns == 0 && st.RegionUse == 0
	})
}

// shmChild gets two values, says so, and waits to be killed.
func shmChild() {
	c, err := DialShm(context.Background(), os.Getenv("KVMESH_SHM_CHILD"), nil)
	if err != nil {
		fmt.Println("dial:", err)
		os.Exit(1)
	}
	r, err := c.Get(context.Background(), []prefixhash.Key{testKey(0), testKey(1), testKey(2)})
	if err != nil || r.Hits() != 2 {
		fmt.Println("get:", err)
		os.Exit(1)
	}
	fmt.Println("holding")
	time.Sleep(time.Hour) // until killed
	r.Release()
}

func TestTransports(t *testing.T) {
	src := newMemSource()
	_, addr := startServer(t, src, nil)
	_, path := startShm(t, src, nil)
	keys := fill(src, []int{100, -1})
	for _, tc := range []struct {
		tr   Transport
		addr string
	}{{TCP{}, addr}, {Shm{}, path}} {
		p, err := tc.tr.Dial(context.Background(), tc.addr)
		if err != nil {
			t.Fatalf("%s: %v", tc.tr.Name(), err)
		}
		r, err := p.Get(context.Background(), keys)
		if err != nil {
			t.Fatalf("%s: %v", tc.tr.Name(), err)
		}
		checkResult(t, src, keys, r)
		r.Release()
		p.Close()
	}
	if p, err := (TCP{Options: &ClientOptions{MaxConns: -1}}).Dial(context.Background(), addr); err == nil || p != nil {
		t.Fatalf("bad options: peer %v, error %v", p, err)
	}
	if p, err := (Shm{}).Dial(context.Background(), path+".missing"); err == nil || p != nil {
		t.Fatalf("missing socket: peer %v, error %v", p, err)
	}
}

// The shared-memory server hands a region only to clients its socket's
// mode, PeerUIDs and Tokens admit; a refused client gets ErrAuth saying why
// and no region.
func TestShmAuth(t *testing.T) {
	tokens, err := auth.NewTokens("tok")
	if err != nil {
		t.Fatal(err)
	}
	src := newMemSource()
	keys := fill(src, []int{100})
	srv, path := startShm(t, src, &ShmServerOptions{Tokens: tokens, PeerUIDs: []uint32{uint32(os.Getuid())}})
	if fi, err := os.Stat(path); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("socket file: %v, %v; want mode 0600", fi.Mode(), err)
	}
	c := dialShm(t, path, &ShmClientOptions{Token: "tok"})
	r, err := c.Get(context.Background(), keys)
	if err != nil {
		t.Fatal(err)
	}
	checkResult(t, src, keys, r)
	r.Release()
	for _, tc := range []struct{ token, says string }{{"bad", "not accepted"}, {"", "sent none"}} {
		within(t, 10*time.Second, func() {
			_, err := DialShm(context.Background(), path, &ShmClientOptions{Token: tc.token, DialTimeout: 5 * time.Second})
			if !errors.Is(err, ErrAuth) || !errors.Is(err, ErrRemote) || !strings.Contains(err.Error(), tc.says) {
				t.Errorf("token %q: %v, want ErrAuth from the server saying %q", tc.token, err, tc.says)
			}
		})
	}

	_, other := startShm(t, src, &ShmServerOptions{PeerUIDs: []uint32{uint32(os.Getuid()) + 1}, SocketMode: 0o660})
	if fi, err := os.Stat(other); err != nil || fi.Mode().Perm() != 0o660 {
		t.Fatalf("socket file: %v, %v; want mode 0660", fi.Mode(), err)
	}
	within(t, 10*time.Second, func() {
		_, err := DialShm(context.Background(), other, &ShmClientOptions{DialTimeout: 5 * time.Second})
		if !errors.Is(err, ErrAuth) || !strings.Contains(err.Error(), fmt.Sprintf("uid %d", os.Getuid())) {
			t.Errorf("uid not in PeerUIDs: %v, want ErrAuth naming the uid", err)
		}
	})
	testkit.WaitFor(t, "the refusals to be counted", func() bool { return srv.Stats().Unauthorized == 2 })
}

func TestShmPutPublish(t *testing.T) {
	p := newPublishSink()
	s, err := NewShmServer(p, p, nil, quietLog)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "data.sock")
	if err := s.Listen(path); err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	c := dialShm(t, path, &ShmClientOptions{Limits: Limits{MaxItems: 2}})
	publishCase(t, p, true, func(keys, chunks []prefixhash.Key, heads, vals [][]byte) ([]Status, error) {
		return c.PutPublish(context.Background(), keys, chunks, heads, vals)
	})
}
