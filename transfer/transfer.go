package transfer

import (
	"context"
	"errors"
	"fmt"

	"github.com/kvmesh/kvmesh/internal/invariants"
	"github.com/kvmesh/kvmesh/prefixhash"
)

// Errors. Every error a Client or ShmClient returns wraps one of these, or
// context.Canceled / context.DeadlineExceeded when the caller's context (or
// the request timeout) ended first, or the network error that broke the
// connection.
var (
	// ErrClosed is returned after Close.
	ErrClosed = errors.New("transfer: closed")
	// ErrCorrupt means a frame failed its checks (magic, version,
	// checksum, lengths). The connection it came on is dropped.
	ErrCorrupt = errors.New("transfer: corrupt frame")
	// ErrLimit means a batch, a frame or a value is over a Limits field.
	ErrLimit = errors.New("transfer: over limit")
	// ErrRemote means the peer answered with an error frame; the message
	// follows.
	ErrRemote = errors.New("transfer: peer error")
	// ErrAuth means the connection was refused before any request was
	// served: the peer refused this client (token missing or wrong, TLS
	// required, client certificate refused) or this client refused the
	// peer (its certificate, or plain TCP where TLS was expected). It is a
	// configuration error, not a miss: retrying will not help. When the
	// peer refused, the error also wraps ErrRemote.
	ErrAuth = errors.New("transfer: not authorized")
	// ErrUnsupported means this build or this host cannot do what was
	// asked (shared memory off Linux, puts to a server without a Sink).
	ErrUnsupported = errors.New("transfer: unsupported")
	// ErrConflict is what a Reservation's Commit wraps when its value is a
	// part whose bytes differ from stored parts it overlaps: answered
	// StatusConflict.
	ErrConflict = errors.New("transfer: part conflicts with the stored part it overlaps")
)

// Status is the outcome of one item of a batch.
type Status uint8

const (
	// StatusMiss: get, the key is not there; put, the value was not
	// stored (the sink dropped it).
	StatusMiss Status = 0
	// StatusOK: get, the value was found and is in Result.Values; put,
	// the value was stored.
	StatusOK Status = 1
	// StatusError: the peer failed this item (a source or sink error, a
	// value over a limit). Callers treat it as a miss.
	StatusError Status = 2
	// statusRetry: the peer did not send this item in this frame (the
	// frame reached its byte limit, or the shared region was full); the
	// client asks for it again. Callers never see it.
	statusRetry Status = 3
)

func (s Status) String() string {
	switch s {
	case StatusMiss:
		return "miss"
	case StatusOK:
		return "ok"
	case StatusError:
		return "error"
	case statusRetry:
		return "retry"
	case StatusConflict:
		return "conflict"
	}
	return fmt.Sprintf("status(%d)", uint8(s))
}

// Source serves the values a server sends. The store implements it.
type Source interface {
	// Acquire looks keys up. For each i it sets st[i] (StatusOK, StatusMiss
	// or StatusError) and, when OK, vals[i]; st and vals arrive zeroed and
	// have len(keys) elements. The values must stay valid and unchanged
	// (pinned) until release is called; the server calls release exactly
	// once, after the values are on the wire or the request was abandoned.
	// release may be nil when nothing is pinned. Acquire should return
	// early, with misses, when ctx is done: ctx ends with the request's
	// deadline, the client's disconnection being noticed, or Close.
	Acquire(ctx context.Context, keys []prefixhash.Key, vals [][]byte, st []Status) (release func())
}

// Sink receives pushed values. The store implements it.
type Sink interface {
	// Put stores vals[i] under keys[i] and sets st[i] (StatusOK when
	// stored, StatusMiss when dropped, StatusError on failure,
	// StatusConflict for a part refused for its overlap; st arrives
	// zeroed). vals alias a receive buffer that is reused after Put
	// returns: a sink that keeps a value copies it. Values are unverified
	// bytes from the network; the sink verifies them (block.Decode) before
	// serving them.
	Put(ctx context.Context, keys []prefixhash.Key, vals [][]byte, st []Status)
}

// Publisher is a Sink that also takes publish requests: puts from a client
// that produced the blocks, which the node stores and then queues for the
// owners of their placement chunks. A server whose sink is not a Publisher
// refuses them (ErrUnsupported).
type Publisher interface {
	Sink
	// PutPublish stores vals[i] under keys[i] as Put does and queues each
	// block it stored for the owners of chunkKeys[i]. A block stored but
	// not queued is reported StatusMiss, so that the client sends it again
	// another way. vals as in Put.
	PutPublish(ctx context.Context, keys, chunkKeys []prefixhash.Key, vals [][]byte, st []Status)
}

// Peer is one node's data plane as a caller sees it. Client (TCP),
// ShmClient (same host) and RMAClient (one-sided reads through a Fabric)
// implement it.
// All methods are safe for concurrent use.
type Peer interface {
	// Get fetches keys. The Result says, per key, found or not, and holds
	// the values until Release. A dead, slow or unreachable peer yields an
	// error within the deadline (ctx's, or the client's RequestTimeout),
	// which callers count as misses.
	Get(ctx context.Context, keys []prefixhash.Key) (*Result, error)
	// Put pushes vals[i] under keys[i] and returns each item's status.
	// vals are only read during the call.
	Put(ctx context.Context, keys []prefixhash.Key, vals [][]byte) ([]Status, error)
	// Close releases the peer's connections. Results already returned
	// stay valid until released.
	Close() error
}

// Transport dials peers of one kind: TCP, same-host shared memory, and, when
// NICs exist, RDMA verbs. A node advertises one address per transport it
// serves (memberlist metadata); a caller picks the best transport both ends
// have.
type Transport interface {
	// Name is "tcp", "shm" or "rdma".
	Name() string
	// Dial returns a Peer for addr (host:port for TCP, a unix socket path
	// for shared memory).
	Dial(ctx context.Context, addr string) (Peer, error)
}

var (
	_ Peer      = (*Client)(nil)
	_ Peer      = (*ShmClient)(nil)
	_ Transport = TCP{}
	_ Transport = Shm{}
)

// Result holds the values of a Get. Status and Values have one element per
// requested key, in request order; Values[i] is non-nil only when Status[i]
// is StatusOK (a found 0-byte value is an empty, non-nil slice).
//
// Values alias memory that the Result owns (pooled receive buffers for TCP,
// the shared region for ShmClient), 64-byte aligned. They are valid until
// Release, which must be called exactly once: it returns the memory (and the
// client's in-flight byte budget) for reuse. A Result is not safe for
// concurrent use.
type Result struct {
	leak invariants.Leak // collected unreleased panics in the invariants build

	Status []Status
	Values [][]byte

	owner resultOwner
	bufs  []*buffer // TCP: receive buffers
	ids   []uint64  // shm: request ids whose region space this holds
	held  int64     // TCP: in-flight bytes held
	ext   []extent  // RMA: landing space of values read one-sidedly
	subs  []*Result // RMA: results of the TCP gets that filled the rest
}

type resultOwner interface{ release(r *Result) }

func newResult(owner resultOwner, n int) *Result {
	r := &Result{Status: make([]Status, n), Values: make([][]byte, n), owner: owner}
	invariants.Track(r, &r.leak, "transfer.Result")
	return r
}

// Hits returns the number of found keys.
func (r *Result) Hits() int {
	n := 0
	for _, s := range r.Status {
		if s == StatusOK {
			n++
		}
	}
	return n
}

// Release gives the Result's memory back. Values must not be used after it.
// Release on a released Result does nothing.
func (r *Result) Release() {
	if r.owner == nil {
		return
	}
	r.owner.release(r)
	r.owner = nil
	r.leak.Stop()
	clear(r.Values)
}
