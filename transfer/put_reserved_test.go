package transfer

import (
	"bytes"
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/internal/testkit"
	"github.com/kvmesh/kvmesh/prefixhash"
)

// memReserver hands out heap slots and commits them into a memSource,
// refusing the keys in refuse (the server must then take the value through
// its Sink) and failing the commits of those in corrupt (StatusError).
type memReserver struct {
	src     *memSource
	refuse  map[prefixhash.Key]bool
	corrupt map[prefixhash.Key]bool

	mu                       sync.Mutex
	reserved, committed, end int
}

type memReservation struct {
	r   *memReserver
	key prefixhash.Key
	buf []byte
}

func (r *memReserver) Reserve(_ context.Context, key, _, _ prefixhash.Key, size int) (Reservation, error) {
	if r.refuse[key] {
		return nil, errors.New("no room")
	}
	r.mu.Lock()
	r.reserved++
	r.mu.Unlock()
	return &memReservation{r: r, key: key, buf: make([]byte, size)}, nil
}

func (m *memReservation) Buf() []byte { return m.buf }

func (m *memReservation) Commit() error {
	m.r.mu.Lock()
	m.r.end++
	m.r.mu.Unlock()
	if m.r.corrupt[m.key] {
		return ErrCorrupt
	}
	m.r.src.set(m.key, m.buf)
	m.r.mu.Lock()
	m.r.committed++
	m.r.mu.Unlock()
	return nil
}

func (m *memReservation) Abort() {
	m.r.mu.Lock()
	m.r.end++
	m.r.mu.Unlock()
}

// TestPutReserved: with a Reserver, a TCP put's values are read into the
// reserved room and committed; a value whose room is refused goes through
// the Sink instead, a commit that fails is that item's error, and every
// reservation ends.
func TestPutReserved(t *testing.T) {
	src := newMemSource()
	sizes := []int{0, 1, 63, 64, 65, 4 << 10, 1 << 20, 3<<20 + 7}
	keys := make([]prefixhash.Key, len(sizes))
	vals := make([][]byte, len(sizes))
	for i, n := range sizes {
		keys[i], vals[i] = testKey(i), testValue(i, n)
	}
	res := &memReserver{src: src, refuse: map[prefixhash.Key]bool{keys[2]: true, keys[6]: true}, corrupt: map[prefixhash.Key]bool{keys[5]: true}}
	_, addr := startServer(t, src, &ServerOptions{Reserver: res})
	c := newClient(t, addr, nil)
	st, err := c.Put(context.Background(), keys, vals)
	if err != nil {
		t.Fatal(err)
	}
	for i, k := range keys {
		want := StatusOK
		if i == 5 {
			want = StatusError
		}
		if st[i] != want {
			t.Fatalf("value %d (%d bytes): status %s, want %s", i, sizes[i], st[i], want)
		}
		if got, ok := src.get(k); want == StatusOK && (!ok || !bytes.Equal(got, vals[i])) {
			t.Fatalf("value %d (%d bytes) stored wrong", i, sizes[i])
		}
	}
	res.mu.Lock()
	defer res.mu.Unlock()
	// Reserved: every non-empty value but the two refused.
	if res.reserved != 5 || res.committed != 4 || res.end != res.reserved {
		t.Fatalf("%d reserved, %d committed, %d ended", res.reserved, res.committed, res.end)
	}
	// The connection still serves.
	r, err := c.Get(context.Background(), keys)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Release()
	if r.Status[6] != StatusOK || !bytes.Equal(r.Values[6], vals[6]) {
		t.Fatal("a value that went through the Sink reads back wrong")
	}
}

// TestPutReservedAbandoned: a put that stops sending halfway through a
// value read into reserved room is dropped after ReadTimeout, and its
// reservation ends uncommitted: nothing reserved is left behind.
func TestPutReservedAbandoned(t *testing.T) {
	src := newMemSource()
	res := &memReserver{src: src}
	s, addr := startServer(t, src, &ServerOptions{ReadTimeout: 200 * time.Millisecond, Reserver: res})
	ncs := silentPuts(t, addr, 1)
	if _, err := ncs[0].Write(make([]byte, 3<<20)); err != nil {
		t.Fatal(err)
	}
	testkit.WaitFor(t, "the abandoned put dropped", func() bool { return s.Stats().Dropped == 1 })
	res.mu.Lock()
	defer res.mu.Unlock()
	if res.reserved != 1 || res.end != 1 || res.committed != 0 {
		t.Fatalf("%d reserved, %d ended, %d committed; want 1, 1, 0", res.reserved, res.end, res.committed)
	}
}
