package node

import (
	"context"
	"errors"
	"fmt"
	"github.com/kvmesh/kvmesh/auth"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvmesh/kvmesh/block"
	"github.com/kvmesh/kvmesh/gossip"
	"github.com/kvmesh/kvmesh/internal/probe"
	"github.com/kvmesh/kvmesh/prefixhash"
	"github.com/kvmesh/kvmesh/store"
	"github.com/kvmesh/kvmesh/transfer"
)

// clusterCache is the production Cache: store.Cluster over store.Local, and
// everything that reaches the other nodes — the data-plane servers (TCP and
// shared memory), membership and the peers' clients. It owns all of it.
type clusterCache struct {
	opts    Options
	local   *store.Local
	cluster *store.Cluster
	members *gossip.Membership
	peers   *peers
	data    *transfer.Server
	shm     *transfer.ShmServer // nil when off
	fab     *fabric             // one-sided reads (UCX); its fields nil on TCP
	log     *slog.Logger

	// Where this node is reached (advertised: never an unspecified host).
	grpcAddr, httpAddr, dataAddr, shmPath string
	hostID                                string
	rdma                                  []string

	refused   atomic.Int64                  // data-plane values refused by the sink
	publisher atomic.Pointer[store.Cluster] // cluster, for the sink, once started
	quotaMu   sync.Mutex                    // orders quota changes and their saving (quota.go)
	closeOnce sync.Once
	closeErr  error
}

var _ Cache = (*clusterCache)(nil)

// startCluster starts the data plane over local, joins the cluster and
// returns the cache of the cluster as this node sees it. grpcAddr and
// httpAddr are the addresses the node's listeners are bound to. On error
// everything started is stopped; local stays the caller's.
// tokens (nil: none) guard the data plane as they guard the gRPC API.
func startCluster(opts Options, local *store.Local, grpcAddr, httpAddr string, peerSeconds *prometheus.HistogramVec, tokens *auth.Tokens) (_ *clusterCache, err error) {
	c := &clusterCache{opts: opts, local: local, log: opts.Logger, hostID: hostID()}
	defer func() {
		if err != nil {
			c.stop()
		}
	}()
	adv, err := advertiseHost(opts)
	if err != nil {
		return nil, err
	}
	c.grpcAddr, c.httpAddr = advertised(grpcAddr, adv), advertised(httpAddr, adv)

	var lim transfer.Limits
	if opts.Limits.MaxBlockBytes > transfer.DefaultMaxValueSize {
		lim.MaxValueSize = opts.Limits.MaxBlockBytes
	}
	src, sink := localSource{local}, localSink{l: local, maxBlock: opts.Limits.MaxBlockBytes, refused: &c.refused, cluster: &c.publisher}
	peerOpts := transfer.ClientOptions{Limits: lim, TLS: opts.Security.PeerTLS, Token: peerToken(&opts.Security)}
	arena, _ := local.Arena()
	if c.fab, err = startFabric(opts, dataHost(opts.Listen.DataAddr), arena, peerOpts, opts.Logger); err != nil {
		return nil, err
	}
	if c.data, err = transfer.NewServer(src, sink, &transfer.ServerOptions{Limits: lim, TLS: opts.Security.TLS, Tokens: tokens, MaxInFlightBytes: int(opts.Limits.MaxInFlightBytes), Window: c.fab.window}, opts.Logger); err != nil {
		return nil, fmt.Errorf("node: data plane: %w", err)
	}
	dataAddr, err := c.data.Listen(opts.Listen.DataAddr)
	if err != nil {
		return nil, fmt.Errorf("node: listen on DataAddr %s: %w", opts.Listen.DataAddr, err)
	}
	c.dataAddr = advertised(dataAddr.String(), adv)
	if opts.Listen.ShmSocket != ShmOff {
		so := &transfer.ShmServerOptions{Limits: lim, RegionSize: opts.Listen.ShmRegionBytes, Tokens: tokens, MaxInFlightBytes: int(opts.Limits.MaxInFlightBytes)}
		if mem, _ := local.Arena(); mem != nil {
			// Trusted same-host clients read blocks in place and write
			// puts into reserved slots (see transfer.ShmServer).
			r := localReserver{l: local, cluster: &c.publisher}
			so.Arena, so.Reserver = r, r
		}
		if c.shm, err = transfer.NewShmServer(src, sink, so, opts.Logger); err != nil {
			return nil, fmt.Errorf("node: shared-memory data plane: %w", err)
		}
		if err := removeStaleSocket(opts.Listen.ShmSocket); err != nil {
			return nil, err
		}
		if dir := filepath.Dir(opts.Listen.ShmSocket); !strings.HasPrefix(opts.Listen.ShmSocket, "@") {
			// A directory of its own under the data dir (the chart's
			// per-host mode): made the node user's alone; shareSocket
			// opens it to the socket's group.
			if err := os.MkdirAll(dir, 0o700); err != nil {
				return nil, fmt.Errorf("node: option ShmSocket: %w", err)
			}
		}
		if err := c.shm.Listen(opts.Listen.ShmSocket); err != nil {
			return nil, fmt.Errorf("node: listen on ShmSocket %s: %w", opts.Listen.ShmSocket, err)
		}
		if err := shareSocket(opts.Listen.ShmSocket, opts.Listen.ShmSocketMode, opts.Listen.ShmSocketGroup); err != nil {
			return nil, err
		}
		c.shmPath = opts.Listen.ShmSocket
	}

	devs, err := transfer.RDMADevices()
	if err != nil {
		opts.Logger.Warn("RDMA device discovery failed; advertising none", "err", err)
	}
	for _, d := range devs {
		c.rdma = append(c.rdma, d.Name)
	}
	meta := gossip.MemberMeta{GRPCAddr: c.grpcAddr, HTTPAddr: c.httpAddr, DataAddr: c.dataAddr,
		DRAMBytes: opts.Tiers.DRAMBytes, NVMeBytes: opts.Tiers.NVMeBytes, RDMA: c.rdma, Version: opts.Version, Role: opts.Prefill.Role, Fabric: c.fab.desc,
		TLS: opts.Security.TLS != nil}
	if opts.Prefill.Disabled {
		meta.Role = gossip.RoleStore
	}
	mopts := gossip.Options{NodeID: opts.NodeID, GossipAddr: opts.Cluster.GossipAddr, Join: opts.Cluster.Join, RetryJoin: true,
		SecretKey: opts.Cluster.GossipKey, Meta: meta, Fast: opts.Cluster.GossipProfile == "local", Logger: opts.Logger}
	if opts.Listen.AdvertiseHost != "" {
		if mopts.AdvertiseAddr, err = resolveIP(opts.Listen.AdvertiseHost); err != nil {
			return nil, err
		}
	}
	if c.members, err = gossip.Start(mopts); err != nil {
		return nil, err
	}
	if len(opts.Cluster.Join) > 0 && !c.members.Joined() {
		if err := checkSeeds(opts.Cluster.Join); err != nil {
			return nil, err
		}
	}
	var obs observer
	if peerSeconds != nil {
		obs = func(op, result string, d time.Duration) { peerSeconds.WithLabelValues(op, result).Observe(d.Seconds()) }
	}
	c.peers = newPeers(c.members, peerOpts, opts.Cluster.PeerBackoff, opts.Limits.MaxMessageBytes, obs, opts.Logger)
	c.peers.rma = c.fab.rma
	c.cluster, err = store.NewCluster(local, newPlacementView(c.members), c.peers, store.ClusterOptions{
		ChunkTokens: opts.Cluster.ChunkTokens, Replicas: opts.Cluster.Replicas, LookupTimeout: opts.Cluster.LookupTimeout, GetTimeout: opts.Cluster.GetTimeout,
		LookupRoundPeers: opts.Cluster.LookupRoundPeers,
		PushYield:        opts.Cluster.PushYield, PushBytesPerSec: opts.Cluster.PushBytesPerSec,
	})
	if err != nil {
		return nil, fmt.Errorf("node: cluster: %w", err)
	}
	c.publisher.Store(c.cluster)
	return c, nil
}

// foreground marks serving work in flight until done is called: the
// cluster's pushes to owners yield to it (store.Cluster.Foreground). A
// no-op on a node without a cluster.
func (n *Node) foreground() (done func()) {
	if n.cluster != nil {
		if c := n.cluster.publisher.Load(); c != nil {
			return c.Foreground()
		}
	}
	return func() {}
}

// placementView shows the gossip's members to store.Cluster as placement
// sees them (id and weight), rebuilt only when the members change.
type placementView struct {
	m  *gossip.Membership
	mu struct {
		sync.Mutex
		version uint64
		built   bool
		members []store.Member
	}
}

func newPlacementView(m *gossip.Membership) *placementView { return &placementView{m: m} }

func (v *placementView) LocalID() string { return v.m.LocalID() }

// Members returns the live members, sorted by id, and the version of the
// newest gossip snapshot they were built from. The slice is shared: do not
// modify it.
func (v *placementView) Members() ([]store.Member, uint64) {
	infos, version := v.m.Members()
	v.mu.Lock()
	defer v.mu.Unlock()
	if !v.mu.built || version > v.mu.version { // versions only grow: never go back to an older snapshot
		members := make([]store.Member, len(infos))
		for i, mi := range infos {
			members[i] = store.Member{ID: mi.ID, Weight: mi.Weight()}
		}
		v.mu.members, v.mu.version, v.mu.built = members, version, true
	}
	return v.mu.members, v.mu.version
}

// advertiseHost is the host other nodes and clients reach this node at.
func advertiseHost(opts Options) (string, error) {
	if opts.Listen.AdvertiseHost != "" {
		return opts.Listen.AdvertiseHost, nil
	}
	if host, _, _ := net.SplitHostPort(opts.Cluster.GossipAddr); !unspecifiedHost(host) {
		return host, nil
	}
	if ip := privateIP(); ip != "" {
		return ip, nil
	}
	return "", errors.New("node: option AdvertiseHost: the node listens on all interfaces and has no private IPv4 address; set it to the address other nodes reach it at")
}

func unspecifiedHost(host string) bool {
	ip := net.ParseIP(host)
	return host == "" || ip != nil && ip.IsUnspecified()
}

// advertised returns addr with an unspecified host replaced by host.
func advertised(addr, host string) string {
	h, port, err := net.SplitHostPort(addr)
	if err != nil || !unspecifiedHost(h) {
		return addr
	}
	return net.JoinHostPort(host, port)
}

// privateIP returns the first private IPv4 address of an interface that is
// up, or "".
func privateIP() string {
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return ""
	}
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok && n.IP.To4() != nil && n.IP.IsPrivate() {
			return n.IP.String()
		}
	}
	return ""
}

func resolveIP(host string) (string, error) {
	if ip := net.ParseIP(host); ip != nil {
		return host, nil
	}
	ips, err := net.LookupIP(host)
	if err != nil || len(ips) == 0 {
		return "", fmt.Errorf("node: option AdvertiseHost: resolve %q: %w", host, err)
	}
	return ips[0].String(), nil
}

// hostID identifies this machine's running kernel; two processes with the
// same id share memory, so a client may use the node's shared-memory socket.
func hostID() string {
	b, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}

// checkSeeds says which seed is not a gossip address, once a join found no
// member: a node's gRPC or HTTP port given to Join would be retried forever,
// with memberlist's "invalid msgType" in the log.
func checkSeeds(seeds []string) error {
	for _, s := range seeds {
		if what := probe.NotGossip(s); what != "" {
			return &OptionError{Field: "Cluster.Join", Msg: fmt.Sprintf("%s answers %s; join takes the members' gossip addresses (their --gossip-addr, port 7603 by default)", s, what)}
		}
	}
	return nil
}

// removeStaleSocket removes a unix socket that a killed node left at path;
// a socket someone still serves is an error.
func removeStaleSocket(path string) error {
	fi, err := os.Lstat(path)
	if err != nil {
		return nil // nothing there (or the listen will say why)
	}
	if fi.Mode()&os.ModeSocket == 0 {
		return fmt.Errorf("node: option ShmSocket: %s exists and is not a socket", path)
	}
	if c, err := net.DialTimeout("unix", path, time.Second); err == nil {
		c.Close()
		return fmt.Errorf("node: option ShmSocket: %s is served by another process (another node on this data dir?)", path)
	}
	if err := os.Remove(path); err != nil {
		return fmt.Errorf("node: remove the stale socket %s: %w", path, err)
	}
	return nil
}

// leave hands this node's hot blocks to their next owners and leaves the
// membership, within ctx. The node must have stopped taking requests.
func (c *clusterCache) leave(ctx context.Context) (taken []prefixhash.Key) {
	start := time.Now()
	if err := c.cluster.Flush(ctx); err != nil {
		c.log.Warn("pushes still queued at shutdown are dropped", "err", err)
	}
	if c.opts.Cluster.HandoffBytes > 0 {
		taken = c.cluster.Handoff(ctx, c.opts.Cluster.HandoffBytes)
	}
	timeout := time.Second
	if dl, ok := ctx.Deadline(); ok {
		timeout = max(min(time.Until(dl), 2*time.Second), 100*time.Millisecond)
	}
	if err := c.members.Leave(timeout); err != nil {
		c.log.Warn("leaving the cluster", "err", err)
	}
	c.log.Info("left the cluster", "handed_off_blocks", len(taken), "took", time.Since(start))
	return taken
}

// spill writes what only DRAM holds to NVMe, within Tiers.SpillOnStopBytes and
// ctx, the blocks no other member took (taken: the handoff's) first, so
// that a restart on the same data dir serves them. It logs its progress
// at most every second, and what it wrote.
func (c *clusterCache) spill(ctx context.Context, taken []prefixhash.Key) {
	if c.opts.Tiers.SpillOnStopBytes <= 0 {
		return
	}
	last := time.Now()
	st := c.local.Spill(ctx, c.opts.Tiers.SpillOnStopBytes, taken, func(st store.SpillStats) {
		if time.Since(last) >= time.Second {
			last = time.Now()
			c.log.Info("writing DRAM to NVMe before exit", "written_bytes", st.Bytes, "of_bytes", st.Planned, "blocks", st.Blocks)
		}
	})
	if st.Planned == 0 && st.Left == 0 {
		return
	}
	gbps := 0.0
	if st.Took > 0 {
		gbps = float64(st.Bytes) / st.Took.Seconds() / 1e9
	}
	attrs := []any{"blocks", st.Blocks, "bytes", st.Bytes, "left_in_dram", st.Left, "took", st.Took, "gbps", gbps}
	switch {
	case ctx.Err() != nil:
		c.log.Warn("wrote DRAM to NVMe until the shutdown timeout; the rest is lost", attrs...)
	case st.Left > 0:
		c.log.Warn("wrote DRAM to NVMe; blocks over --spill-on-stop, busy or refused are lost", attrs...)
	default:
		c.log.Info("wrote DRAM to NVMe", attrs...)
	}
}

// Close stops serving peers and clients, the pushes, the peers' clients and
// gossip (without a leave: see leave), then closes the store.
func (c *clusterCache) Close() error {
	c.closeOnce.Do(func() {
		c.stop()
		if err := c.local.Close(); err != nil {
			c.closeErr = err
		}
	})
	return c.closeErr
}

// stop stops everything but the store, in order: nothing may pin a block or
// push once the store closes.
func (c *clusterCache) stop() {
	if c.data != nil {
		c.data.Close()
	}
	if c.shm != nil {
		c.shm.Close()
	}
	if c.cluster != nil {
		c.cluster.Close()
	}
	if c.peers != nil {
		c.peers.Close()
	}
	if c.members != nil {
		if err := c.members.Close(); err != nil {
			c.log.Warn("stopping gossip", "err", err)
		}
	}
	c.fab.close() // after the data plane and the peers, before the arena goes
}

func (c *clusterCache) Put(ctx context.Context, block []byte, chunkKey prefixhash.Key) error {
	return cacheError(c.cluster.Put(ctx, [][]byte{block}, []prefixhash.Key{chunkKey}))
}

func (c *clusterCache) Get(ctx context.Context, key prefixhash.Key) (Ref, error) {
	r, err := c.local.Get(ctx, key)
	if err != nil {
		return nil, cacheError(err)
	}
	return r, nil
}

func (c *clusterCache) Read(ctx context.Context, keys, chunkKeys []prefixhash.Key, remoteBy time.Time) ([][]byte, func(), error) {
	f, err := c.cluster.GetKeys(ctx, keys, chunkKeys, remoteBy)
	if err != nil {
		return nil, nil, cacheError(err)
	}
	return f.Blocks, f.Release, nil
}

func (c *clusterCache) Exists(ctx context.Context, keys, chunkKeys []prefixhash.Key) ([]bool, error) {
	present, err := c.cluster.Exists(ctx, keys, chunkKeys)
	return present, cacheError(err)
}

func (c *clusterCache) Locate(ctx context.Context, chain []prefixhash.Key, blockTokens int) (int, []Location) {
	// One index probe per block: the tiers of the blocks held here come
	// from the probe that found them, not from a second query per block.
	n, spans := c.cluster.Locate(ctx, chain, blockTokens)
	return n, c.locations(spans)
}

func (c *clusterCache) Resume(ctx context.Context, groups []prefixhash.Group, blockTokens int, chain []prefixhash.Key) (prefixhash.Hit, []Location) {
	hit, spans := c.cluster.Resume(ctx, groups, blockTokens, chain)
	return hit, c.locations(spans)
}

// locations converts a located prefix's spans.
func (c *clusterCache) locations(spans []store.Span) []Location {
	runs := make([]Location, 0, len(spans))
	self := c.members.LocalID()
	for _, sp := range spans {
		l := Location{Node: sp.Node, Blocks: sp.Blocks}
		if sp.Node == self {
			l = Location{Tier: sp.Tier, Blocks: sp.Blocks}
		}
		runs = append(runs, l)
	}
	return runs
}

func (c *clusterCache) Publish(ctx context.Context, keys, chunkKeys []prefixhash.Key) (int, error) {
	n, err := c.cluster.Publish(ctx, keys, chunkKeys)
	return n, cacheError(err)
}

func (c *clusterCache) ChunkBlocks(blockTokens int) int { return c.cluster.ChunkBlocks(blockTokens) }
func (c *clusterCache) LongestPrefix(a auth.Access, keys []prefixhash.Key) int {
	return c.local.LongestPrefix(a, keys)
}

func (c *clusterCache) Info(a auth.Access, key prefixhash.Key) (BlockInfo, bool) {
	i, ok := c.local.Info(a, key)
	return BlockInfo{Tier: i.Tier, Size: i.Size, Retention: i.Retention}, ok
}

// Partials lists the incomplete blocks a request with access a may see.
func (c *clusterCache) Partials(a auth.Access) []store.PartialInfo {
	ps := c.local.Partials()
	out := ps[:0]
	for _, p := range ps {
		if a.Allows(p.Tenant) {
			out = append(out, p)
		}
	}
	return out
}

// Remove drops keys from every member (here only with local).
func (c *clusterCache) Remove(ctx context.Context, keys []prefixhash.Key, local bool) ([]bool, error) {
	var found []bool
	var err error
	if local {
		found, err = c.local.Remove(ctx, keys)
	} else {
		found, err = c.cluster.Remove(ctx, keys)
	}
	return found, cacheError(err)
}

// Retain sets the retention of keys on their owners (here only with
// local).
func (c *clusterCache) Retain(ctx context.Context, keys, chunkKeys []prefixhash.Key, r block.Retention, local bool) ([]bool, error) {
	var applied []bool
	var err error
	if local {
		applied, err = c.local.Retain(ctx, keys, r)
	} else {
		applied, err = c.cluster.Retain(ctx, keys, chunkKeys, r)
	}
	return applied, cacheError(err)
}

func (c *clusterCache) DropNamespace(digest uint64) (int, error) {
	n, err := c.local.DropNamespace(digest)
	return n, cacheError(err)
}

func (c *clusterCache) Stats() CacheStats { return localStats(c.local) }
