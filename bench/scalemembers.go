package bench

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"runtime"
	"slices"
	"time"

	"github.com/kvmesh/kvmesh/gossip"
)

// scaleMembership gathers the membership phase's figures over the sizes.
type scaleMembership struct {
	events  []scaleEventRow
	gossip  []scaleGossipRow
	backlog []scaleBacklogRow
}

// scaleBacklogRow is gossip's cost while every member's advertised backlog
// (work stealing's) changes every steal interval, beside the steady cost
// measured just before.
type scaleBacklogRow struct {
	Nodes int `json:"nodes"`
	// AdvertisementsPerNodeS is the backlog changes a member made a second
	// (SetBacklog calls; each is one metadata broadcast).
	AdvertisementsPerNodeS float64 `json:"advertisements_per_node_s"`
	SteadyBytesPerNodeS    float64 `json:"steady_bytes_per_node_s"`
	BacklogBytesPerNodeS   float64 `json:"backlog_bytes_per_node_s"`
	PacketsPerNodeS        float64 `json:"backlog_packets_per_node_s"`
	// VsSteady is BacklogBytesPerNodeS over SteadyBytesPerNodeS.
	VsSteady float64 `json:"vs_steady"`
}

// scaleEventRow is how long one kind of membership change took to reach the
// members, at one size, over the repeats.
type scaleEventRow struct {
	Nodes int `json:"nodes"`
	// Event is join (a new node), leave (graceful), crash (its traffic
	// lost, no leave) or heal (a partition of 10% of the nodes, for long
	// enough that each side dropped the other, heals: until every member
	// sees every other again).
	Event string `json:"event"`
	// P99S and AllS are when 99% and all of the other members saw it, in
	// the protocol's seconds (the median over the repeats).
	P99S    float64 `json:"p99_s"`
	AllS    float64 `json:"all_s"`
	MinAllS float64 `json:"min_all_s"`
	MaxAllS float64 `json:"max_all_s"`
	Repeats int     `json:"repeats"`
}

// scaleGossipRow is gossip's steady cost at one size.
type scaleGossipRow struct {
	Nodes int `json:"nodes"`
	// BytesPerNodeS is what a member sends per second, packets and
	// streams, once the cluster is whole and nothing changes.
	BytesPerNodeS       float64 `json:"bytes_per_node_s"`
	PacketBytesPerNodeS float64 `json:"packet_bytes_per_node_s"`
	StreamBytesPerNodeS float64 `json:"stream_bytes_per_node_s"`
	PacketsPerNodeS     float64 `json:"packets_per_node_s"`
	// StreamBytesPerExchange is the bytes of a stream (both ways) once the
	// cluster was whole, over the settling and the steady window: a
	// push-pull of N members' records (and the odd fallback ping). The
	// streams' steady cost is this over the push-pull interval, which a
	// window shorter than it samples only in part.
	StreamBytesPerExchange float64  `json:"stream_bytes_per_exchange"`
	RatioVsSmallest        *float64 `json:"ratio_vs_smallest,omitempty"`
	// BootstrapS is how long N nodes started 8 at a time took until every
	// one saw all of them.
	BootstrapS float64 `json:"bootstrap_s"`
	// SettleS is how long after that gossip took to calm down (the joins'
	// broadcasts retransmitted and every member's first push-pull made)
	// before the steady window: gossipSim.calm.
	SettleS float64 `json:"settle_s"`
	// Refutes is how many times a member refuted a suspicion of itself
	// during the steady window: members wrongly suspected, here because
	// the process fell behind their timers (a loaded machine; raise the
	// dilation). Each is a broadcast every member retransmits, counted
	// in the packets' bytes.
	Refutes int64 `json:"refutes"`
	// Calm is whether gossip was calm by then; when not (a mass join's
	// broadcasts still retransmitted, at 1,024 members), the packets'
	// figures include that and only the streams' are steady.
	Calm bool `json:"calm"`
	// HeapMiBPerNode and GoroutinesPerNode are this process's heap and
	// goroutines over the members, once whole: what simulating one costs.
	HeapMiBPerNode    float64 `json:"heap_mib_per_node"`
	GoroutinesPerNode float64 `json:"goroutines_per_node"`
	// Dilation is the factor the simulation's clock ran slower by at this
	// size (ScaleOptions.at).
	Dilation float64 `json:"dilation"`
	WallS    float64 `json:"wall_s" table:"-"`
}

// measure runs the membership phase at n nodes: the steady cost, then,
// with changes set, the timed joins, leaves, crashes and a partition.
func (s *scaleMembership) measure(ctx context.Context, env *Env, o ScaleOptions, n int, changes bool, bar Bar) error {
	began := time.Now()
	dilation, repeats, calmLimit := o.at(n)
	g := newGossipSim(gossipSimOptions{Links: o.Links, Dilation: dilation, Seed: o.Seed + uint64(n), Profile: o.Profile,
		Log: quiet(env)})
	defer g.Close()
	var before runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	g0 := runtime.NumGoroutine()
	boot, err := g.grow(ctx, n, bar)
	if err != nil {
		return err
	}
	var after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&after)
	whole := g.counters()
	row := scaleGossipRow{Nodes: n, BootstrapS: boot.Seconds(), Dilation: dilation,
		HeapMiBPerNode:    float64(int64(after.HeapInuse)-int64(before.HeapInuse)) / (1 << 20) / float64(n),
		GoroutinesPerNode: float64(runtime.NumGoroutine()-g0) / float64(n)}

	// Steady state: let the joins' broadcasts drain and every member make
	// the first push-pull it makes after starting (within the profile's
	// push-pull interval: 30s lan, 5s local), then count.
	bar.Describe(fmt.Sprintf("scale: membership, %d nodes: steady traffic", n))
	settle := 40 * time.Second
	if o.Profile == "local" {
		settle = 15 * time.Second
	}
	if err := sleepCtx(ctx, g.dilate(settle)); err != nil {
		return err
	}
	calm, ok, err := g.calm(ctx, 10*time.Second, calmLimit)
	if err != nil {
		return err
	}
	row.SettleS, row.Calm = (settle + calm).Seconds(), ok
	c0, t0, r0 := g.counters(), time.Now(), g.refutes.Load()
	if err := sleepCtx(ctx, g.dilate(o.SteadyWindow)); err != nil {
		return err
	}
	d := g.counters().Sub(c0)
	row.Refutes = g.refutes.Load() - r0
	if all := g.counters().Sub(whole); all.Streams > 0 {
		row.StreamBytesPerExchange = float64(all.StreamBytes) / float64(all.Streams)
	}
	secs := g.real(time.Since(t0)).Seconds() * float64(n)
	row.BytesPerNodeS = float64(d.Bytes()) / secs
	row.PacketBytesPerNodeS = float64(d.PacketBytes) / secs
	row.StreamBytesPerNodeS = float64(d.StreamBytes) / secs
	row.PacketsPerNodeS = float64(d.Packets) / secs
	if o.BacklogWindow > 0 {
		bar.Describe(fmt.Sprintf("scale: membership, %d nodes: backlogs changing every %v", n, o.StealInterval))
		stop := g.churnBacklogs(o.StealInterval)
		err := sleepCtx(ctx, g.dilate(o.StealInterval)) // every member has advertised once
		c0, t0 := g.counters(), time.Now()
		if err == nil {
			err = sleepCtx(ctx, g.dilate(o.BacklogWindow))
		}
		d, took := g.counters().Sub(c0), g.real(time.Since(t0))
		calls := stop()
		if err != nil {
			return err
		}
		secs := took.Seconds() * float64(n)
		b := scaleBacklogRow{Nodes: n, SteadyBytesPerNodeS: row.BytesPerNodeS, BacklogBytesPerNodeS: float64(d.Bytes()) / secs,
			PacketsPerNodeS: float64(d.Packets) / secs, AdvertisementsPerNodeS: float64(calls) / (took + o.StealInterval).Seconds() / float64(n)}
		b.VsSteady = b.BacklogBytesPerNodeS / b.SteadyBytesPerNodeS
		s.backlog = append(s.backlog, b)
		// Let the last advertisements' broadcasts drain.
		if err := sleepCtx(ctx, g.dilate(settle)); err != nil {
			return err
		}
	}
	if !changes {
		row.WallS = time.Since(began).Seconds()
		s.gossip = append(s.gossip, row)
		return nil
	}

	// Joins, leaves and crashes, each timed until every other member saw it.
	limit := 10 * time.Minute
	times := map[string][][2]time.Duration{}
	for r := range repeats {
		bar.Describe(fmt.Sprintf("scale: membership, %d nodes: changes, %d/%d", n, r+1, repeats))
		t0 := time.Now()
		id, err := g.start()
		if err != nil {
			return fmt.Errorf("join: %w", err)
		}
		// A join is timed from its start: Start returns once the new
		// node's push-pull with its seed is done.
		started := g.real(time.Since(t0))
		seen, err := g.watch(ctx, has(id), limit, id)
		if err != nil {
			return fmt.Errorf("join: %w", err)
		}
		p99, all := seenBy(seen)
		times["join"] = append(times["join"], [2]time.Duration{started + p99, started + all})

		id = g.pick()
		left := make(chan error, 1)
		go func() { left <- g.leave(id) }()
		seen, err = g.watch(ctx, lacks(id), limit)
		if lerr := <-left; err == nil && lerr != nil {
			g.log.Warn("leave", "err", lerr)
		}
		if err != nil {
			return fmt.Errorf("leave: %w", err)
		}
		p99, all = seenBy(seen)
		times["leave"] = append(times["leave"], [2]time.Duration{p99, all})

		id = g.pick()
		g.crash(id)
		if seen, err = g.watch(ctx, lacks(id), limit); err != nil {
			return fmt.Errorf("crash: %w", err)
		}
		p99, all = seenBy(seen)
		times["crash"] = append(times["crash"], [2]time.Duration{p99, all})
	}

	// A partition of 10% of the nodes, long enough for each side to drop
	// the other, then healed.
	bar.Describe(fmt.Sprintf("scale: membership, %d nodes: partition of 10%%", n))
	ids, _ := g.live()
	rng := rand.New(rand.NewPCG(o.Seed, uint64(n)))
	rng.Shuffle(len(ids), func(i, j int) { ids[i], ids[j] = ids[j], ids[i] })
	minority := ids[:max(1, len(ids)/10)]
	g.net.Partition(minority)
	side := func(m *gossip.Membership) bool {
		ms, _ := m.Members()
		if slices.Contains(minority, m.LocalID()) {
			return len(ms) == len(minority)
		}
		return len(ms) == len(ids)-len(minority)
	}
	if _, err := g.watch(ctx, side, limit); err != nil {
		return fmt.Errorf("partition: %w", err)
	}
	g.net.Heal()
	seen, err := g.watch(ctx, func(m *gossip.Membership) bool { ms, _ := m.Members(); return len(ms) == len(ids) }, limit)
	if err != nil {
		return fmt.Errorf("heal: %w", err)
	}
	p99, all := seenBy(seen)
	times["heal"] = append(times["heal"], [2]time.Duration{p99, all})

	for _, ev := range []string{"join", "leave", "crash", "heal"} {
		ts := times[ev]
		if len(ts) == 0 {
			continue
		}
		p99s := make([]float64, len(ts))
		alls := make([]float64, len(ts))
		for i, t := range ts {
			p99s[i], alls[i] = t[0].Seconds(), t[1].Seconds()
		}
		s.events = append(s.events, scaleEventRow{Nodes: n, Event: ev, P99S: medianOf(p99s), AllS: medianOf(alls),
			MinAllS: slices.Min(alls), MaxAllS: slices.Max(alls), Repeats: len(ts)})
	}
	row.WallS = time.Since(began).Seconds()
	s.gossip = append(s.gossip, row)
	return nil
}

// report adds the phase's tables, plots and checks to res.
func (s *scaleMembership) report(res *Result, env *Env, o ScaleOptions) {
	if len(s.gossip) == 0 && len(s.events) == 0 {
		return
	}
	if len(s.backlog) > 0 {
		res.AddTable("scale_backlog", fmt.Sprintf("gossip's cost per member while every member's advertised backlog (work stealing) changes "+
			"every %v, over %v of protocol time, beside the steady cost", o.StealInterval, o.BacklogWindow), s.backlog)
	}
	if len(s.gossip) > 0 {
		base := s.gossip[0].BytesPerNodeS
		for i := range s.gossip {
			r := s.gossip[i].BytesPerNodeS / base
			s.gossip[i].RatioVsSmallest = &r
		}
		res.AddTable("scale_gossip", fmt.Sprintf("gossip's steady cost per member (profile %s), counted by the simulated network over %v "+
			"of protocol time once the cluster was whole; rates in the protocol's time (each row's dilation undone)", o.Profile, o.SteadyWindow), s.gossip)
		first, last := s.gossip[0], s.gossip[len(s.gossip)-1]
		if last.Nodes >= 1024 && first.Nodes <= 16 {
			res.Checks = append(res.Checks, NewCheck(fmt.Sprintf("scale: gossip bytes per node per second, %d vs %d nodes", last.Nodes, first.Nodes),
				"bytes_per_node_s ratio", last.BytesPerNodeS/first.BytesPerNodeS, "<=", 2, BackendSimulation))
		}
		var xs, ys, ps, ss []float64
		for _, r := range s.gossip {
			xs = append(xs, float64(r.Nodes))
			ys, ps, ss = append(ys, r.BytesPerNodeS), append(ps, r.PacketBytesPerNodeS), append(ss, r.StreamBytesPerNodeS)
		}
		savePlot(res, env, "scale_gossip_bytes.png", LinePlot{Title: "gossip bytes sent per member per second, steady", XLabel: "nodes",
			YLabel: "bytes/s", LogX: true, XTick: intTick, Series: []Series{{Name: "all", X: xs, Y: ys},
				{Name: "packets (probes, gossip)", X: xs, Y: ps}, {Name: "streams (push-pull)", X: xs, Y: ss}}})
	}
	if len(s.events) > 0 {
		res.AddTable("scale_membership", "time until 99% and all of the other members saw a change, in the protocol's seconds "+
			"(median of the repeats; min/max of all_s beside)", s.events)
		var series []Series
		for _, ev := range []string{"join", "leave", "crash", "heal"} {
			var x, y99, yall []float64
			for _, r := range s.events {
				if r.Event == ev {
					x, y99, yall = append(x, float64(r.Nodes)), append(y99, r.P99S), append(yall, r.AllS)
				}
			}
			if len(x) > 0 {
				series = append(series, Series{Name: ev + " (all)", X: x, Y: yall}, Series{Name: ev + " (99%)", X: x, Y: y99, Dashed: true})
			}
		}
		savePlot(res, env, "scale_membership.png", LinePlot{Title: "membership changes: time until seen", XLabel: "nodes",
			YLabel: "seconds", LogX: true, XTick: intTick, Series: series})
	}
}

// intTick labels a tick with its integer value.
func intTick(x float64) string { return fmt.Sprint(int(x)) }

// quiet is the logger of simulated members: warnings and up.
func quiet(env *Env) *slog.Logger {
	return env.log().With("sim", true)
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
