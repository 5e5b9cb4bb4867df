package bench

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvmesh/kvmesh/auth"
	"github.com/kvmesh/kvmesh/block"
	"github.com/kvmesh/kvmesh/gossip/gossiptest"
	"github.com/kvmesh/kvmesh/prefixhash"
	"github.com/kvmesh/kvmesh/store"
	"github.com/kvmesh/kvmesh/tiers"
)

// dataSim is the data plane of N nodes in this process: each node is a
// store.Cluster over a store.Local with a small DRAM tier, as kvmesh serve
// builds it; peers reach each other through simPeers, which runs the
// owner's store.Local in process, as the node's data-plane server does, and
// charges the call its link's round trip on the caller's virtual clock.
type dataSim struct {
	links *gossiptest.Links
	opts  store.ClusterOptions
	// dilation, when positive, holds each timed call's answer for its
	// virtual round trip times dilation of real time, so that the caller
	// sees the answers of a round in the order the network would bring
	// them (the slow links' last): a lookup that acts on the answers it
	// has (store's speculative rounds) acts as it would on that network.
	// The time charged stays virtual. Zero: answers come at once.
	dilation float64
	nodes    []*dataNode
	byID     map[string]*dataNode
	members  atomic.Pointer[memberList]

	c struct {
		lookups, lookupKeys, gets, puts, putBlocks atomic.Uint64
	}
	mu struct {
		sync.Mutex
		held map[string]map[string]struct{} // node → the peers it called
	}
}

// memberList is the membership every node of a dataSim sees.
type memberList struct {
	members []store.Member
	version uint64
}

// dataNode is one node of a dataSim.
type dataNode struct {
	id      string
	local   *store.Local
	cluster *store.Cluster
	gone    atomic.Bool // left or crashed: calls to it fail
}

// dataView is a node's store.Membership: the dataSim's member list.
type dataView struct {
	s  *dataSim
	id string
}

func (v dataView) LocalID() string { return v.id }
func (v dataView) Members() ([]store.Member, uint64) {
	m := v.s.members.Load()
	return m.members, m.version
}

// newDataSim starts n nodes, each with dramBytes of DRAM.
func newDataSim(n int, links *gossiptest.Links, opts store.ClusterOptions, dramBytes int64) (*dataSim, error) {
	s := &dataSim{links: links, opts: opts, byID: map[string]*dataNode{}}
	s.mu.held = map[string]map[string]struct{}{}
	s.opts.EnsureDefaults()
	ms := make([]store.Member, n)
	for i := range n {
		ms[i] = store.Member{ID: simNodeID(i), Weight: float64(dramBytes)}
	}
	s.members.Store(&memberList{members: ms, version: 1})
	for i := range n {
		d := &dataNode{id: simNodeID(i)}
		dram, err := tiers.NewDRAM(tiers.DRAMOptions{Capacity: dramBytes, SlabSize: 1 << 20})
		if err != nil {
			s.Close()
			return nil, fmt.Errorf("bench: scale: DRAM tier of %s: %w", d.id, err)
		}
		if d.local, err = store.Open(store.Options{DRAM: dram, MaxBlocks: 1 << 16}); err != nil {
			dram.Close()
			s.Close()
			return nil, fmt.Errorf("bench: scale: store of %s: %w", d.id, err)
		}
		if d.cluster, err = store.NewCluster(d.local, dataView{s, d.id}, &simPeers{s: s, self: d.id}, opts); err != nil {
			d.local.Close()
			s.Close()
			return nil, err
		}
		s.nodes = append(s.nodes, d)
		s.byID[d.id] = d
	}
	return s, nil
}

// remove takes node id out of every node's membership (a leave or a crash
// as gossip would report it).
func (s *dataSim) remove(id string) {
	old := s.members.Load()
	ms := make([]store.Member, 0, len(old.members))
	for _, m := range old.members {
		if m.ID != id {
			ms = append(ms, m)
		}
	}
	s.members.Store(&memberList{members: ms, version: old.version + 1})
}

// held returns how many peers node id has called.
func (s *dataSim) held(id string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.mu.held[id])
}

// Close stops every node.
func (s *dataSim) Close() {
	for _, d := range s.nodes {
		d.cluster.Close()
		d.local.Close()
	}
}

// errGone is a call to a node that left or crashed.
var errGone = errors.New("bench: scale: peer is gone")

// simPeers is one node's store.Peers in a dataSim.
type simPeers struct {
	s    *dataSim
	self string
}

var _ store.Peers = (*simPeers)(nil)

// call runs serve on the owner and charges the call on ctx's virtual clock
// (if it has one): its link's round trip. The owner's service time is CPU
// time, which the caller counts for the whole operation (on a loaded machine
// a wall-clock service time would charge other processes' load). A call
// whose charge passes the round's deadline (the store's, virtual) fails, as a
// late answer does.
func (p *simPeers) call(ctx context.Context, id string, serve func(d *dataNode)) error {
	d := p.s.byID[id]
	if d == nil || d.gone.Load() {
		return errGone
	}
	p.s.mu.Lock()
	h := p.s.mu.held[p.self]
	if h == nil {
		h = map[string]struct{}{}
		p.s.mu.held[p.self] = h
	}
	h[id] = struct{}{}
	p.s.mu.Unlock()
	vc, _ := ctx.Value(vclockKey{}).(*vclock)
	var start time.Duration
	t0 := time.Now()
	if vc != nil {
		start = vc.begin(ctx, id)
	}
	serve(d)
	if vc != nil {
		rtt := p.s.links.RTT(p.self, id)
		end := start + rtt
		if dl, ok := vc.deadline(ctx); ok && end > dl {
			vc.end(dl)
			return context.DeadlineExceeded
		}
		if p.s.dilation > 0 {
			hold := time.NewTimer(time.Until(t0.Add(time.Duration(float64(rtt) * p.s.dilation))))
			defer hold.Stop()
			select {
			case <-hold.C:
			case <-ctx.Done():
				return ctx.Err() // the caller stopped waiting: nothing to charge
			}
		}
		vc.end(end)
	}
	return nil
}

func (p *simPeers) Lookup(ctx context.Context, id string, runs [][]prefixhash.Key) ([]int, error) {
	p.s.c.lookups.Add(1)
	counts := make([]int, len(runs))
	err := p.call(ctx, id, func(d *dataNode) {
		a := auth.AccessFrom(ctx)
		for i, r := range runs {
			counts[i] = d.local.LongestPrefix(a, r)
			p.s.c.lookupKeys.Add(uint64(len(r)))
		}
	})
	if err != nil {
		return nil, err
	}
	return counts, nil
}

func (p *simPeers) Get(ctx context.Context, id string, keys []prefixhash.Key) ([][]byte, func(), error) {
	p.s.c.gets.Add(1)
	out := make([][]byte, len(keys))
	err := p.call(ctx, id, func(d *dataNode) {
		refs, err := d.local.GetMany(ctx, keys)
		if err != nil {
			return
		}
		for i, r := range refs {
			if r != nil {
				out[i] = append([]byte(nil), r.Bytes()...)
				r.Release()
			}
		}
	})
	if err != nil {
		return nil, nil, err
	}
	return out, nil, nil
}

func (p *simPeers) Put(ctx context.Context, id string, blocks [][]byte) error {
	p.s.c.puts.Add(1)
	p.s.c.putBlocks.Add(uint64(len(blocks)))
	var errs []error
	err := p.call(ctx, id, func(d *dataNode) {
		for _, b := range blocks {
			if err := d.local.Put(ctx, b); err != nil {
				errs = append(errs, err)
			}
		}
	})
	return errors.Join(append(errs, err)...)
}

// Remove drops keys on member id (objects' removal; the scale model puts
// none, but a Cluster's peers answer every call).
func (p *simPeers) Remove(ctx context.Context, id string, keys []prefixhash.Key) ([]bool, error) {
	var got []bool
	var rerr error
	err := p.call(ctx, id, func(d *dataNode) { got, rerr = d.local.Remove(ctx, keys) })
	return got, errors.Join(err, rerr)
}

// Retain sets the retention of keys on member id.
func (p *simPeers) Retain(ctx context.Context, id string, keys []prefixhash.Key, r block.Retention) ([]bool, error) {
	var got []bool
	var rerr error
	err := p.call(ctx, id, func(d *dataNode) { got, rerr = d.local.Retain(ctx, keys, r) })
	return got, errors.Join(err, rerr)
}

// vclock is the virtual time of one operation (a lookup, a get) of the
// data-plane model: each peer call starts when its round started and ends
// its link's round trip and the owner's service time later; a round ends
// when its slowest call does. Calls of one round share the context the
// store made for the round (store.Cluster's lookupRound), which is how the
// clock tells rounds apart: the first call with a new context starts a new
// round at the current time.
type vclock struct {
	mu     sync.Mutex
	now    time.Duration
	rounds map[context.Context]time.Duration // round context → its virtual start
	peers  map[string]struct{}
	calls  int
	limit  time.Duration // a round's virtual timeout (the store's LookupTimeout)
}

type vclockKey struct{}

// withVClock returns ctx carrying a new virtual clock whose rounds time out
// after limit.
func withVClock(ctx context.Context, limit time.Duration) (context.Context, *vclock) {
	vc := &vclock{rounds: map[context.Context]time.Duration{}, peers: map[string]struct{}{}, limit: limit}
	return context.WithValue(ctx, vclockKey{}, vc), vc
}

// begin records a call to id in ctx's round and returns the round's start.
func (v *vclock) begin(ctx context.Context, id string) time.Duration {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.calls++
	v.peers[id] = struct{}{}
	start, ok := v.rounds[ctx]
	if !ok {
		start = v.now
		v.rounds[ctx] = start
	}
	return start
}

// deadline returns the virtual deadline of ctx's round.
func (v *vclock) deadline(ctx context.Context) (time.Duration, bool) {
	v.mu.Lock()
	defer v.mu.Unlock()
	start, ok := v.rounds[ctx]
	return start + v.limit, ok
}

// end records that a call ended at t.
func (v *vclock) end(t time.Duration) {
	v.mu.Lock()
	v.now = max(v.now, t)
	v.mu.Unlock()
}

// result returns the operation's virtual network time, its calls and the
// peers it reached.
func (v *vclock) result() (time.Duration, int, int, int) {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.now, v.calls, len(v.peers), len(v.rounds)
}
