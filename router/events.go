package router

import (
	"context"
	"encoding/hex"
	"fmt"
	"log/slog"
	"math"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvmesh/kvmesh/kvevents"
	"github.com/kvmesh/kvmesh/openai"
	"github.com/kvmesh/kvmesh/prefixhash"
)

// EngineEvents is a source of KV events the router subscribes to
// (Options.EngineEvents): an engine's (vLLM's kv-events publisher) or a
// kvmesh node's (--kv-events-addr).
type EngineEvents struct {
	// Addr is the ZMQ PUB endpoint, tcp://HOST:PORT.
	Addr string
	// ReplayAddr is the publisher's replay endpoint (ROUTER), or "": with
	// it, batches missed (a gap in the sequence numbers, or those sent
	// before the router subscribed) are asked for again.
	ReplayAddr string
	// Member is the member whose engine publishes on Addr. Empty: the
	// member the topic names, kv@<member>@<model> (llm-d's convention,
	// and a kvmesh node's default topic).
	Member string
}

// ParseEngineEvents parses a --engine-events value:
// tcp://HOST:PORT[?replay=tcp://HOST:PORT][&member=ID].
func ParseEngineEvents(s string) (EngineEvents, error) {
	addr, query, _ := strings.Cut(s, "?")
	if !strings.HasPrefix(addr, "tcp://") || len(addr) == len("tcp://") {
		return EngineEvents{}, fmt.Errorf("%q: want tcp://HOST:PORT[?replay=tcp://HOST:PORT&member=ID]", s)
	}
	e := EngineEvents{Addr: addr}
	q, err := url.ParseQuery(query)
	if err != nil {
		return EngineEvents{}, fmt.Errorf("%q: %w", s, err)
	}
	for k, v := range q {
		switch k {
		case "replay":
			e.ReplayAddr = v[len(v)-1]
			if !strings.HasPrefix(e.ReplayAddr, "tcp://") {
				return EngineEvents{}, fmt.Errorf("%q: replay=%q: want tcp://HOST:PORT", s, e.ReplayAddr)
			}
		case "member":
			e.Member = v[len(v)-1]
		default:
			return EngineEvents{}, fmt.Errorf("%q: unknown parameter %q: want replay or member", s, k)
		}
	}
	return e, nil
}

// Weights are the shares of a block's prompt tokens a node is spared,
// by where the block is (Options.Weights): in the node's engine's GPU
// memory (nothing to load or compute), in the store's DRAM or NVMe (to
// load over the network or from disk). Each is in 0..1; the zero Weights
// means DefaultWeights.
type Weights struct {
	GPU, CPU, Disk float64
}

// DefaultWeights are the weights of the zero Weights.
var DefaultWeights = Weights{GPU: 1, CPU: 0.8, Disk: 0.5}

func (w *Weights) ensureDefaults() {
	if *w == (Weights{}) {
		*w = DefaultWeights
	}
}

// validate returns an OptionError naming the first weight outside 0..1.
func (w Weights) validate() error {
	for _, f := range []struct {
		field string
		v     float64
	}{{"Weights.GPU", w.GPU}, {"Weights.CPU", w.CPU}, {"Weights.Disk", w.Disk}} {
		if math.IsNaN(f.v) || f.v < 0 || f.v > 1 {
			return &OptionError{Field: f.field, Msg: fmt.Sprintf("%v is outside 0..1", f.v)}
		}
	}
	return nil
}

// ensureEvents fills the engine-event options' defaults and checks them.
func (o *Options) ensureEvents() error {
	o.Weights.ensureDefaults()
	if o.EngineEventsTTL == 0 {
		o.EngineEventsTTL = 30 * time.Second
	}
	if o.MaxIndexedBlocks == 0 {
		o.MaxIndexedBlocks = 1 << 22
	}
	for _, e := range o.EngineEvents {
		if !strings.HasPrefix(e.Addr, "tcp://") || (e.ReplayAddr != "" && !strings.HasPrefix(e.ReplayAddr, "tcp://")) {
			return &OptionError{Field: "EngineEvents", Msg: fmt.Sprintf("%+v: want tcp://HOST:PORT endpoints", e)}
		}
	}
	if err := o.Weights.validate(); err != nil {
		return err
	}
	switch {
	case o.EngineEventsTTL < 0:
		return &OptionError{Field: "EngineEventsTTL", Msg: fmt.Sprintf("%v must not be negative", o.EngineEventsTTL)}
	case o.MaxIndexedBlocks < 0:
		return &OptionError{Field: "MaxIndexedBlocks", Msg: fmt.Sprintf("%d must not be negative", o.MaxIndexedBlocks)}
	}
	return nil
}

// followEvents starts the subscribers of the engine-event sources and the
// ageing of the index; the function it returns stops them and waits.
func (r *Router) followEvents(ctx context.Context) (stop func()) {
	if r.events == nil {
		return func() {}
	}
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	for _, src := range r.opts.EngineEvents {
		wg.Add(1)
		go func() { defer wg.Done(); r.events.subscribe(ctx, src) }()
	}
	wg.Add(1)
	go func() { defer wg.Done(); r.ageEvents(ctx) }()
	return func() { cancel(); wg.Wait() }
}

// ageEvents drops, now and then, the event-index entries of members gone
// from the cluster for longer than EngineEventsTTL.
func (r *Router) ageEvents(ctx context.Context) {
	t := time.NewTicker(max(time.Second, r.opts.EngineEventsTTL/4))
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			ms, _ := r.members.Members()
			alive := make(map[string]bool, len(ms))
			for _, m := range ms {
				alive[m.ID] = true
			}
			r.events.age(alive, now)
		}
	}
}

// Media of a block, as bits.
const (
	inGPU uint8 = 1 << iota
	inCPU
	inDisk
)

func mediumBit(m string) uint8 {
	switch m {
	case "GPU", "": // a vLLM before the medium field publishes its GPU blocks
		return inGPU
	case "CPU":
		return inCPU
	case "DISK":
		return inDisk
	}
	return 0 // a medium the router does not weigh
}

// eventIndex is what the router knows from KV events: per member, per
// topic, the media that hold each block (by its key: a hash's first 16
// bytes). Subscribers write it; the request handlers read it.
type eventIndex struct {
	log     *slog.Logger
	ttl     time.Duration
	max     int
	weights Weights

	mu struct {
		sync.RWMutex
		members map[string]*memberBlocks
		blocks  int // entries, all members together
	}

	c struct {
		events, malformed, unattributed, gaps, replays, replayFails, restarts, agedOut, overflow atomic.Uint64
	}
}

type memberBlocks struct {
	topics    map[string]map[prefixhash.Key]uint8
	lastAlive time.Time
}

func newEventIndex(opts Options) *eventIndex {
	x := &eventIndex{log: opts.Logger, ttl: opts.EngineEventsTTL, max: opts.MaxIndexedBlocks, weights: opts.Weights}
	x.mu.members = map[string]*memberBlocks{}
	return x
}

// collectors are the index's metrics.
func (x *eventIndex) collectors() []prometheus.Collector {
	counter := func(name, help string, v *atomic.Uint64) prometheus.Collector {
		return prometheus.NewCounterFunc(prometheus.CounterOpts{Name: name, Help: help}, func() float64 { return float64(v.Load()) })
	}
	return []prometheus.Collector{
		counter("kvmesh_router_engine_events_total", "KV events applied from --engine-events sources.", &x.c.events),
		counter("kvmesh_router_engine_events_malformed_total", "KV-event batches from --engine-events sources that did not decode, ignored.", &x.c.malformed),
		counter("kvmesh_router_engine_events_unattributed_total", "KV-event batches whose topic names no member (want kv@<member>@<model>, or member= in --engine-events), ignored.", &x.c.unattributed),
		counter("kvmesh_router_engine_events_gaps_total", "Gaps in a source's sequence numbers: batches the router missed.", &x.c.gaps),
		counter("kvmesh_router_engine_events_replays_total", "Replays asked of a source's replay endpoint (for a gap, or the history before the router subscribed).", &x.c.replays),
		counter("kvmesh_router_engine_events_replay_failures_total", "Replays that failed or timed out: the index misses those batches.", &x.c.replayFails),
		counter("kvmesh_router_engine_events_restarts_total", "Publishers whose sequence numbers started over (a restarted engine): what they had published is dropped.", &x.c.restarts),
		counter("kvmesh_router_engine_events_aged_out_total", "Members whose blocks were dropped after being gone from the cluster, or their publisher's connection lost, for --engine-events-ttl.", &x.c.agedOut),
		counter("kvmesh_router_engine_events_overflow_total", "Blocks not indexed: the index held --engine-events-max-blocks.", &x.c.overflow),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "kvmesh_router_engine_blocks", Help: "Blocks the router's KV-event index holds, all members together."},
			func() float64 { x.mu.RLock(); defer x.mu.RUnlock(); return float64(x.mu.blocks) }),
	}
}

// memberOfTopic returns the member a topic kv@<member>@<model> names.
func memberOfTopic(topic string) string {
	parts := strings.SplitN(topic, "@", 3)
	if len(parts) < 2 || parts[0] != "kv" {
		return ""
	}
	return parts[1]
}

func keyOf(hash []byte) prefixhash.Key {
	var k prefixhash.Key
	copy(k[:], hash)
	return k
}

// apply records a batch a member's publisher sent on topic.
func (x *eventIndex) apply(member, topic string, b *kvevents.Batch) {
	x.mu.Lock()
	defer x.mu.Unlock()
	m := x.mu.members[member]
	if m == nil {
		m = &memberBlocks{topics: map[string]map[prefixhash.Key]uint8{}, lastAlive: time.Now()}
		x.mu.members[member] = m
	}
	blocks := m.topics[topic]
	if blocks == nil {
		blocks = map[prefixhash.Key]uint8{}
		m.topics[topic] = blocks
	}
	for i := range b.Events {
		e := &b.Events[i]
		switch e.Tag {
		case kvevents.TagBlockStored:
			bit := mediumBit(e.Medium)
			for _, h := range e.BlockHashes {
				k := keyOf(h)
				old, had := blocks[k]
				if !had && x.mu.blocks >= x.max {
					x.c.overflow.Add(1)
					continue
				}
				if !had {
					x.mu.blocks++
				}
				blocks[k] = old | bit
			}
		case kvevents.TagBlockRemoved:
			bit := mediumBit(e.Medium)
			for _, h := range e.BlockHashes {
				k := keyOf(h)
				if old, had := blocks[k]; had {
					if old &^= bit; old == 0 {
						delete(blocks, k)
						x.mu.blocks--
					} else {
						blocks[k] = old
					}
				}
			}
		case kvevents.TagAllBlocksCleared:
			x.mu.blocks -= len(blocks)
			clear(blocks)
		}
		x.c.events.Add(1)
	}
}

// forget drops what members published.
func (x *eventIndex) forget(members ...string) {
	x.mu.Lock()
	defer x.mu.Unlock()
	for _, id := range members {
		if m := x.mu.members[id]; m != nil {
			for _, blocks := range m.topics {
				x.mu.blocks -= len(blocks)
			}
			delete(x.mu.members, id)
		}
	}
}

// age drops the blocks of members gone from the cluster (not in alive)
// for longer than the TTL: their engines, dead or restarted elsewhere, no
// longer hold them.
func (x *eventIndex) age(alive map[string]bool, now time.Time) {
	var gone []string
	x.mu.Lock()
	for id, m := range x.mu.members {
		switch {
		case alive[id]:
			m.lastAlive = now
		case now.Sub(m.lastAlive) > x.ttl:
			gone = append(gone, id)
		}
	}
	x.mu.Unlock()
	x.forget(gone...)
	x.c.agedOut.Add(uint64(len(gone)))
}

// costs returns, for each candidate, the prompt tokens it would compute:
// the prompt less what it is spared, block by block from the first: the
// leading blocks its engine holds in GPU memory (Weights.GPU of their
// tokens), then the blocks the store holds (the lookup's cached prefix;
// Weights.CPU or .Disk by the tier the events place them in, CPU when
// they say nothing), up to the first block held by neither.
func (x *eventIndex) costs(cands []backend, look openai.LookupResult) []int {
	bt := look.BlockTokens
	if bt <= 0 || len(look.BlockKeys) == 0 {
		return nil
	}
	keys := make([]prefixhash.Key, 0, len(look.BlockKeys))
	for _, s := range look.BlockKeys {
		var k prefixhash.Key
		if hex.DecodedLen(len(s)) != len(k) {
			return nil
		}
		if _, err := hex.Decode(k[:], []byte(s)); err != nil {
			return nil
		}
		keys = append(keys, k)
	}
	stored := min(len(keys), (look.CachedTokens+bt-1)/bt)
	w := x.weights
	x.mu.RLock()
	defer x.mu.RUnlock()
	// The store's tiers, from every member's events.
	storeWeight := make([]float64, stored)
	for i := range stored {
		var media uint8
		for _, m := range x.mu.members {
			for _, blocks := range m.topics {
				media |= blocks[keys[i]]
			}
		}
		switch {
		case media&inCPU != 0 || media&(inCPU|inDisk) == 0:
			storeWeight[i] = w.CPU
		default:
			storeWeight[i] = w.Disk
		}
	}
	out := make([]int, len(cands))
	for c, b := range cands {
		m := x.mu.members[b.id]
		saved := 0.0
		i := 0
		for ; m != nil && i < len(keys); i++ {
			held := false
			for _, blocks := range m.topics {
				if blocks[keys[i]]&inGPU != 0 {
					held = true
					break
				}
			}
			if !held {
				break
			}
			saved += w.GPU
		}
		for ; i < stored; i++ {
			saved += storeWeight[i]
		}
		out[c] = max(0, look.PromptTokens-int(math.Round(saved*float64(bt))))
	}
	return out
}

// source is the state of one subscription.
type source struct {
	EngineEvents
	last    uint64
	any     bool
	members map[string]bool // members its batches named
}

// subscribe follows src until ctx ends, resubscribing after a failure
// (a connection lost: the publisher died, or the network). The sequence
// numbers carry over: after a restart they start over, which drops what
// the old publisher had published. A publisher that sends nothing for
// EngineEventsTTL after its connection was lost (dead, not restarted)
// loses what it had published: its members fall back to the store's view.
func (x *eventIndex) subscribe(ctx context.Context, src EngineEvents) {
	s := &source{EngineEvents: src, members: map[string]bool{}}
	var down time.Time // when the subscription was lost with no batch since
	for ctx.Err() == nil {
		err := kvevents.Subscribe(ctx, src.Addr, "", func(m kvevents.Message) bool {
			down = time.Time{}
			x.receive(ctx, s, m)
			return true
		})
		if ctx.Err() != nil {
			return
		}
		if down.IsZero() {
			down = time.Now()
			x.log.Warn("router: engine events: subscription ended; resubscribing", "addr", src.Addr, "err", err)
		}
		if len(s.members) > 0 && time.Since(down) > x.ttl {
			x.c.agedOut.Add(uint64(len(s.members)))
			x.log.Info("router: engine events: the publisher is gone; forgetting what it published", "addr", src.Addr, "down", time.Since(down).Round(time.Second))
			for id := range s.members {
				x.forget(id)
			}
			clear(s.members)
		}
		select {
		case <-ctx.Done():
		case <-time.After(time.Second):
		}
	}
}

// receive applies one live batch: first the batches it missed, from the
// replay endpoint (a gap, or what came before the subscription), or, when
// the sequence numbers started over, after dropping what the restarted
// publisher had published.
func (x *eventIndex) receive(ctx context.Context, s *source, m kvevents.Message) {
	if m.Err != nil {
		x.c.malformed.Add(1)
		return
	}
	member := s.Member
	if member == "" {
		member = memberOfTopic(m.Topic)
	}
	if member == "" {
		x.c.unattributed.Add(1)
		return
	}
	switch {
	case !s.any:
		if m.Seq > 0 {
			x.replay(ctx, s, member, m.Topic, 0, m.Seq)
		}
	case m.Seq <= s.last:
		x.c.restarts.Add(1)
		for id := range s.members {
			x.forget(id)
		}
		clear(s.members)
		x.log.Info("router: engine events: the publisher started over", "addr", s.Addr, "seq", m.Seq, "last", s.last)
	case m.Seq > s.last+1:
		x.c.gaps.Add(1)
		x.replay(ctx, s, member, m.Topic, s.last+1, m.Seq)
	}
	s.members[member] = true
	x.apply(member, m.Topic, &m.Batch)
	s.last, s.any = m.Seq, true
}

// replay applies the batches [from, to) the publisher still holds (on
// the member and topic of the live batch that showed them missing: a
// replay carries no topic).
func (x *eventIndex) replay(ctx context.Context, s *source, member, topic string, from, to uint64) {
	if s.ReplayAddr == "" {
		return
	}
	x.c.replays.Add(1)
	rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	err := kvevents.Replay(rctx, s.ReplayAddr, from, func(r kvevents.Message) bool {
		if r.Err != nil || r.Seq >= to {
			return false
		}
		if r.Seq >= from {
			s.members[member] = true
			x.apply(member, topic, &r.Batch)
		}
		return true
	})
	if err != nil {
		x.c.replayFails.Add(1)
		x.log.Warn("router: engine events: replay failed", "addr", s.ReplayAddr, "from", from, "err", err)
	}
}
