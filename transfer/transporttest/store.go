package transporttest

import (
	"bytes"
	"context"
	"sync"

	"github.com/kvmesh/kvmesh/block"
	"github.com/kvmesh/kvmesh/prefixhash"
	"github.com/kvmesh/kvmesh/transfer"
)

// Store is an in-memory transfer.Source, transfer.Sink and
// transfer.Claimer: the server side of the suite. Values are immutable
// once set, so Acquire pins nothing.
//
// Part records (values that decode as a part of a block, not the whole)
// are kept apart, by key and range, the way the node's store keeps
// incomplete blocks, reduced to what the transports must carry: a part
// put again with other bytes is StatusConflict, and a claim of a range is
// ClaimComplete when the whole block is held, ClaimCovered when that very
// range was put, ClaimClaimed when it was claimed before, and ClaimWrite
// the first time.
type Store struct {
	mu     sync.Mutex
	vals   map[prefixhash.Key][]byte
	parts  map[partKey][]byte
	claims map[partKey]bool
}

type partKey struct {
	key  prefixhash.Key
	part block.Part
}

var (
	_ transfer.Source  = (*Store)(nil)
	_ transfer.Sink    = (*Store)(nil)
	_ transfer.Claimer = (*Store)(nil)
)

// NewStore returns an empty Store.
func NewStore() *Store {
	return &Store{vals: map[prefixhash.Key][]byte{}, parts: map[partKey][]byte{}, claims: map[partKey]bool{}}
}

// Part returns the part record stored for part p of key's block.
func (s *Store) Part(k prefixhash.Key, p block.Part) ([]byte, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	v, ok := s.parts[partKey{k, p}]
	return v, ok
}

// Claim implements transfer.Claimer.
func (s *Store) Claim(_ context.Context, keys []prefixhash.Key, parts []block.Part, st []block.ClaimStatus) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for i, k := range keys {
		pk := partKey{k, parts[i]}
		switch _, whole := s.vals[k]; {
		case whole:
			st[i] = block.ClaimComplete
		case s.parts[pk] != nil:
			st[i] = block.ClaimCovered
		case s.claims[pk]:
			st[i] = block.ClaimClaimed
		default:
			s.claims[pk] = true
		}
	}
}

// Set stores v under k; v must not change afterwards.
func (s *Store) Set(k prefixhash.Key, v []byte) {
	s.mu.Lock()
	s.vals[k] = v
	s.mu.Unlock()
}

// Delete forgets the value under k.
func (s *Store) Delete(k prefixhash.Key) {
	s.mu.Lock()
	delete(s.vals, k)
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
// buffer. A part record is kept as a part (see Store).
func (s *Store) Put(_ context.Context, keys []prefixhash.Key, vals [][]byte, st []transfer.Status) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for i, k := range keys {
		v := append([]byte(nil), vals[i]...)
		st[i] = transfer.StatusOK
		if h, err := block.DecodeHeader(v, 0); err == nil && !h.Whole() {
			pk := partKey{k, h.Part}
			switch old, ok := s.parts[pk]; {
			case ok && !bytes.Equal(old, v):
				st[i] = transfer.StatusConflict
			case !ok:
				s.parts[pk] = v
			}
			continue
		}
		s.vals[k] = v
	}
}
