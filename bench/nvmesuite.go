package bench

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvmesh/kvmesh/prefixhash"
	"github.com/kvmesh/kvmesh/tiers"
)

// NVMeOptions configures the nvme suite. Zero fields take the defaults
// documented on each, for a full run or for --quick.
type NVMeOptions struct {
	// Dir is a directory on the disk to measure. Default: the work
	// directory (`kvmesh bench --work-dir`).
	Dir string
	// DataBytes is what the spill writes, and what the reads choose from.
	// Default 1 GiB; quick 256 MiB.
	DataBytes int64
	// SpillBatch is the number of 1 MiB values per PutBatch. Default 16.
	SpillBatch int
	// Readers is the number of concurrent readers of 256 KiB values, each
	// with one read in flight; fio runs as many jobs of queue depth 1.
	// Default 8.
	Readers int
	// ReadTime is how long each read measurement runs. Default 5s; quick 1s.
	ReadTime time.Duration
	// Rounds is how many (kvmesh, fio) pairs each pattern runs, alternately;
	// the medians are reported. Default 2; quick 1.
	Rounds int
}

// The block sizes DESIGN's NVMe targets are stated at.
const (
	nvmeSpillValue = 1 << 20
	nvmeReadValue  = 256 << 10
)

// EnsureDefaults fills zero fields with their defaults for a full run, or
// for --quick when quick is set.
func (o *NVMeOptions) EnsureDefaults(quick bool, workDir string) {
	if o.Dir == "" {
		o.Dir = workDir
	}
	if o.DataBytes == 0 {
		o.DataBytes = pick[int64](quick, 1<<30, 256<<20)
	}
	if o.SpillBatch == 0 {
		o.SpillBatch = 16
	}
	if o.Readers == 0 {
		o.Readers = 8
	}
	if o.ReadTime == 0 {
		o.ReadTime = pick(quick, 5*time.Second, time.Second)
	}
	if o.Rounds == 0 {
		o.Rounds = pick(quick, 2, 1)
	}
}

// Validate names the first field that is out of range.
func (o *NVMeOptions) Validate() error {
	switch {
	case o.Dir == "":
		return errors.New("bench: nvme: dir is required")
	case o.DataBytes < 16<<20 || o.DataBytes > 1<<40:
		return fmt.Errorf("bench: nvme: data bytes %d is outside 16MiB..1TiB", o.DataBytes)
	case o.SpillBatch < 1 || o.SpillBatch > 1024:
		return fmt.Errorf("bench: nvme: spill batch %d is outside 1..1024", o.SpillBatch)
	case o.Readers < 1 || o.Readers > 256:
		return fmt.Errorf("bench: nvme: readers %d is outside 1..256", o.Readers)
	case o.ReadTime < 10*time.Millisecond:
		return fmt.Errorf("bench: nvme: read time %v is under 10ms", o.ReadTime)
	case o.Rounds < 1 || o.Rounds > 100:
		return fmt.Errorf("bench: nvme: rounds %d is outside 1..100", o.Rounds)
	}
	return nil
}

// NVMeSuite measures the NVMe tier (tiers.NVMe, the node's disk tier) next
// to fio running the same I/O pattern on the same file system, alternately:
// spill writes of 1 MiB values (PutBatch, one goroutine, durable on return)
// against fio's sequential direct 1 MiB writes at queue depth 1 with a
// final fsync, and random reads of 256 KiB values by N readers against
// fio's random direct 256 KiB reads by N jobs of queue depth 1; end to end,
// the Go client's Get of 64-block prompts from a node whose DRAM holds a
// small part of them, against the same fio figure; and a warm restart: a
// node's DRAM written to NVMe as it stops, against fio's sequential write,
// and what a lookup finds once it is back.
type NVMeSuite struct {
	Options NVMeOptions
}

// Name returns "nvme".
func (s *NVMeSuite) Name() string { return "nvme" }

// nvmeRow is one pattern: kvmesh, fio, and their ratio.
type nvmeRow struct {
	Pattern    string  `json:"pattern"`
	BlockBytes int     `json:"block_bytes"`
	Jobs       int     `json:"jobs"`
	KvmeshGBps float64 `json:"kvmesh_gbps"`
	FioGBps    float64 `json:"fio_gbps,omitempty"`
	// RatioVsFio is the median of the ratios of adjacent (kvmesh, fio)
	// pairs: the disk's speed drifts, adjacent runs see the same disk.
	RatioVsFio *float64 `json:"ratio_vs_fio,omitempty"`
	DirectIO   bool     `json:"direct_io" table:"wide"`
	Rounds     int      `json:"rounds" table:"-"`
	FioArgs    string   `json:"fio_args" table:"-"`
}

// Run measures.
func (s *NVMeSuite) Run(ctx context.Context, env *Env) (*Result, error) {
	o := s.Options
	o.EnsureDefaults(env.Quick, env.WorkDir)
	if err := o.Validate(); err != nil {
		return nil, err
	}
	res := &Result{Suite: s.Name()}
	bar := env.Progress.Bar(int64(4*o.Rounds+2), "nvme")
	defer bar.Finish()

	fo := FioOptions{Dir: o.Dir, FileBytes: o.DataBytes, Runtime: o.ReadTime, IOEngine: "psync", IODepth: 1}
	writeJob := FioJob{Name: "seq_write", RW: "write", BlockBytes: nvmeSpillValue, Once: true, Args: []string{"--end_fsync=1"}}
	readJob := FioJob{Name: "rand_read", RW: "randread", BlockBytes: nvmeReadValue}
	fioMissing := false
	runFio := func(job FioJob, jobs int) float64 {
		if fioMissing {
			return 0
		}
		jo := fo
		jo.NumJobs = jobs
		r, err := Fio(ctx, jo, job)
		if err != nil {
			if ctx.Err() == nil {
				res.Skip("fio "+job.Name, err)
				fioMissing = errors.Is(err, ErrMissing)
			}
			return 0
		}
		return r.GBps
	}

	direct := true
	var spill, spillFio, read, readFio []float64
	for round := range o.Rounds {
		bar.Describe(fmt.Sprintf("nvme: fio sequential write, round %d", round+1))
		spillFio = append(spillFio, runFio(writeJob, 1))
		_ = RemoveFioFile(o.Dir)
		bar.Add(1)
		bar.Describe(fmt.Sprintf("nvme: kvmesh spill, round %d", round+1))
		g, d, err := nvmeSpillAndRead(ctx, o, false)
		if err != nil {
			return res, err
		}
		spill, direct = append(spill, g), direct && d
		bar.Add(1)
		bar.Describe(fmt.Sprintf("nvme: fio random read, round %d", round+1))
		readFio = append(readFio, runFio(readJob, o.Readers))
		_ = RemoveFioFile(o.Dir)
		bar.Add(1)
		bar.Describe(fmt.Sprintf("nvme: kvmesh random read, round %d", round+1))
		g, d, err = nvmeSpillAndRead(ctx, o, true)
		if err != nil {
			return res, err
		}
		read, direct = append(read, g), direct && d
		bar.Add(1)
	}
	// The rows that start nodes are skipped, saying why, where no node
	// can be started; any other error fails the suite.
	fatal := func(what string, err error) bool {
		if errors.Is(err, ErrMissing) || errors.Is(err, ErrNoBinary) {
			res.Skip(what, err)
			return false
		}
		return err != nil
	}
	bar.Describe("nvme: end to end, prompts of 64 blocks mostly on NVMe")
	e2e, e2eErr := nvmeEndToEnd(ctx, env, o)
	if fatal("nvme end to end", e2eErr) {
		return res, e2eErr
	}
	bar.Add(1)
	bar.Describe("nvme: warm restart, DRAM written to NVMe on SIGTERM")
	wr, wrErr := nvmeWarmRestart(ctx, env, o)
	if fatal("nvme warm restart", wrErr) {
		return res, wrErr
	}
	var wrFio float64
	if wrErr == nil {
		// fio right after it: adjacent runs see the same disk.
		wrFio = runFio(writeJob, 1)
		_ = RemoveFioFile(o.Dir)
	}
	bar.Add(1)
	rows := []nvmeRow{
		nvmeRowOf("spill write (PutBatch, durable)", nvmeSpillValue, 1, spill, spillFio, direct, o.Rounds,
			"--rw=write --bs=1M --direct=1 --ioengine=psync --iodepth=1 --end_fsync=1 --size="+strconv.FormatInt(o.DataBytes, 10)),
		nvmeRowOf("random block read", nvmeReadValue, o.Readers, read, readFio, direct, o.Rounds,
			fmt.Sprintf("--rw=randread --bs=256k --direct=1 --ioengine=psync --iodepth=1 --numjobs=%d --time_based --runtime=%v --size=%d",
				o.Readers, o.ReadTime, o.DataBytes)),
	}
	if e2eErr == nil {
		// The node reads a prompt's blocks at a depth of slowReadDepth (8):
		// fio's random read row, o.Readers jobs of depth 1, is that depth at
		// the default Readers.
		row := nvmeRowOf(fmt.Sprintf("end to end: Go client Get of %d-block prompts, mostly on NVMe, bytes verified", nvmePromptBlocks),
			nvmeReadValue, 1, []float64{e2e}, []float64{medianOf(readFio)}, direct, 1, rows[1].FioArgs)
		rows = append(rows, row)
	}
	e2eRow := len(rows) - 1
	if wrErr == nil {
		rows = append(rows, nvmeRowOf("warm restart: DRAM written to NVMe on SIGTERM (spill-on-stop)", nvmeSpillValue, 1,
			[]float64{wr.GBps}, []float64{wrFio}, direct, 1, rows[0].FioArgs))
	}
	res.AddTable("nvme", fmt.Sprintf("the NVMe tier vs fio on the same file system (%s), alternately", o.Dir), rows)
	for i, name := range []string{"nvme: spill writes vs fio sequential direct write (1 MiB)", "nvme: block reads vs fio random direct read (256 KiB, same queue depth)"} {
		if r := rows[i].RatioVsFio; r != nil {
			res.Checks = append(res.Checks, NewCheck(name, "ratio_vs_fio", *r, ">=", 0.7, BackendKvmesh))
		}
	}
	if e2eErr == nil {
		if r := rows[e2eRow].RatioVsFio; r != nil {
			res.Checks = append(res.Checks, NewCheck("nvme: end-to-end prompt reads vs fio random direct read (256 KiB, depth 8)", "ratio_vs_fio", *r, ">=", 0.7, BackendKvmesh))
		}
		res.Note("the end-to-end row starts one node with a %d MiB DRAM tier, puts %s of 64-block prompts of 256 KiB blocks and gets random whole prompts one at a time for %v; "+
			"its fio figure is the random read row's (%d jobs of depth 1), the page cache of the node's files is not dropped",
			nvmeE2EDRAM>>20, formatBytes(float64(o.DataBytes)), o.ReadTime, o.Readers)
	}
	if wrErr == nil {
		if r := rows[len(rows)-1].RatioVsFio; r != nil {
			res.Checks = append(res.Checks, NewCheck("nvme: DRAM written to NVMe on SIGTERM vs fio sequential direct write (1 MiB)", "ratio_vs_fio", *r, ">=", 0.7, BackendKvmesh))
		}
		res.Checks = append(res.Checks, NewCheck("nvme: blocks a lookup finds after a graceful restart", "found", wr.Found, ">=", 0.99, BackendKvmesh))
		res.Note("the warm-restart row starts one node whose DRAM holds %s of 1 MiB blocks, stops it with SIGTERM, reads what it wrote and how fast from its log (%s), "+
			"starts it again on its data dir and looks every prompt up: %.1f%% of the blocks found; its fio figure is fio's sequential write run right after it",
			formatBytes(float64(o.DataBytes)), formatBytes(float64(wr.Bytes)), 100*wr.Found)
	}
	if !direct {
		res.Note("the file system of %s refused O_DIRECT: the tier fell back to buffered I/O (and fio, which needs it, was skipped)", o.Dir)
	}
	return res, nil
}

func nvmeRowOf(pattern string, block, jobs int, kv, fio []float64, direct bool, rounds int, fioArgs string) nvmeRow {
	r := nvmeRow{Pattern: pattern, BlockBytes: block, Jobs: jobs, KvmeshGBps: medianOf(kv), DirectIO: direct, Rounds: rounds, FioArgs: fioArgs}
	var ratios []float64
	for i := range kv {
		if i < len(fio) && fio[i] > 0 {
			ratios = append(ratios, kv[i]/fio[i])
		}
	}
	if len(ratios) > 0 {
		r.FioGBps = medianOf(slices.DeleteFunc(slices.Clone(fio), func(x float64) bool { return x <= 0 }))
		m := medianOf(ratios)
		r.RatioVsFio = &m
	}
	return r
}

// medianOf returns the median of xs (the mean of the middle two for an
// even count), or 0 for none.
func medianOf(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// nvmeSpillAndRead opens a fresh NVMe tier in o.Dir and, without read,
// writes o.DataBytes of 1 MiB values with PutBatch from one goroutine and
// returns GB/s; with read, lays out o.DataBytes of 256 KiB values
// (untimed) and returns the GB/s of o.Readers goroutines reading random
// ones for o.ReadTime. It also reports whether the tier used direct I/O.
func nvmeSpillAndRead(ctx context.Context, o NVMeOptions, read bool) (float64, bool, error) {
	dir, err := os.MkdirTemp(o.Dir, "kvmesh-bench-nvme-")
	if err != nil {
		return 0, false, fmt.Errorf("bench: nvme: %w", err)
	}
	defer os.RemoveAll(dir)
	t, err := tiers.OpenNVMe(tiers.NVMeOptions{Dir: filepath.Join(dir, "nvme"), Capacity: o.DataBytes + 2*(64<<20),
		Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		return 0, false, fmt.Errorf("bench: nvme: %w", err)
	}
	defer t.Close()
	size := nvmeSpillValue
	if read {
		size = nvmeReadValue
	}
	count := int(o.DataBytes / int64(size))
	batch := o.SpillBatch
	if read {
		batch = 64
	}
	val := make([]byte, size)
	for i := range val {
		val[i] = byte(i*7 + i>>9)
	}
	vals := make([][]byte, batch)
	for i := range vals {
		vals[i] = val
	}
	keys := make([]prefixhash.Key, batch)
	locs := make([]tiers.Loc, count)
	start := time.Now()
	for i := 0; i < count; i += batch {
		if err := ctx.Err(); err != nil {
			return 0, false, err
		}
		m := min(batch, count-i)
		for j := range m {
			keys[j] = prefixhash.BlockKey(prefixhash.Key{}, []uint32{uint32(i + j), 0x6e766d65})
		}
		if _, err := t.PutBatch(keys[:m], vals[:m], locs[i:i+m]); err != nil {
			return 0, false, fmt.Errorf("bench: nvme: put: %w", err)
		}
	}
	if !read {
		return float64(count) * float64(size) / time.Since(start).Seconds() / 1e9, t.DirectIO(), nil
	}
	var (
		total atomic.Int64
		wg    sync.WaitGroup
		errMu sync.Mutex
		first error
	)
	deadline := time.Now().Add(o.ReadTime)
	start = time.Now()
	for r := range o.Readers {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(r), 0x72656164))
			buf := make([]byte, size)
			var got int64
			for time.Now().Before(deadline) && ctx.Err() == nil {
				if err := t.Read(locs[rng.IntN(len(locs))], buf); err != nil {
					errMu.Lock()
					first = cmpOr(first, err)
					errMu.Unlock()
					break
				}
				got += int64(size)
			}
			total.Add(got)
		})
	}
	wg.Wait()
	if err := ctx.Err(); err != nil {
		return 0, false, err
	}
	if first != nil {
		return 0, false, fmt.Errorf("bench: nvme: read: %w", first)
	}
	return float64(total.Load()) / time.Since(start).Seconds() / 1e9, t.DirectIO(), nil
}

// cmpOr returns a when it is not nil, else b.
func cmpOr(a, b error) error {
	if a != nil {
		return a
	}
	return b
}
