package store

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"

	"github.com/kvmesh/kvmesh/block"
	"github.com/kvmesh/kvmesh/prefixhash"
	"github.com/kvmesh/kvmesh/tiers"
)

// Reservation errors.
var (
	// ErrReservation: Commit of a reservation that was aborted, committed
	// already, or whose context ended first (its slot is freed).
	ErrReservation = errors.New("store: reservation is not open")
	// ErrNoReserve: the memory tier cannot hand out a slot before its
	// value exists (it is not a tiers.Reserver); use Put.
	ErrNoReserve = errors.New("store: the memory tier does not take reservations")
)

// A Reservation is a slot of the memory tier taken for one block before the
// block exists, so that its bytes are received or written straight into the
// slot (a socket read, or a same-host client writing through its mapping of
// the arena) and stored without a copy. It is open until Commit or Abort, or
// until the context given to Reserve ends, which aborts it: an abandoned
// reservation never holds memory past its context. While open, the slot is
// in no index: no reader sees it and eviction does not touch it.
//
// Commit verifies the bytes as Put verifies a block (header, key, parent,
// length, payload checksum, tenant, layout) and indexes the slot in place:
// the block becomes visible all at once, or, when it fails, the slot is
// freed and the key stays absent. Commit and Abort may race with the
// context's end; exactly one of them acts.
type Reservation struct {
	l           *Local
	ctx         context.Context // Reserve's: its access and deadline
	key, parent prefixhash.Key
	loc         tiers.Loc
	buf         []byte
	// state: resOpen, then resDone once Commit, Abort or the context's
	// end took it.
	state atomic.Int32
	stop  func() bool // unregisters the context's abort
	// sealed: buf is an incomplete block just sealed (block.Seal) from
	// verified parts, its checksum computed over these very bytes; put
	// does not hash it again.
	sealed bool
}

const (
	resOpen int32 = iota
	resDone
)

// Reserve takes room in the memory tier for the size-byte encoded block of
// key, child of parent, making room as Put does (a first block's parent is
// its namespace's root key; zero means unknown: a data plane that moves
// opaque bytes does not know it, and Commit then takes the header's).
// The reservation ends with ctx: give it the deadline by which the bytes
// must arrive. ctx's access (auth.WithAccess) is what Commit checks the
// block's tenant against. Errors: block.ErrTooLarge (size is over
// MaxBlockBytes or fits no slot), ErrNoReserve, ErrFull, ErrClosed, ctx's.
func (l *Local) Reserve(ctx context.Context, key, parent prefixhash.Key, size int) (*Reservation, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	rs, ok := l.mem.(tiers.Reserver)
	if !ok {
		return nil, ErrNoReserve
	}
	if size <= 0 || size > l.opts.MaxBlockBytes {
		return nil, fmt.Errorf("%w: a reservation of %d bytes (MaxBlockBytes %d)", block.ErrTooLarge, size, l.opts.MaxBlockBytes)
	}
	class := l.classOf(size)
	if class < 0 {
		return nil, fmt.Errorf("%w: a block of %d bytes fits no slot of %s", block.ErrTooLarge, size, l.mem.Name())
	}
	l.mu.Lock()
	if !l.enterLocked() {
		l.mu.Unlock()
		return nil, ErrClosed
	}
	indexFull := l.indexFullLocked()
	l.mu.Unlock()
	defer l.exit()
	// Room in the index first, as Put makes it: making room in memory
	// first would demote the blocks that room in the index then drops,
	// a write to NVMe for nothing, and leave memory without a block to
	// drop (Commit makes index room again if reservations raced).
	if indexFull {
		if err := l.makeIndexRoom(ctx); err != nil {
			return nil, err
		}
	}
	loc, buf, err := l.reserveSlot(ctx, rs, key, parent, size, class)
	if err != nil {
		return nil, err
	}
	r := &Reservation{l: l, ctx: ctx, key: key, parent: parent, loc: loc, buf: buf}
	l.mu.Lock()
	l.mu.reservations++
	l.mu.Unlock()
	r.stop = context.AfterFunc(ctx, func() { r.end(true) })
	return r, nil
}

// Buf returns the slot: exactly the reserved size, to be filled with the
// encoded block before Commit. It belongs to the reservation's holder until
// Commit or Abort (or the context's end); it must not be used after.
func (r *Reservation) Buf() []byte { return r.buf }

// Key returns the key the reservation was taken for.
func (r *Reservation) Key() prefixhash.Key { return r.key }

// Commit stores the block written into Buf, or fails and frees the slot
// (the key stays absent). Errors are Put's, and ErrReservation when the
// reservation is no longer open. A block whose key, parent or length is not
// the reserved one is block.ErrCorrupt.
func (r *Reservation) Commit() error { return r.commit(false) }

// CommitCopy is Commit for a block this node keeps although placement gives
// it to another node, as PutCopy is Put's.
func (r *Reservation) CommitCopy() error { return r.commit(true) }

func (r *Reservation) commit(asCopy bool) error {
	if !r.state.CompareAndSwap(resOpen, resDone) {
		return ErrReservation
	}
	r.stop()
	l := r.l
	l.mu.Lock()
	l.mu.reservations--
	l.mu.Unlock()
	h, err := block.DecodeHeader(r.buf, l.opts.MaxBlockBytes)
	switch {
	case err != nil:
	case h.Key != r.key || !r.parent.IsZero() && h.Parent != r.parent:
		err = fmt.Errorf("%w: reserved for %s (parent %s), the bytes are %s (parent %s)", block.ErrCorrupt, r.key, r.parent, h.Key, h.Parent)
	}
	if err != nil {
		l.freeAll([]freeLoc{{false, r.loc}})
		l.countCorruptCommit()
		return err
	}
	err = l.put(r.ctx, r.buf, asCopy && l.opts.Eviction.keepsCopies(), r)
	if errors.Is(err, block.ErrCorrupt) {
		l.countCorruptCommit()
	}
	return err
}

// reserveSlot takes a size-byte slot of the memory tier for key, making
// room as a write would; the caller holds an operation (enterLocked).
func (l *Local) reserveSlot(ctx context.Context, rs tiers.Reserver, key, parent prefixhash.Key, size, class int) (tiers.Loc, []byte, error) {
	var (
		loc tiers.Loc
		buf []byte
		err error
	)
	for round := 0; ; round++ {
		loc, buf, err = rs.Reserve(key, size)
		if err == nil || !errors.Is(err, tiers.ErrFull) || round == maxRoomRounds {
			break
		}
		if err = ctx.Err(); err != nil {
			break
		}
		if err = l.makeMemRoom(class, size, parent, true); err != nil {
			break
		}
	}
	if err != nil {
		if errors.Is(err, errColdest) {
			err = tiers.ErrFull
		}
		return 0, nil, l.refused(err, size)
	}
	return loc, buf, nil
}

// Abort gives the slot back. It does nothing once the reservation ended.
func (r *Reservation) Abort() { r.end(false) }

// end frees an open reservation's slot; expired says its context ended.
func (r *Reservation) end(expired bool) {
	if !r.state.CompareAndSwap(resOpen, resDone) {
		return
	}
	if !expired {
		r.stop()
	}
	l := r.l
	l.freeAll([]freeLoc{{false, r.loc}})
	l.mu.Lock()
	l.mu.reservations--
	if expired {
		l.mu.c.reservationsExpired++
	}
	l.mu.Unlock()
}

func (l *Local) countCorruptCommit() {
	l.mu.Lock()
	l.mu.c.corruptCommits++
	l.mu.Unlock()
}

// Arena returns the memory tier's mapping and the memfd it maps when the
// tier can be shared with processes on the same host (tiers.DRAM), else nil
// and -1. Both are valid until Close. The shared-memory data plane hands
// the descriptor to trusted clients, which read blocks in place (under a
// pin) and write reserved slots.
func (l *Local) Arena() (mem []byte, fd int) {
	if a, ok := l.mem.(interface{ Arena() ([]byte, int) }); ok {
		return a.Arena()
	}
	return nil, -1
}
