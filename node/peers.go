package node

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/kvmesh/kvmesh/block"
	"github.com/kvmesh/kvmesh/gossip"
	"github.com/kvmesh/kvmesh/prefixhash"
	kvmeshv1 "github.com/kvmesh/kvmesh/proto/kvmesh/v1"
	"github.com/kvmesh/kvmesh/store"
	"github.com/kvmesh/kvmesh/transfer"
)

// Errors of peers. Callers (store.Cluster) count every error as a miss.
var (
	errNotMember = errors.New("node: not a live member")
	errPeerDown  = errors.New("node: peer skipped after a recent failure")
	errPeersShut = errors.New("node: peers closed")
)

// peers implements store.Peers over the data plane: lookups, reads and
// pushes all go through a transfer.Client per peer (lookups as lookup frames:
// half the time of the same call over gRPC, see BenchmarkPeerLookup). Clients
// are made lazily from the member's gossiped addresses, on the first call,
// and closed when the member leaves the membership or changes address. Each
// peer also gets a gRPC connection, for PeerService (tools, and the
// benchmark that compares the two).
//
// A peer whose call failed (not cancelled by the caller) is skipped for
// backoff: its calls fail at once, as misses, instead of each waiting for
// its deadline; the first call after that tries it again. So a dead or
// partitioned peer costs one deadline per backoff, not one per request.
type peers struct {
	members *gossip.Membership
	log     *slog.Logger
	tcp     transfer.ClientOptions
	backoff time.Duration
	maxMsg  int
	seconds observer // op, result → latency; may be nil
	// rma, when set, makes each peer's data-plane client an RMAClient:
	// its DRAM blocks are read one-sidedly (fabric.go).
	rma *transfer.RMA
	// What gets over TCP found, from peers without one-sided reads (the
	// RMA transport counts its own).
	tcpValues, tcpBytes atomic.Int64

	stop chan struct{}
	done chan struct{}

	mu struct {
		sync.Mutex
		m      map[string]*peer
		closed bool
	}
}

// observer records a peer call's latency by operation and result.
type observer func(op, result string, d time.Duration)

// peer is one other member as peers reaches it.
type peer struct {
	id        string
	meta      gossip.MemberMeta
	data      *transfer.Client
	rma       *transfer.RMAClient // with one-sided reads; its TCP client is data
	conn      *grpc.ClientConn
	lookup    kvmeshv1.PeerServiceClient
	downUntil atomic.Int64 // unix nanoseconds; 0 when up
}

var _ store.Peers = (*peers)(nil)

func newPeers(m *gossip.Membership, tcp transfer.ClientOptions, backoff time.Duration, maxMsg int, obs observer, log *slog.Logger) *peers {
	p := &peers{members: m, log: log, tcp: tcp, backoff: backoff, maxMsg: maxMsg, seconds: obs,
		stop: make(chan struct{}), done: make(chan struct{})}
	p.mu.m = make(map[string]*peer)
	go p.prune(m.Subscribe())
	return p
}

// prune closes the clients of members that left or moved, after every
// membership change, until Close.
func (p *peers) prune(changed <-chan struct{}) {
	defer close(p.done)
	for {
		select {
		case <-p.stop:
			return
		case <-changed:
		}
		var gone []*peer
		p.mu.Lock()
		for id, pe := range p.mu.m {
			if mi, ok := p.members.Member(id); !ok || mi.Meta.DataAddr != pe.meta.DataAddr || mi.Meta.GRPCAddr != pe.meta.GRPCAddr {
				gone = append(gone, pe)
				delete(p.mu.m, id)
			}
		}
		p.mu.Unlock()
		for _, pe := range gone {
			pe.close()
		}
	}
}

// Close closes every client; calls in flight fail (as misses).
func (p *peers) Close() error {
	p.mu.Lock()
	if p.mu.closed {
		p.mu.Unlock()
		return nil
	}
	p.mu.closed = true
	all := p.mu.m
	p.mu.m = nil
	p.mu.Unlock()
	close(p.stop)
	<-p.done
	for _, pe := range all {
		pe.close()
	}
	return nil
}

func (pe *peer) close() {
	if pe.rma != nil {
		pe.rma.Close() // data with it
	} else {
		pe.data.Close()
	}
	pe.conn.Close()
}

// peer returns the clients of member id, making them on first use.
func (p *peers) peer(id string) (*peer, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.mu.closed {
		return nil, errPeersShut
	}
	if pe := p.mu.m[id]; pe != nil {
		return pe, nil
	}
	mi, ok := p.members.Member(id)
	if !ok {
		return nil, fmt.Errorf("%w: %s", errNotMember, id)
	}
	var rma *transfer.RMAClient
	var data *transfer.Client
	var err error
	if p.rma != nil {
		if rma, err = p.rma.Client(mi.Meta.DataAddr); err == nil {
			data = rma.TCP()
		}
	} else {
		data, err = transfer.NewClient(mi.Meta.DataAddr, &p.tcp)
	}
	if err != nil {
		return nil, fmt.Errorf("node: data plane client of %s: %w", id, err)
	}
	conn, err := grpc.NewClient(mi.Meta.GRPCAddr, append(p.grpcSecurity(),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(p.maxMsg), grpc.MaxCallSendMsgSize(p.maxMsg)),
		// A peer that comes back is reached within a second, not after
		// gRPC's default backoff of up to two minutes.
		grpc.WithConnectParams(grpc.ConnectParams{
			Backoff:           backoff.Config{BaseDelay: 100 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: time.Second},
			MinConnectTimeout: time.Second,
		}))...)
	if err != nil {
		if rma != nil {
			rma.Close()
		} else {
			data.Close()
		}
		return nil, fmt.Errorf("node: gRPC client of %s: %w", id, err)
	}
	pe := &peer{id: id, meta: mi.Meta, data: data, rma: rma, conn: conn, lookup: kvmeshv1.NewPeerServiceClient(conn)}
	p.mu.m[id] = pe
	return pe, nil
}

// grpcSecurity returns the dial options that reach a peer's gRPC API as the
// data plane reaches it: TLS with the peers' configuration, the node's token.
func (p *peers) grpcSecurity() []grpc.DialOption {
	creds := insecure.NewCredentials()
	if p.tcp.TLS != nil {
		creds = credentials.NewTLS(p.tcp.TLS)
	}
	out := []grpc.DialOption{grpc.WithTransportCredentials(creds)}
	if p.tcp.Token != "" {
		out = append(out, grpc.WithPerRPCCredentials(bearer(p.tcp.Token)))
	}
	return out
}

// call runs fn against member id unless it is backing off, records the
// outcome, and starts a backoff after a failure the caller did not cause.
func (p *peers) call(ctx context.Context, op, id string, fn func(pe *peer) error) error {
	start := time.Now()
	pe, err := p.peer(id)
	if err == nil && start.UnixNano() < pe.downUntil.Load() {
		err = errPeerDown
	}
	if err != nil {
		p.observe(op, "skipped", start)
		return err
	}
	budget := time.Duration(1<<63 - 1)
	if dl, ok := ctx.Deadline(); ok {
		budget = dl.Sub(start)
	}
	err = fn(pe)
	switch {
	case err == nil:
		pe.downUntil.Store(0)
		p.observe(op, "ok", start)
		return nil
	case errors.Is(ctx.Err(), context.Canceled):
		// The caller gave up: says nothing about the peer.
	case errors.Is(err, context.DeadlineExceeded) && budget < minBudget:
		// Too little time to judge the peer.
	default:
		if pe.downUntil.Swap(time.Now().Add(p.backoff).UnixNano()) == 0 {
			p.log.Warn("peer failed; its blocks are misses while it is skipped", "peer", id, "op", op, "skip", p.backoff, "err", err)
		}
	}
	p.observe(op, "error", start)
	return err
}

// minBudget is the least time a call must have had for its timing out to
// count against the peer.
const minBudget = 10 * time.Millisecond

func (p *peers) observe(op, result string, start time.Time) {
	if p.seconds != nil {
		p.seconds(op, result, time.Since(start))
	}
}

// Lookup asks member id, in one data-plane lookup request, how many leading
// keys of each run it holds.
func (p *peers) Lookup(ctx context.Context, id string, runs [][]prefixhash.Key) ([]int, error) {
	var counts []int
	err := p.call(ctx, "lookup", id, func(pe *peer) (err error) {
		counts, err = pe.data.Lookup(ctx, runs)
		return err
	})
	return counts, err
}

// grpcLookup is Lookup over gRPC (PeerService.Lookup), for comparison.
func (p *peers) grpcLookup(ctx context.Context, id string, runs [][]prefixhash.Key) ([]int, error) {
	n := 0
	for _, r := range runs {
		n += len(r)
	}
	req := &kvmeshv1.PeerServiceLookupRequest{Keys: make([]byte, 0, n*prefixhash.KeySize), Runs: make([]uint32, len(runs))}
	for i, r := range runs {
		for _, k := range r {
			req.Keys = append(req.Keys, k[:]...)
		}
		req.Runs[i] = uint32(len(r))
	}
	var counts []int
	err := p.call(ctx, "lookup", id, func(pe *peer) error {
		resp, err := pe.lookup.Lookup(ctx, req)
		if err != nil {
			return err
		}
		if len(resp.GetCounts()) != len(runs) {
			return fmt.Errorf("node: peer %s answered %d counts for %d runs", id, len(resp.GetCounts()), len(runs))
		}
		counts = make([]int, len(runs))
		for i, c := range resp.GetCounts() {
			counts[i] = min(int(c), len(runs[i]))
		}
		return nil
	})
	return counts, err
}

// Get reads blocks from member id over the data plane. The blocks alias the
// transfer Result's buffers until release.
func (p *peers) Get(ctx context.Context, id string, keys []prefixhash.Key) ([][]byte, func(), error) {
	var r *transfer.Result
	err := p.call(ctx, "get", id, func(pe *peer) (err error) {
		if pe.rma != nil {
			r, err = pe.rma.Get(ctx, keys)
			return err
		}
		if r, err = pe.data.Get(ctx, keys); err == nil {
			for _, v := range r.Values {
				if v != nil {
					p.tcpValues.Add(1)
					p.tcpBytes.Add(int64(len(v)))
				}
			}
		}
		return err
	})
	if err != nil {
		return nil, nil, err
	}
	return r.Values, r.Release, nil // Values[i] is nil unless found
}

// Put pushes encoded blocks to member id over the data plane. It fails when
// the peer failed any of them (a block it dropped, full, is not a failure).
func (p *peers) Put(ctx context.Context, id string, blocks [][]byte) error {
	keys := make([]prefixhash.Key, len(blocks))
	for i, b := range blocks {
		h, err := block.DecodeHeader(b, 0)
		if err != nil {
			return fmt.Errorf("node: push of a block that does not decode: %w", err)
		}
		keys[i] = h.Key
	}
	var st []transfer.Status
	err := p.call(ctx, "put", id, func(pe *peer) (err error) {
		st, err = pe.data.Put(ctx, keys, blocks)
		return err
	})
	if err != nil {
		return err
	}
	// A refused block says something about the block, not the peer: no
	// backoff for it.
	failed := 0
	for _, s := range st {
		if s == transfer.StatusError {
			failed++
		}
	}
	if failed > 0 {
		return fmt.Errorf("node: peer %s refused %d of %d pushed blocks", id, failed, len(blocks))
	}
	return nil
}
