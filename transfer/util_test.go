package transfer

import (
	"bytes"
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/prefixhash"
	"github.com/kvmesh/kvmesh/transfer/internal/pattern"
)

// memSource is an in-memory Source and Sink. Keys in block are held until
// unblock is closed or the request's context ends; entered receives one
// value per blocked Acquire, and ctxDone one per blocked Acquire that ended
// by its context.
type memSource struct {
	mu      sync.Mutex
	vals    map[prefixhash.Key][]byte
	pins    int
	block   map[prefixhash.Key]bool
	unblock chan struct{}
	entered chan struct{}
	ctxDone chan struct{}
}

func newMemSource() *memSource {
	return &memSource{
		vals:    make(map[prefixhash.Key][]byte),
		block:   make(map[prefixhash.Key]bool),
		unblock: make(chan struct{}),
		entered: make(chan struct{}, 100),
		ctxDone: make(chan struct{}, 100),
	}
}

func (m *memSource) set(k prefixhash.Key, v []byte) {
	m.mu.Lock()
	m.vals[k] = v
	m.mu.Unlock()
}

func (m *memSource) setBlock(k prefixhash.Key) {
	m.mu.Lock()
	m.block[k] = true
	m.mu.Unlock()
}

func (m *memSource) get(k prefixhash.Key) ([]byte, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	v, ok := m.vals[k]
	return v, ok
}

func (m *memSource) Acquire(ctx context.Context, keys []prefixhash.Key, vals [][]byte, st []Status) func() {
	m.mu.Lock()
	blocked := false
	for _, k := range keys {
		blocked = blocked || m.block[k]
	}
	m.mu.Unlock()
	if blocked {
		m.entered <- struct{}{}
		select {
		case <-m.unblock:
		case <-ctx.Done():
			m.ctxDone <- struct{}{}
			return nil
		}
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	for i, k := range keys {
		if v, ok := m.vals[k]; ok {
			vals[i], st[i] = v, StatusOK
		}
	}
	m.pins++
	return func() {
		m.mu.Lock()
		m.pins--
		m.mu.Unlock()
	}
}

func (m *memSource) Put(_ context.Context, keys []prefixhash.Key, vals [][]byte, st []Status) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for i, k := range keys {
		m.vals[k] = bytes.Clone(vals[i])
		st[i] = StatusOK
	}
}

func testKey(i int) prefixhash.Key { return pattern.Key(i) }

// testValue returns n bytes that depend on i and n (cheap under the race
// detector).
func testValue(i, n int) []byte { return pattern.Value(i, n) }

// checkResult asserts that r answers keys as src would.
func checkResult(t testing.TB, src *memSource, keys []prefixhash.Key, r *Result) {
	t.Helper()
	if len(r.Status) != len(keys) || len(r.Values) != len(keys) {
		t.Fatalf("result has %d statuses and %d values for %d keys", len(r.Status), len(r.Values), len(keys))
	}
	for i, k := range keys {
		want, ok := src.get(k)
		switch {
		case !ok && r.Status[i] != StatusMiss:
			t.Fatalf("key %d: status %s, want miss", i, r.Status[i])
		case !ok:
			if r.Values[i] != nil {
				t.Fatalf("key %d: missed key has a value", i)
			}
		case r.Status[i] != StatusOK:
			t.Fatalf("key %d: status %s, want ok", i, r.Status[i])
		case r.Values[i] == nil || !bytes.Equal(r.Values[i], want):
			t.Fatalf("key %d: value of %d bytes differs from the %d stored", i, len(r.Values[i]), len(want))
		case len(want) > 0 && uintptrOf(r.Values[i])%valueAlign != 0:
			t.Fatalf("key %d: value not 64-byte aligned", i)
		}
	}
}

// within runs fn and fails the test if it does not return within d: the
// guard that turns a hang into a failure.
func within(t testing.TB, d time.Duration, fn func()) {
	t.Helper()
	done := make(chan struct{})
	go func() {
		defer close(done)
		fn()
	}()
	select {
	case <-done:
	case <-time.After(d):
		panic(fmt.Sprintf("%s: operation still blocked after %v", t.Name(), d))
	}
}
