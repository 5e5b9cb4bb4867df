package bench

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvmesh/kvmesh/gossip"
	"github.com/kvmesh/kvmesh/gossip/gossiptest"
)

// gossipSim is N real gossip.Memberships (memberlist and kvmesh's
// refresher and reconnector) on a simulated network in this process.
type gossipSim struct {
	net      *gossiptest.Network
	dilation float64
	profile  string
	rng      *rand.Rand
	log      *slog.Logger

	// refutes counts the suspicions members refuted (memberlist's
	// "Refuting a suspect message"): each a member wrongly suspected, on
	// this machine because the process fell behind its timers.
	refutes atomic.Int64

	mu      sync.Mutex
	members map[string]*gossip.Membership // live, by id
	next    int                           // the next node number
}

// simSeed is the node every other joins through while it is live, as the
// nodes of a deployment join the seeds it names (kvmesh serve --join): a
// seed knows every member whose join it answered, so a new node learns the
// whole cluster from its join. pick never chooses it.
var simSeed = simNodeID(0)

// gossipSimOptions configure a gossipSim.
type gossipSimOptions struct {
	Links    gossiptest.Links
	Dilation float64
	Loss     float64
	Seed     uint64
	// Profile is node.Options.GossipProfile: "lan" or "local".
	Profile string
	Log     *slog.Logger
}

func newGossipSim(o gossipSimOptions) *gossipSim {
	g := &gossipSim{
		net:      gossiptest.NewNetwork(gossiptest.Options{Links: o.Links, Dilation: o.Dilation, Loss: o.Loss, Seed: o.Seed}),
		dilation: o.Dilation, profile: o.Profile, rng: rand.New(rand.NewPCG(o.Seed, 0x676f73)),
		members: map[string]*gossip.Membership{},
	}
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	g.log = slog.New(&refuteCounter{Handler: o.Log.Handler(), n: &g.refutes})
	return g
}

// refuteCounter counts the members' refutations and passes every record on.
type refuteCounter struct {
	slog.Handler
	n *atomic.Int64
}

func (h *refuteCounter) Enabled(ctx context.Context, l slog.Level) bool {
	return l >= slog.LevelWarn || h.Handler.Enabled(ctx, l)
}

func (h *refuteCounter) Handle(ctx context.Context, r slog.Record) error {
	if strings.HasPrefix(r.Message, "memberlist: Refuting") {
		h.n.Add(1)
	}
	if !h.Handler.Enabled(ctx, r.Level) {
		return nil
	}
	return h.Handler.Handle(ctx, r)
}

func (h *refuteCounter) WithAttrs(as []slog.Attr) slog.Handler {
	return &refuteCounter{Handler: h.Handler.WithAttrs(as), n: h.n}
}

func (h *refuteCounter) WithGroup(name string) slog.Handler {
	return &refuteCounter{Handler: h.Handler.WithGroup(name), n: h.n}
}

// simNodeID names node i of a simulation.
func simNodeID(i int) string { return fmt.Sprintf("n%04d", i) }

// simMeta is what a simulated node gossips: a node's real metadata shape,
// with addresses of its own, 64 GiB of DRAM and 1 TiB of NVMe.
func simMeta(i int) gossip.MemberMeta {
	host := fmt.Sprintf("10.%d.%d.%d", i>>16&255, i>>8&255, i&255)
	return gossip.MemberMeta{GRPCAddr: host + ":7600", HTTPAddr: host + ":7601", DataAddr: host + ":7602",
		DRAMBytes: 64 << 30, NVMeBytes: 1 << 40, Version: "scale-sim", Role: gossip.RoleBoth}
}

// real converts a dilated duration measured on the wall clock to the
// protocol's own time.
func (g *gossipSim) real(d time.Duration) time.Duration {
	return time.Duration(float64(d) / g.dilation)
}

// dilate converts a protocol duration to the wall clock's.
func (g *gossipSim) dilate(d time.Duration) time.Duration {
	return time.Duration(float64(d) * g.dilation)
}

// start starts one node, joining the seed (simSeed), or a random live
// member once the seed is gone (none for the first), and returns its id.
// A join that times out (a seed starved of CPU answers late) is tried
// again, as a new node through a random member, twice.
func (g *gossipSim) start() (string, error) {
	var errs []error
	for try := range 3 {
		g.mu.Lock()
		i := g.next
		g.next++
		var join []string
		if s := g.members[simSeed]; s != nil && try == 0 {
			join = []string{s.GossipAddr()}
		} else if len(g.members) > 0 {
			ids := g.idsLocked()
			join = []string{g.members[ids[g.rng.IntN(len(ids))]].GossipAddr()}
		}
		g.mu.Unlock()
		id := simNodeID(i)
		reconnect := 10 * time.Second
		if g.profile == "local" {
			reconnect = time.Second
		}
		m, err := gossip.Start(gossip.Options{NodeID: id, Transport: g.net.NewTransport(id), Join: join,
			Meta: simMeta(i), Fast: g.profile == "local", Logger: g.log, Tune: gossiptest.Dilate(g.dilation),
			ReconnectInterval: g.dilate(reconnect)})
		if err == nil {
			g.mu.Lock()
			g.members[id] = m
			g.mu.Unlock()
			return id, nil
		}
		g.net.SetDown(id, true) // its seed may have merged it: a crash, as they see it
		errs = append(errs, fmt.Errorf("bench: scale: start %s: %w", id, err))
		if !errors.Is(err, gossip.ErrJoin) {
			break
		}
		g.log.Warn("join failed; trying again as a new node", "node", id, "err", err)
	}
	return "", errors.Join(errs...)
}

// idsLocked returns the live ids, sorted.
func (g *gossipSim) idsLocked() []string {
	ids := make([]string, 0, len(g.members))
	for id := range g.members {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	return ids
}

// live returns the live members, by id order.
func (g *gossipSim) live() ([]string, []*gossip.Membership) {
	g.mu.Lock()
	defer g.mu.Unlock()
	ids := g.idsLocked()
	ms := make([]*gossip.Membership, len(ids))
	for i, id := range ids {
		ms[i] = g.members[id]
	}
	return ids, ms
}

// pick returns a random live id, not the seed's while another is live.
func (g *gossipSim) pick() string {
	g.mu.Lock()
	defer g.mu.Unlock()
	ids := g.idsLocked()
	if len(ids) > 1 {
		ids = slices.DeleteFunc(ids, func(id string) bool { return id == simSeed })
	}
	return ids[g.rng.IntN(len(ids))]
}

// grow starts n nodes, a few at a time, and waits until every one sees all
// of them (or ctx ends). It returns how long that took, in protocol time.
func (g *gossipSim) grow(ctx context.Context, n int, bar Bar) (time.Duration, error) {
	start := time.Now()
	if _, err := g.start(); err != nil {
		return 0, err
	}
	const parallel = 8
	for done := 1; done < n; {
		k := min(parallel, n-done)
		errs := make([]error, k)
		var wg sync.WaitGroup
		for j := range k {
			wg.Add(1)
			go func() {
				defer wg.Done()
				_, errs[j] = g.start()
			}()
		}
		wg.Wait()
		if err := errors.Join(errs...); err != nil {
			return 0, err
		}
		done += k
		bar.Describe(fmt.Sprintf("scale: %d nodes: %d started", n, done))
		if ctx.Err() != nil {
			return 0, ctx.Err()
		}
	}
	_, err := g.watch(ctx, func(m *gossip.Membership) bool { ms, _ := m.Members(); return len(ms) == n }, 0)
	return g.real(time.Since(start)), err
}

// watch polls every live member until pred holds for it, and returns, in
// protocol time since the call, when it first held for each (sorted). It
// returns when pred holds everywhere or ctx ends. skip, when set, names a
// member left out.
func (g *gossipSim) watch(ctx context.Context, pred func(*gossip.Membership) bool, limit time.Duration, skip ...string) ([]time.Duration, error) {
	t0 := time.Now()
	ids, ms := g.live()
	var watched []*gossip.Membership
	for i, m := range ms {
		if !slices.Contains(skip, ids[i]) {
			watched = append(watched, m)
		}
	}
	seen := make([]time.Duration, len(watched))
	left := len(watched)
	for i := range seen {
		seen[i] = -1
	}
	tick := time.NewTicker(max(g.dilate(2*time.Millisecond), time.Millisecond))
	defer tick.Stop()
	for left > 0 {
		now := time.Since(t0)
		for i, m := range watched {
			if seen[i] < 0 && pred(m) {
				seen[i] = g.real(now)
				left--
			}
		}
		if left == 0 {
			break
		}
		if limit > 0 && g.real(now) > limit {
			return nil, fmt.Errorf("bench: scale: %d of %d members still waiting after %v", left, len(watched), limit)
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-tick.C:
		}
	}
	slices.Sort(seen)
	return seen, nil
}

// seenBy returns the times by which 99% and 100% of members saw a change.
func seenBy(seen []time.Duration) (p99, all time.Duration) {
	if len(seen) == 0 {
		return 0, 0
	}
	i := (len(seen)*99+99)/100 - 1
	return seen[min(i, len(seen)-1)], seen[len(seen)-1]
}

// has reports whether m sees member id.
func has(id string) func(*gossip.Membership) bool {
	return func(m *gossip.Membership) bool { _, ok := m.Member(id); return ok }
}

// lacks reports whether m no longer sees member id.
func lacks(id string) func(*gossip.Membership) bool {
	return func(m *gossip.Membership) bool { _, ok := m.Member(id); return !ok }
}

// churnBacklogs makes every live member advertise a new backlog
// (gossip.Membership.SetBacklog, as openai's work stealing does) every
// interval of protocol time, each from a random phase, alternating
// between two buckets, until stop is called; it returns how many
// advertisements were made, read after stop.
func (g *gossipSim) churnBacklogs(interval time.Duration) (stop func() (calls int64)) {
	_, ms := g.live()
	done := make(chan struct{})
	var wg sync.WaitGroup
	var calls atomic.Int64
	for i, m := range ms {
		phase := time.Duration(g.rng.Int64N(int64(g.dilate(interval))))
		wg.Add(1)
		go func() {
			defer wg.Done()
			t := time.NewTimer(phase)
			defer t.Stop()
			for b := 1 + i%2; ; b = 3 - b { // 1, 2, 1, ...: the bucket changes every time
				select {
				case <-done:
					return
				case <-t.C:
				}
				if err := m.SetBacklog(b); err != nil {
					g.log.Warn("advertise backlog", "err", err)
				}
				calls.Add(1)
				t.Reset(g.dilate(interval))
			}
		}()
	}
	return func() int64 {
		close(done)
		wg.Wait()
		return calls.Load()
	}
}

// calm waits until gossip is calm: the packets a member sends a second over
// a window of protocol time are fewer than 5 (a probe and an ack and the
// odd gossip; a member with broadcasts queued sends up to 15 more) and
// within 10% of the window's before. A mass join leaves every member
// retransmitting each new member's broadcast some 4 × log10 N times at
// up to 15 packets a second, which takes minutes at 1,024 members. It
// returns how long it waited, in protocol time, and whether gossip was
// calm by then or limit passed.
func (g *gossipSim) calm(ctx context.Context, window, limit time.Duration) (time.Duration, bool, error) {
	start := time.Now()
	prev := -1.0
	for {
		c0, t0 := g.counters(), time.Now()
		if err := sleepCtx(ctx, g.dilate(window)); err != nil {
			return 0, false, err
		}
		n, _ := g.live()
		rate := float64(g.counters().Sub(c0).Packets) / g.real(time.Since(t0)).Seconds() / float64(len(n))
		took := g.real(time.Since(start))
		if rate < 5 && prev >= 0 && rate <= 1.1*prev && rate >= prev/1.1 {
			return took, true, nil
		}
		if took >= limit {
			return took, false, nil
		}
		prev = rate
	}
}

// counters sums what every node sent so far.
func (g *gossipSim) counters() gossiptest.Counters {
	ids, _ := g.live()
	var sum gossiptest.Counters
	for _, id := range ids {
		sum = sum.Add(g.net.Counters(id))
	}
	return sum
}

// crash cuts member id off the network and stops it without a leave.
func (g *gossipSim) crash(id string) {
	g.net.SetDown(id, true)
	g.mu.Lock()
	m := g.members[id]
	delete(g.members, id)
	g.mu.Unlock()
	m.Close()
}

// leave makes member id leave gracefully, then stops it.
func (g *gossipSim) leave(id string) error {
	g.mu.Lock()
	m := g.members[id]
	delete(g.members, id)
	g.mu.Unlock()
	err := m.Leave(g.dilate(2 * time.Second))
	m.Close()
	return err
}

// Close stops every member and the network.
func (g *gossipSim) Close() {
	_, ms := g.live()
	var wg sync.WaitGroup
	for _, m := range ms {
		wg.Add(1)
		go func() {
			defer wg.Done()
			m.Close()
		}()
	}
	wg.Wait()
	g.net.Close()
}
