package client

import (
	"context"
	"crypto/tls"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/kvmesh/kvmesh/prefixhash"
	kvmeshv1 "github.com/kvmesh/kvmesh/proto/kvmesh/v1"
)

// Options configure a Client. Zero fields take their defaults.
type Options struct {
	// Timeout bounds a call whose context has no deadline. Default 30s.
	Timeout time.Duration
	// MaxRetries is how many times a safe call is retried after the node
	// answered Unavailable. Default 2; negative disables retries.
	MaxRetries int
	// Backoff is the wait before the first retry; it doubles for each
	// next one, with jitter. Default 50ms.
	Backoff time.Duration
	// MaxMessageBytes is the largest gRPC message sent or received, in
	// bytes. Default 4 MiB, the node's default.
	MaxMessageBytes int
	// ChunkBytes is the most payload bytes in one BatchPut message. Default
	// 1 MiB.
	ChunkBytes int
	// MaxBatchBlocks is the most blocks one request names; longer puts and
	// gets are split. Default 16384, the node's default.
	MaxBatchBlocks int
	// MaxBlockBytes is the largest payload the client accepts from a node,
	// in bytes: a guard against a node announcing absurd sizes. Default
	// 64 MiB (the node's own default limit is 16 MiB).
	MaxBlockBytes int
	// TLS, when set, makes the client speak TLS 1.3 to the node, on gRPC
	// and on its TCP data plane alike (transfer.LoadTLS builds one from PEM
	// files: the CA that signs the node's certificate; a client
	// certificate for a node that asks for one). The server name verified
	// is TLS.ServerName, else the host of the address dialed. Default nil:
	// plain TCP.
	TLS *tls.Config
	// Token is the bearer token presented to a node that asks for one: as
	// "authorization: Bearer <token>" metadata on every gRPC call, and in
	// the hello of every data-plane connection. Without TLS it travels in
	// the clear. Default empty: none.
	Token string
	// DialOptions are added to Dial's (which default to an insecure
	// transport, or TLS with Options.TLS), after them: theirs win.
	DialOptions []grpc.DialOption
	// Transport selects how block bytes travel: TransportAuto (the
	// default) uses the node's shared-memory socket when the client runs
	// on the node's host, else its TCP data plane, and falls back to the
	// next (then to gRPC) on any failure; TransportTCP skips shared memory;
	// TransportGRPC uses the gRPC streams only, which carry whole blocks:
	// a Get of a rank's part then cuts it out of them, and a Put of a part
	// fails.
	Transport string
	// VerifySharedMemory makes blocks read through shared memory have
	// their payload checksum verified too. Default false: their header is
	// verified (key, parent, tokens, namespace), and their payload was
	// verified by the node when it stored it and crossed no network.
	// Blocks read over TCP or gRPC are always verified whole.
	VerifySharedMemory bool
}

// Transports, for Options.Transport.
const (
	TransportAuto = "auto"
	TransportTCP  = "tcp"
	TransportGRPC = "grpc"
)

// validate refuses options no client can use (with defaults filled in).
func (o *Options) validate() error {
	for _, f := range []struct {
		name string
		v    int64
	}{
		{"Timeout", int64(o.Timeout)}, {"Backoff", int64(o.Backoff)}, {"MaxMessageBytes", int64(o.MaxMessageBytes)},
		{"ChunkBytes", int64(o.ChunkBytes)}, {"MaxBatchBlocks", int64(o.MaxBatchBlocks)}, {"MaxBlockBytes", int64(o.MaxBlockBytes)},
	} {
		if f.v < 0 {
			return fmt.Errorf("%w: Options.%s is negative (%d)", ErrInvalid, f.name, f.v)
		}
	}
	return nil
}

func (o *Options) ensureDefaults() {
	if o.Timeout == 0 {
		o.Timeout = 30 * time.Second
	}
	if o.MaxRetries == 0 {
		o.MaxRetries = 2
	}
	if o.Backoff == 0 {
		o.Backoff = 50 * time.Millisecond
	}
	if o.MaxMessageBytes == 0 {
		o.MaxMessageBytes = 4 << 20
	}
	if o.ChunkBytes == 0 {
		o.ChunkBytes = 1 << 20
	}
	if o.MaxBatchBlocks == 0 {
		o.MaxBatchBlocks = 16384
	}
	if o.MaxBlockBytes == 0 {
		o.MaxBlockBytes = 64 << 20
	}
	if o.Transport == "" {
		o.Transport = TransportAuto
	}
}

// Client talks to one kvmesh node.
type Client struct {
	opts  Options
	conn  *grpc.ClientConn // nil when the caller owns the connection
	cache kvmeshv1.CacheServiceClient
	admin kvmeshv1.AdminServiceClient
	// objects is the node's ObjectService (object.go).
	objects kvmeshv1.ObjectServiceClient
	bulk    bulk
	// prefill is the node's PrefillService (prefill.go).
	prefill kvmeshv1.PrefillServiceClient
	dp      *dataPlane // nil with TransportGRPC
	// refused counts blocks Get received but refused: not the tokens or
	// parent of the prompt asked for (RefusedBlocks).
	refused atomic.Int64

	session struct {
		sync.Mutex
		known bool
		s     Session
	}

	info struct {
		sync.Mutex
		node    *nodeInfo // nil until fetched, or after a data-plane failure
		err     error     // why the last fetch failed
		fetched time.Time
	}
}

// Dial returns a client of the node at addr (host:port). It does not wait
// for the connection: the first call does. Close releases it.
func Dial(addr string, opts Options) (*Client, error) {
	opts.ensureDefaults()
	creds := insecure.NewCredentials()
	if opts.TLS != nil {
		cfg := opts.TLS.Clone()
		cfg.MinVersion = max(cfg.MinVersion, tls.VersionTLS13)
		creds = credentials.NewTLS(cfg)
	}
	dopts := []grpc.DialOption{
		grpc.WithTransportCredentials(creds),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(opts.MaxMessageBytes), grpc.MaxCallSendMsgSize(opts.MaxMessageBytes),
			grpc.ForceCodecV2(kvmeshv1.Codec)), // gRPC's proto codec with buffers that fit large messages
	}
	if opts.Token != "" {
		dopts = append(dopts, grpc.WithPerRPCCredentials(bearer(opts.Token)))
	}
	dopts = append(dopts, opts.DialOptions...)
	conn, err := grpc.NewClient(addr, dopts...)
	if err != nil {
		return nil, fmt.Errorf("client: dial %s: %w", addr, err)
	}
	c, err := newClient(conn, opts)
	if err != nil {
		conn.Close()
		return nil, err
	}
	c.conn = conn
	return c, nil
}

// New returns a client over an existing connection, which the caller keeps
// owning (Close does not close it); the connection carries the node's
// credentials, Options.TLS and Token serve the data plane only. It fails
// (ErrInvalid) on options it cannot use, as Dial does.
func New(conn grpc.ClientConnInterface, opts Options) (*Client, error) {
	return newClient(conn, opts)
}

func newClient(conn grpc.ClientConnInterface, opts Options) (*Client, error) {
	opts.ensureDefaults()
	if err := opts.validate(); err != nil {
		return nil, err
	}
	c := &Client{
		opts:    opts,
		cache:   kvmeshv1.NewCacheServiceClient(conn),
		admin:   kvmeshv1.NewAdminServiceClient(conn),
		objects: kvmeshv1.NewObjectServiceClient(conn),
		prefill: kvmeshv1.NewPrefillServiceClient(conn),
	}
	g := &grpcBulk{c: c}
	switch opts.Transport {
	case TransportGRPC:
		c.bulk = g
	case TransportAuto, TransportTCP:
		c.dp = &dataPlane{c: c, shm: opts.Transport == TransportAuto}
		c.bulk = &dataBulk{c: c, dp: c.dp, grpc: g}
	default:
		return nil, fmt.Errorf("%w: Options.Transport %q: want auto, tcp or grpc", ErrInvalid, opts.Transport)
	}
	return c, nil
}

// Close closes the data-plane connections and the connection Dial opened.
func (c *Client) Close() error {
	if c.dp != nil {
		c.dp.close()
	}
	if c.conn == nil {
		return nil
	}
	return c.conn.Close()
}

// NamespaceProto returns the wire form of ns.
func NamespaceProto(ns prefixhash.Namespace) *kvmeshv1.Namespace {
	return &kvmeshv1.Namespace{
		Model:         ns.Model,
		Dtype:         kvmeshv1.Dtype(ns.DType),
		BlockTokens:   uint32(ns.BlockTokens),
		Layers:        uint32(ns.Layers),
		KvHeads:       uint32(ns.KVHeads),
		HeadDim:       uint32(ns.HeadDim),
		TenantSalt:    ns.TenantSalt,
		KvLayout:      kvmeshv1.KVLayout(ns.Layout),
		LatentDim:     uint32(ns.LatentDim),
		Scales:        kvmeshv1.Scales(ns.Scales),
		Lora:          ns.LoRA,
		KeyScheme:     kvmeshv1.KeyScheme(ns.Scheme),
		HashSeed:      ns.HashSeed,
		ExtraKeyBytes: uint32(ns.ExtraKeyBytes),
		Groups:        GroupsProto(ns.Groups),
	}
}

// withTimeout applies Options.Timeout to a context without a deadline.
func (c *Client) withTimeout(ctx context.Context) (context.Context, context.CancelFunc) {
	if _, ok := ctx.Deadline(); ok {
		return context.WithCancel(ctx)
	}
	return context.WithTimeout(ctx, c.opts.Timeout)
}

// retry runs call until it succeeds, fails with anything but Unavailable,
// MaxRetries retries are spent or ctx is done. Only safe calls use it.
func (c *Client) retry(ctx context.Context, call func(ctx context.Context) error) error {
	ctx, cancel := c.withTimeout(ctx)
	defer cancel()
	return c.retryIn(ctx, call)
}

// retryIn is retry under a context the caller bounded (withTimeout) and
// cancels itself: a loop of calls, like getKeys's batches, makes that
// context once rather than once per call.
func (c *Client) retryIn(ctx context.Context, call func(ctx context.Context) error) error {
	wait := c.opts.Backoff
	for attempt := 0; ; attempt++ {
		err := call(ctx)
		if err == nil || status.Code(err) != codes.Unavailable || attempt >= c.opts.MaxRetries {
			return err
		}
		d := wait/2 + rand.N(wait/2+1)
		wait *= 2
		t := time.NewTimer(d)
		select {
		case <-ctx.Done():
			t.Stop()
			return err
		case <-t.C:
		}
	}
}

// once runs a call that is not safe to repeat, with the default timeout.
func (c *Client) once(ctx context.Context, call func(ctx context.Context) error) error {
	ctx, cancel := c.withTimeout(ctx)
	defer cancel()
	return call(ctx)
}

// bearer presents a token on every gRPC call.
type bearer string

func (b bearer) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	return map[string]string{"authorization": "Bearer " + string(b)}, nil
}

// RequireTransportSecurity is false: a node without TLS may still ask for
// a token (it then travels in the clear).
func (b bearer) RequireTransportSecurity() bool { return false }

func checkNamespace(ns prefixhash.Namespace) error {
	if err := ns.Validate(); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	return nil
}
