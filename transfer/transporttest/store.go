package transporttest

import (
	"context"
	"sync"

	"github.com/kvmesh/kvmesh/prefixhash"
	"github.com/kvmesh/kvmesh/transfer"
)

// Store is an in-memory transfer.Source and transfer.Sink: the server side
// of the suite. Values are immutable once set, so Acquire pins nothing.
type Store struct {
	mu   sync.Mutex
	vals map[prefixhash.Key][]byte
}

var (
	_ transfer.Source = (*Store)(nil)
	_ transfer.Sink   = (*Store)(nil)
)

// NewStore returns an empty Store.
func NewStore() *Store { return &Store{vals: map[prefixhash.Key][]byte{}} }

// Set stores v under k; v must not change afterwards.
func (s *Store) Set(k prefixhash.Key, v []byte) {
	s.mu.Lock()
	s.vals[k] = v
	s.mu.Unlock()
}

// Get returns the value under k.
func (s *Store) Get(k prefixhash.Key) ([]byte, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	v, ok := s.vals[k]
	return v, ok
}

// Acquire implements transfer.Source.
func (s *Store) Acquire(_ context.Context, keys []prefixhash.Key, vals [][]byte, st []transfer.Status) func() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for i, k := range keys {
		if v, ok := s.vals[k]; ok {
			vals[i], st[i] = v, transfer.StatusOK
		}
	}
	return nil
}

// Put implements transfer.Sink: it copies, since vals alias a receive
// buffer.
func (s *Store) Put(_ context.Context, keys []prefixhash.Key, vals [][]byte, st []transfer.Status) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for i, k := range keys {
		s.vals[k] = append([]byte(nil), vals[i]...)
		st[i] = transfer.StatusOK
	}
}
