package node

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync/atomic"

	"github.com/kvmesh/kvmesh/auth"
	"github.com/kvmesh/kvmesh/block"
	"github.com/kvmesh/kvmesh/prefixhash"
	"github.com/kvmesh/kvmesh/store"
	"github.com/kvmesh/kvmesh/transfer"
)

// The data plane serves this node's own tiers, never the cluster: a peer
// asks the owner it chose, and an owner that fanned out again could loop.
// Clients read the cluster through BatchGet for what their node lacks.

// localSource serves data-plane gets from store.Local: the values are the
// pinned blocks GetMany returns, released when the server has sent them.
type localSource struct{ l *store.Local }

var (
	_ transfer.Source = localSource{}
	_ transfer.Looker = localSource{}
)

// Lookup counts the leading keys of each run held here (peers' lookups).
func (s localSource) Lookup(ctx context.Context, runs [][]prefixhash.Key, counts []int) {
	for i, r := range runs {
		if ctx.Err() != nil {
			return
		}
		counts[i] = s.l.LongestPrefix(auth.AccessFrom(ctx), r)
	}
}

func (s localSource) Acquire(ctx context.Context, keys []prefixhash.Key, vals [][]byte, st []transfer.Status) func() {
	refs, err := s.l.GetMany(ctx, keys)
	if err != nil {
		return nil // every key a miss: closed, or the request was abandoned
	}
	for i, r := range refs {
		if r != nil {
			vals[i], st[i] = r.Bytes(), transfer.StatusOK
		}
	}
	return func() {
		for _, r := range refs {
			r.Release() // nil-safe
		}
	}
}

// localSink stores blocks pushed over the data plane (by peers: pushes and
// handoffs; by clients: puts and publish requests) in store.Local. Each
// value must be a block whose key is the key it was sent under; Local.Put
// verifies the rest (checksums, layout) before storing it. A client's
// publish request also queues what was stored for its owners, as the gRPC
// Publish does; a peer's put never is (that could loop).
type localSink struct {
	l        *store.Local
	maxBlock int
	refused  *atomic.Int64                  // values that were not the block they claimed to be
	cluster  *atomic.Pointer[store.Cluster] // publishes; nil until the cluster started
}

var (
	_ transfer.Publisher = localSink{}
	_ transfer.Claimer   = localSink{}
)

// Claim answers a rank's question whether a part still needs sending
// (store.Local.Claim). A claim the store cannot answer (a bad range, an
// error) is left ClaimWrite: the put that follows gets the verdict.
func (s localSink) Claim(ctx context.Context, keys []prefixhash.Key, parts []block.Part, st []block.ClaimStatus) {
	for i, k := range keys {
		if ctx.Err() != nil {
			return
		}
		if cs, err := s.l.Claim(ctx, k, parts[i]); err == nil {
			st[i] = cs
		}
	}
}

// PutPublish stores the blocks as Put does, then queues those it stored for
// the owners of their chunks (store.Cluster.Publish). When they cannot be
// queued (the cluster is not started yet, or is closing), the stored blocks
// are reported as misses: the client then sends them through BatchPut,
// which stores (a no-op now) and queues them.
func (s localSink) PutPublish(ctx context.Context, keys, chunkKeys []prefixhash.Key, vals [][]byte, st []transfer.Status) {
	// A block another node owns is the producer's copy (store.EvictDedup).
	var copyOf func(i int) bool
	if c := s.cluster.Load(); c != nil {
		copyOf = func(i int) bool { return !c.Owns(chunkKeys[i]) }
	}
	s.put(ctx, keys, vals, st, copyOf)
	pv, pc := vals, chunkKeys // usually every block was stored
	if slices.ContainsFunc(st, func(x transfer.Status) bool { return x != transfer.StatusOK }) {
		pv, pc = nil, nil
		for i := range keys {
			if st[i] == transfer.StatusOK {
				pv, pc = append(pv, vals[i]), append(pc, chunkKeys[i])
			}
		}
		if len(pv) == 0 {
			return
		}
	}
	if c := s.cluster.Load(); c != nil {
		// From the bytes put: a copy may be gone from the store already.
		if _, err := c.PublishBlocks(pv, pc); err == nil {
			return
		}
	}
	for i := range st {
		if st[i] == transfer.StatusOK {
			st[i] = transfer.StatusMiss
		}
	}
}

func (s localSink) Put(ctx context.Context, keys []prefixhash.Key, vals [][]byte, st []transfer.Status) {
	s.put(ctx, keys, vals, st, nil)
}

// put stores vals; those copyOf names (when it is not nil) as copies
// (store.Local.PutCopy).
func (s localSink) put(ctx context.Context, keys []prefixhash.Key, vals [][]byte, st []transfer.Status, copyOf func(i int) bool) {
	for i, v := range vals {
		if ctx.Err() != nil {
			return // the rest stay StatusMiss
		}
		h, err := block.DecodeHeader(v, s.maxBlock)
		if err != nil || h.Key != keys[i] {
			s.refused.Add(1)
			st[i] = transfer.StatusError
			continue
		}
		put := s.l.Put
		if copyOf != nil && copyOf(i) {
			put = s.l.PutCopy
		}
		switch err := put(ctx, v); {
		case err == nil:
			st[i] = transfer.StatusOK
		case errors.Is(err, store.ErrPartConflict):
			// A part whose bytes differ from the parts it overlaps
			// (counted by the store).
			st[i] = transfer.StatusConflict
		case errors.Is(err, block.ErrCorrupt), errors.Is(err, block.ErrTooLarge), errors.Is(err, block.ErrBadPart), errors.Is(err, store.ErrLayout), errors.Is(err, store.ErrTenant):
			s.refused.Add(1)
			st[i] = transfer.StatusError
		default:
			// No room (full, over a quota), closing, or given up: the
			// block is dropped, which is no fault of the sender's.
			st[i] = transfer.StatusMiss
		}
	}
}

// localReserver serves the shared-memory data plane's reserve and commit
// requests from store.Local: the DRAM arena it shares and slots reserved in
// it. A publish (a chunk key given) is handled as localSink.PutPublish
// handles one: a block another node owns is committed as a copy, and the
// block is queued for its owners from its bytes.
type localReserver struct {
	l       *store.Local
	cluster *atomic.Pointer[store.Cluster] // publishes; nil until the cluster started
}

var (
	_ transfer.Reserver = localReserver{}
	_ transfer.Arena    = localReserver{}
)

func (r localReserver) Arena() ([]byte, int) { return r.l.Arena() }

func (r localReserver) Reserve(ctx context.Context, key, parent, chunk prefixhash.Key, size int) (transfer.Reservation, error) {
	res, err := r.l.Reserve(ctx, key, parent, size)
	if err != nil {
		if errors.Is(err, block.ErrTooLarge) {
			return nil, fmt.Errorf("%w: %w", transfer.ErrLimit, err)
		}
		return nil, err
	}
	return reservation{Reservation: res, chunk: chunk, cluster: r.cluster}, nil
}

// errNotPublished: a publish that cannot be queued (the cluster is not
// started) is not stored either, so that the client sends it through
// BatchPut, which publishes.
var errNotPublished = errors.New("node: the cluster is not started: nothing to publish with")

// reservation adapts store.Reservation: a block that fails verification is
// the client's fault (transfer.ErrCorrupt, StatusError), not a miss.
type reservation struct {
	*store.Reservation
	chunk   prefixhash.Key // zero: a put, not a publish
	cluster *atomic.Pointer[store.Cluster]
}

func (r reservation) Commit() error {
	commit := r.Reservation.Commit
	if !r.chunk.IsZero() {
		c := r.cluster.Load()
		if c == nil {
			r.Abort()
			return errNotPublished
		}
		if !c.Owns(r.chunk) {
			commit = r.Reservation.CommitCopy
		}
		// Queued (copied) from the slot before the commit hands it to the
		// index: a copy may be evicted, its slot reused, at once. A block
		// that then fails verification was queued in vain; its owners
		// verify every push and refuse it.
		if _, err := c.PublishBlocks([][]byte{r.Buf()}, []prefixhash.Key{r.chunk}); err != nil {
			r.Abort()
			return err
		}
	}
	err := commit()
	if errors.Is(err, store.ErrPartConflict) {
		return fmt.Errorf("%w: %w", transfer.ErrConflict, err)
	}
	if errors.Is(err, block.ErrCorrupt) || errors.Is(err, store.ErrLayout) || errors.Is(err, store.ErrTenant) {
		return fmt.Errorf("%w: %w", transfer.ErrCorrupt, err)
	}
	return err
}
