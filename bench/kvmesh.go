package bench

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"sync"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/kvmesh/kvmesh/client"
	"github.com/kvmesh/kvmesh/prefixhash"
)

// This file is kvmesh as the suites drive it: through its Go client, the way
// an inference worker does, against nodes the bench started (StartDaemons)
// or an existing cluster (Env.Addrs).

// startNodes returns the gRPC addresses a suite runs against: env.Addrs,
// or the nodes it starts with o (then also their Daemons), stopped by the
// returned stop. Joined nodes that fail to start are a *clusterUnavailable
// (a build that cannot join nodes).
func startNodes(ctx context.Context, env *Env, o DaemonOptions) (*Daemons, []string, func() error, error) {
	if len(env.Addrs) > 0 {
		return nil, env.Addrs, func() error { return nil }, nil
	}
	if env.Binary == "" {
		return nil, nil, nil, fmt.Errorf("%w: run it as `kvmesh bench`, or point it at a cluster with --addr", ErrNoBinary)
	}
	o.Binary, o.Dir = env.Binary, env.WorkDir
	ds, err := StartDaemons(ctx, o)
	if err != nil {
		if o.Join && o.Nodes > 1 && ctx.Err() == nil {
			err = &clusterUnavailable{err}
		}
		return nil, nil, nil, err
	}
	return ds, ds.Addrs(), ds.Close, nil
}

// nodeAddrs is startNodes without the Daemons.
func nodeAddrs(ctx context.Context, env *Env, o DaemonOptions) ([]string, func() error, error) {
	_, addrs, stop, err := startNodes(ctx, env, o)
	return addrs, stop, err
}

// clusterUnavailable means the nodes could not be joined into a cluster
// (a build without clustering): the cluster size is skipped, not failed.
type clusterUnavailable struct{ err error }

func (e *clusterUnavailable) Error() string {
	return "this kvmesh cannot join nodes into a cluster: " + e.err.Error()
}
func (e *clusterUnavailable) Unwrap() error { return e.err }

// KVNamespace returns the namespace the store suite keys its values under:
// one-layer float16 blocks of 16 tokens whose payload is valueBytes (a
// multiple of 64, so that head_dim = valueBytes/64).
func KVNamespace(valueBytes int) (prefixhash.Namespace, error) {
	if valueBytes < 64 || valueBytes%64 != 0 {
		return prefixhash.Namespace{}, fmt.Errorf("bench: kvmesh values are block payloads: %d bytes is not a positive multiple of 64", valueBytes)
	}
	ns := prefixhash.Namespace{Model: fmt.Sprintf("kvmesh/bench-kv-%d", valueBytes), DType: prefixhash.Float16,
		BlockTokens: 16, Layers: 1, KVHeads: 1, HeadDim: valueBytes / 64}
	if ns.BlockBytes() != valueBytes {
		panic(fmt.Sprintf("bench: KVNamespace(%d) holds %d bytes", valueBytes, ns.BlockBytes()))
	}
	return ns, ns.Validate()
}

// kvTokens writes the tokens of the one-block prompt that stands for key
// k: distinct keys, distinct tokens, hence distinct block keys.
func kvTokens(dst []uint32, k int) {
	clear(dst)
	dst[0], dst[1], dst[2] = uint32(k), uint32(uint64(k)>>32), 0x6b766d
}

// NodeKV returns the kvmesh node at addr as a KVTarget: key k is the
// one-block prompt kvTokens(k) of KVNamespace(valueBytes) and its value the
// block's payload. Every connection is a client of its own (its own gRPC
// connection), as every Redis connection is. name names it in reports
// ("kvmesh-grpc", ...); opts configure the clients.
func NodeKV(name, addr string, valueBytes int, opts client.Options) (KVTarget, error) {
	ns, err := KVNamespace(valueBytes)
	if err != nil {
		return nil, err
	}
	return &kvmeshTarget{name: name, addr: addr, ns: ns, opts: opts}, nil
}

type kvmeshTarget struct {
	name string
	addr string
	ns   prefixhash.Namespace
	opts client.Options
}

var (
	_ KVTarget   = (*kvmeshTarget)(nil)
	_ KVResetter = (*kvmeshTarget)(nil)
	_ KVResetter = redisTarget{}
)

func (t *kvmeshTarget) Name() string { return t.name }

func (t *kvmeshTarget) Dial(context.Context) (KVConn, error) {
	c, err := client.Dial(t.addr, t.opts)
	if err != nil {
		return nil, err
	}
	kc := &kvmeshConn{t: t, c: c, tokens: make([]uint32, t.ns.BlockTokens), payloads: make([][]byte, 1)}
	if t.opts.Transport == client.TransportAuto {
		// The same-host path reads blocks in place: GETs view them.
		return kvmeshViewConn{kc}, nil
	}
	return kc, nil
}

// Reset drops the target's namespace from the node.
func (t *kvmeshTarget) Reset(ctx context.Context) error {
	c, err := client.Dial(t.addr, t.opts)
	if err != nil {
		return err
	}
	defer c.Close()
	_, err = c.DropNamespace(ctx, t.ns)
	return err
}

type kvmeshConn struct {
	t        *kvmeshTarget
	c        *client.Client
	tokens   []uint32
	payloads [][]byte
	keys     [1]prefixhash.Key
}

func (c *kvmeshConn) Set(ctx context.Context, k int, value []byte) error {
	kvTokens(c.tokens, k)
	c.payloads[0] = value
	stored, err := c.c.Put(ctx, c.t.ns, client.Prompt{Tokens: c.tokens}, c.payloads)
	c.payloads[0] = nil
	if err != nil {
		return err
	}
	if len(stored) != 1 {
		return fmt.Errorf("bench: kvmesh stored %d of 1 block", len(stored))
	}
	return nil
}

var errKVMiss = errors.New("bench: kvmesh: block not found")

func (c *kvmeshConn) Get(ctx context.Context, k int, dst []byte) ([]byte, error) {
	kvTokens(c.tokens, k)
	c.keys[0] = prefixhash.BlockKey(c.t.ns.Root(), c.tokens)
	size := c.t.ns.BlockBytes()
	if cap(dst) < size {
		dst = make([]byte, size)
	}
	dst = dst[:size]
	blocks, err := c.c.Get(ctx, c.t.ns, client.Prompt{Keys: c.keys[:]}, client.Into([][]byte{dst}))
	if err != nil {
		return dst[:0], err
	}
	if len(blocks) != 1 || !blocks[0].Found {
		return dst[:0], errKVMiss
	}
	return dst, nil
}

// kvmeshViewConn is a kvmeshConn whose GETs read in place (KVViewer).
type kvmeshViewConn struct{ *kvmeshConn }

// View reads key's block in place: through the same-host path, the
// payload is the node's memory, leased for the call.
func (c kvmeshViewConn) View(ctx context.Context, k int, fn func(v []byte) error) error {
	kvTokens(c.tokens, k)
	c.keys[0] = prefixhash.BlockKey(c.t.ns.Root(), c.tokens)
	v, err := c.c.View(ctx, c.t.ns, client.Prompt{Keys: c.keys[:]})
	if err != nil {
		return err
	}
	defer v.Release()
	if len(v.Blocks) != 1 || !v.Blocks[0].Found {
		return errKVMiss
	}
	return fn(v.Blocks[0].Payload)
}

func (c *kvmeshConn) Close() error { return c.c.Close() }

// stampKey writes k into the first 8 bytes of v, as KVLoad stamps values.
func stampKey(v []byte, k uint64) { binary.LittleEndian.PutUint64(v, k) }

// clientPool is one client per address, dialed on first use; Close closes
// them. Safe for concurrent use.
type clientPool struct {
	opts client.Options
	mu   struct {
		sync.Mutex
		m map[string]*client.Client
	}
}

func (p *clientPool) get(addr string) (*client.Client, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if c, ok := p.mu.m[addr]; ok {
		return c, nil
	}
	c, err := client.Dial(addr, p.opts)
	if err != nil {
		return nil, err
	}
	if p.mu.m == nil {
		p.mu.m = map[string]*client.Client{}
	}
	p.mu.m[addr] = c
	return c, nil
}

func (p *clientPool) Close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	var errs []error
	for _, c := range p.mu.m {
		errs = append(errs, c.Close())
	}
	p.mu.m = nil
	return errors.Join(errs...)
}

// KvmeshCluster returns a ClusterFactory of kvmesh nodes for trace replays:
// spec.Nodes `kvmesh serve` processes (env.Binary) joined into one cluster,
// or left separate for spec.LocalOnly, each with DRAM for
// spec.CapacityBlocks blocks (and the smallest NVMe tier, 64 MiB) and at
// most spec.CapacityBlocks blocks cached over both tiers; or, with
// env.Addrs, the running cluster there, whose trace namespace is dropped
// before and after the replay (local-only is then unavailable). Nodes are
// driven through the Go client: Lookup with the prompt's tokens, Put of the
// payloads of the blocks it missed. A cluster that cannot be joined is an
// error wrapping ErrMissing.
func KvmeshCluster(env *Env) ClusterFactory {
	return func(ctx context.Context, spec ClusterSpec) (Cluster, error) {
		if len(env.Addrs) > 0 && spec.LocalOnly {
			return nil, fmt.Errorf("%w: local-only needs separate nodes, and --addr names one cluster", ErrMissing)
		}
		perBlock := int64(spec.BlockBytes) + 128 // slot header, size-class rounding
		dram := int64(spec.CapacityBlocks)*perBlock + 64<<20
		nvme, maxBlock := int64(0), int64(0) // the daemons' defaults: the smallest NVMe tier, 16 MiB blocks
		if spec.DRAMBlocks > 0 {
			// DRAM for DRAMBlocks (1 MiB at least), NVMe for the rest
			// with room for segment reclaim; a DRAM tier that small must
			// not have to hold a 16 MiB block.
			dram = dramBytesFor(spec.DRAMBlocks, spec.BlockBytes)
			nvme = (2*int64(spec.CapacityBlocks)*perBlock + 64<<20 + 64<<20 - 1) &^ (64<<20 - 1)
			maxBlock = max(64<<10, int64(spec.BlockBytes))
		}
		// DRAM has slack for slot headers and size classes, and there is an
		// NVMe tier: MaxBlocks is what holds each node to its capacity, in
		// both tiers together.
		addrs, stop, err := nodeAddrs(ctx, env, DaemonOptions{Nodes: spec.Nodes, Join: !spec.LocalOnly, DRAMBytes: dram, NVMeBytes: nvme, MaxBlockBytes: maxBlock,
			MaxBlocks: spec.CapacityBlocks, Eviction: spec.Eviction, NVMeAdmission: spec.NVMeAdmission})
		var unavailable *clusterUnavailable
		if errors.As(err, &unavailable) {
			return nil, fmt.Errorf("%w: %w", ErrMissing, err)
		}
		if err != nil {
			return nil, err
		}
		c := &kvmeshCluster{ns: spec.Namespace, stop: stop, pool: &clientPool{opts: client.Options{MaxRetries: -1}},
			drop: len(env.Addrs) > 0}
		for _, a := range addrs {
			cl, err := c.pool.get(a)
			if err != nil {
				c.Close()
				return nil, err
			}
			c.nodes = append(c.nodes, &kvmeshNode{c: cl, ns: spec.Namespace})
		}
		if c.drop {
			if err := c.dropNamespace(ctx); err != nil {
				c.Close()
				return nil, err
			}
		}
		return c, nil
	}
}

// dramBytesFor is the DRAM tier KvmeshCluster gives a node for blocks
// blocks of blockBytes (ClusterSpec.DRAMBlocks): 1 MiB at least, the
// daemons' least.
func dramBytesFor(blocks, blockBytes int) int64 {
	return max(int64(blocks)*(int64(blockBytes)+128), 1<<20)
}

type kvmeshCluster struct {
	ns    prefixhash.Namespace
	nodes []Node
	stop  func() error
	pool  *clientPool
	drop  bool // an existing cluster: drop the namespace on Close
}

var (
	_ Cluster    = (*kvmeshCluster)(nil)
	_ tierWriter = (*kvmeshCluster)(nil)
)

// TierCounts are one tier's counters summed over a cluster's nodes, read
// from their Stats after a replay.
type TierCounts struct {
	Name         string `json:"name"`
	Blocks       int64  `json:"blocks"`
	WrittenBytes int64  `json:"written_bytes"`
	// Evicted are the blocks that left the tier, by reason.
	Evicted client.TierEvictions `json:"evicted"`
}

// tierWriter is a Cluster whose nodes report their tiers' counters.
type tierWriter interface {
	TierCounts(ctx context.Context) ([]TierCounts, error)
}

// TierCounts sums the nodes' tier counters, by tier name.
func (c *kvmeshCluster) TierCounts(ctx context.Context) ([]TierCounts, error) {
	var out []TierCounts
	for _, n := range c.nodes {
		st, err := n.(*kvmeshNode).c.Stats(ctx)
		if err != nil {
			return nil, err
		}
		for _, t := range st.Tiers {
			k := slices.IndexFunc(out, func(x TierCounts) bool { return x.Name == t.Name })
			if k < 0 {
				out = append(out, TierCounts{Name: t.Name})
				k = len(out) - 1
			}
			x := &out[k]
			x.Blocks += t.Blocks
			x.WrittenBytes += t.WrittenBytes
			x.Evicted.Capacity += t.Evicted.Capacity
			x.Evicted.Demoted += t.Evicted.Demoted
			x.Evicted.Refused += t.Evicted.Refused
			x.Evicted.Unadmitted += t.Evicted.Unadmitted
			x.Evicted.Expired += t.Evicted.Expired
		}
	}
	return out, nil
}

func (c *kvmeshCluster) Nodes() []Node   { return c.nodes }
func (c *kvmeshCluster) Backend() string { return BackendKvmesh }

func (c *kvmeshCluster) dropNamespace(ctx context.Context) error {
	for _, n := range c.nodes {
		if _, err := n.(*kvmeshNode).c.DropNamespace(ctx, c.ns); err != nil {
			return fmt.Errorf("bench: drop the trace namespace: %w", err)
		}
	}
	return nil
}

// Close stops the nodes it started, or drops the namespace from a running
// cluster.
func (c *kvmeshCluster) Close() error {
	var errs []error
	if c.drop {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		errs = append(errs, c.dropNamespace(ctx))
		cancel()
	}
	errs = append(errs, c.pool.Close(), c.stop())
	return errors.Join(errs...)
}

// kvmeshNode is one node of a replay, through its client.
type kvmeshNode struct {
	c  *client.Client
	ns prefixhash.Namespace
}

func (n *kvmeshNode) LongestPrefix(ctx context.Context, p Prompt) (int, error) {
	if len(p.Keys) == 0 {
		return 0, nil
	}
	l, err := n.c.Lookup(ctx, n.ns, client.Prompt{Tokens: p.Tokens})
	if err != nil {
		return 0, err
	}
	return l.CachedBlocks, nil
}

func (n *kvmeshNode) Put(ctx context.Context, p Prompt, blocks []Block) error {
	if len(blocks) == 0 {
		return nil
	}
	payloads := make([][]byte, blocks[len(blocks)-1].Index+1)
	for _, b := range blocks {
		payloads[b.Index] = b.Payload
	}
	_, err := n.c.Put(ctx, n.ns, client.Prompt{Tokens: p.Tokens}, payloads)
	return err
}

// nodeHTTPAddr returns the /metrics address the node at grpcAddr reports
// for itself (Members).
func nodeHTTPAddr(ctx context.Context, c *client.Client) (string, error) {
	m, err := c.Members(ctx)
	if err != nil {
		return "", err
	}
	for _, mb := range m.Members {
		if mb.ID == m.SelfID && mb.HTTPAddr != "" {
			return mb.HTTPAddr, nil
		}
	}
	return "", fmt.Errorf("bench: node %s reports no metrics address", m.SelfID)
}

// transferBytes returns, per data-plane transport ("tcp", "shm"), the value
// bytes the node's data plane has moved (kvmesh_transfer_bytes_total, both
// directions), read from its /metrics. A node without a data plane has
// none.
func transferBytes(ctx context.Context, httpAddr string) (map[string]float64, error) {
	mf, err := nodeMetrics(ctx, httpAddr)
	if err != nil {
		return nil, err
	}
	return countersBy(mf, "kvmesh_transfer_bytes_total", "transport"), nil
}

// countersBy sums the counters of the metric family name by the value of
// their label label.
func countersBy(mf map[string]*dto.MetricFamily, name, label string) map[string]float64 {
	out := map[string]float64{}
	for _, m := range mf[name].GetMetric() {
		for _, l := range m.GetLabel() {
			if l.GetName() == label {
				out[l.GetValue()] += m.GetCounter().GetValue()
			}
		}
	}
	return out
}

// nodeMetrics reads and parses the /metrics page the node serves at
// httpAddr.
func nodeMetrics(ctx context.Context, httpAddr string) (map[string]*dto.MetricFamily, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+httpAddr+"/metrics", nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, fmt.Errorf("bench: node metrics: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("bench: node metrics: %s", resp.Status)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	mf, err := p.TextToMetricFamilies(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return nil, fmt.Errorf("bench: node metrics: %w", err)
	}
	return mf, nil
}
