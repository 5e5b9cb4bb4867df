package bench

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"
)

// PeersOptions configures the peers suite. Zero fields take the defaults
// documented on each, for a full run or for --quick.
type PeersOptions struct {
	// BlockSizes are the block (value, write) sizes in bytes. Default 64
	// KiB, 1 MiB and 4 MiB, DESIGN's store sizes.
	BlockSizes []int
	// Concurrency lists the Redis client concurrencies. Default 4 and 16.
	Concurrency []int
	// Duration is the length of each measurement (each memcpy, TCP stream,
	// Redis SET or GET phase). Default 2s; quick 500ms.
	Duration time.Duration
	// MemcpyWorkingSetBytes is memcpy's buffer size. Default 256 MiB; quick 64 MiB.
	MemcpyWorkingSetBytes int
	// RedisKeyBytes bounds the Redis data set (keys × value size). Default
	// 256 MiB; quick 64 MiB.
	RedisKeyBytes int
	// Redis configures the Redis server.
	Redis RedisOptions
	// Fio configures fio. Dir defaults to the bench's work directory;
	// FileBytes to 1 GiB (quick 256 MiB); Runtime to 5s (quick 1s).
	Fio FioOptions
}

// EnsureDefaults fills zero fields with their defaults for a full run, or
// for --quick when quick is set.
func (o *PeersOptions) EnsureDefaults(quick bool, workDir string) {
	pick := func(full, q int) int {
		if quick {
			return q
		}
		return full
	}
	if len(o.BlockSizes) == 0 {
		o.BlockSizes = []int{64 << 10, 1 << 20, 4 << 20}
	}
	if len(o.Concurrency) == 0 {
		o.Concurrency = []int{4, 16}
	}
	if o.Duration == 0 {
		o.Duration = time.Duration(pick(2000, 500)) * time.Millisecond
	}
	if o.MemcpyWorkingSetBytes == 0 {
		o.MemcpyWorkingSetBytes = pick(256<<20, 64<<20)
	}
	if o.RedisKeyBytes == 0 {
		o.RedisKeyBytes = pick(256<<20, 64<<20)
	}
	if o.Redis.Dir == "" {
		o.Redis.Dir = workDir
	}
	if o.Fio.Dir == "" {
		o.Fio.Dir = workDir
	}
	if o.Fio.FileBytes == 0 {
		o.Fio.FileBytes = int64(pick(1<<30, 256<<20))
	}
	if o.Fio.Runtime == 0 {
		o.Fio.Runtime = time.Duration(pick(5000, 1000)) * time.Millisecond
	}
	o.Fio.EnsureDefaults()
}

// Validate names the first field that is out of range.
func (o *PeersOptions) Validate() error {
	for _, b := range o.BlockSizes {
		if b < 8 || b > 1<<30 {
			return fmt.Errorf("bench: peers: block size %d is outside 8..1GiB", b)
		}
	}
	for _, c := range o.Concurrency {
		if c < 1 || c > 1024 {
			return fmt.Errorf("bench: peers: concurrency %d is outside 1..1024", c)
		}
	}
	switch {
	case o.Duration <= 0:
		return fmt.Errorf("bench: peers: duration %v must be positive", o.Duration)
	case o.MemcpyWorkingSetBytes < 1:
		return fmt.Errorf("bench: peers: memcpy working set %d must be positive", o.MemcpyWorkingSetBytes)
	case o.RedisKeyBytes < 1:
		return fmt.Errorf("bench: peers: redis key bytes %d must be positive", o.RedisKeyBytes)
	}
	return o.Fio.Validate()
}

// PeersSuite measures, on this machine, the peers and limits kvmesh is
// judged against: memcpy (from DRAM and from cache) and a raw loopback TCP
// stream at each block size,
// Redis GET/SET at each block size and concurrency, and fio's sequential
// direct write (1 MiB) and random direct read (256 KiB). The kvmesh suites
// call the same functions (Memcpy, RawTCP, MeasureRedis, Fio) to put their
// figures next to these in one run.
type PeersSuite struct {
	Options PeersOptions
}

// Name returns "peers".
func (s *PeersSuite) Name() string { return "peers" }

// PeerFigures is what the peers suite measured, for suites that compare
// against it.
type PeerFigures struct {
	// Memcpy copies through a working set larger than the caches, one row
	// per block size: the limit of a path that copies a block out of DRAM.
	// MemcpyCached copies one block again and again.
	Memcpy       []MemcpyResult
	MemcpyCached []MemcpyResult
	RawTCP       []TCPResult
	RedisVersion string
	Redis        []KVResult
	Fio          []FioResult
}

// Run measures every peer; a missing one is skipped.
func (s *PeersSuite) Run(ctx context.Context, env *Env) (*Result, error) {
	res := &Result{Suite: s.Name()}
	_, err := MeasurePeers(ctx, env, s.Options, res)
	return res, err
}

// MeasurePeers runs the peers suite's measurements with o (defaults filled
// for env), adds their tables, skips and plot to res, and returns the
// figures.
func MeasurePeers(ctx context.Context, env *Env, o PeersOptions, res *Result) (PeerFigures, error) {
	o.EnsureDefaults(env.Quick, env.WorkDir)
	var f PeerFigures
	if err := o.Validate(); err != nil {
		return f, err
	}
	steps := 3*len(o.BlockSizes) + len(o.BlockSizes)*len(o.Concurrency) + 2
	bar := env.Progress.Bar(int64(steps), "peers")
	defer bar.Finish()

	for _, b := range o.BlockSizes {
		bar.Describe("memcpy " + formatBytes(float64(b)))
		m, err := Memcpy(ctx, MemcpyOptions{BlockBytes: b, WorkingSetBytes: o.MemcpyWorkingSetBytes, Duration: o.Duration})
		if err != nil {
			return f, err
		}
		f.Memcpy = append(f.Memcpy, m)
		bar.Add(1)
		m, err = Memcpy(ctx, MemcpyOptions{BlockBytes: b, WorkingSetBytes: b, Duration: o.Duration})
		if err != nil {
			return f, err
		}
		f.MemcpyCached = append(f.MemcpyCached, m)
		bar.Add(1)
	}
	res.AddTable("memcpy", "memcpy: copy() through a working set larger than the caches (DRAM), and of one block again and again (cache)",
		append(slices.Clone(f.Memcpy), f.MemcpyCached...))

	type tcpRow struct {
		TCPResult
		RatioVsMemcpy *float64 `json:"ratio_vs_memcpy,omitempty"`
	}
	var tcpRows []tcpRow
	for i, b := range o.BlockSizes {
		bar.Describe("raw tcp " + formatBytes(float64(b)))
		t, err := RawTCP(ctx, TCPOptions{Conns: 1, WriteBytes: b, Duration: o.Duration})
		if err != nil {
			return f, err
		}
		f.RawTCP = append(f.RawTCP, t)
		tcpRows = append(tcpRows, tcpRow{TCPResult: t, RatioVsMemcpy: Ratio(t.GBps, f.Memcpy[i].GBps)})
		bar.Add(1)
	}
	res.AddTable("raw_tcp", "raw TCP stream on 127.0.0.1 (one connection, writes and reads of block size)", tcpRows)

	var loads []KVLoadOptions
	for _, b := range o.BlockSizes {
		for _, c := range o.Concurrency {
			loads = append(loads, KVLoadOptions{ValueBytes: b, Concurrency: c, Duration: o.Duration,
				Keys: max(2*c, o.RedisKeyBytes/b)})
		}
	}
	version, rows, err := MeasureRedis(ctx, o.Redis, loads, bar)
	switch {
	case errors.Is(err, ErrMissing):
		res.Skip("redis", err)
		bar.Add(int64(len(loads)))
	case err != nil:
		return f, err
	default:
		f.RedisVersion, f.Redis = version, rows
		for i := range rows {
			for j, b := range o.BlockSizes {
				if rows[i].ValueBytes == b {
					rows[i].RatioVsRawTCP = Ratio(rows[i].GBps, f.RawTCP[j].GBps)
				}
			}
		}
		res.AddTable("redis", fmt.Sprintf("Redis %s GET/SET (persistence off, one request in flight per connection)", version), rows)
	}

	for _, job := range []FioJob{FioSeqWrite, FioRandRead} {
		bar.Describe("fio " + job.Name)
		r, err := Fio(ctx, o.Fio, job)
		bar.Add(1)
		if err != nil {
			if ctx.Err() != nil {
				return f, ctx.Err()
			}
			// A missing fio, a file system without direct I/O and a fio that
			// fails are all the peer's problem, not a failure of the suite.
			res.Skip("fio "+job.Name, err)
			continue
		}
		f.Fio = append(f.Fio, r)
	}
	if err := RemoveFioFile(o.Fio.Dir); err != nil {
		res.Note("fio: could not remove its test file: %v", err)
	}
	if len(f.Fio) > 0 {
		res.AddTable("fio", fmt.Sprintf("fio direct I/O in %s (%s, iodepth %d)", o.Fio.Dir, o.Fio.IOEngine, o.Fio.IODepth), f.Fio)
	}

	if err := SavePlot(env, res, "peers_throughput_vs_block_size", ThroughputPlot("peers and limits on this machine", f.Series()...)); err != nil {
		return f, err
	}
	return f, nil
}

// Series returns the figures as dashed plot series (peers and limits are
// references), for a throughput vs block size plot: memcpy, raw TCP and
// Redis GET and SET at each concurrency.
func (f PeerFigures) Series() []Series {
	var out []Series
	m := Series{Name: "memcpy (DRAM)", Dashed: true}
	for _, r := range f.Memcpy {
		m.X, m.Y = append(m.X, float64(r.BlockBytes)), append(m.Y, r.GBps)
	}
	mc := Series{Name: "memcpy (cache)", Dashed: true}
	for _, r := range f.MemcpyCached {
		mc.X, mc.Y = append(mc.X, float64(r.BlockBytes)), append(mc.Y, r.GBps)
	}
	t := Series{Name: "raw TCP", Dashed: true}
	for _, r := range f.RawTCP {
		t.X, t.Y = append(t.X, float64(r.WriteBytes)), append(t.Y, r.GBps)
	}
	out = append(out, m, mc, t)
	out = append(out, GroupSeries(f.Redis, func(r KVResult) (string, bool, bool, float64, float64) {
		return fmt.Sprintf("Redis %s c=%d", r.Op, r.Concurrency), true, false, float64(r.ValueBytes), r.GBps
	})...)
	return out
}
