// Package transporttest is the conformance suite every data-plane
// transport passes (memberlist's transport tests): put, get and miss
// through transfer.Transport and transfer.Peer, concurrent Get/Release and
// Put storms, a closed peer, and, through transfer.PartPeer, part reads at
// every TP and PP slice, bad ranges, claims and conflicting parts. The TCP and shared-memory transports run
// it from transfer's tests, so a behaviour one of them gets wrong fails the
// same test the other passes.
//
// It is test support beside transfer (like certtest and transfertest), not
// in internal/testkit: transfer's own tests import testkit, and this
// package imports transfer.
package transporttest

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"sync"
	"testing"

	"github.com/kvmesh/kvmesh/internal/testkit"
	"github.com/kvmesh/kvmesh/prefixhash"
	"github.com/kvmesh/kvmesh/transfer"
)

// Harness is one transport under test.
type Harness struct {
	// Transport dials the server Serve started. Peers it returns are
	// closed by the suite.
	Transport transfer.Transport
	// Serve starts a server over store (its Source and Sink) and returns
	// the address Transport dials; the server stops when the test ends.
	Serve func(t *testing.T, store *Store) string
	// Idle, if set, reports that the server holds nothing for finished
	// requests (the shared-memory region is empty); the suite waits for
	// it after each storm.
	Idle func() bool
}

// Run runs the suite against h.
func Run(t *testing.T, h Harness) {
	t.Run("PutGet", func(t *testing.T) { putGet(t, h) })
	t.Run("Storm", func(t *testing.T) { storm(t, h) })
	t.Run("ClosedPeer", func(t *testing.T) { closedPeer(t, h) })
	t.Run("PartReads", func(t *testing.T) { partReads(t, h) })
	t.Run("BadParts", func(t *testing.T) { badParts(t, h) })
	t.Run("Claims", func(t *testing.T) { claims(t, h) })
}

// sizes are the values the suite moves: empty, small, and over the 64 KiB
// a single frame or region slot is often tuned for.
var sizes = []int{0, 100, 64 << 10, 300 << 10}

func key(i int) prefixhash.Key {
	var k prefixhash.Key
	binary.BigEndian.PutUint64(k[8:], uint64(i)+1)
	k[0] = 0x5e
	return k
}

func value(i, n int) []byte {
	v := make([]byte, n)
	for j := range v {
		v[j] = byte(i*131 + j*7)
	}
	return v
}

func dial(t *testing.T, h Harness, addr string) transfer.Peer {
	t.Helper()
	p, err := h.Transport.Dial(context.Background(), addr)
	if err != nil {
		t.Fatalf("%s: dial %s: %v", h.Transport.Name(), addr, err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

// putGet: what a Put stored, a Get returns byte for byte; a key never put
// is a miss, in any position of a batch.
func putGet(t *testing.T, h Harness) {
	st := NewStore()
	p := dial(t, h, h.Serve(t, st))
	ctx := context.Background()
	var keys []prefixhash.Key
	var vals [][]byte
	for i, n := range sizes {
		keys, vals = append(keys, key(i)), append(vals, value(i, n))
	}
	status, err := p.Put(ctx, keys, vals)
	if err != nil {
		t.Fatalf("Put: %v", err)
	}
	for i, s := range status {
		if s != transfer.StatusOK {
			t.Fatalf("Put of value %d (%d bytes): %v", i, len(vals[i]), s)
		}
	}
	missing := key(1000)
	ask := []prefixhash.Key{missing, keys[0], keys[1], missing, keys[2], keys[3], missing}
	r, err := p.Get(ctx, ask)
	if err != nil {
		t.Fatalf("Get: %v", err)
	}
	defer r.Release()
	if len(r.Status) != len(ask) || len(r.Values) != len(ask) || r.Hits() != len(keys) {
		t.Fatalf("Get of %d keys: %d statuses, %d values, %d hits", len(ask), len(r.Status), len(r.Values), r.Hits())
	}
	for i, k := range ask {
		want, ok := st.Get(k)
		switch {
		case !ok && r.Status[i] != transfer.StatusMiss:
			t.Errorf("key %d, never put: %v, want a miss", i, r.Status[i])
		case ok && (r.Status[i] != transfer.StatusOK || !bytes.Equal(r.Values[i], want)):
			t.Errorf("key %d: %v, %d bytes; want the %d bytes put", i, r.Status[i], len(r.Values[i]), len(want))
		}
	}
}

// storm: goroutines on two peers get, release and put concurrently while
// one result is held throughout; every result is right, and once all are
// released the server holds nothing.
func storm(t *testing.T, h Harness) {
	st := NewStore()
	const nkeys = 48
	keys := make([]prefixhash.Key, nkeys)
	for i := range keys {
		keys[i] = key(i)
		if i%5 != 4 { // every fifth key stays missing
			st.Set(keys[i], value(i, sizes[i%len(sizes)]))
		}
	}
	addr := h.Serve(t, st)
	peers := []transfer.Peer{dial(t, h, addr), dial(t, h, addr)}
	// One result is held through the whole storm: its bytes must not change
	// while others' requests reuse buffers and region space.
	long, err := peers[0].Get(context.Background(), keys[2:3])
	if err != nil {
		t.Fatal(err)
	}
	defer long.Release()
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for g := range 8 {
		wg.Go(func() {
			p := peers[g%len(peers)]
			for it := range 30 {
				lo := (g*7 + it*5) % nkeys
				sub := keys[lo:min(lo+1+it%12, nkeys)]
				if it%4 == 3 {
					if err := rePut(p, st, sub); err != nil {
						errs <- err
						return
					}
					continue
				}
				r, err := p.Get(context.Background(), sub)
				if err != nil {
					errs <- fmt.Errorf("Get: %w", err)
					return
				}
				err = check(st, sub, r)
				r.Release()
				if err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if err := check(st, keys[2:3], long); err != nil {
		t.Fatalf("the result held through the storm: %v", err)
	}
	long.Release()
	if h.Idle != nil {
		testkit.WaitFor(t, h.Transport.Name()+" server to hold nothing once every result is released", h.Idle)
	}
}

// rePut puts again what the store holds of keys: the content never changes,
// so concurrent Gets stay checkable.
func rePut(p transfer.Peer, st *Store, keys []prefixhash.Key) error {
	var pk []prefixhash.Key
	var pv [][]byte
	for _, k := range keys {
		if v, ok := st.Get(k); ok {
			pk, pv = append(pk, k), append(pv, v)
		}
	}
	status, err := p.Put(context.Background(), pk, pv)
	if err != nil {
		return fmt.Errorf("Put: %w", err)
	}
	for i, s := range status {
		if s != transfer.StatusOK {
			return fmt.Errorf("Put of %d bytes: %v", len(pv[i]), s)
		}
	}
	return nil
}

func check(st *Store, keys []prefixhash.Key, r *transfer.Result) error {
	if len(r.Status) != len(keys) {
		return fmt.Errorf("%d statuses for %d keys", len(r.Status), len(keys))
	}
	for i, k := range keys {
		want, ok := st.Get(k)
		if ok != (r.Status[i] == transfer.StatusOK) || ok && !bytes.Equal(r.Values[i], want) {
			return fmt.Errorf("key %v: status %v, %d bytes; stored %v, %d bytes", k, r.Status[i], len(r.Values[i]), ok, len(want))
		}
	}
	return nil
}

// closedPeer: a closed peer refuses requests with an error, not a hang or a
// panic, and a result taken before Close stays readable.
func closedPeer(t *testing.T, h Harness) {
	st := NewStore()
	st.Set(key(0), value(0, 1000))
	p := dial(t, h, h.Serve(t, st))
	r, err := p.Get(context.Background(), []prefixhash.Key{key(0)})
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if want, _ := st.Get(key(0)); r.Status[0] != transfer.StatusOK || !bytes.Equal(r.Values[0], want) {
		t.Fatal("a result taken before Close changed")
	}
	r.Release()
	if _, err := p.Get(context.Background(), []prefixhash.Key{key(0)}); !errors.Is(err, transfer.ErrClosed) {
		t.Fatalf("Get after Close: %v, want ErrClosed", err)
	}
	if _, err := p.Put(context.Background(), []prefixhash.Key{key(1)}, [][]byte{value(1, 10)}); !errors.Is(err, transfer.ErrClosed) {
		t.Fatalf("Put after Close: %v, want ErrClosed", err)
	}
}
