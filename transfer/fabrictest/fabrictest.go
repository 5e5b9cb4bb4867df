// Package fabrictest is an in-process transfer.Fabric for tests of the
// one-sided path (transfer.RMA, the lease protocol, the node's wiring)
// in builds without UCX: a read copies from the registered memory of the
// same process, and a test can hold reads, fail connections and make the
// owner vanish. It is test support beside transfer (like certtest): the
// node and the client do not link it.
package fabrictest

import (
	"encoding/binary"
	"errors"
	"fmt"
	"sync"

	"github.com/kvmesh/kvmesh/transfer"
)

// Mem is the fabric. Every Mem of the process shares one table of
// registered regions, so that an owner's Mem and a reader's Mem reach each
// other as two processes' fabrics would.
type Mem struct {
	name string

	mu struct {
		sync.Mutex
		transports []string
		connectErr error
		held       chan struct{} // non-nil: reads wait for it to close
		waiting    int           // reads waiting on held
		reads      int           // spans read
	}
	wg sync.WaitGroup // reads in flight
}

var regions struct {
	sync.Mutex
	m    map[uint64][]byte
	next uint64
}

// New returns a Mem named name ("ucx", so that it stands in for UCX).
func New(name string) *Mem { return &Mem{name: name} }

var _ transfer.Fabric = (*Mem)(nil)

// Name returns the name given to New.
func (m *Mem) Name() string { return m.name }

// SetTransports sets what Remote.Transports reports ("tcp/lo" makes a
// TCP-only fabric).
func (m *Mem) SetTransports(t []string) {
	m.mu.Lock()
	m.mu.transports = t
	m.mu.Unlock()
}

// FailConnect makes Connect fail with err (nil: connect again).
func (m *Mem) FailConnect(err error) {
	m.mu.Lock()
	m.mu.connectErr = err
	m.mu.Unlock()
}

// Hold makes reads started from now on wait until release is called or
// their Remote is closed.
func (m *Mem) Hold() (release func()) {
	ch := make(chan struct{})
	m.mu.Lock()
	m.mu.held = ch
	m.mu.Unlock()
	var once sync.Once
	return func() {
		once.Do(func() {
			m.mu.Lock()
			if m.mu.held == ch {
				m.mu.held = nil
			}
			m.mu.Unlock()
			close(ch)
		})
	}
}

// Waiting returns how many reads wait on Hold.
func (m *Mem) Waiting() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.mu.waiting
}

// Reads returns how many spans were read.
func (m *Mem) Reads() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.mu.reads
}

// Wait waits for every read in flight to end.
func (m *Mem) Wait() { m.wg.Wait() }

type region struct{ id uint64 }

// Register records mem under a new id, its descriptor.
func (m *Mem) Register(mem []byte) (transfer.Region, error) {
	regions.Lock()
	defer regions.Unlock()
	if regions.m == nil {
		regions.m = map[uint64][]byte{}
	}
	regions.next++
	regions.m[regions.next] = mem
	return &region{id: regions.next}, nil
}

func (r *region) Descriptor() []byte { return binary.LittleEndian.AppendUint64(nil, r.id) }

// Close forgets the region: reads of it fail from now on (its owner is
// gone).
func (r *region) Close() error {
	regions.Lock()
	delete(regions.m, r.id)
	regions.Unlock()
	return nil
}

type remote struct {
	m      *Mem
	id     uint64
	once   sync.Once
	closed chan struct{}
}

// Connect reaches the region desc names.
func (m *Mem) Connect(desc []byte) (transfer.Remote, error) {
	m.mu.Lock()
	err := m.mu.connectErr
	m.mu.Unlock()
	if err != nil {
		return nil, err
	}
	if len(desc) != 8 {
		return nil, fmt.Errorf("%w: fabrictest descriptor of %d bytes", transfer.ErrCorrupt, len(desc))
	}
	id := binary.LittleEndian.Uint64(desc)
	regions.Lock()
	_, ok := regions.m[id]
	regions.Unlock()
	if !ok {
		return nil, fmt.Errorf("fabrictest: region %d is not registered (its owner is gone)", id)
	}
	return &remote{m: m, id: id, closed: make(chan struct{})}, nil
}

func (r *remote) Transports() []string {
	r.m.mu.Lock()
	defer r.m.mu.Unlock()
	return r.m.mu.transports
}

func (r *remote) Close() error {
	r.once.Do(func() { close(r.closed) })
	return nil
}

var errClosed = errors.New("fabrictest: remote closed")

// Read copies the spans on a goroutine of the fabric's, after Hold's
// release when reads are held.
func (r *remote) Read(_ transfer.Region, spans []transfer.Span, done func(error)) error {
	select {
	case <-r.closed:
		return errClosed
	default:
	}
	m := r.m
	m.mu.Lock()
	held := m.mu.held
	if held != nil {
		m.mu.waiting++
	}
	m.mu.Unlock()
	m.wg.Add(1)
	go func() {
		defer m.wg.Done()
		if held != nil {
			select {
			case <-held:
			case <-r.closed:
			}
			m.mu.Lock()
			m.mu.waiting--
			m.mu.Unlock()
		}
		done(r.copy(spans))
	}()
	return nil
}

func (r *remote) copy(spans []transfer.Span) error {
	select {
	case <-r.closed:
		return errClosed
	default:
	}
	regions.Lock()
	defer regions.Unlock()
	mem, ok := regions.m[r.id]
	if !ok {
		return fmt.Errorf("fabrictest: region %d is gone", r.id)
	}
	for _, s := range spans {
		if s.Off > uint64(len(mem)) || uint64(len(s.Dst)) > uint64(len(mem))-s.Off {
			return fmt.Errorf("fabrictest: read of [%d, +%d) outside a %d-byte region", s.Off, len(s.Dst), len(mem))
		}
		copy(s.Dst, mem[s.Off:])
	}
	r.m.mu.Lock()
	r.m.mu.reads += len(spans)
	r.m.mu.Unlock()
	return nil
}
