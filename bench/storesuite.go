package bench

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/kvmesh/kvmesh/client"
)

// StoreOptions configures the store suite. Zero fields take the defaults
// documented on each, for a full run or for --quick.
type StoreOptions struct {
	// BlockSizes are the value (block payload) sizes in bytes, multiples of
	// 64. Default 64 KiB, 1 MiB and 4 MiB.
	BlockSizes []int
	// Concurrency lists the client concurrencies: connections with one
	// request in flight each, for kvmesh and Redis alike. Default 4 and 16.
	Concurrency []int
	// Duration is the length of each GET and SET phase, and of each raw TCP
	// and memcpy measurement. Default 2s; quick 500ms.
	Duration time.Duration
	// DataSetBytes is what each load fills before its GET phase. Default
	// 256 MiB; quick 64 MiB.
	DataSetBytes int
	// MaxSetBytes bounds what each SET phase writes (new keys). Default
	// 1 GiB; quick 256 MiB.
	MaxSetBytes int64
	// NodeDRAMBytes is the DRAM tier of the node the suite starts, so that
	// a load never evicts. Default DataSetBytes + MaxSetBytes + 256 MiB.
	NodeDRAMBytes int64
	// Redis configures the Redis server. Dir defaults to the work directory.
	Redis RedisOptions
}

// EnsureDefaults fills zero fields with their defaults for a full run, or
// for --quick when quick is set.
func (o *StoreOptions) EnsureDefaults(quick bool, workDir string) {
	if len(o.BlockSizes) == 0 {
		o.BlockSizes = []int{64 << 10, 1 << 20, 4 << 20}
	}
	if len(o.Concurrency) == 0 {
		o.Concurrency = []int{4, 16}
	}
	if o.Duration == 0 {
		o.Duration = pick(quick, 2*time.Second, 500*time.Millisecond)
	}
	if o.DataSetBytes == 0 {
		o.DataSetBytes = pick(quick, 256<<20, 64<<20)
	}
	if o.MaxSetBytes == 0 {
		o.MaxSetBytes = pick[int64](quick, 1<<30, 256<<20)
	}
	if o.NodeDRAMBytes == 0 {
		o.NodeDRAMBytes = int64(o.DataSetBytes) + o.MaxSetBytes + 256<<20
	}
	if o.Redis.Dir == "" {
		o.Redis.Dir = workDir
	}
}

// pick returns full, or quick when quick is set.
func pick[T any](quick bool, full, q T) T {
	if quick {
		return q
	}
	return full
}

// Validate names the first field that is out of range.
func (o *StoreOptions) Validate() error {
	for _, b := range o.BlockSizes {
		if b < 64 || b%64 != 0 || b > 64<<20 {
			return fmt.Errorf("bench: store: block size %d is not a multiple of 64 in 64..64MiB", b)
		}
	}
	for _, c := range o.Concurrency {
		if c < 1 || c > 1024 {
			return fmt.Errorf("bench: store: concurrency %d is outside 1..1024", c)
		}
	}
	switch {
	case o.Duration <= 0:
		return fmt.Errorf("bench: store: duration %v must be positive", o.Duration)
	case o.DataSetBytes < 1:
		return fmt.Errorf("bench: store: data set bytes %d must be positive", o.DataSetBytes)
	case o.MaxSetBytes < 1:
		return fmt.Errorf("bench: store: max set bytes %d must be positive", o.MaxSetBytes)
	case o.NodeDRAMBytes < 64<<20:
		return fmt.Errorf("bench: store: node DRAM %d bytes is less than 64 MiB", o.NodeDRAMBytes)
	}
	return nil
}

// StoreSuite measures kvmesh's GET and SET of whole blocks through its Go
// client, over the network path and the same-host shared-memory path, next
// to Redis 7 driven by the same load loop (KVLoad) at the same value sizes
// and concurrency in the same run, and next to the limits of each path (a
// raw loopback TCP stream; memcpy).
type StoreSuite struct {
	Options StoreOptions
}

// Name returns "store".
func (s *StoreSuite) Name() string { return "store" }

// storePath is one way the client reaches the node.
type storePath struct {
	target    string // KVResult.Target
	transport string // the node's data-plane transport it must use; "" for gRPC
	opts      client.Options
}

// storePaths returns the paths the client of this build has, and why a
// missing one is missing.
func storePaths() (have []storePath, missing map[string]error) {
	have = []storePath{
		{target: "kvmesh-tcp", transport: "tcp", opts: client.Options{MaxRetries: -1, Transport: client.TransportTCP}},
		{target: "kvmesh-shm", transport: "shm", opts: client.Options{MaxRetries: -1, Transport: client.TransportAuto}},
	}
	return have, nil
}

// pathShare runs load against t and, for a path over the node's data
// plane, reports in PathShare how much of the load that transport carried.
func pathShare(ctx context.Context, p storePath, httpAddr string, load func() ([]KVResult, error), keys, valueBytes int) ([]KVResult, error) {
	var before map[string]float64
	if p.transport != "" && httpAddr != "" {
		before, _ = transferBytes(ctx, httpAddr)
	}
	rs, err := load()
	if err != nil || before == nil {
		return rs, err
	}
	after, err := transferBytes(ctx, httpAddr)
	if err != nil {
		return rs, nil // the figure stays unmeasured
	}
	ops := keys
	for _, r := range rs {
		ops += int(r.Ops)
	}
	share := (after[p.transport] - before[p.transport]) / (float64(ops) * float64(valueBytes))
	for i := range rs {
		rs[i].PathShare = &share
	}
	return rs, nil
}

// Run measures: the machine's limits, then every path of the node and
// Redis under each load, then the report.
func (s *StoreSuite) Run(ctx context.Context, env *Env) (*Result, error) {
	o := s.Options
	o.EnsureDefaults(env.Quick, env.WorkDir)
	if err := o.Validate(); err != nil {
		return nil, err
	}
	res := &Result{Suite: s.Name()}
	paths, missing := storePaths()
	for _, name := range slices.Sorted(maps.Keys(missing)) {
		res.Skip(name, missing[name])
	}

	// The node's DRAM is populated at start, as a host that gives the
	// cache its memory runs it: SETs then measure the data path, not the
	// kernel faulting in fresh pages (BENCHMARKS.md has both).
	addrs, stop, err := nodeAddrs(ctx, env, DaemonOptions{DRAMBytes: o.NodeDRAMBytes,
		MaxBlockBytes: int64(max(16<<20, 2*slices.Max(o.BlockSizes))), Args: []string{"--dram-populate"}})
	if err != nil {
		return res, err
	}
	defer stop()
	r := &storeRun{ctx: ctx, o: o, res: res, paths: paths, addr: addrs[0]}
	if c, err := client.Dial(r.addr, client.Options{MaxRetries: -1}); err == nil {
		r.httpAddr, _ = nodeHTTPAddr(ctx, c) // without it, path_share stays unmeasured
		c.Close()
	}
	redis, err := StartRedis(ctx, o.Redis)
	switch {
	case errors.Is(err, ErrMissing):
		res.Skip("redis", err)
	case err != nil:
		return res, err
	default:
		defer redis.Close()
		r.redis = redis
	}

	// The bar counts what will run: Redis only when it started.
	targets := len(paths)
	if r.redis != nil {
		targets++
	}
	r.bar = env.Progress.Bar(int64(len(o.BlockSizes)*len(o.Concurrency)*targets+2*len(o.BlockSizes)), "store")
	defer r.bar.Finish()
	limits, err := r.limits()
	if err != nil {
		return res, err
	}
	rows, err := r.loads()
	if err != nil {
		return res, err
	}
	return res, r.report(env, rows, limits)
}

// storeRun is one run of the store suite: the node, its paths, Redis when
// there is one.
type storeRun struct {
	ctx      context.Context
	o        StoreOptions
	res      *Result
	paths    []storePath
	addr     string // the node's gRPC address
	httpAddr string // its metrics address; "" when unknown
	redis    *Redis // nil without one
	bar      Bar
}

// limits measures the machine's limits per block size: a raw TCP stream
// and memcpy.
func (r *storeRun) limits() ([]limitRow, error) {
	var limits []limitRow
	for _, b := range r.o.BlockSizes {
		r.bar.Describe("store: limits " + formatBytes(float64(b)))
		l, err := measureLimits(r.ctx, b, r.o.Duration, r.o.DataSetBytes)
		if err != nil {
			return nil, err
		}
		limits = append(limits, l)
		r.bar.Add(2)
	}
	r.res.AddTable("limits", "limits on this machine: raw TCP stream on 127.0.0.1 (one connection) and memcpy from DRAM, per block size", limits)
	return limits, nil
}

// loads runs the GET and SET load of each block size and concurrency on
// every path of the node, then on Redis (by the same loop and by
// redis-benchmark).
func (r *storeRun) loads() ([]KVResult, error) {
	ctx, o := r.ctx, r.o
	var rows []KVResult
	var redisBenchMissing error
	for _, b := range o.BlockSizes {
		for _, c := range o.Concurrency {
			load := KVLoadOptions{ValueBytes: b, Concurrency: c, Duration: o.Duration,
				Keys: max(2*c, o.DataSetBytes/b), MaxSetBytes: o.MaxSetBytes}
			for _, p := range r.paths {
				t, err := NodeKV(p.target, r.addr, b, p.opts)
				if err != nil {
					return nil, err
				}
				r.bar.Describe(fmt.Sprintf("store: %s %s × %d", t.Name(), formatBytes(float64(b)), c))
				rs, err := pathShare(ctx, p, r.httpAddr, func() ([]KVResult, error) { return KVLoadPhases(ctx, t, load) }, load.Keys, b)
				if err != nil {
					return nil, err
				}
				rows = append(rows, rs...)
				r.bar.Add(1)
			}
			if r.redis != nil {
				r.bar.Describe(fmt.Sprintf("store: redis %s × %d", formatBytes(float64(b)), c))
				set, get, err := KVLoad(ctx, r.redis.Target(), load)
				if err != nil {
					return nil, err
				}
				rows = append(rows, get, set)
				peer, err := redisBenchmarkRows(ctx, r.redis.Socket(), load, get, set)
				switch {
				case errors.Is(err, ErrMissing):
					redisBenchMissing = err
				case err != nil:
					return nil, err
				}
				rows = append(rows, peer...)
				r.bar.Add(1)
			}
		}
		// Each load sized the node's DRAM for itself alone: drop this
		// size's blocks before the next size fills the node, lest the next
		// loads measure evictions and misses instead of GETs.
		if err := dropKV(ctx, r.addr, b, r.paths[0].opts); err != nil {
			return nil, err
		}
	}
	if redisBenchMissing != nil {
		r.res.Skip(RedisBenchmarkTarget, redisBenchMissing)
	}
	return rows, nil
}

// report adds the store table, its checks, notes and plots.
func (r *storeRun) report(env *Env, rows []KVResult, limits []limitRow) error {
	res := r.res
	storeRatios(rows, limits)
	title := "GET and SET of whole blocks, one request in flight per connection; kvmesh through its Go client " +
		"(kvmesh-shm: through shared memory, its GETs copied into the client's buffer, its VIEWs read in place)"
	if r.redis != nil {
		title += fmt.Sprintf(", Redis %s (persistence off, on a unix socket) by the same load loop and by redis-benchmark", r.redis.Version())
	}
	res.AddTable("store", title, rows)
	storeChecks(res, rows)
	for _, l := range redisClientsDisagree(rows) {
		res.Note("Redis clients differ by more than %.0f%%: %s; the faster is the peer.", 100*peerSpread, l)
	}
	res.Note("ratio_vs_redis is against the faster of the bench's Redis client (target redis) and redis-benchmark " +
		"(same value size, clients and key pattern: random GETs over the fill, SETs of new keys; its request count set to last about as long as the bench client's phase). ")
	if len(env.Addrs) == 0 {
		res.Note("The kvmesh node runs with --dram-populate (its DRAM tier backed with memory at start); Redis allocates as it stores.")
	}
	res.Note("SET writes keys never written before (a block store answers a SET of a block it holds without storing it); " +
		"GET reads random keys of the data set filled before it. GB/s count value bytes only. " +
		"Redis listens on a unix socket and no TCP port (the bench starts it on its own, with no port it could learn), " +
		"which spares it the loopback TCP stack: a stricter baseline for kvmesh's network path than Redis over TCP.")
	res.Note("view (kvmesh-shm only) reads each value in place in the node's shared memory and copies it nowhere: " +
		"it is reported apart from get, which copies every value into the caller's buffer as Redis's client does, and is not compared with memcpy.")
	for _, op := range []string{"get", "set"} {
		for _, c := range r.o.Concurrency {
			series := storeSeries(rows, limits, op, c)
			if err := SavePlot(env, res, fmt.Sprintf("store_%s_c%d_vs_block_size", op, c),
				ThroughputPlot(vsTitle(fmt.Sprintf("store %s, %d connections: kvmesh", op, c), series), series...)); err != nil {
				return err
			}
		}
	}
	return nil
}

// redisBenchmarkRows runs redis-benchmark's GET (over the fill the bench's
// client left) and SET of new keys, mirroring load.
func redisBenchmarkRows(ctx context.Context, socket string, load KVLoadOptions, get, set KVResult) ([]KVResult, error) {
	gl, sl := redisBenchmarkLoads(load, get, set)
	g, err := RunRedisBenchmark(ctx, socket, gl)
	if err != nil {
		return nil, err
	}
	s, err := RunRedisBenchmark(ctx, socket, sl)
	if err != nil {
		return nil, err
	}
	return []KVResult{g, s}, nil
}

// dropKV drops the namespace of valueBytes values from the node at addr.
func dropKV(ctx context.Context, addr string, valueBytes int, opts client.Options) error {
	t, err := NodeKV("kvmesh", addr, valueBytes, opts)
	if err != nil {
		return err
	}
	if err := t.(KVResetter).Reset(ctx); err != nil {
		return fmt.Errorf("bench: store: dropping the %s values: %w", formatBytes(float64(valueBytes)), err)
	}
	return nil
}

// limitRow is the limits of one block size.
type limitRow struct {
	BlockBytes   int     `json:"block_bytes"`
	RawTCPGBps   float64 `json:"raw_tcp_gbps"`
	MemcpyGBps   float64 `json:"memcpy_gbps"`
	MemcpyBytes  int     `json:"memcpy_working_set_bytes" table:"-"`
	RawTCPSecond float64 `json:"raw_tcp_s" table:"-"`
}

// measureLimits measures a raw TCP stream and memcpy (through a working
// set of workingSet bytes, from DRAM) at block size b.
func measureLimits(ctx context.Context, b int, d time.Duration, workingSet int) (limitRow, error) {
	t, err := RawTCP(ctx, TCPOptions{Conns: 1, WriteBytes: b, Duration: d})
	if err != nil {
		return limitRow{}, err
	}
	m, err := Memcpy(ctx, MemcpyOptions{BlockBytes: b, WorkingSetBytes: max(workingSet, 4*b), Duration: d})
	if err != nil {
		return limitRow{}, err
	}
	return limitRow{BlockBytes: b, RawTCPGBps: t.GBps, MemcpyGBps: m.GBps, MemcpyBytes: m.WorkingSetBytes, RawTCPSecond: t.Seconds}, nil
}

// storeRatios fills the ratios of kvmesh's rows: against Redis at the same
// op, size and concurrency, against the raw TCP stream (network path) or
// memcpy (shared memory) at the same size.
func storeRatios(rows []KVResult, limits []limitRow) {
	for i := range rows {
		r := &rows[i]
		if r.Target == "redis" || r.Target == RedisBenchmarkTarget {
			continue
		}
		q := *r
		if q.Op == "view" {
			q.Op = "get" // a read, against Redis's reads
		}
		if peer, ok := redisPeer(rows, q); ok {
			r.RatioVsRedis = Ratio(r.GBps, peer.GBps)
		}
		for _, l := range limits {
			if l.BlockBytes != r.ValueBytes {
				continue
			}
			switch {
			case r.Op == "view": // copies nothing: no copy to compare with
			case r.Target == "kvmesh-shm":
				r.RatioVsMemcpy = Ratio(r.GBps, l.MemcpyGBps)
			default:
				r.RatioVsRawTCP = Ratio(r.GBps, l.RawTCPGBps)
			}
		}
	}
}

func findKVTarget(rows []KVResult, target, op string, size, conc int) (KVResult, bool) {
	for _, r := range rows {
		if r.Target == target && r.Op == op && r.ValueBytes == size && r.Concurrency == conc {
			return r, true
		}
	}
	return KVResult{}, false
}

// storeChecks adds DESIGN's store targets: over the network path, GET and
// SET ≥ 1.2× Redis at every size and concurrency; through shared memory,
// GET ≥ 4× Redis GET. Each check is the worst ratio over the sizes and
// concurrencies measured.
func storeChecks(res *Result, rows []KVResult) {
	worst := func(target, op string) (float64, bool) {
		w, found := 0.0, false
		for _, r := range rows {
			if r.Target == target && r.Op == op && r.RatioVsRedis != nil {
				if !found || *r.RatioVsRedis < w {
					w = *r.RatioVsRedis
				}
				found = true
			}
		}
		return w, found
	}
	for _, c := range []struct {
		target, op string
		target2    float64
	}{{"kvmesh-tcp", "get", 1.2}, {"kvmesh-tcp", "set", 1.2}, {"kvmesh-shm", "get", 4}} {
		if w, ok := worst(c.target, c.op); ok {
			what := c.target + " " + c.op
			if c.target == "kvmesh-shm" {
				what += " (copied into the client's buffer)"
			}
			res.Checks = append(res.Checks, NewCheck(fmt.Sprintf("store: %s vs Redis %s, every size and concurrency", what, c.op),
				"min ratio_vs_redis", w, ">=", c.target2, BackendKvmesh))
		}
	}
}

// storeSeries returns the plot series of op at concurrency conc: kvmesh
// solid (for get, kvmesh-shm's views beside its copies), Redis and the
// limits dashed: the raw TCP stream, and memcpy where kvmesh-shm copies.
func storeSeries(rows []KVResult, limits []limitRow, op string, conc int) []Series {
	out := GroupSeries(rows, func(r KVResult) (string, bool, bool, float64, float64) {
		name := r.Target
		switch {
		case r.Op == "view":
			name += " view (in place, no copy)"
		case r.Target == "kvmesh-shm":
			name += " " + r.Op + " (copied)"
		}
		peer := r.Target == "redis" || r.Target == RedisBenchmarkTarget
		keep := r.Concurrency == conc && (r.Op == op || op == "get" && r.Op == "view")
		return name, peer, !keep, float64(r.ValueBytes), r.GBps
	})
	raw := Series{Name: "raw TCP stream", Dashed: true}
	memcpy := Series{Name: "memcpy", Dashed: true}
	for _, l := range limits {
		raw.X, raw.Y = append(raw.X, float64(l.BlockBytes)), append(raw.Y, l.RawTCPGBps)
		memcpy.X, memcpy.Y = append(memcpy.X, float64(l.BlockBytes)), append(memcpy.Y, l.MemcpyGBps)
	}
	return append(out, raw, memcpy)
}
