package transfer

import (
	"fmt"
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
}

// Default limits.
const (
	DefaultMaxItems      = 4096
	DefaultMaxValueSize  = 64 << 20
	DefaultMaxBatchBytes = 64 << 20

	// hard ceilings, so that counts and lengths fit the wire's fields
	maxItemsLimit   = 1 << 20
	maxBatchLimit   = 1 << 31
	maxRegionSize   = 1 << 40
	maxPendingLimit = 1 << 16
)

// tighter returns the field-by-field minimum of two valid Limits.
func tighter(a, b Limits) Limits {
	return Limits{MaxItems: min(a.MaxItems, b.MaxItems), MaxValueSize: min(a.MaxValueSize, b.MaxValueSize), MaxBatchBytes: min(a.MaxBatchBytes, b.MaxBatchBytes)}
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
	// DialTimeout bounds connecting. Default 1s.
	DialTimeout time.Duration
	// MaxIdle is how long a pooled connection may sit unused and still be
	// reused; older ones are closed. Keep it below the server's
	// IdleTimeout. Default 1m.
	MaxIdle time.Duration
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
	}
	return nil
}

// ServerOptions configure a Server (TCP).
type ServerOptions struct {
	Limits
	// MaxConns is the most open connections; further ones are closed at
	// accept. Default 1024.
	MaxConns int
	// MaxInFlightBytes bounds the put payload bytes being received and
	// applied at once, over all connections; a put waits for room.
	// Default 256 MiB; at least MaxBatchBytes.
	MaxInFlightBytes int
	// RequestTimeout bounds one request on the server, from its header to
	// the last byte of the response, when the client asks for no shorter
	// timeout. Default 30s.
	RequestTimeout time.Duration
	// IdleTimeout closes a connection with no request for this long.
	// Default 5m.
	IdleTimeout time.Duration
}

// EnsureDefaults fills zero fields with their defaults.
func (o *ServerOptions) EnsureDefaults() {
	o.Limits.EnsureDefaults()
	if o.MaxConns == 0 {
		o.MaxConns = 1024
	}
	if o.MaxInFlightBytes == 0 {
		o.MaxInFlightBytes = max(256<<20, o.MaxBatchBytes)
	}
	if o.RequestTimeout == 0 {
		o.RequestTimeout = 30 * time.Second
	}
	if o.IdleTimeout == 0 {
		o.IdleTimeout = 5 * time.Minute
	}
}

// Validate reports the first field out of range.
func (o *ServerOptions) Validate() error {
	if err := o.Limits.Validate(); err != nil {
		return err
	}
	switch {
	case o.MaxConns < 1:
		return fmt.Errorf("transfer: ServerOptions.MaxConns %d must be at least 1", o.MaxConns)
	case o.MaxInFlightBytes < o.MaxBatchBytes:
		return fmt.Errorf("transfer: ServerOptions.MaxInFlightBytes %d is below MaxBatchBytes %d", o.MaxInFlightBytes, o.MaxBatchBytes)
	case o.RequestTimeout <= 0:
		return fmt.Errorf("transfer: ServerOptions.RequestTimeout %v must be positive", o.RequestTimeout)
	case o.IdleTimeout <= 0:
		return fmt.Errorf("transfer: ServerOptions.IdleTimeout %v must be positive", o.IdleTimeout)
	}
	return nil
}

// ShmServerOptions configure a ShmServer (same-host shared memory).
type ShmServerOptions struct {
	Limits
	// RegionSize is the size of each client's shared region in bytes, a
	// multiple of the page size. Memory is committed as values are copied
	// in, not up front. Values larger than the region are answered with
	// StatusError. Default 256 MiB.
	RegionSize int64
	// MaxClients is the most clients at once; further ones are closed at
	// accept. Default 64.
	MaxClients int
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
	if o.MaxPending == 0 {
		o.MaxPending = 64
	}
	if o.MaxInFlightBytes == 0 {
		o.MaxInFlightBytes = max(256<<20, o.MaxBatchBytes)
	}
	if o.RequestTimeout == 0 {
		o.RequestTimeout = 30 * time.Second
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
	case o.MaxPending < 1 || o.MaxPending > maxPendingLimit:
		return fmt.Errorf("transfer: ShmServerOptions.MaxPending %d out of [1, %d]", o.MaxPending, maxPendingLimit)
	case o.MaxInFlightBytes < o.MaxBatchBytes:
		return fmt.Errorf("transfer: ShmServerOptions.MaxInFlightBytes %d is below MaxBatchBytes %d", o.MaxInFlightBytes, o.MaxBatchBytes)
	case o.RequestTimeout <= 0:
		return fmt.Errorf("transfer: ShmServerOptions.RequestTimeout %v must be positive", o.RequestTimeout)
	}
	return nil
}

// ShmClientOptions configure a ShmClient.
type ShmClientOptions struct {
	Limits
	// RequestTimeout bounds a whole Get or Put when the caller's context
	// has no earlier deadline. Default 5s.
	RequestTimeout time.Duration
	// DialTimeout bounds connecting and receiving the region. Default 1s.
	DialTimeout time.Duration
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
	return nil
}
