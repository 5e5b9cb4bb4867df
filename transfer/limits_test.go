package transfer

import (
	"context"
	"errors"
	"io"
	"net"
	"os"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/internal/testkit"
	"github.com/kvmesh/kvmesh/prefixhash"
)

func (s *byteSem) used() int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.mu.used
}

// heapInuse is the heap in use after two collections (the second frees
// what sync.Pools dropped in the first).
func heapInuse() uint64 {
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapInuse
}

// lookupFrame is a lookup request of n keys, one run each: the most
// scratch a lookup of n keys makes a server allocate.
func lookupFrame(n int) []byte {
	var enc encoder
	tb := enc.begin(typeLookupReq, n)
	for i := range n {
		putLookupEntry(tb, i, testKey(i), i)
	}
	return enc.finish(header{typ: typeLookupReq, id: 1, count: n})
}

// TestIdleLookupConnsHeap: connections that each sent a lookup of
// MaxLookupKeys keys and then sit idle hold no request-sized memory on the
// server: the heap retained by 200 of them is bounded by their read buffers
// (64 KiB each) and a little more. Before the limits, each such connection
// kept its scratch (about 750 KB at 8192 keys, 11 MB at 131072) for its
// life.
func TestIdleLookupConnsHeap(t *testing.T) {
	const conns = 200
	s, addr := startLookupServer(t, lookSource{newMemSource()})
	frame := lookupFrame(DefaultMaxLookupKeys)
	before := heapInuse()
	var ncs []net.Conn
	t.Cleanup(func() {
		for _, nc := range ncs {
			nc.Close()
		}
	})
	resp := make([]byte, headerLen+DefaultMaxLookupKeys*countEntry)
	for range conns {
		nc, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		ncs = append(ncs, nc)
		nc.SetDeadline(time.Now().Add(30 * time.Second))
		if _, err := nc.Write(frame); err != nil {
			t.Fatal(err)
		}
		if _, err := io.ReadFull(nc, resp); err != nil {
			t.Fatalf("lookup answer: %v", err)
		}
		if h, err := parseHeader(resp, &Limits{}); err != nil || h.typ != typeLookupResp || h.count != DefaultMaxLookupKeys {
			t.Fatalf("lookup answer: %v, %s of %d", err, h.typ, h.count)
		}
	}
	// Requests is counted once a connection is back to waiting, idle.
	testkit.WaitFor(t, "every connection idle", func() bool { return s.Stats().Requests == conns })
	after := heapInuse()
	grown := int64(after) - int64(before)
	const perConn = 96 << 10 // the 64 KiB read buffer, the connection's objects, slack
	t.Logf("heap in use: %d KiB before, %d KiB after %d idle connections that each looked up %d keys (%d KiB each)",
		before>>10, after>>10, conns, DefaultMaxLookupKeys, grown/conns>>10)
	if grown > conns*perConn {
		t.Fatalf("%d idle connections retain %d KiB of heap, over the bound of %d KiB (%d KiB each)",
			conns, grown>>10, conns*perConn>>10, perConn>>10)
	}
}

// TestLookupOverLimit: a lookup frame over MaxLookupKeys is refused with
// ErrLimit before its table is read.
func TestLookupOverLimit(t *testing.T) {
	_, addr := startLookupServer(t, lookSource{newMemSource()})
	frame := lookupFrame(DefaultMaxLookupKeys + 1)
	if msg := errorFrame(t, writeRaw(t, addr, frame)); !strings.Contains(msg, "limit is 8192") {
		t.Fatalf("over-limit lookup answered %q", msg)
	}
}

// TestRequestBudget: a request that finds the in-flight budget full waits
// for room until its deadline, then is refused with a message saying so;
// once there is room, requests are served.
func TestRequestBudget(t *testing.T) {
	src := newMemSource()
	src.set(testKey(1), []byte{1})
	// The server gives up waiting before the client does, so the client
	// hears why.
	s, err := NewServer(lookSource{src}, src, &ServerOptions{RequestTimeout: 200 * time.Millisecond}, quietLog)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	ln, err := s.Listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.String()
	c := newClient(t, addr, nil)
	s.inflight.force(s.inflight.size)
	_, err = c.Lookup(context.Background(), [][]prefixhash.Key{{testKey(1)}})
	if !errors.Is(err, ErrRemote) || !strings.Contains(err.Error(), "server busy") {
		t.Fatalf("lookup with the budget full: %v, want a remote 'server busy' error", err)
	}
	s.inflight.release(s.inflight.size)
	got, err := c.Lookup(context.Background(), [][]prefixhash.Key{{testKey(1)}})
	if err != nil || got[0] != 1 {
		t.Fatalf("lookup with room: %v, %v", got, err)
	}
	r, err := c.Get(context.Background(), []prefixhash.Key{testKey(1)})
	if err != nil || r.Hits() != 1 {
		t.Fatalf("get with room: %v", err)
	}
	r.Release()
	testkit.WaitFor(t, "the budget given back", func() bool { return s.inflight.used() == 0 })
}

// TestPartialTablesHoldWhatArrived: requests that declared a large table
// and sent one byte of it hold one piece of the in-flight budget each, not
// what they declared, and give it back when their connection goes.
func TestPartialTablesHoldWhatArrived(t *testing.T) {
	s, addr := startLookupServer(t, lookSource{newMemSource()})
	frame := lookupFrame(DefaultMaxLookupKeys)
	const conns = 10
	var ncs []net.Conn
	for range conns {
		nc, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer nc.Close()
		ncs = append(ncs, nc)
		if _, err := nc.Write(frame[:headerLen+1]); err != nil {
			t.Fatal(err)
		}
	}
	declared := requestCost(&header{typ: typeLookupReq, count: DefaultMaxLookupKeys})
	testkit.WaitFor(t, "a table piece charged per connection", func() bool { return s.inflight.used() == conns*tablePiece })
	t.Logf("%d connections that sent 1 byte of a %d-byte table hold %d KiB (they declared %d KiB)",
		conns, DefaultMaxLookupKeys*lookupEntry, conns*tablePiece>>10, conns*declared>>10)
	for _, nc := range ncs {
		nc.Close()
	}
	testkit.WaitFor(t, "the budget given back", func() bool { return s.inflight.used() == 0 })
}

// silentPuts opens n connections that each send a put declaring 8 values
// of 8 MiB (the whole MaxBatchBytes) and then send nothing.
func silentPuts(t *testing.T, addr string, n int) []net.Conn {
	t.Helper()
	const items, size = 8, 8 << 20
	var enc encoder
	tb := enc.begin(typePutReq, items)
	for i := range items {
		putPutEntry(tb, i, testKey(100+i), size)
	}
	frame := enc.finish(header{typ: typePutReq, id: 1, count: items, payload: items * size})
	var ncs []net.Conn
	t.Cleanup(func() {
		for _, nc := range ncs {
			nc.Close()
		}
	})
	for range n {
		nc, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		ncs = append(ncs, nc)
		if _, err := nc.Write(frame); err != nil {
			t.Fatal(err)
		}
	}
	return ncs
}

// TestSilentPutsDoNotStall: puts that declared their whole MaxBatchBytes and
// then send nothing reserve none of the in-flight budget, so a put from
// another client is served while they wait. Before, each reserved its
// declared 64 MiB for the request timeout, and four of them stalled every
// put.
func TestSilentPutsDoNotStall(t *testing.T) {
	src := newMemSource()
	s, addr := startServer(t, src, &ServerOptions{ReadTimeout: time.Minute})
	silentPuts(t, addr, 8)
	// Each holds its request's charge (table and scratch) and waits for
	// its values.
	charge := requestCost(&header{typ: typePutReq, count: 8})
	testkit.WaitFor(t, "the silent puts waiting for their values", func() bool { return s.inflight.used() == 8*charge })
	c := newClient(t, addr, nil)
	keys := []prefixhash.Key{testKey(1), testKey(2), testKey(3)}
	vals := [][]byte{testValue(1, 1<<20), testValue(2, 3<<20), testValue(3, 5<<20)}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	st, err := c.Put(ctx, keys, vals)
	if err != nil {
		t.Fatalf("put beside 8 silent puts: %v", err)
	}
	for i, x := range st {
		if x != StatusOK {
			t.Fatalf("value %d: %s", i, x)
		}
	}
	r, err := c.Get(ctx, keys)
	if err != nil {
		t.Fatal(err)
	}
	checkResult(t, src, keys, r)
	r.Release()
	// The silent ones still hold only their requests' tables and scratch.
	if used := s.inflight.used(); used != 8*charge {
		t.Fatalf("8 silent puts hold %d bytes of the in-flight budget, want %d", used, 8*charge)
	}
	if st := s.Stats(); st.Conns != 9 || st.Dropped != 0 {
		t.Fatalf("silent puts: %d connections, %d dropped; want 9 and 0", st.Conns, st.Dropped)
	}
}

// TestSilentPutsDropped: a put that stops sending is dropped after
// ReadTimeout, its connection closed and what it reserved given back; so is
// one that sent part of a segment.
func TestSilentPutsDropped(t *testing.T) {
	src := newMemSource()
	s, addr := startServer(t, src, &ServerOptions{ReadTimeout: 200 * time.Millisecond})
	ncs := silentPuts(t, addr, 4)
	if _, err := ncs[0].Write(make([]byte, 3<<20)); err != nil { // 3 MiB of a 4 MiB segment
		t.Fatal(err)
	}
	testkit.WaitFor(t, "the silent puts dropped", func() bool {
		st := s.Stats()
		return st.Dropped == 4 && st.Conns == 0
	})
	if used := s.inflight.used(); used != 0 {
		t.Fatalf("%d bytes of the in-flight budget still held after the silent puts were dropped", used)
	}
	for i, nc := range ncs {
		nc.SetReadDeadline(time.Now().Add(10 * time.Second))
		if _, err := io.ReadAll(nc); err != nil && !strings.Contains(err.Error(), "reset") {
			t.Fatalf("silent put %d: connection not closed by the server: %v", i, err)
		}
	}
	c := newClient(t, addr, nil)
	if st, err := c.Put(context.Background(), []prefixhash.Key{testKey(1)}, [][]byte{testValue(1, 100)}); err != nil || st[0] != StatusOK {
		t.Fatalf("put after the drops: %v %v", st, err)
	}
}

// TestIdleLookupConnsFullSize is the measurement behind BENCHMARKS.md:
// KVMESH_IDLE_CONNS connections (1000) each send one lookup of
// KVMESH_IDLE_KEYS keys (MaxLookupKeys) and stay open; it logs the heap in
// use and the process's RSS before and after. Skipped unless
// KVMESH_IDLE_CONNS is set:
//
//	KVMESH_IDLE_CONNS=1000 go test -run IdleLookupConnsFullSize -v ./transfer
func TestIdleLookupConnsFullSize(t *testing.T) {
	conns, _ := strconv.Atoi(os.Getenv("KVMESH_IDLE_CONNS"))
	if conns == 0 {
		t.Skip("set KVMESH_IDLE_CONNS (and KVMESH_IDLE_KEYS) to measure")
	}
	keys := DefaultMaxLookupKeys
	if k, _ := strconv.Atoi(os.Getenv("KVMESH_IDLE_KEYS")); k > 0 {
		keys = k
	}
	rss := func() int64 {
		b, _ := os.ReadFile("/proc/self/status")
		for l := range strings.Lines(string(b)) {
			if v, ok := strings.CutPrefix(l, "VmRSS:"); ok {
				kb, _ := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
				return kb << 10
			}
		}
		return 0
	}
	lim := Limits{MaxLookupKeys: max(keys, DefaultMaxLookupKeys)}
	s, err := NewServer(lookSource{newMemSource()}, nil, &ServerOptions{Limits: lim, MaxConns: conns + 1}, quietLog)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ln, err := s.Listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	frame := lookupFrame(keys)
	heap0, rss0 := heapInuse(), rss()
	resp := make([]byte, headerLen+keys*countEntry)
	var ncs []net.Conn
	defer func() {
		for _, nc := range ncs {
			nc.Close()
		}
	}()
	for range conns {
		nc, err := net.Dial("tcp", ln.String())
		if err != nil {
			t.Fatal(err)
		}
		ncs = append(ncs, nc)
		if _, err := nc.Write(frame); err != nil {
			t.Fatal(err)
		}
		if _, err := io.ReadFull(nc, resp); err != nil {
			t.Fatalf("lookup answer: %v (%s)", err, resp[headerLen:min(len(resp), headerLen+200)])
		}
	}
	testkit.WaitFor(t, "every connection idle", func() bool { return s.Stats().Requests == int64(conns) })
	heap1, rss1 := heapInuse(), rss()
	t.Logf("%d idle connections after one %d-key lookup each: heap in use %d MiB -> %d MiB, RSS %d MiB -> %d MiB",
		conns, keys, heap0>>20, heap1>>20, rss0>>20, rss1>>20)
}

// discardSink takes every value and keeps none.
type discardSink struct{}

func (discardSink) Put(_ context.Context, _ []prefixhash.Key, vals [][]byte, st []Status) {
	for i := range vals {
		st[i] = StatusOK
	}
}

// BenchmarkTCPPut: Client.Put of 16 MiB batches to a server whose Sink
// drops them, the cost of reading puts a segment at a time:
//
//	go test -run '^$' -bench TCPPut -benchtime 40x -count 5 ./transfer/
func BenchmarkTCPPut(b *testing.B) {
	for _, size := range []struct {
		name string
		n    int
	}{{"64KiB", 64 << 10}, {"1MiB", 1 << 20}, {"4MiB", 4 << 20}} {
		b.Run("size="+size.name, func(b *testing.B) {
			s, err := NewServer(newMemSource(), discardSink{}, nil, quietLog)
			if err != nil {
				b.Fatal(err)
			}
			defer s.Close()
			ln, err := s.Listen("127.0.0.1:0")
			if err != nil {
				b.Fatal(err)
			}
			c, err := NewClient(ln.String(), nil)
			if err != nil {
				b.Fatal(err)
			}
			defer c.Close()
			n := (16 << 20) / size.n
			keys, vals := make([]prefixhash.Key, n), make([][]byte, n)
			for i := range n {
				keys[i], vals[i] = testKey(i), testValue(i, size.n)
			}
			b.SetBytes(16 << 20)
			b.ResetTimer()
			for b.Loop() {
				if _, err := c.Put(context.Background(), keys, vals); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
