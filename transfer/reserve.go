package transfer

import (
	"context"
	"time"
	"unsafe"

	"github.com/kvmesh/kvmesh/prefixhash"
)

// Arena is the memory a ShmServer's Source serves from and its Reserver
// reserves in: the node's DRAM tier (tiers.DRAM implements it). When a
// ShmServer has one, it hands trusted clients (node-wide principals that
// may write; never a tenant or a reader: the arena holds every tenant's
// blocks, and any descriptor of it can be reopened writable) a descriptor of it at
// connect, so that they read found values in place, under a lease, instead
// of the server copying them into their region, and write puts into
// reserved slots.
type Arena interface {
	// Arena returns the arena's mapping in this process and the memfd it
	// maps: byte i of mem is byte i of the file.
	Arena() (mem []byte, fd int)
}

// Reserver takes room for a value before it exists, so that it arrives
// straight in place: a same-host client writes it into the shared arena,
// then asks the server to commit it. store.Local implements it (through a
// node adapter).
type Reserver interface {
	// Reserve takes room for the size-byte value of key, child of parent.
	// A non-zero chunk makes it a publish (see Publisher): Commit also
	// queues the value for the owners of that placement chunk, or fails
	// (the client then sends it another way). The reservation ends with
	// ctx: Commit after that fails. ctx carries the requester's access
	// (auth.WithAccess), which Commit checks.
	Reserve(ctx context.Context, key, parent, chunk prefixhash.Key, size int) (Reservation, error)
}

// Reservation is room taken by a Reserver.
type Reservation interface {
	// Buf is the room: exactly the reserved size, to be filled before
	// Commit, and not used after Commit or Abort.
	Buf() []byte
	// Commit verifies and stores what Buf holds, visible all at once, or
	// fails and frees the room. An error wrapping ErrCorrupt or ErrLimit
	// is the value's fault (StatusError); one wrapping ErrConflict, a
	// part refused for its overlap (StatusConflict); any other leaves it
	// unstored (StatusMiss).
	Commit() error
	// Abort frees the room; it does nothing after Commit.
	Abort()
}

// DefaultLeaseTimeout is ShmServerOptions.LeaseTimeout's and
// ServerOptions.LeaseTimeout's default.
const DefaultLeaseTimeout = 30 * time.Second

// uintptrOf is the address of b's first byte.
func uintptrOf(b []byte) uintptr { return uintptr(unsafe.Pointer(unsafe.SliceData(b))) }
