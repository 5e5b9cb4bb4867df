package bench

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"runtime"
	"slices"
	"time"

	"github.com/kvmesh/kvmesh/gossip/gossiptest"
)

// ScaleOptions configure the scale suite. Zero fields take the defaults
// documented on each, for a full run or for --quick.
type ScaleOptions struct {
	// Nodes are the cluster sizes simulated. Default 16, 64, 256 and 1024;
	// quick 16 and 64.
	Nodes []int
	// Phases are what is measured: "membership", "placement", "lookup",
	// and "gossip" (membership's steady cost alone, without the timed
	// changes). Default placement, lookup and membership. (The control traffic besides gossip, work
	// stealing's claims, is not simulated: BENCHMARKS.md measures it on
	// real processes.)
	Phases []string
	// Links is the latency model of the simulated network, for gossip and
	// for the data plane. Default gossiptest.Links' (50µs median round
	// trip, 1% of links at 5ms).
	Links gossiptest.Links
	// Dilation slows the gossip simulation's clock: memberlist's timers and
	// the links' latencies are multiplied by it and the times measured are
	// divided by it, so that a loaded machine's scheduling delays weigh
	// Dilation times less. The lookup phase holds each answer for its
	// link's round trip times Dilation of real time, so that answers come
	// in the network's order (the time it reports stays virtual). Default
	// 4; quick 2.
	Dilation float64
	// LargeDilation is Dilation at LargeNodes nodes and more, where the
	// members' own CPU work (bootstraps, push-pulls of long member lists,
	// a partition's storm of suspicions) grows. Default 8; quick Dilation.
	LargeDilation float64
	// Profile is the gossip profile simulated (kvmesh serve
	// --gossip-profile): "lan" or "local". Default "lan".
	Profile string
	// SteadyWindow is how long gossip traffic is counted once the cluster
	// is whole, in protocol time. Default 60s; quick 10s.
	SteadyWindow time.Duration
	// Repeats is how many joins, leaves and crashes are timed per size.
	// Default 3; quick 1.
	Repeats int
	// LargeRepeats is Repeats at LargeNodes nodes and more. Default 1.
	LargeRepeats int
	// LargeNodes is the size from which LargeDilation and LargeRepeats
	// apply. Default 1024.
	LargeNodes int
	// BacklogWindow, when set, measures gossip's cost while every member's
	// advertised backlog changes every StealInterval, over this much
	// protocol time after the steady window. Default 0: not measured
	// ("backlog" in Phases sets 30s).
	BacklogWindow time.Duration
	// CalmLimit is the most the membership phase waits, after the
	// bootstrap and 40s, for gossip to calm down before its steady window
	// (gossipSim.calm). Default 2m; 20s from LargeNodes nodes, where the
	// joins' broadcasts take minutes to retransmit (the row says so).
	CalmLimit time.Duration
	// StealInterval is how often a member's backlog changes in that
	// measurement (openai's BatchOptions.StealInterval). Default 1s.
	StealInterval time.Duration
	// Seed draws the links, the members picked and the prompts. Default 1.
	Seed uint64
}

// scalePhases are the phases of the scale suite, in the order they run.
var scalePhases = []string{"placement", "lookup", "membership", "gossip", "backlog"}

// scaleDefaultPhases run when none is named: "gossip" is part of
// "membership"; "backlog" is "gossip" with BacklogWindow.
var scaleDefaultPhases = []string{"placement", "lookup", "membership"}

// EnsureDefaults fills zero fields with their defaults for a full run, or
// for --quick when quick is set.
func (o *ScaleOptions) EnsureDefaults(quick bool) {
	if len(o.Nodes) == 0 {
		o.Nodes = pick(quick, []int{16, 64, 256, 1024}, []int{16, 64})
	}
	if len(o.Phases) == 0 {
		o.Phases = scaleDefaultPhases
	}
	o.Links.EnsureDefaults()
	if o.Dilation == 0 {
		o.Dilation = pick(quick, 4.0, 2.0)
	}
	if o.Profile == "" {
		o.Profile = "lan"
	}
	if o.SteadyWindow == 0 {
		o.SteadyWindow = pick(quick, 60*time.Second, 10*time.Second)
	}
	if o.LargeDilation == 0 {
		o.LargeDilation = pick(quick, 8, o.Dilation)
	}
	if o.Repeats == 0 {
		o.Repeats = pick(quick, 3, 1)
	}
	if o.LargeRepeats == 0 {
		o.LargeRepeats = 1
	}
	if o.LargeNodes == 0 {
		o.LargeNodes = 1024
	}
	if o.BacklogWindow == 0 && slices.Contains(o.Phases, "backlog") {
		o.BacklogWindow = 30 * time.Second
	}
	if o.CalmLimit == 0 {
		o.CalmLimit = 2 * time.Minute
	}
	if o.StealInterval == 0 {
		o.StealInterval = time.Second
	}
	if o.Seed == 0 {
		o.Seed = 1
	}
}

// Validate names the first field that is out of range.
func (o *ScaleOptions) Validate() error {
	for _, n := range o.Nodes {
		if n < 2 || n > 4096 {
			return fmt.Errorf("bench: scale: %d nodes is outside 2..4096", n)
		}
	}
	for _, p := range o.Phases {
		if !slices.Contains(scalePhases, p) {
			return fmt.Errorf("bench: scale: phase %q: want one of %v", p, scalePhases)
		}
	}
	switch {
	case len(o.Nodes) == 0:
		return errors.New("bench: scale: no cluster sizes")
	case o.Dilation < 1 || o.Dilation > 100 || o.LargeDilation < 1 || o.LargeDilation > 100:
		return fmt.Errorf("bench: scale: dilation %v (%v at %d nodes) is outside 1..100", o.Dilation, o.LargeDilation, o.LargeNodes)
	case o.Profile != "lan" && o.Profile != "local":
		return fmt.Errorf("bench: scale: gossip profile %q: want lan or local", o.Profile)
	case o.SteadyWindow <= 0:
		return fmt.Errorf("bench: scale: steady window %v must be positive", o.SteadyWindow)
	case o.Repeats < 1 || o.Repeats > 100 || o.LargeRepeats < 1 || o.LargeRepeats > 100:
		return fmt.Errorf("bench: scale: repeats %d (%d at %d nodes) is outside 1..100", o.Repeats, o.LargeRepeats, o.LargeNodes)
	}
	return nil
}

// at returns the dilation, the repeats and the calm limit of the
// membership phase at n nodes.
func (o *ScaleOptions) at(n int) (dilation float64, repeats int, calm time.Duration) {
	if n >= o.LargeNodes {
		return o.LargeDilation, o.LargeRepeats, min(o.CalmLimit, 20*time.Second)
	}
	return o.Dilation, o.Repeats, o.CalmLimit
}

// ScaleSuite simulates clusters of up to thousands of nodes in this
// process, with kvmesh's own code for everything but the wire, and reports
// what grows with the cluster's size: gossip (package gossip over
// memberlist, on gossiptest's simulated network), placement (store's
// rendezvous hashing), lookups, pushes and handoffs (store.Cluster over
// store.Local, peers reached through an in-process model of the data plane
// that charges each call its link's round trip on a virtual clock), with
// the pushes each node makes. See scaleReal for what is real and what is
// modelled.
type ScaleSuite struct {
	Options ScaleOptions
}

// Name returns "scale".
func (s *ScaleSuite) Name() string { return "scale" }

func (*ScaleSuite) notInAll() {}

// scaleReal says, in the report, which parts of a scale run are kvmesh's
// code and which are modelled.
const scaleReal = "real code: gossip.Membership over memberlist (probes, suspicion, push-pull, kvmesh's refresher and reconnector), " +
	"store.Placement, store.Cluster's lookup, push queues and handoff, store.Local with a DRAM tier on each node; " +
	"modelled: the network (gossiptest: per-link round trips drawn once per pair, loss, partitions; memberlist's timers dilated), " +
	"the data plane's wire (a peer call runs the owner's store.Local in process and is charged its link's round trip on a virtual clock; " +
	"its answer is held for that round trip times the dilation, so answers come in the network's order), " +
	"the membership the data plane sees (a fixed member list, changed by the harness as gossip would)"

// Run measures.
func (s *ScaleSuite) Run(ctx context.Context, env *Env) (*Result, error) {
	o := s.Options
	o.EnsureDefaults(env.Quick)
	if err := o.Validate(); err != nil {
		return nil, err
	}
	res := &Result{Suite: s.Name()}
	res.Note("%s", scaleReal)
	res.Note("links: median round trip %v (log-normal spread %.2f), %.1f%% of links at %v; seed %d; gossip profile %s, dilation %.0f× (%.0f× from %d nodes)",
		o.Links.MedianRTT, o.Links.Spread, 100*o.Links.SlowFraction, o.Links.SlowRTT, o.Seed, o.Profile, o.Dilation, o.LargeDilation, o.LargeNodes)
	if l, err := loadAverage(); err == nil {
		res.Note("machine load average at start: %.2f over %d CPUs", l, runtime.NumCPU())
	}
	bar := env.Progress.Bar(int64(len(o.Nodes)*len(o.Phases)), "scale")
	defer bar.Finish()
	var membership scaleMembership
	var placement scalePlacement
	var lookup scaleLookup
	report := func() {
		placement.report(res, env)
		lookup.report(res, env)
		membership.report(res, env, o)
	}
	for _, phase := range scalePhases {
		if !slices.Contains(o.Phases, phase) {
			continue
		}
		for _, n := range o.Nodes {
			bar.Describe(fmt.Sprintf("scale: %s, %d nodes", phase, n))
			var err error
			switch phase {
			case "placement":
				err = placement.measure(ctx, o, n, env.Quick)
			case "lookup":
				err = lookup.measure(ctx, o, n, env.Quick, bar)
			case "membership", "gossip", "backlog":
				po := o
				if phase != "backlog" {
					po.BacklogWindow = 0
				}
				err = membership.measure(ctx, env, po, n, phase == "membership", bar)
			}
			if err != nil {
				report()
				return res, fmt.Errorf("bench: scale: %s at %d nodes: %w", phase, n, err)
			}
			bar.Add(1)
		}
	}
	report()
	if l, err := loadAverage(); err == nil {
		res.Note("machine load average at the end: %.2f", l)
	}
	return res, nil
}

// savePlot writes p as env.OutDir/name (nothing without an OutDir) and
// lists it in res; a plot that fails is a note, not an error.
func savePlot(res *Result, env *Env, name string, p LinePlot) {
	if env.OutDir == "" {
		return
	}
	path := filepath.Join(env.OutDir, name)
	if err := p.Save(path); err != nil {
		res.Note("plot %s: %v", name, err)
		return
	}
	res.Plots = append(res.Plots, path)
}
