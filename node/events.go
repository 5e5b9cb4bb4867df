package node

import (
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvmesh/kvmesh/kvevents"
	"github.com/kvmesh/kvmesh/prefixhash"
	"github.com/kvmesh/kvmesh/store"
)

// nodeEvents is a node's KV-event publisher (Options.Events.Addr), nil
// when it publishes none: every method of a nil one does nothing.
type nodeEvents struct {
	pub *kvevents.Publisher
	// names is the node's table of namespaces, bound once the node is
	// built (the store, opened before it, may publish from its recovery
	// on: those events name no model).
	names atomic.Pointer[names]
}

// openEvents binds the publisher's sockets, or returns nil when opts name
// none.
func openEvents(opts Options) (*nodeEvents, error) {
	if opts.Events.Addr == "" {
		return nil, nil
	}
	e := &nodeEvents{}
	pub, err := kvevents.New(kvevents.Options{Addr: opts.Events.Addr, ReplayAddr: opts.Events.ReplayAddr,
		Topic: opts.Events.Topic, NodeID: opts.NodeID, Names: e})
	if err != nil {
		return nil, err
	}
	e.pub = pub
	return e, nil
}

// store returns the store's hook, nil when there is no publisher.
func (e *nodeEvents) store() store.Events {
	if e == nil {
		return nil
	}
	return e.pub
}

func (e *nodeEvents) bind(n *names) {
	if e != nil {
		e.names.Store(n)
	}
}

// Namespace implements kvevents.Names over the node's table, once bound.
func (e *nodeEvents) Namespace(d uint64) (prefixhash.Namespace, bool) {
	if n := e.names.Load(); n != nil {
		return n.Namespace(d)
	}
	return prefixhash.Namespace{}, false
}

// addrs returns the bound PUB and ROUTER endpoints ("" when none).
func (e *nodeEvents) addrs() (pub, replay string) {
	if e == nil {
		return "", ""
	}
	return e.pub.Addr(), e.pub.ReplayAddr()
}

func (e *nodeEvents) close() error {
	if e == nil {
		return nil
	}
	return e.pub.Close()
}

// collectors returns the publisher's metrics, none when there is no
// publisher.
func (e *nodeEvents) collectors() []prometheus.Collector {
	if e == nil {
		return nil
	}
	return []prometheus.Collector{&eventsCollector{e: e,
		events:  prometheus.NewDesc("kvmesh_kv_events_published_total", "KV events published (--kv-events-addr), in batches (kvmesh_kv_events_batches_total).", nil, nil),
		batches: prometheus.NewDesc("kvmesh_kv_events_batches_total", "KV-event batches published, one sequence number each.", nil, nil),
		dropped: prometheus.NewDesc("kvmesh_kv_events_dropped_total", "KV events dropped: the publisher's queue was full (the store never waits on it), or a removal of a vllm-scheme block whose hash was no longer tracked.", nil, nil),
		replays: prometheus.NewDesc("kvmesh_kv_events_replays_total", "Replay requests answered on --kv-events-replay-addr, by result: ok or malformed.", []string{"result"}, nil),
	}}
}

type eventsCollector struct {
	e                                 *nodeEvents
	events, batches, dropped, replays *prometheus.Desc
}

func (c *eventsCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.events
	ch <- c.batches
	ch <- c.dropped
	ch <- c.replays
}

func (c *eventsCollector) Collect(ch chan<- prometheus.Metric) {
	s := c.e.pub.Stats()
	ch <- prometheus.MustNewConstMetric(c.events, prometheus.CounterValue, float64(s.Events))
	ch <- prometheus.MustNewConstMetric(c.batches, prometheus.CounterValue, float64(s.Batches))
	ch <- prometheus.MustNewConstMetric(c.dropped, prometheus.CounterValue, float64(s.Dropped+s.Untracked))
	ch <- prometheus.MustNewConstMetric(c.replays, prometheus.CounterValue, float64(s.Replays), "ok")
	ch <- prometheus.MustNewConstMetric(c.replays, prometheus.CounterValue, float64(s.ReplaysBad), "malformed")
}
