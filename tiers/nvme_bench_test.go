package tiers

import (
	"encoding/json"
	"log/slog"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/prefixhash"
)

// Benchmarks of the NVMe tier, and the same I/O pattern run by fio in the
// same directory so that every figure comes with its peer:
//
//	go test -run '^$' -bench 'NVMeVsFio' -benchtime 3x -count 2 ./tiers/
//	go test -run '^$' -bench 'NVMeSpill|NVMeBlockRead' -benchtime 2s -count 3 ./tiers/
//
// KVMESH_BENCH_DIR sets the directory (default: a temporary directory, on
// the filesystem of $TMPDIR); KVMESH_BENCH_BYTES the data set size (default
// 1 GiB); KVMESH_BENCH_WRITEBUF the tier's WriteBuffer (default: the
// tier's default). BenchmarkNVMeVsFio reports kvmesh GB/s, fio GB/s and
// their ratio.
const (
	nvmeSpillValue = 1 << 20   // spill writes: 1 MiB values
	nvmeSpillBatch = 16        // values per PutBatch
	nvmeBlockValue = 256 << 10 // block reads: 256 KiB values
	nvmeReaders    = 8         // concurrent readers = fio numjobs
	nvmeReadTime   = 5 * time.Second
)

func nvmeBenchDir(b *testing.B) string {
	if d := os.Getenv("KVMESH_BENCH_DIR"); d != "" {
		dir, err := os.MkdirTemp(d, "kvmesh-bench-")
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { os.RemoveAll(dir) })
		return dir
	}
	return b.TempDir()
}

func nvmeBenchBytes() int64 {
	if s := os.Getenv("KVMESH_BENCH_BYTES"); s != "" {
		if n, err := strconv.ParseInt(s, 10, 64); err == nil && n > 0 {
			return n
		}
	}
	return 1 << 30
}

func nvmeBenchOpen(b *testing.B, dir string, capacity int64) *NVMe {
	b.Helper()
	wb, _ := strconv.Atoi(os.Getenv("KVMESH_BENCH_WRITEBUF"))
	n, err := OpenNVMe(NVMeOptions{
		Dir:         filepath.Join(dir, "kvmesh"),
		Capacity:    capacity + 2*(64<<20),
		WriteBuffer: wb,
		Logger:      slog.New(slog.DiscardHandler),
	})
	if err != nil {
		b.Fatal(err)
	}
	if !n.DirectIO() {
		b.Logf("O_DIRECT refused by the filesystem of %s: buffered I/O", dir)
	}
	return n
}

// nvmeBenchValues returns count distinct keys and one shared value of size bytes.
func nvmeBenchValues(count, size int) ([]prefixhash.Key, []byte) {
	keys := make([]prefixhash.Key, count)
	for i := range keys {
		keys[i] = nvmeTestKey(uint64(i))
	}
	return keys, nvmeTestVal(keys[0], size)
}

// spill writes total bytes of 1 MiB values with PutBatch (batch > 1) or Put,
// from one goroutine, and returns bytes per second.
func nvmeBenchSpill(b *testing.B, n *NVMe, total int64, batch int) float64 {
	count := int(total / nvmeSpillValue)
	keys, val := nvmeBenchValues(count, nvmeSpillValue)
	vals := make([][]byte, batch)
	for i := range vals {
		vals[i] = val
	}
	locs := make([]Loc, batch)
	start := time.Now()
	for i := 0; i < count; i += batch {
		m := min(batch, count-i)
		if batch == 1 {
			if _, err := n.Put(keys[i], val); err != nil {
				b.Fatal(err)
			}
			continue
		}
		if _, err := n.PutBatch(keys[i:i+m], vals[:m], locs[:m]); err != nil {
			b.Fatal(err)
		}
	}
	return float64(count) * nvmeSpillValue / time.Since(start).Seconds()
}

// nvmeBenchFill stores total bytes of 256 KiB values and returns their locations.
func nvmeBenchFill(b *testing.B, n *NVMe, total int64) ([]Loc, []byte) {
	count := int(total / nvmeBlockValue)
	keys, val := nvmeBenchValues(count, nvmeBlockValue)
	vals := make([][]byte, 64)
	for i := range vals {
		vals[i] = val
	}
	locs := make([]Loc, count)
	for i := 0; i < count; i += len(vals) {
		m := min(len(vals), count-i)
		if _, err := n.PutBatch(keys[i:i+m], vals[:m], locs[i:i+m]); err != nil {
			b.Fatal(err)
		}
	}
	return locs, val
}

// nvmeBenchRead reads random values of locs from readers goroutines for d and
// returns bytes per second.
func nvmeBenchRead(b *testing.B, n *NVMe, locs []Loc, readers int, d time.Duration) float64 {
	var total atomic.Int64
	var wg sync.WaitGroup
	deadline := time.Now().Add(d)
	start := time.Now()
	for r := range readers {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(r), 99))
			buf := make([]byte, nvmeBlockValue)
			var got int64
			for time.Now().Before(deadline) {
				if err := n.Read(locs[rng.IntN(len(locs))], buf); err != nil {
					b.Error(err)
					return
				}
				got += nvmeBlockValue
			}
			total.Add(got)
		})
	}
	wg.Wait()
	return float64(total.Load()) / time.Since(start).Seconds()
}

// BenchmarkNVMeSpillPut: sequential Puts of 1 MiB values, one goroutine,
// each durable on return.
func BenchmarkNVMeSpillPut(b *testing.B) {
	n := nvmeBenchOpen(b, nvmeBenchDir(b), int64(b.N)*nvmeSpillValue*2)
	defer n.Close()
	keys, val := nvmeBenchValues(b.N, nvmeSpillValue)
	b.SetBytes(nvmeSpillValue)
	b.ResetTimer()
	for i := range b.N {
		if _, err := n.Put(keys[i], val); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkNVMeSpillPutParallel: Puts of 1 MiB values from 8 goroutines,
// group-committed (one sync for all the Puts queued meanwhile).
func BenchmarkNVMeSpillPutParallel(b *testing.B) {
	n := nvmeBenchOpen(b, nvmeBenchDir(b), int64(b.N)*nvmeSpillValue*2)
	defer n.Close()
	keys, val := nvmeBenchValues(b.N, nvmeSpillValue)
	var next atomic.Int64
	b.SetBytes(nvmeSpillValue)
	b.ResetTimer()
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for i := next.Add(1) - 1; i < int64(b.N); i = next.Add(1) - 1 {
				if _, err := n.Put(keys[i], val); err != nil {
					b.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
}

// BenchmarkNVMeSpillPutBatch: sequential PutBatch calls of 16 × 1 MiB values,
// one goroutine.
func BenchmarkNVMeSpillPutBatch(b *testing.B) {
	n := nvmeBenchOpen(b, nvmeBenchDir(b), int64(b.N)*nvmeSpillBatch*nvmeSpillValue*2)
	defer n.Close()
	keys, val := nvmeBenchValues(b.N*nvmeSpillBatch, nvmeSpillValue)
	vals := make([][]byte, nvmeSpillBatch)
	for i := range vals {
		vals[i] = val
	}
	locs := make([]Loc, nvmeSpillBatch)
	b.SetBytes(nvmeSpillBatch * nvmeSpillValue)
	b.ResetTimer()
	for i := range b.N {
		if _, err := n.PutBatch(keys[i*nvmeSpillBatch:(i+1)*nvmeSpillBatch], vals, locs); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkNVMeBlockRead: random reads of 256 KiB values by nvmeReaders
// goroutines over a data set of KVMESH_BENCH_BYTES.
func BenchmarkNVMeBlockRead(b *testing.B) {
	total := nvmeBenchBytes()
	n := nvmeBenchOpen(b, nvmeBenchDir(b), total)
	defer n.Close()
	locs, _ := nvmeBenchFill(b, n, total)
	b.SetBytes(nvmeBlockValue)
	b.ResetTimer()
	var next atomic.Int64
	var wg sync.WaitGroup
	for r := range nvmeReaders {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(r), 7))
			buf := make([]byte, nvmeBlockValue)
			for next.Add(1) <= int64(b.N) {
				if err := n.Read(locs[rng.IntN(len(locs))], buf); err != nil {
					b.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
}

// BenchmarkNVMeVsFio runs each kvmesh pattern and the matching fio job in
// the same directory, alternately, b.N times each, and reports the medians
// of kvmesh's and fio's GB/s and of the ratio of each adjacent pair (the
// machine's speed drifts; adjacent runs see the same disk).
//
//	spill-batch: PutBatch of 16 × 1 MiB, one goroutine
//	             vs fio --rw=write --bs=1M --direct=1 --ioengine=psync --iodepth=1 --end_fsync=1
//	spill-put:   Put of 1 MiB, one goroutine, each durable on return
//	             vs the same fio job with --fdatasync=1
//	read-256k:   Read of random 256 KiB values, 8 goroutines
//	             vs fio --rw=randread --bs=256k --direct=1 --ioengine=psync --numjobs=8
func BenchmarkNVMeVsFio(b *testing.B) {
	if _, err := exec.LookPath("fio"); err != nil {
		b.Skip("fio not installed")
	}
	total := nvmeBenchBytes()
	size := strconv.FormatInt(total, 10)
	pair := func(b *testing.B, kvmesh func(dir string) float64, fio func(dir string) float64) {
		var kvs, fios, ratios []float64
		for range b.N {
			dir := nvmeBenchDir(b)
			f := fio(dir)
			os.Remove(filepath.Join(dir, "fio.dat"))
			k := kvmesh(dir)
			b.Logf("kvmesh %.3f GB/s, fio %.3f GB/s, ratio %.2f", k/1e9, f/1e9, k/f)
			kvs, fios, ratios = append(kvs, k), append(fios, f), append(ratios, k/f)
		}
		b.ReportMetric(nvmeMedian(kvs)/1e9, "kvmesh-GB/s")
		b.ReportMetric(nvmeMedian(fios)/1e9, "fio-GB/s")
		b.ReportMetric(nvmeMedian(ratios), "ratio")
	}
	b.Run("spill-batch", func(b *testing.B) {
		pair(b, func(dir string) float64 {
			n := nvmeBenchOpen(b, dir, total)
			defer n.Close()
			return nvmeBenchSpill(b, n, total, nvmeSpillBatch)
		}, func(dir string) float64 {
			return nvmeRunFio(b, dir, "--rw=write", "--bs=1M", "--iodepth=1", "--end_fsync=1", "--size="+size)
		})
	})
	b.Run("spill-put", func(b *testing.B) {
		small := min(total, 256<<20)
		pair(b, func(dir string) float64 {
			n := nvmeBenchOpen(b, dir, small)
			defer n.Close()
			return nvmeBenchSpill(b, n, small, 1)
		}, func(dir string) float64 {
			return nvmeRunFio(b, dir, "--rw=write", "--bs=1M", "--iodepth=1", "--fdatasync=1", "--size="+strconv.FormatInt(small, 10))
		})
	})
	b.Run("read-256k", func(b *testing.B) {
		pair(b, func(dir string) float64 {
			n := nvmeBenchOpen(b, dir, total)
			defer n.Close()
			locs, _ := nvmeBenchFill(b, n, total)
			return nvmeBenchRead(b, n, locs, nvmeReaders, nvmeReadTime)
		}, func(dir string) float64 {
			// fio lays its file out first (untimed), then reads.
			return nvmeRunFio(b, dir, "--rw=randread", "--bs=256k", "--iodepth=1",
				"--numjobs="+strconv.Itoa(nvmeReaders), "--group_reporting",
				"--time_based", "--runtime="+strconv.Itoa(int(nvmeReadTime.Seconds())), "--size="+size)
		})
	})
}

func nvmeMedian(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// nvmeRunFio runs one fio job on dir/fio.dat with direct I/O and returns its
// bandwidth in bytes per second.
func nvmeRunFio(b *testing.B, dir string, args ...string) float64 {
	b.Helper()
	args = append([]string{"--name=kvmesh", "--filename=" + filepath.Join(dir, "fio.dat"),
		"--direct=1", "--ioengine=psync", "--output-format=json"}, args...)
	out, err := exec.Command("fio", args...).Output()
	if err != nil {
		b.Fatalf("fio %v: %v", args, err)
	}
	var res struct {
		Jobs []struct {
			Read struct {
				BwBytes float64 `json:"bw_bytes"`
			} `json:"read"`
			Write struct {
				BwBytes float64 `json:"bw_bytes"`
			} `json:"write"`
		} `json:"jobs"`
	}
	if err := json.Unmarshal(out, &res); err != nil || len(res.Jobs) == 0 {
		b.Fatalf("fio output: %v\n%s", err, out)
	}
	bw := res.Jobs[0].Read.BwBytes + res.Jobs[0].Write.BwBytes
	if bw == 0 {
		b.Fatalf("fio reported no bandwidth: %s", out)
	}
	return bw
}
