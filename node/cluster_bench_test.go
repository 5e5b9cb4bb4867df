package node

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/bench"
	"github.com/kvmesh/kvmesh/block"
	"github.com/kvmesh/kvmesh/client"
	"github.com/kvmesh/kvmesh/internal/testkit"
	"github.com/kvmesh/kvmesh/prefixhash"
	kvmeshv1 "github.com/kvmesh/kvmesh/proto/kvmesh/v1"
)

// The cluster benchmarks, run on in-process nodes (Open: the real tiers,
// memberlist, the data planes) on loopback. Each reports its figure next to
// the peer or limit measured in the same run:
//
//	go test -run '^$' -bench 'NodeToNode' -benchtime 30x -count 3 ./node/
//	go test -run '^$' -bench 'ClientSharedMemory' -benchtime 2x -count 3 ./node/
//	go test -run '^$' -bench 'Lookup128k|PeerLookup' -benchtime 2000x -count 3 ./node/

// benchNamespace has blocks of 16 tokens whose payload is exactly payload
// bytes (float16; layers × KV heads × head dim = payload/64).
func benchNamespace(payload int) prefixhash.Namespace {
	lhd := payload / 64
	layers, heads := 1, 1
	for lhd/(layers*heads) > 128 {
		if heads < 8 {
			heads *= 2
		} else {
			layers *= 2
		}
	}
	ns := prefixhash.Namespace{Model: "bench/cluster", DType: prefixhash.Float16, BlockTokens: 16,
		Layers: layers, KVHeads: heads, HeadDim: lhd / (layers * heads)}
	if ns.BlockBytes() != payload {
		panic(fmt.Sprintf("bench namespace of %d payload bytes has %d", payload, ns.BlockBytes()))
	}
	return ns
}

// benchBlock encodes the one-block prompt number i of ns.
func benchBlock(ns prefixhash.Namespace, i int, payload []byte) ([]byte, prefixhash.Key) {
	tokens := make([]uint32, ns.BlockTokens)
	for j := range tokens {
		tokens[j] = uint32(i*ns.BlockTokens + j)
	}
	b, key, err := block.Encode(nil, ns, ns.Root(), tokens, payload)
	if err != nil {
		panic(err)
	}
	return b, key
}

// storeOwned stores on node on blocks of ns that on owns, total bytes of
// payload in all, and returns their keys (each block is its own chunk).
func storeOwned(b *testing.B, on *clusterNode, ns prefixhash.Namespace, total int) []prefixhash.Key {
	b.Helper()
	payload := make([]byte, ns.BlockBytes())
	for j := range payload {
		payload[j] = byte(j * 7)
	}
	var keys []prefixhash.Key
	for i := 0; len(keys)*ns.BlockBytes() < total; i++ {
		payload[0], payload[1] = byte(i), byte(i>>8)
		blk, key := benchBlock(ns, i, payload)
		if on.cluster.cluster.Owners(key)[0] != on.ID() {
			continue
		}
		if err := on.cluster.local.Put(context.Background(), blk); err != nil {
			b.Fatal(err)
		}
		keys = append(keys, key)
	}
	return keys
}

var benchSizes = []struct {
	name string
	n    int
}{{"64KiB", 64 << 10}, {"1MiB", 1 << 20}, {"4MiB", 4 << 20}}

const (
	benchBatch  = 16 << 20 // bytes per timed batch
	benchSource = 64 << 20 // distinct bytes the batches cycle through
)

func median(d []time.Duration) time.Duration {
	s := slices.Clone(d)
	slices.Sort(s)
	return s[len(s)/2]
}

func quantile(d []time.Duration, q float64) time.Duration {
	s := slices.Clone(d)
	slices.Sort(s)
	return s[min(len(s)-1, int(q*float64(len(s))))]
}

// BenchmarkNodeToNode moves batches of 16 MiB of blocks from node B's DRAM to
// node A through the node's data plane, two ways: "peer" is A's peer client
// (transfer over TCP: the bytes alone), "cluster" is A's store.Cluster.GetKeys
// (the same, plus each block's verification: key, header and payload
// checksums). "raw" is a plain Go TCP stream (bench.RawTCP, 1 MiB writes)
// measured between the batches of the same run. GB/s are of the median batch.
func BenchmarkNodeToNode(b *testing.B) {
	for _, size := range benchSizes {
		b.Run("size="+size.name, func(b *testing.B) {
			ns := benchNamespace(size.n)
			nodes := startClusterNodes(b, 2, func(_ int, o *Options) {
				o.Tiers.DRAMBytes, o.Limits.MaxBlockBytes, o.Cluster.ChunkTokens, o.Listen.ShmSocket = 256*MiB, 8*MiB, ns.BlockTokens, ShmOff
			})
			a, on := nodes[0], nodes[1]
			keys := storeOwned(b, on, ns, benchSource)
			per := max(1, benchBatch/size.n)
			win := func(i int) []prefixhash.Key { lo := i * per % (len(keys) - per + 1); return keys[lo : lo+per] }
			ctx := context.Background()
			peer := func(i int) error {
				blocks, release, err := a.cluster.peers.Get(ctx, on.ID(), win(i))
				if err != nil {
					return err
				}
				defer release()
				for _, blk := range blocks {
					if blk == nil {
						return errors.New("a miss")
					}
				}
				return nil
			}
			cluster := func(i int) error {
				ks := win(i)
				f, err := a.cluster.cluster.GetKeys(ctx, ks, ks, time.Time{})
				if err != nil {
					return err
				}
				defer f.Release()
				for _, blk := range f.Blocks {
					if blk == nil {
						return errors.New("a miss")
					}
				}
				return nil
			}
			raw := func() float64 {
				r, err := bench.RawTCP(ctx, bench.TCPOptions{Duration: 250 * time.Millisecond, WriteBytes: benchBatch})
				if err != nil {
					b.Fatal(err)
				}
				return r.GBps
			}
			for _, f := range []func(int) error{peer, cluster} { // warm: connections, pools, pages
				if err := f(0); err != nil {
					b.Fatal(err)
				}
			}
			var rawGBps []float64
			var tPeer, tCluster []time.Duration
			b.ResetTimer()
			for i := range b.N {
				if i%10 == 0 {
					b.StopTimer()
					rawGBps = append(rawGBps, raw())
					b.StartTimer()
				}
				for j := range 2 { // alternate which goes first
					f, spent := peer, &tPeer
					if (i+j)%2 == 1 {
						f, spent = cluster, &tCluster
					}
					t0 := time.Now()
					if err := f(i + 1); err != nil {
						b.Fatal(err)
					}
					*spent = append(*spent, time.Since(t0))
				}
			}
			b.StopTimer()
			rawGBps = append(rawGBps, raw())
			slices.Sort(rawGBps)
			rawMed := rawGBps[len(rawGBps)/2]
			batch := float64(per * size.n)
			peerGBps, clusterGBps := batch/median(tPeer).Seconds()/1e9, batch/median(tCluster).Seconds()/1e9
			b.SetBytes(int64(batch))
			b.ReportMetric(rawMed, "raw_GB/s")
			b.ReportMetric(peerGBps, "peer_GB/s")
			b.ReportMetric(clusterGBps, "cluster_GB/s")
			b.ReportMetric(peerGBps/rawMed, "peer/raw")
			b.ReportMetric(clusterGBps/rawMed, "cluster/raw")
			b.ReportMetric(peerGBps/1.44, "peer/mooncake")
		})
	}
}

// kvTarget runs bench.KVLoad against a node through the Go client: key k is
// the one-block prompt number k of ns (SET is client.Put of it, GET is
// client.GetKeys of its key, copied into the caller's buffer as Redis's
// reader does).
type kvTarget struct {
	name, addr string
	ns         prefixhash.Namespace
	opts       client.Options
}

func (t kvTarget) Name() string { return t.name }

func (t kvTarget) Dial(context.Context) (bench.KVConn, error) {
	c, err := client.Dial(t.addr, t.opts)
	if err != nil {
		return nil, err
	}
	return &kvConn{c: c, ns: t.ns}, nil
}

type kvConn struct {
	c  *client.Client
	ns prefixhash.Namespace
}

func (c *kvConn) tokens(k int) []uint32 {
	tokens := make([]uint32, c.ns.BlockTokens)
	for j := range tokens {
		tokens[j] = uint32(k*c.ns.BlockTokens + j)
	}
	return tokens
}

func (c *kvConn) Set(ctx context.Context, k int, v []byte) error {
	_, err := c.c.Put(ctx, c.ns, client.Prompt{Tokens: c.tokens(k)}, [][]byte{v})
	return err
}

func (c *kvConn) Get(ctx context.Context, k int, dst []byte) ([]byte, error) {
	found := false
	err := c.c.GetKeys(ctx, c.ns, prefixhash.Keys(c.ns, c.tokens(k)), func(b client.Block) error {
		found = b.Found
		dst = append(dst[:0], b.Payload...)
		return nil
	})
	if err == nil && !found {
		err = fmt.Errorf("key %d: a miss", k)
	}
	return dst, err
}

func (c *kvConn) Close() error { return c.c.Close() }

// BenchmarkClientSharedMemory runs the same GET/SET load (bench.KVLoad: 1 MiB
// values, 4 connections each with one request in flight, 256 keys) against a
// node through the Go client on the node's host (the shared-memory data
// plane), the client's TCP data plane, and redis-server 7 (bench.StartRedis),
// one after the other in each round, and reports each target's GET GB/s (the
// median round) and the ratios. A kvmesh SET of a key already cached is a
// cheap no-op on the node (blocks are content-addressed), so SET figures do
// not compare with Redis's; they are reported for what they are.
func BenchmarkClientSharedMemory(b *testing.B) {
	redis, err := bench.StartRedis(context.Background(), bench.RedisOptions{Dir: b.TempDir()})
	if errors.Is(err, bench.ErrMissing) {
		b.Skip(err)
	}
	if err != nil {
		b.Fatal(err)
	}
	defer redis.Close()
	ns := benchNamespace(1 << 20)
	n := startClusterNodes(b, 1, func(_ int, o *Options) {
		o.Tiers.DRAMBytes, o.Limits.MaxBlockBytes, o.Listen.ShmRegionBytes = 512*MiB, 2*MiB, 64*MiB
	})[0]
	targets := []bench.KVTarget{
		kvTarget{name: "kvmesh-shm", addr: n.GRPCAddr(), ns: ns},
		kvTarget{name: "kvmesh-tcp", addr: n.GRPCAddr(), ns: ns, opts: client.Options{Transport: client.TransportTCP}},
		redis.Target(),
	}
	load := bench.KVLoadOptions{ValueBytes: ns.BlockBytes(), Concurrency: 4, Keys: 256, Duration: time.Second}
	get, set := map[string][]float64{}, map[string][]float64{}
	ctx := context.Background()
	var views []float64
	b.ResetTimer()
	for range b.N {
		for _, t := range targets {
			s, g, err := bench.KVLoad(ctx, t, load)
			if err != nil || s.Errors > 0 || g.Errors > 0 {
				b.Fatalf("%s: %v (%d SET and %d GET errors)", t.Name(), err, s.Errors, g.Errors)
			}
			get[t.Name()] = append(get[t.Name()], g.GBps)
			set[t.Name()] = append(set[t.Name()], s.GBps)
		}
		views = append(views, viewLoad(b, n.GRPCAddr(), ns, load))
	}
	b.StopTimer()
	med := func(v []float64) float64 {
		s := slices.Clone(v)
		slices.Sort(s)
		return s[len(s)/2]
	}
	for _, t := range targets {
		b.ReportMetric(med(get[t.Name()]), t.Name()+"_GET_GB/s")
		b.ReportMetric(med(set[t.Name()]), t.Name()+"_SET_GB/s")
	}
	b.ReportMetric(med(views), "kvmesh-shm-view_GET_GB/s")
	b.ReportMetric(med(get["kvmesh-shm"])/med(get["redis"]), "shm/redis")
	b.ReportMetric(med(views)/med(get["redis"]), "shm-view/redis")
	b.ReportMetric(med(get["kvmesh-tcp"])/med(get["redis"]), "tcp/redis")
}

// viewLoad reads the keys KVLoad stored the way a worker beside its node
// would: through shared memory, in batches of 16 blocks, using each block in
// place (here: its first 8 bytes, which KVLoad set to the key) instead of
// copying it out. load.Concurrency clients read for load.Duration; it
// returns GB/s of payload.
func viewLoad(b *testing.B, addr string, ns prefixhash.Namespace, load bench.KVLoadOptions) float64 {
	b.Helper()
	const batch = 16
	keys := make([]prefixhash.Key, load.Keys)
	for k := range keys {
		keys[k] = prefixhash.Keys(ns, (&kvConn{ns: ns}).tokens(k))[0]
	}
	var total atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, load.Concurrency)
	start := time.Now()
	end := start.Add(load.Duration)
	for w := range load.Concurrency {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c, err := client.Dial(addr, client.Options{})
			if err != nil {
				errs <- err
				return
			}
			defer c.Close()
			for i := w * batch; time.Now().Before(end); i += load.Concurrency * batch {
				lo := i % (len(keys) - batch)
				err := c.GetKeys(context.Background(), ns, keys[lo:lo+batch], func(blk client.Block) error {
					if !blk.Found || binary.LittleEndian.Uint64(blk.Payload) != uint64(lo+blk.Index) {
						return fmt.Errorf("key %d: found %v, wrong bytes", lo+blk.Index, blk.Found)
					}
					total.Add(int64(len(blk.Payload)))
					return nil
				})
				if err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		b.Fatal(err)
	}
	return float64(total.Load()) / time.Since(start).Seconds() / 1e9
}

// lookupCluster starts 4 nodes and puts a 128k-token prompt (8192 blocks of
// 16 tokens, placement chunks of 512 tokens: 256 chunks) through the first,
// and returns the nodes, the prompt and its chain once the fourth node finds
// all of it.
func lookupCluster(b *testing.B) ([]*clusterNode, prefixhash.Namespace, []uint32, []prefixhash.Key) {
	b.Helper()
	ns := prefixhash.Namespace{Model: "bench/lookup", DType: prefixhash.Float16, BlockTokens: 16, Layers: 1, KVHeads: 1, HeadDim: 4}
	nodes := startClusterNodes(b, 4, func(_ int, o *Options) {
		o.Cluster.ChunkTokens, o.Cluster.LookupTimeout, o.Limits.MaxMessageBytes, o.Limits.ChunkBytes = 512, time.Second, 8*MiB, 1*MiB
	})
	tokens := make([]uint32, 128<<10)
	for i := range tokens {
		tokens[i] = uint32(i * 2654435761)
	}
	chain := prefixhash.Keys(ns, tokens)
	blocks := make([][]byte, len(chain))
	payload := make([]byte, ns.BlockBytes())
	for i := range chain {
		parent := ns.Root()
		if i > 0 {
			parent = chain[i-1]
		}
		var err error
		if blocks[i], _, err = block.Encode(nil, ns, parent, tokens[i*16:(i+1)*16], payload); err != nil {
			b.Fatal(err)
		}
	}
	cl := nodes[0].cluster.cluster
	ctx := context.Background()
	if err := cl.Put(ctx, blocks, cl.ChunkKeys(chain, ns.BlockTokens, 0, len(chain))); err != nil {
		b.Fatal(err)
	}
	if err := cl.Flush(ctx); err != nil {
		b.Fatal(err)
	}
	if st := cl.Stats(); st.PushDropped+st.PushFailed > 0 {
		b.Fatalf("pushes failed: %+v", st)
	}
	testkit.WaitFor(b, "node 4 to find the whole prompt", func() bool {
		return nodes[3].cluster.cluster.LongestPrefix(ctx, chain, ns.BlockTokens) == len(chain)
	})
	return nodes, ns, tokens, chain
}

// BenchmarkLookup128k looks a 128k-token prompt up on a 4-node cluster
// through a node that did not produce it (so three quarters of the prompt is
// on other nodes), by four paths: "cluster" is store.Cluster.LongestPrefix
// given the chain (one PeerService.Lookup to each other node, in parallel);
// "grpc" the whole client.Lookup, what an inference worker calls (the client
// hashes the prompt and sends its chain, 8192 keys; the node answers with
// counts and runs); "grpc-keys" the same call given the chain (Prompt.Keys:
// what it costs besides hashing); "grpc-tokens" client.LookupTokens (the prompt's 128k
// tokens sent, the chain hashed on the node, the answer listing 8192 blocks
// and where each is); "grpc-tokens-summary" the tokens sent, the answer
// without the listing. It reports the p50 and p99 of b.N lookups (target:
// p99 ≤ 2 ms) and the CPU time they took, client and all four nodes
// together (this process's), which the machine's other load disturbs less.
func BenchmarkLookup128k(b *testing.B) {
	nodes, ns, tokens, chain := lookupCluster(b)
	d := nodes[3]
	ctx := context.Background()
	c, err := client.Dial(d.GRPCAddr(), client.Options{MaxMessageBytes: 8 * MiB})
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	raw := rawAPI(b, d.GRPCAddr())
	summary := &kvmeshv1.LookupRequest{Namespace: client.NamespaceProto(ns), Tokens: tokens, Summary: true}
	for _, path := range []struct {
		name   string
		lookup func() (int, error)
	}{
		{"cluster", func() (int, error) { return d.cluster.cluster.LongestPrefix(ctx, chain, ns.BlockTokens), nil }},
		{"grpc", func() (int, error) {
			l, err := c.Lookup(ctx, ns, client.Prompt{Tokens: tokens})
			return l.CachedBlocks, err
		}},
		{"grpc-keys", func() (int, error) {
			l, err := c.Lookup(ctx, ns, client.Prompt{Keys: chain})
			return l.CachedBlocks, err
		}},
		{"grpc-tokens", func() (int, error) { l, err := c.LookupTokens(ctx, ns, tokens); return l.CachedBlocks, err }},
		{"grpc-tokens-summary", func() (int, error) {
			l, err := raw.cache.Lookup(ctx, summary)
			return int(l.GetCachedBlocks()), err
		}},
	} {
		b.Run("path="+path.name, func(b *testing.B) {
			lat := make([]time.Duration, 0, b.N)
			cpu0 := cpuTime()
			for range b.N {
				t0 := time.Now()
				if n, err := path.lookup(); err != nil || n != len(chain) {
					b.Fatalf("lookup found %d of %d blocks, %v", n, len(chain), err)
				}
				lat = append(lat, time.Since(t0))
			}
			b.ReportMetric(float64((cpuTime()-cpu0).Microseconds())/1000/float64(b.N), "cpu_ms/op")
			b.ReportMetric(float64(quantile(lat, 0.5).Microseconds())/1000, "p50_ms")
			b.ReportMetric(float64(quantile(lat, 0.99).Microseconds())/1000, "p99_ms")
		})
	}
}

// BenchmarkPeerLookup measures what one owner's part of that lookup costs
// (2048 keys in 64 runs of 32: a 128k-token prompt's share of one of four
// nodes) on the two paths a lookup can take: a lookup frame on the data
// plane (transfer.Client.Lookup, what the node uses) and the PeerService
// gRPC call. p50 and p99 of b.N calls.
func BenchmarkPeerLookup(b *testing.B) {
	nodes, _, _, chain := lookupCluster(b)
	a, other := nodes[0], nodes[1]
	runs := make([][]prefixhash.Key, 64)
	for i := range runs {
		runs[i] = chain[i*32 : (i+1)*32]
	}
	ctx := context.Background()
	for _, path := range []struct {
		name string
		call func() error
	}{
		{"transfer", func() error { _, err := a.cluster.peers.Lookup(ctx, other.ID(), runs); return err }},
		{"grpc", func() error { _, err := a.cluster.peers.grpcLookup(ctx, other.ID(), runs); return err }},
	} {
		b.Run("path="+path.name, func(b *testing.B) {
			lat := make([]time.Duration, 0, b.N)
			for range b.N {
				t0 := time.Now()
				if err := path.call(); err != nil {
					b.Fatal(err)
				}
				lat = append(lat, time.Since(t0))
			}
			b.ReportMetric(float64(quantile(lat, 0.5).Microseconds())/1000, "p50_ms")
			b.ReportMetric(float64(quantile(lat, 0.99).Microseconds())/1000, "p99_ms")
		})
	}
}

//lint:file-ignore SA1019 the node's tests call the client's deprecated methods, kept one release (client/deprecated.go).
