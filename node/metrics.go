package node

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"sort"
	"time"

	grpcprom "github.com/grpc-ecosystem/go-grpc-middleware/providers/prometheus"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"google.golang.org/grpc"

	"github.com/kvmesh/kvmesh/block"
	"github.com/kvmesh/kvmesh/transfer"
)

// metrics are the node's Prometheus metrics, in a registry of its own (two
// nodes in one process, as in tests, never collide). Every name starts with
// kvmesh_ but the gRPC server's, which keep the names that stock dashboards
// and alerts query (grpc_server_handled_total, grpc_server_handling_seconds,
// from the grpc-ecosystem middleware); the Go runtime and process collectors
// are added beside them.
type metrics struct {
	reg *prometheus.Registry

	grpc         *grpcprom.ServerMetrics
	inFlight     prometheus.Gauge
	promptTokens prometheus.Counter     // tokens of looked-up prompts
	cachedTokens prometheus.Counter     // of which cached
	lookups      *lookupCounts          // the same per namespace
	blocks       *prometheus.CounterVec // op: get, put
	bytes        *prometheus.CounterVec // op: get, put (payload bytes)
	dropped      *prometheus.CounterVec // reason: blocks read but refused (verify: corrupt, other namespace or key; tokens: not the tokens asked for)
}

// The reasons of kvmesh_blocks_refused_total.
const (
	refusedVerify = "verify"
	refusedTokens = "tokens"
)

// metricsOptions are what newMetrics needs beside the cache.
type metricsOptions struct {
	labelKey []byte                // keys namespace labels; nil: plain digests
	version  string                // kvmesh_build_info's version
	model    func(d uint64) string // the model id of a namespace digest, "" when unknown
}

func newMetrics(cache Cache, o metricsOptions, extra ...prometheus.Collector) *metrics {
	m := &metrics{reg: prometheus.NewRegistry(), lookups: new(lookupCounts)}
	m.grpc = grpcprom.NewServerMetrics(grpcprom.WithServerHandlingTimeHistogram(
		grpcprom.WithHistogramBuckets([]float64{.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30})))
	m.inFlight = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "kvmesh_grpc_requests_in_flight",
		Help: "gRPC requests being served.",
	})
	m.promptTokens = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "kvmesh_lookup_prompt_tokens_total",
		Help: "Tokens of the prompts looked up.",
	})
	m.cachedTokens = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "kvmesh_lookup_cached_tokens_total",
		Help: "Tokens of looked-up prompts found in the longest cached prefix.",
	})
	m.blocks = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "kvmesh_blocks_total",
		Help: "Blocks served (op=get) and stored (op=put) through the gRPC API.",
	}, []string{"op"})
	m.bytes = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "kvmesh_payload_bytes_total",
		Help: "Payload bytes served (op=get) and stored (op=put) through the gRPC API.",
	}, []string{"op"})
	m.dropped = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "kvmesh_blocks_refused_total",
		Help: "Blocks read from the cache but not served, answered as misses, by reason: verify (checksum, key, namespace or format failed), tokens (a read by tokens found a block holding other tokens).",
	}, []string{"reason"})
	for _, r := range []string{refusedVerify, refusedTokens} {
		m.dropped.WithLabelValues(r) // every reason is a series from the start
	}
	m.reg.MustRegister(m.grpc, m.inFlight, m.promptTokens, m.cachedTokens, m.blocks, m.bytes, m.dropped,
		newCacheCollector(cache, o.labelKey, o.model), newLookupCollector(m.lookups, o.labelKey, o.model), newBuildInfo(o.version),
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	m.reg.MustRegister(extra...)
	return m
}

// newPeerHistogram is the latency of this node's calls to its peers.
func newPeerHistogram() *prometheus.HistogramVec {
	return prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "kvmesh_peer_request_duration_seconds",
		Help:    "Time of this node's calls to other nodes, by op (lookup, get, put) and result (ok, error, or skipped: the peer was backing off after a failure).",
		Buckets: []float64{.00005, .0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10},
	}, []string{"op", "result"})
}

// clusterCollector turns the cluster's, the data plane's and membership's
// counters into metrics at each scrape.
type clusterCollector struct {
	c *clusterCache

	members, refused, unauthorized                                   *prometheus.Desc
	lookups, lookupFails, gets, getFails, remoteBlocks, pushed       *prometheus.Desc
	pushYields                                                       *prometheus.Desc
	conns, connsRefused, requests, dropped, values, bytes, regionUse *prometheus.Desc
	leases, leasesExpired, reservations, reservationsAborted         *prometheus.Desc
	connsEvicted, connsRevoked                                       *prometheus.Desc
	reads, readBytes, landing                                        *prometheus.Desc
}

func newClusterCollector(c *clusterCache) *clusterCollector {
	d := func(name, help string, labels ...string) *prometheus.Desc {
		return prometheus.NewDesc(name, help, labels, nil)
	}
	return &clusterCollector{
		c:            c,
		members:      d("kvmesh_cluster_members", "Members this node believes alive (alive or suspected), itself included."),
		lookups:      d("kvmesh_cluster_remote_lookups_total", "Lookup calls sent to other nodes."),
		lookupFails:  d("kvmesh_cluster_remote_lookup_failures_total", "Lookup calls that failed or timed out, counted as misses."),
		gets:         d("kvmesh_cluster_remote_gets_total", "Get calls sent to other nodes over the data plane."),
		getFails:     d("kvmesh_cluster_remote_get_failures_total", "Get calls that failed or timed out, counted as misses."),
		remoteBlocks: d("kvmesh_cluster_remote_blocks_total", "Blocks asked of other nodes, by result: hit, miss, or corrupt (failed verification, dropped).", "result"),
		pushed:       d("kvmesh_cluster_pushed_blocks_total", "Blocks pushed to their owners, by result: ok, dropped (queue full or owner gone), failed.", "result"),
		pushYields:   d("kvmesh_cluster_push_yields_total", "Push batches that waited for this node's serving work, by how the wait ended: idle (the work ended) or bound (--push-yield passed).", "end"),
		refused:      d("kvmesh_transfer_refused_blocks_total", "Blocks pushed to this node over the data plane that were refused: not the block their key named, or failing verification."),
		conns:        d("kvmesh_transfer_connections", "Open data-plane connections (shm: clients).", "transport"),
		connsRefused: d("kvmesh_transfer_refused_connections_total", "Data-plane connections refused over a limit: all connections, or a tenant's share.", "transport"),
		connsEvicted: d("kvmesh_transfer_evicted_connections_total", "Data-plane connections closed in their handshake (no hello yet) to make room for newer ones.", "transport"),
		connsRevoked: d("kvmesh_transfer_revoked_connections_total", "Data-plane connections closed because a token reload dropped or changed their token.", "transport"),
		unauthorized: d("kvmesh_transfer_unauthorized_connections_total", "Data-plane connections refused before serving: TLS failed, bearer token missing or not accepted.", "transport"),
		requests:     d("kvmesh_transfer_requests_total", "Data-plane requests served.", "transport"),
		dropped:      d("kvmesh_transfer_dropped_connections_total", "Data-plane connections dropped for a bad frame, a limit or an I/O error.", "transport"),
		values:       d("kvmesh_transfer_values_total", "Values the data plane served (op=get: sent; op=get_miss: asked for and not sent) or received (op=put).", "transport", "op"),
		bytes:        d("kvmesh_transfer_bytes_total", "Value bytes the data plane sent (op=get) or received (op=put).", "transport", "op"),
		regionUse:    d("kvmesh_transfer_shm_region_bytes", "Bytes of the shared-memory clients' regions held by results they have not released."),
		leases:       d("kvmesh_transfer_shm_leases", "Shared-memory gets whose blocks clients read in place in the DRAM arena (pinned) and have not released."),
		leasesExpired: d("kvmesh_transfer_shm_leases_expired_total",
			"Shared-memory leases the node ended at the lease timeout because the client had not released them."),
		reservations: d("kvmesh_transfer_shm_reservations", "DRAM slots reserved for shared-memory puts and not yet committed or freed."),
		reservationsAborted: d("kvmesh_transfer_shm_reservations_aborted_total",
			"Reserved DRAM slots freed uncommitted: released by the client, past the lease timeout, or the client gone."),
		reads: d("kvmesh_transfer_reads_total",
			"Values this node read from other nodes, by transport: ucx (one-sided reads of their DRAM arenas, --transport ucx or auto) or tcp (data-plane gets).", "transport"),
		readBytes: d("kvmesh_transfer_read_bytes_total", "Bytes of kvmesh_transfer_reads_total's values, by transport.", "transport"),
		landing:   d("kvmesh_transfer_ucx_landing_bytes", "Bytes of the UCX landing region held by blocks read one-sidedly and not yet released."),
	}
}

func (c *clusterCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.members, c.refused, c.unauthorized, c.lookups, c.lookupFails, c.gets, c.getFails, c.remoteBlocks,
		c.pushed, c.pushYields, c.conns, c.connsRefused, c.requests, c.dropped, c.values, c.bytes, c.regionUse,
		c.leases, c.leasesExpired, c.reservations, c.reservationsAborted, c.connsEvicted, c.connsRevoked,
		c.reads, c.readBytes, c.landing} {
		ch <- d
	}
}

func (c *clusterCollector) Collect(ch chan<- prometheus.Metric) {
	metric := func(d *prometheus.Desc, t prometheus.ValueType, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, t, v, labels...)
	}
	counter := func(d *prometheus.Desc, v uint64, labels ...string) {
		metric(d, prometheus.CounterValue, float64(v), labels...)
	}
	ms, _ := c.c.members.Members()
	metric(c.members, prometheus.GaugeValue, float64(len(ms)))
	counter(c.refused, uint64(c.c.refused.Load()))
	st := c.c.cluster.Stats()
	counter(c.lookups, st.RemoteLookups)
	counter(c.lookupFails, st.RemoteLookupFails)
	counter(c.gets, st.RemoteGets)
	counter(c.getFails, st.RemoteGetFails)
	counter(c.remoteBlocks, st.RemoteHits, "hit")
	counter(c.remoteBlocks, st.RemoteMisses, "miss")
	counter(c.remoteBlocks, st.RemoteCorrupt, "corrupt")
	counter(c.pushed, st.Pushed, "ok")
	counter(c.pushed, st.PushDropped, "dropped")
	counter(c.pushed, st.PushFailed, "failed")
	counter(c.pushYields, st.PushYields-st.PushYieldTimeouts, "idle")
	counter(c.pushYields, st.PushYieldTimeouts, "bound")
	servers := []struct {
		name  string
		stats func() transfer.Stats
	}{{"tcp", c.c.data.Stats}}
	if c.c.shm != nil {
		servers = append(servers, struct {
			name  string
			stats func() transfer.Stats
		}{"shm", c.c.shm.Stats})
	}
	for _, s := range servers {
		t := s.stats()
		metric(c.conns, prometheus.GaugeValue, float64(t.Conns), s.name)
		counter(c.connsRefused, uint64(t.Refused), s.name)
		counter(c.connsEvicted, uint64(t.Evicted), s.name)
		counter(c.connsRevoked, uint64(t.Revoked), s.name)
		counter(c.unauthorized, uint64(t.Unauthorized), s.name)
		counter(c.requests, uint64(t.Requests), s.name)
		counter(c.dropped, uint64(t.Dropped), s.name)
		counter(c.values, uint64(t.Hits), s.name, "get")
		counter(c.values, uint64(t.Misses), s.name, "get_miss")
		counter(c.values, uint64(t.Puts), s.name, "put")
		counter(c.bytes, uint64(t.BytesOut), s.name, "get")
		counter(c.bytes, uint64(t.BytesIn), s.name, "put")
		if s.name == "tcp" && c.c.fab.window != nil { // granted to one-sided readers
			counter(c.values, uint64(t.Granted), c.c.fab.window.Fabric(), "get")
			counter(c.bytes, uint64(t.GrantedBytes), c.c.fab.window.Fabric(), "get")
		}
		if s.name == "shm" {
			metric(c.regionUse, prometheus.GaugeValue, float64(t.RegionUse))
			metric(c.leases, prometheus.GaugeValue, float64(t.Leases))
			counter(c.leasesExpired, uint64(t.LeasesExpired))
			metric(c.reservations, prometheus.GaugeValue, float64(t.Reservations))
			counter(c.reservationsAborted, uint64(t.ReservationsAborted))
		}
	}
	tcpValues, tcpBytes := c.c.peers.tcpValues.Load(), c.c.peers.tcpBytes.Load()
	if rma := c.c.fab.rma; rma != nil {
		rs := rma.Stats()
		counter(c.reads, uint64(rs.Reads), rma.Name())
		counter(c.readBytes, uint64(rs.ReadBytes), rma.Name())
		tcpValues, tcpBytes = tcpValues+rs.FallbackValues, tcpBytes+rs.FallbackBytes
		held, _ := rma.LandingUse()
		metric(c.landing, prometheus.GaugeValue, float64(held))
	}
	counter(c.reads, uint64(tcpValues), "tcp")
	counter(c.readBytes, uint64(tcpBytes), "tcp")
}

// unary counts the call in flight, applies the node's request timeout and
// logs the outcome (the gRPC server metrics, outside it, see the status it
// returns).
func (n *Node) unary(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
	start := time.Now()
	n.metrics.inFlight.Inc()
	defer n.metrics.inFlight.Dec()
	ctx, cancel := context.WithTimeout(ctx, n.opts.Limits.RequestTimeout)
	defer cancel()
	resp, err := h(ctx, req)
	err = statusError(err)
	n.logRequest(info.FullMethod, start, err)
	return resp, err
}

// stream is unary's counterpart for streaming calls.
func (n *Node) stream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
	start := time.Now()
	n.metrics.inFlight.Inc()
	defer n.metrics.inFlight.Dec()
	ctx, cancel := context.WithTimeout(ss.Context(), n.opts.Limits.RequestTimeout)
	defer cancel()
	err := statusError(h(srv, &ctxStream{ServerStream: ss, ctx: ctx}))
	n.logRequest(info.FullMethod, start, err)
	return err
}

type ctxStream struct {
	grpc.ServerStream
	ctx context.Context
}

func (s *ctxStream) Context() context.Context { return s.ctx }

// maxNamespaceSeries bounds the namespaces a scrape shows one by one: the
// largest by bytes; the others are summed into one row labelled "other", so
// that a node caching thousands of namespaces keeps a bounded /metrics.
const maxNamespaceSeries = 32

// otherNamespaces labels the row of the namespaces past maxNamespaceSeries.
const otherNamespaces = "other"

// cacheCollector turns one Cache.Stats call per scrape into metrics.
type cacheCollector struct {
	cache                                                  Cache
	labelKey                                               []byte                // keys namespace labels; nil: plain digests
	model                                                  func(d uint64) string // model id of a digest; nil or "": unknown
	hits, misses, evictions, demotions, promotions         *prometheus.Desc
	promotionsDeferred, tierWarm                           *prometheus.Desc
	quotaRefused, corruptDrops                             *prometheus.Desc
	retained, pinnedBytes, removed                         *prometheus.Desc
	tierBlocks, tierBytes, tierCapacity                    *prometheus.Desc
	namespaceBlocks, namespaceBytes, namespaceTokensCached *prometheus.Desc
	namespaceTierBytes, namespaceQuota, namespaces         *prometheus.Desc
	partials, partialBytes, parts, partialsEnded, claims   *prometheus.Desc
	tierEvictions, secondChances, reusedBlocks             *prometheus.Desc
	branchingBlocks, tierWritten                           *prometheus.Desc
}

func newCacheCollector(cache Cache, labelKey []byte, model func(uint64) string) *cacheCollector {
	d := func(name, help string, labels ...string) *prometheus.Desc {
		return prometheus.NewDesc(name, help, labels, nil)
	}
	ns := fmt.Sprintf(" The namespace label is the namespace's digest in hex (a keyed hash of it on a node with tenants), the model label its model id (\"unknown\" until a request names it); past the largest %d namespaces by bytes, the rest are summed under namespace=\"other\".", maxNamespaceSeries)
	return &cacheCollector{
		cache:                 cache,
		labelKey:              labelKey,
		model:                 model,
		hits:                  d("kvmesh_cache_hits_total", "Block reads that found their block."),
		misses:                d("kvmesh_cache_misses_total", "Block reads that did not find their block (or found it corrupt)."),
		evictions:             d("kvmesh_cache_evictions_total", "Blocks dropped from the cache to make room."),
		demotions:             d("kvmesh_cache_demotions_total", "Blocks moved one tier down under pressure."),
		promotions:            d("kvmesh_cache_promotions_total", "Blocks moved one tier up on a hit."),
		promotionsDeferred:    d("kvmesh_cache_promotions_deferred_total", "Second hits on NVMe served from the read and left there, because another promotion was making room in DRAM (a later hit may promote them)."),
		tierWarm:              d("kvmesh_tier_warm_bytes", "Memory a tier keeps for reuse though it holds no block (DRAM's emptied slabs kept warm): resident, not in kvmesh_tier_bytes.", "tier"),
		quotaRefused:          d("kvmesh_cache_quota_refused_total", "Writes refused because their namespace had no room within its quota (answered ResourceExhausted)."),
		retained:              d("kvmesh_cache_retained", "Values (objects' pieces, blocks of pinned prefixes) under a pin or a lease (ObjectService.Retain, an object's retention)."),
		pinnedBytes:           d("kvmesh_cache_pinned_bytes", "Bytes under hard pins and leases, bounded by --max-pinned of DRAM and NVMe together and by each namespace's quota."),
		removed:               d("kvmesh_cache_removed_total", "Values removed by key (objects removed or upserted)."),
		corruptDrops:          d("kvmesh_cache_corrupt_drops_total", "Blocks dropped because they failed verification when read (corrupt or torn on disk); each read of one is a miss."),
		partials:              d("kvmesh_cache_partials", "Incomplete blocks: some parts put by parallel ranks, not all; not served, dropped first for room."),
		partialBytes:          d("kvmesh_cache_partial_bytes", "DRAM bytes held by incomplete blocks (each the size of its whole block)."),
		parts:                 d("kvmesh_cache_parts_total", "Parts of blocks put by parallel ranks, by result: stored, conflict (overlapping stored cells with other bytes, refused), completed (counts blocks the parts completed).", "result"),
		partialsEnded:         d("kvmesh_cache_partials_dropped_total", "Incomplete blocks dropped, by reason: expired (--partial-ttl passed) or room (memory was needed).", "reason"),
		claims:                d("kvmesh_cache_claims_total", "Claims on parts answered, by status: write (the rank sends it), complete, covered, claimed (another rank is sending it).", "status"),
		tierBlocks:            d("kvmesh_tier_blocks", "Blocks held by a tier.", "tier"),
		tierEvictions:         d("kvmesh_tier_evictions_total", "Blocks that left a tier, by reason: capacity (dropped from the node for room, descendants included), demoted (moved one tier down), refused (writes refused for lack of room), unadmitted (DRAM: accepted but colder than everything held, evicted at once; NVMe: DRAM victims --nvme-admission reused dropped instead of writing), expired (dropped for room after the TTL of their lease or pin lapsed, not read since).", "tier", "reason"),
		branchingBlocks:       d("kvmesh_cache_branching_blocks", "Cached blocks with two or more cached children: where cached chains fork (shared system prompts, tool lists)."),
		tierWritten:           d("kvmesh_tier_written_bytes_total", "Bytes written to a tier: NVMe's demotions, direct writes and segment rewrites (0 for the other tiers).", "tier"),
		secondChances:         d("kvmesh_cache_second_chances_total", "Blocks the reuse eviction policy passed over at the cold end, because they were asked for again, and moved to the hot end."),
		reusedBlocks:          d("kvmesh_cache_reused_blocks", "Cached blocks the reuse eviction policy holds marked: asked for again since they were stored or last passed over (0 under other policies)."),
		tierBytes:             d("kvmesh_tier_bytes", "Encoded block bytes held by a tier.", "tier"),
		tierCapacity:          d("kvmesh_tier_capacity_bytes", "A tier's configured capacity.", "tier"),
		namespaces:            d("kvmesh_namespaces", "Namespaces with blocks cached on this node (all of them, also those summed under \"other\")."),
		namespaceBlocks:       d("kvmesh_namespace_blocks", "Blocks cached per namespace."+ns, "namespace", "model"),
		namespaceBytes:        d("kvmesh_namespace_bytes", "Encoded bytes cached per namespace."+ns, "namespace", "model"),
		namespaceTokensCached: d("kvmesh_namespace_tokens", "Tokens held by the cached blocks of a namespace."+ns, "namespace", "model"),
		namespaceTierBytes:    d("kvmesh_namespace_tier_bytes", "Encoded bytes of a namespace held by a tier: what its quota bounds."+ns, "namespace", "model", "tier"),
		namespaceQuota:        d("kvmesh_namespace_quota_bytes", "A namespace's quota in a tier, in encoded bytes; absent when unlimited, and for the \"other\" row."+ns, "namespace", "model", "tier"),
	}
}

func (c *cacheCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.hits, c.misses, c.evictions, c.demotions, c.promotions, c.promotionsDeferred, c.tierWarm, c.quotaRefused, c.corruptDrops,
		c.retained, c.pinnedBytes, c.removed, c.tierBlocks, c.tierBytes, c.tierCapacity, c.namespaces, c.namespaceBlocks, c.namespaceBytes, c.namespaceTokensCached,
		c.namespaceTierBytes, c.namespaceQuota, c.partials, c.partialBytes, c.parts, c.partialsEnded, c.claims,
		c.tierEvictions, c.secondChances, c.reusedBlocks, c.branchingBlocks, c.tierWritten} {
		ch <- d
	}
}

func (c *cacheCollector) Collect(ch chan<- prometheus.Metric) {
	s := c.cache.Stats()
	counter := func(d *prometheus.Desc, v int64) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v))
	}
	gauge := func(d *prometheus.Desc, v int64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, float64(v), labels...)
	}
	counter(c.hits, s.Hits)
	counter(c.misses, s.Misses)
	counter(c.evictions, s.Evictions)
	counter(c.demotions, s.Demotions)
	counter(c.promotions, s.Promotions)
	counter(c.promotionsDeferred, s.PromotionsDeferred)
	counter(c.quotaRefused, s.QuotaRefused)
	counter(c.corruptDrops, s.CorruptDrops)
	counter(c.removed, s.Removed)
	gauge(c.retained, s.Retained)
	gauge(c.pinnedBytes, s.PinnedBytes)
	counter(c.secondChances, s.SecondChances)
	gauge(c.reusedBlocks, s.ReusedBlocks)
	gauge(c.branchingBlocks, s.BranchingBlocks)
	gauge(c.partials, s.Parts.Open)
	gauge(c.partialBytes, s.Parts.Bytes)
	labelled := func(d *prometheus.Desc, v int64, label string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), label)
	}
	labelled(c.parts, s.Parts.Stored, "stored")
	labelled(c.parts, s.Parts.Conflicts, "conflict")
	labelled(c.parts, s.Parts.Completed, "completed")
	labelled(c.partialsEnded, s.Parts.Expired, "expired")
	labelled(c.partialsEnded, s.Parts.Dropped, "room")
	for st, n := range s.Parts.Claims {
		labelled(c.claims, n, block.ClaimStatus(st).String())
	}
	for _, t := range s.Tiers {
		gauge(c.tierBlocks, t.Blocks, t.Name)
		for _, r := range []struct {
			reason string
			n      int64
		}{{"capacity", t.Evicted.Capacity}, {"demoted", t.Evicted.Demoted}, {"refused", t.Evicted.Refused}, {"unadmitted", t.Evicted.Unadmitted},
			{"expired", t.Evicted.Expired}} {
			ch <- prometheus.MustNewConstMetric(c.tierEvictions, prometheus.CounterValue, float64(r.n), t.Name, r.reason)
		}
		ch <- prometheus.MustNewConstMetric(c.tierWritten, prometheus.CounterValue, float64(t.WrittenBytes), t.Name)
		gauge(c.tierBytes, t.Bytes, t.Name)
		gauge(c.tierCapacity, t.Capacity, t.Name)
		gauge(c.tierWarm, t.Warm, t.Name)
	}
	gauge(c.namespaces, int64(len(s.Namespaces)))
	top, other := topNamespaces(s.Namespaces, maxNamespaceSeries)
	row := func(ns NamespaceStats, name, model string) {
		gauge(c.namespaceBlocks, ns.Blocks, name, model)
		gauge(c.namespaceBytes, ns.Bytes, name, model)
		gauge(c.namespaceTokensCached, ns.Tokens, name, model)
		gauge(c.namespaceTierBytes, ns.DRAMBytes, name, model, "dram")
		gauge(c.namespaceTierBytes, ns.NVMeBytes, name, model, "nvme")
	}
	for _, ns := range top {
		name, model := namespaceLabel(c.labelKey, ns.Digest), c.modelOf(ns.Digest)
		row(ns, name, model)
		for _, q := range []struct {
			tier  string
			bytes int64
		}{{"dram", ns.QuotaDRAM}, {"nvme", ns.QuotaNVMe}} {
			if q.bytes > 0 {
				gauge(c.namespaceQuota, q.bytes, name, model, q.tier)
			}
		}
	}
	if other != nil {
		row(*other, otherNamespaces, otherNamespaces)
	}
}

// modelOf is the model label of digest d.
func (c *cacheCollector) modelOf(d uint64) string {
	if c.model != nil {
		if m := c.model(d); m != "" {
			return m
		}
	}
	return "unknown"
}

// topNamespaces returns the n namespaces of all with the most bytes (ties:
// the lower digest first, so that a scrape's rows do not flap), and the sum
// of the others' counts, nil when there are none. It does not modify all.
func topNamespaces(all []NamespaceStats, n int) (top []NamespaceStats, other *NamespaceStats) {
	if len(all) <= n {
		return all, nil
	}
	sorted := append([]NamespaceStats(nil), all...)
	sort.Slice(sorted, func(i, j int) bool {
		if sorted[i].Bytes != sorted[j].Bytes {
			return sorted[i].Bytes > sorted[j].Bytes
		}
		return sorted[i].Digest < sorted[j].Digest
	})
	var sum NamespaceStats
	for _, ns := range sorted[n:] {
		sum.Blocks += ns.Blocks
		sum.Bytes += ns.Bytes
		sum.Tokens += ns.Tokens
		sum.DRAMBytes += ns.DRAMBytes
		sum.NVMeBytes += ns.NVMeBytes
	}
	return sorted[:n], &sum
}

// namespaceLabel is the label of the namespace with the given digest in
// the node's metrics: the digest in hex, or, on a node with tenants, a
// keyed hash of it (HMAC-SHA-256 under key, 64 bits in hex), so that no
// one reads a tenant's digest off the unauthenticated /metrics.
func namespaceLabel(key []byte, digest uint64) string {
	if key == nil {
		return digestString(digest)
	}
	m := hmac.New(sha256.New, key)
	var b [8]byte
	binary.LittleEndian.PutUint64(b[:], digest)
	m.Write(b[:])
	return "k" + hex.EncodeToString(m.Sum(nil)[:8])
}
