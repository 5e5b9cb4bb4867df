package transfer

import (
	"crypto/tls"
	"fmt"
	"github.com/kvmesh/kvmesh/auth"
	"os"
	"time"
)

// Limits bound what one frame may ask its receiver to allocate. Both ends
// enforce them on decode: a frame over a limit is refused with ErrLimit and
// its connection dropped, before anything is allocated for it. Gets adapt to
// the requester (a get request carries the client's limits and the server
// answers within them); ShmClient adopts the server's limits at connect;
// puts over TCP must fit the server's limits, so a server's limits should be
// at least its clients' (the defaults are equal).
type Limits struct {
	// MaxItems is the most keys (get) or items (put) in one frame.
	// Clients split larger batches. Default 4096.
	MaxItems int
	// MaxValueSize is the largest value in bytes. Default 64 MiB.
	MaxValueSize int
	// MaxBatchBytes is the most value bytes (each value padded to 64
	// bytes) in one frame. Clients split larger puts; servers answer
	// larger gets in several frames. Default 64 MiB; at least
	// MaxValueSize.
	MaxBatchBytes int
	// MaxLookupKeys is the most keys in one lookup frame (24 bytes each on
	// the wire, about 100 bytes of server memory while it is answered).
	// Client.Lookup splits larger lookups, and longer runs, so any chain
	// can be looked up. Default 8192: a 128k-token prompt in blocks of 16
	// tokens in one frame. Not carried by the shared-memory hello (shared
	// memory serves no lookups).
	MaxLookupKeys int
}

// Default limits.
const (
	DefaultMaxItems      = 4096
	DefaultMaxValueSize  = 64 << 20
	DefaultMaxBatchBytes = 64 << 20
	DefaultMaxLookupKeys = 8192

	// hard ceilings, so that counts and lengths fit the wire's fields
	maxItemsLimit   = 1 << 20
	maxBatchLimit   = 1 << 31
	maxRegionSize   = 1 << 40
	maxPendingLimit = 1 << 16
)

// tighter returns the field-by-field minimum of two valid Limits.
func tighter(a, b Limits) Limits {
	return Limits{MaxItems: min(a.MaxItems, b.MaxItems), MaxValueSize: min(a.MaxValueSize, b.MaxValueSize),
		MaxBatchBytes: min(a.MaxBatchBytes, b.MaxBatchBytes), MaxLookupKeys: min(a.MaxLookupKeys, b.MaxLookupKeys)}
}

// lookupKeys is MaxLookupKeys, or its default when l was not defaulted.
func (l *Limits) lookupKeys() int {
	if l.MaxLookupKeys == 0 {
		return DefaultMaxLookupKeys
	}
	return l.MaxLookupKeys
}

// EnsureDefaults fills zero fields with their defaults.
func (l *Limits) EnsureDefaults() {
	if l.MaxItems == 0 {
		l.MaxItems = DefaultMaxItems
	}
	if l.MaxValueSize == 0 {
		l.MaxValueSize = DefaultMaxValueSize
		if l.MaxBatchBytes > 0 {
			l.MaxValueSize = min(l.MaxValueSize, l.MaxBatchBytes&^(valueAlign-1))
		}
	}
	if l.MaxBatchBytes == 0 {
		l.MaxBatchBytes = max(DefaultMaxBatchBytes, alignUp(l.MaxValueSize))
	}
	if l.MaxLookupKeys == 0 {
		l.MaxLookupKeys = DefaultMaxLookupKeys
	}
}

// Validate reports the first field out of range.
func (l *Limits) Validate() error {
	switch {
	case l.MaxItems < 1 || l.MaxItems > maxItemsLimit:
		return fmt.Errorf("transfer: Limits.MaxItems %d out of [1, %d]", l.MaxItems, maxItemsLimit)
	case l.MaxValueSize < 0 || l.MaxValueSize >= 1<<32:
		return fmt.Errorf("transfer: Limits.MaxValueSize %d out of [0, 4GiB)", l.MaxValueSize)
	case l.MaxBatchBytes < alignUp(l.MaxValueSize) || l.MaxBatchBytes > maxBatchLimit:
		return fmt.Errorf("transfer: Limits.MaxBatchBytes %d out of [MaxValueSize rounded up to 64 (%d), %d]",
			l.MaxBatchBytes, alignUp(l.MaxValueSize), maxBatchLimit)
	case l.MaxLookupKeys < 1 || l.MaxLookupKeys > maxItemsLimit:
		return fmt.Errorf("transfer: Limits.MaxLookupKeys %d out of [1, %d]", l.MaxLookupKeys, maxItemsLimit)
	}
	return nil
}

// ClientOptions configure a Client (TCP).
type ClientOptions struct {
	Limits
	// MaxConns is the most connections to the peer; that many requests
	// run at once and more wait for a free connection. Default 4.
	MaxConns int
	// MaxInFlightBytes bounds the value bytes held by unreleased Results
	// and puts on the wire; a request waits (with its context) for room.
	// Default 256 MiB; at least MaxBatchBytes.
	MaxInFlightBytes int
	// RequestTimeout bounds a whole Get or Put when the caller's context
	// has no earlier deadline. Default 5s.
	RequestTimeout time.Duration
	// DialTimeout bounds opening a connection: connecting, the TLS
	// handshake and the hello. Default 1s.
	DialTimeout time.Duration
	// MaxIdle is how long a pooled connection may sit unused and still be
	// reused; older ones are closed. Keep it below the server's
	// IdleTimeout. Default 1m.
	MaxIdle time.Duration
	// TLS, when set, makes every connection TLS 1.3 with this
	// configuration (LoadTLS builds one from PEM files); it must match the
	// server's. Its ServerName defaults to the host of the address dialed;
	// Certificates are presented to a server that requires a client
	// certificate. The client uses a copy. Default nil: plain TCP.
	TLS *tls.Config
	// Token is the bearer token presented once per connection, in the
	// hello that opens it (at most MaxTokenLen bytes). It travels in the
	// clear unless TLS is set. Default empty: no token.
	Token string
}

// EnsureDefaults fills zero fields with their defaults.
func (o *ClientOptions) EnsureDefaults() {
	o.Limits.EnsureDefaults()
	if o.MaxConns == 0 {
		o.MaxConns = 4
	}
	if o.MaxInFlightBytes == 0 {
		o.MaxInFlightBytes = max(256<<20, o.MaxBatchBytes)
	}
	if o.RequestTimeout == 0 {
		o.RequestTimeout = 5 * time.Second
	}
	if o.DialTimeout == 0 {
		o.DialTimeout = time.Second
	}
	if o.MaxIdle == 0 {
		o.MaxIdle = time.Minute
	}
}

// Validate reports the first field out of range.
func (o *ClientOptions) Validate() error {
	if err := o.Limits.Validate(); err != nil {
		return err
	}
	switch {
	case o.MaxConns < 1:
		return fmt.Errorf("transfer: ClientOptions.MaxConns %d must be at least 1", o.MaxConns)
	case o.MaxInFlightBytes < o.MaxBatchBytes:
		return fmt.Errorf("transfer: ClientOptions.MaxInFlightBytes %d is below MaxBatchBytes %d", o.MaxInFlightBytes, o.MaxBatchBytes)
	case o.RequestTimeout < 0, o.DialTimeout < 0, o.MaxIdle < 0:
		return fmt.Errorf("transfer: ClientOptions timeouts must not be negative")
	case len(o.Token) > MaxTokenLen:
		return fmt.Errorf("transfer: ClientOptions.Token is %d bytes, MaxTokenLen is %d", len(o.Token), MaxTokenLen)
	}
	return validateTLS(o.TLS, "ClientOptions.TLS", false)
}

// ServerOptions configure a Server (TCP).
type ServerOptions struct {
	Limits
	// MaxConns is the most authenticated connections (their hello
	// accepted); a hello past it is refused with ErrLimit. Connections
	// still in their handshake have slots of their own beside these (a
	// quarter as many, at least 16): when those are full, a new connection
	// evicts the oldest of them, so sockets that never authenticate cannot
	// keep credentialed clients out. Default 1024.
	MaxConns int
	// MaxConnsPerTenant is the most authenticated connections one tenant's
	// tokens may hold together, so one tenant cannot take every slot.
	// Node-wide principals (a shared token, the cluster's) count only
	// toward MaxConns. Default MaxConns/4, at least 1.
	MaxConnsPerTenant int
	// MaxInFlightBytes is the node-wide budget, in bytes, of the memory
	// requests hold, over all connections, each part charged before it is
	// allocated: a request's item table as it arrives (64 KiB at a time,
	// once the first byte of each piece is there), then its scratch (about
	// 100 bytes per key or item), and a put's values as they arrive, one
	// segment (4 MiB, or one value when larger) at a time. A request
	// waits for room until its deadline, then is refused with ErrLimit.
	// One connection serves one request at a time, so it holds at most one
	// request's table and one segment: with the defaults, a
	// sixteenth of the budget for a 16 MiB value, a quarter for a 64 MiB
	// one. Default 256 MiB; at least MaxBatchBytes.
	MaxInFlightBytes int
	// RequestTimeout bounds one request on the server, from its header to
	// the last byte of the response, when the client asks for no shorter
	// timeout. Default 30s.
	RequestTimeout time.Duration
	// ReadTimeout bounds each wait for the next bytes of a request the
	// server has begun to read (its item table, each MiB of a put's
	// values): a request that stops sending for this long is dropped with
	// its connection, and what it reserved of MaxInFlightBytes released.
	// A put's values are not reserved before their first bytes arrive.
	// Default 5s.
	ReadTimeout time.Duration
	// IdleTimeout closes a connection with no request for this long.
	// Default 5m.
	IdleTimeout time.Duration
	// HandshakeTimeout bounds a new connection's TLS handshake and hello:
	// how long a client that has not yet been accepted may hold a
	// connection. Default 2s.
	HandshakeTimeout time.Duration
	// TLS, when set, makes the server speak TLS 1.3 only, with this
	// configuration (LoadTLS builds one from PEM files): it needs a
	// certificate, and with ClientAuth set to RequireAndVerifyClientCert
	// it refuses clients without a certificate its ClientCAs trust
	// (mutual TLS). Plain clients are refused with an ErrAuth error. The
	// server uses a copy. Default nil: plain TCP.
	TLS *tls.Config
	// Tokens, when set, is the set of bearer tokens the server accepts:
	// a connection must open with a hello carrying one of them, or it is
	// refused (ErrAuth on the client) before any request is served.
	// Default nil: no token required.
	Tokens *auth.Tokens
	// Window, when set, is memory the Source serves from that peers read
	// one-sidedly (the node's DRAM arena, registered with a Fabric): the
	// server gives its descriptor to node-wide clients that may read and
	// write, and grants them leases on the values that lie in it (see
	// lease.go and RMA). The window must outlive the server. Default nil:
	// values travel over TCP only.
	Window *Window
	// LeaseTimeout bounds how long a lease on values in Window lasts
	// (the values stay pinned meanwhile) when the lease request's own
	// deadline is later. Default DefaultLeaseTimeout (30s).
	LeaseTimeout time.Duration
}

// EnsureDefaults fills zero fields with their defaults.
func (o *ServerOptions) EnsureDefaults() {
	o.Limits.EnsureDefaults()
	if o.MaxConns == 0 {
		o.MaxConns = 1024
	}
	if o.MaxConnsPerTenant == 0 {
		o.MaxConnsPerTenant = max(1, o.MaxConns/4)
	}
	if o.MaxInFlightBytes == 0 {
		o.MaxInFlightBytes = max(256<<20, o.MaxBatchBytes)
	}
	if o.RequestTimeout == 0 {
		o.RequestTimeout = 30 * time.Second
	}
	if o.ReadTimeout == 0 {
		o.ReadTimeout = 5 * time.Second
	}
	if o.IdleTimeout == 0 {
		o.IdleTimeout = 5 * time.Minute
	}
	if o.HandshakeTimeout == 0 {
		o.HandshakeTimeout = DefaultHandshakeTimeout
	}
	if o.LeaseTimeout == 0 {
		o.LeaseTimeout = DefaultLeaseTimeout
	}
}

// DefaultHandshakeTimeout is how long a new data-plane connection has to
// finish its TLS handshake and hello, by default: a loopback or LAN client
// takes a millisecond or two; the rest is slack for a loaded host.
const DefaultHandshakeTimeout = 2 * time.Second

// Validate reports the first field out of range.
func (o *ServerOptions) Validate() error {
	if err := o.Limits.Validate(); err != nil {
		return err
	}
	switch {
	case o.MaxConns < 1:
		return fmt.Errorf("transfer: ServerOptions.MaxConns %d must be at least 1", o.MaxConns)
	case o.MaxConnsPerTenant < 1:
		return fmt.Errorf("transfer: ServerOptions.MaxConnsPerTenant %d must be at least 1", o.MaxConnsPerTenant)
	case o.MaxInFlightBytes < o.MaxBatchBytes:
		return fmt.Errorf("transfer: ServerOptions.MaxInFlightBytes %d is below MaxBatchBytes %d", o.MaxInFlightBytes, o.MaxBatchBytes)
	case o.RequestTimeout <= 0:
		return fmt.Errorf("transfer: ServerOptions.RequestTimeout %v must be positive", o.RequestTimeout)
	case o.ReadTimeout <= 0:
		return fmt.Errorf("transfer: ServerOptions.ReadTimeout %v must be positive", o.ReadTimeout)
	case o.IdleTimeout <= 0:
		return fmt.Errorf("transfer: ServerOptions.IdleTimeout %v must be positive", o.IdleTimeout)
	case o.HandshakeTimeout <= 0:
		return fmt.Errorf("transfer: ServerOptions.HandshakeTimeout %v must be positive", o.HandshakeTimeout)
	case o.LeaseTimeout <= 0:
		return fmt.Errorf("transfer: ServerOptions.LeaseTimeout %v must be positive", o.LeaseTimeout)
	}
	return validateTLS(o.TLS, "ServerOptions.TLS", true)
}

// ShmServerOptions configure a ShmServer (same-host shared memory).
type ShmServerOptions struct {
	Limits
	// RegionSize is the size of each client's shared region in bytes, a
	// multiple of the page size. Memory is committed as values are copied
	// in, not up front. Values larger than the region are answered with
	// StatusError. Default 256 MiB.
	RegionSize int64
	// MaxClients is the most clients at once (their hello accepted); a
	// hello past it is refused with ErrLimit. Connections still in their
	// handshake have slots of their own, the oldest evicted when they are
	// full (see ServerOptions.MaxConns). Default 64.
	MaxClients int
	// MaxClientsPerTenant is the most clients one tenant's tokens may hold
	// at once, and so the most region memory it can pin
	// (MaxClientsPerTenant × RegionSize): one tenant cannot take every
	// slot. Node-wide principals count only toward MaxClients. Default
	// MaxClients/4, at least 1.
	MaxClientsPerTenant int
	// MaxPending is the most requests a client may have queued on the
	// server; a client that exceeds it is disconnected (ShmClient never
	// does). Default 64.
	MaxPending int
	// MaxInFlightBytes bounds the put payload bytes being received and
	// applied at once, over all clients. Default 256 MiB; at least
	// MaxBatchBytes.
	MaxInFlightBytes int
	// RequestTimeout bounds one request on the server (including waiting
	// for region space) when the client asks for no shorter timeout.
	// Default 30s.
	RequestTimeout time.Duration
	// HandshakeTimeout bounds a new client's hello. Default 2s
	// (DefaultHandshakeTimeout).
	HandshakeTimeout time.Duration
	// SocketMode is the permission bits of the socket file, set right
	// after it is created: who may connect, and so read the cache. 0600
	// admits processes of the server's user (and root); 0660 also its
	// group. Keep the socket in a directory no one else can write to.
	// Default 0600.
	SocketMode os.FileMode
	// PeerUIDs, when set, admits only processes running as one of these
	// user ids (the kernel's SO_PEERCRED of the connecting process),
	// whatever the socket's mode. Default nil: the mode decides.
	PeerUIDs []uint32
	// Tokens, when set, is the set of bearer tokens the server accepts,
	// as for ServerOptions.Tokens: no region is handed to a client whose
	// hello carries none of them. Default nil: no token required.
	Tokens *auth.Tokens
	// Arena, when set, is shared with clients that are node-wide
	// principals allowed to write (see Arena), writable when Reserver is
	// set too. A tenant's client or a node-wide reader never gets it (any
	// descriptor of a memfd can be reopened writable) and is served by
	// copies into its region. Default nil: every value is copied into the
	// client's region.
	Arena Arena
	// Reserver, with Arena, serves reserve and commit requests: puts
	// written by the client straight into arena slots. Its Buf must lie in
	// Arena. Default nil: puts travel inline over the socket.
	Reserver Reserver
	// LeaseTimeout bounds how long a client may hold values it reads in
	// place in the arena (the blocks stay pinned meanwhile) and slots it
	// reserved but did not commit. A lease or reservation older than this
	// is ended by the server: the client must not read or write its bytes
	// after it. Default DefaultLeaseTimeout (30s).
	LeaseTimeout time.Duration
}

// EnsureDefaults fills zero fields with their defaults.
func (o *ShmServerOptions) EnsureDefaults() {
	o.Limits.EnsureDefaults()
	if o.RegionSize == 0 {
		o.RegionSize = 256 << 20
	}
	if o.MaxClients == 0 {
		o.MaxClients = 64
	}
	if o.MaxClientsPerTenant == 0 {
		o.MaxClientsPerTenant = max(1, o.MaxClients/4)
	}
	if o.MaxPending == 0 {
		o.MaxPending = 64
	}
	if o.MaxInFlightBytes == 0 {
		o.MaxInFlightBytes = max(256<<20, o.MaxBatchBytes)
	}
	if o.RequestTimeout == 0 {
		o.RequestTimeout = 30 * time.Second
	}
	if o.HandshakeTimeout == 0 {
		o.HandshakeTimeout = DefaultHandshakeTimeout
	}
	if o.LeaseTimeout == 0 {
		o.LeaseTimeout = DefaultLeaseTimeout
	}
	if o.SocketMode == 0 {
		o.SocketMode = 0o600
	}
}

// Validate reports the first field out of range.
func (o *ShmServerOptions) Validate() error {
	if err := o.Limits.Validate(); err != nil {
		return err
	}
	switch {
	case o.RegionSize < 1<<16 || o.RegionSize > maxRegionSize || o.RegionSize%(1<<12) != 0:
		return fmt.Errorf("transfer: ShmServerOptions.RegionSize %d must be a multiple of 4KiB in [64KiB, 1TiB]", o.RegionSize)
	case o.MaxClients < 1:
		return fmt.Errorf("transfer: ShmServerOptions.MaxClients %d must be at least 1", o.MaxClients)
	case o.MaxClientsPerTenant < 1:
		return fmt.Errorf("transfer: ShmServerOptions.MaxClientsPerTenant %d must be at least 1", o.MaxClientsPerTenant)
	case o.MaxPending < 1 || o.MaxPending > maxPendingLimit:
		return fmt.Errorf("transfer: ShmServerOptions.MaxPending %d out of [1, %d]", o.MaxPending, maxPendingLimit)
	case o.MaxInFlightBytes < o.MaxBatchBytes:
		return fmt.Errorf("transfer: ShmServerOptions.MaxInFlightBytes %d is below MaxBatchBytes %d", o.MaxInFlightBytes, o.MaxBatchBytes)
	case o.RequestTimeout <= 0:
		return fmt.Errorf("transfer: ShmServerOptions.RequestTimeout %v must be positive", o.RequestTimeout)
	case o.HandshakeTimeout <= 0:
		return fmt.Errorf("transfer: ShmServerOptions.HandshakeTimeout %v must be positive", o.HandshakeTimeout)
	case o.SocketMode&^os.ModePerm != 0:
		return fmt.Errorf("transfer: ShmServerOptions.SocketMode %v has bits other than permissions", o.SocketMode)
	case o.LeaseTimeout <= 0:
		return fmt.Errorf("transfer: ShmServerOptions.LeaseTimeout %v must be positive", o.LeaseTimeout)
	case o.Reserver != nil && o.Arena == nil:
		return fmt.Errorf("transfer: ShmServerOptions.Reserver needs Arena: reserved slots are written through it")
	}
	return nil
}

// ShmClientOptions configure a ShmClient.
type ShmClientOptions struct {
	Limits
	// RequestTimeout bounds a whole Get or Put when the caller's context
	// has no earlier deadline. Default 5s.
	RequestTimeout time.Duration
	// DialTimeout bounds connecting, the hello and receiving the region.
	// Default 1s.
	DialTimeout time.Duration
	// Token is the bearer token presented in the hello (at most
	// MaxTokenLen bytes). Default empty: no token.
	Token string
}

// EnsureDefaults fills zero fields with their defaults.
func (o *ShmClientOptions) EnsureDefaults() {
	o.Limits.EnsureDefaults()
	if o.RequestTimeout == 0 {
		o.RequestTimeout = 5 * time.Second
	}
	if o.DialTimeout == 0 {
		o.DialTimeout = time.Second
	}
}

// Validate reports the first field out of range.
func (o *ShmClientOptions) Validate() error {
	if err := o.Limits.Validate(); err != nil {
		return err
	}
	if o.RequestTimeout < 0 || o.DialTimeout < 0 {
		return fmt.Errorf("transfer: ShmClientOptions timeouts must not be negative")
	}
	if len(o.Token) > MaxTokenLen {
		return fmt.Errorf("transfer: ShmClientOptions.Token is %d bytes, MaxTokenLen is %d", len(o.Token), MaxTokenLen)
	}
	return nil
}
