package tiers

import (
	"bufio"
	"fmt"
	"os"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/prefixhash"
)

// The values of the benchmarks: a power-of-two payload plus the header of a
// 512-token block, as kvmesh stores them.
var benchSizes = []struct {
	name string
	n    int
}{
	{"64KiB", 64<<10 + blockHeader512},
	{"1MiB", 1<<20 + blockHeader512},
	{"4MiB", 4<<20 + blockHeader512},
}

// benchOp runs op b.N times and, between runs of it with the timer stopped,
// a plain copy() of the same n bytes: the physical limit of a copying tier,
// measured under the same load as op on a noisy machine. The two alternate
// every 16 MiB or so of op's bytes (at most 256 times per run); each copy
// round moves as much, at most 16 MiB, after one untimed copy that brings its
// buffers back into cache as op's runs find theirs. It reports op's GB/s,
// copy's and their ratio.
func benchOp(b *testing.B, n int, op func()) {
	src, dst := make([]byte, n), make([]byte, n)
	every := max(1, (16<<20)/n, b.N/256)
	round := min(every, max(1, (16<<20)/n))
	var copyTime time.Duration
	copies := 0
	b.SetBytes(int64(n))
	b.ResetTimer()
	for i := range b.N {
		op()
		if i%every == every-1 || i == b.N-1 && copies == 0 {
			b.StopTimer()
			copy(dst, src)
			start := time.Now()
			for range round {
				copy(dst, src)
			}
			copyTime += time.Since(start)
			copies += round
			b.StartTimer()
		}
	}
	b.StopTimer()
	gbs := float64(n) * float64(b.N) / b.Elapsed().Seconds() / 1e9
	limit := float64(n) * float64(copies) / copyTime.Seconds() / 1e9
	b.ReportMetric(gbs, "GB/s")
	b.ReportMetric(limit, "copy-GB/s")
	b.ReportMetric(gbs/limit, "x-copy")
}

// newBenchDRAM returns a tier and a value of n bytes. With anchor, the tier
// holds a copy of the value, at loc, so the slab of n's class never empties
// and a benchmark measures copies into resident memory, not page faults.
func newBenchDRAM(b *testing.B, n int, anchor bool) (d *DRAM, val []byte, loc Loc) {
	d = newTestDRAM(b, DRAMOptions{Capacity: 4 * DefaultSlabSize})
	val = make([]byte, n)
	fill(val, 1)
	if anchor {
		var err error
		if loc, err = d.Put(testKey(0), val); err != nil {
			b.Fatal(err)
		}
	}
	return d, val, loc
}

func benchPutFree(b *testing.B, anchor bool) {
	for _, sz := range benchSizes {
		b.Run(sz.name, func(b *testing.B) {
			d, val, _ := newBenchDRAM(b, sz.n, anchor)
			key := testKey(1)
			benchOp(b, sz.n, func() {
				loc, err := d.Put(key, val)
				if err != nil {
					b.Fatal(err)
				}
				d.Free(loc)
			})
		})
	}
}

// BenchmarkDRAMPut measures Put followed by Free of the same value: the slot
// is reused, so this is a copy into resident memory plus two lock round
// trips.
func BenchmarkDRAMPut(b *testing.B) { benchPutFree(b, true) }

// BenchmarkDRAMPutFirstTouch measures Put and Free in an otherwise empty
// tier: every Free empties the slab and returns its pages to the kernel, so
// every Put faults fresh zeroed pages in. This is the cost of resident memory
// that follows usage, paid once per slab filled after it emptied.
func BenchmarkDRAMPutFirstTouch(b *testing.B) { benchPutFree(b, false) }

func BenchmarkDRAMRead(b *testing.B) {
	for _, sz := range benchSizes {
		b.Run(sz.name, func(b *testing.B) {
			d, _, loc := newBenchDRAM(b, sz.n, true)
			dst := make([]byte, sz.n)
			benchOp(b, sz.n, func() {
				if err := d.Read(loc, dst); err != nil {
					b.Fatal(err)
				}
			})
		})
	}
}

// BenchmarkDRAMView measures View: no byte is copied, so its "GB/s" is the
// rate at which values are made available to a reader that consumes them in
// place (a socket write, a shared-memory reader), and ns/op is flat in size.
func BenchmarkDRAMView(b *testing.B) {
	for _, sz := range benchSizes {
		b.Run(sz.name, func(b *testing.B) {
			d, _, loc := newBenchDRAM(b, sz.n, true)
			var sink byte
			benchOp(b, sz.n, func() {
				v := d.View(loc, sz.n)
				sink ^= v[len(v)-1]
			})
			_ = sink
		})
	}
}

// BenchmarkCopy is the physical limit by itself, for benchstat comparisons.
func BenchmarkCopy(b *testing.B) {
	for _, sz := range benchSizes {
		b.Run(sz.name, func(b *testing.B) {
			src, dst := make([]byte, sz.n), make([]byte, sz.n)
			b.SetBytes(int64(sz.n))
			for b.Loop() {
				copy(dst, src)
			}
		})
	}
}

// gcBenchBytes returns the size of the GC benchmark's cache: the
// KVMESH_BENCH_GC_BYTES environment variable (bytes, or with a KiB, MiB or
// GiB suffix), default 4 GiB. It skips when the machine has not that much
// memory available with room to spare.
func gcBenchBytes(b *testing.B) int64 {
	size := int64(4 << 30)
	if s := os.Getenv("KVMESH_BENCH_GC_BYTES"); s != "" {
		v, err := parseBytes(s)
		if err != nil {
			b.Fatalf("KVMESH_BENCH_GC_BYTES: %v", err)
		}
		size = v
	}
	avail, err := memAvailable()
	if err != nil {
		b.Skipf("cannot tell available memory: %v", err)
	}
	if need := size + size/4 + 512<<20; avail < need {
		b.Skipf("caching %d MiB needs about %d MiB available, the machine has %d MiB (set KVMESH_BENCH_GC_BYTES lower)",
			size>>20, need>>20, avail>>20)
	}
	return size
}

func parseBytes(s string) (int64, error) {
	mult := int64(1)
	for _, u := range []struct {
		suffix string
		mult   int64
	}{{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30}} {
		if strings.HasSuffix(s, u.suffix) {
			s, mult = strings.TrimSuffix(s, u.suffix), u.mult
			break
		}
	}
	v, err := strconv.ParseInt(s, 10, 64)
	if err != nil || v <= 0 {
		return 0, fmt.Errorf("%q is not a positive size in bytes", s)
	}
	return v * mult, nil
}

func memAvailable() (int64, error) {
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), "MemAvailable:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			return kb << 10, err
		}
	}
	return 0, fmt.Errorf("no MemAvailable in /proc/meminfo")
}

// BenchmarkGC caches the same bytes, 64 KiB blocks, in the DRAM tier (with
// its index as a map[Key]Loc, as the store keeps it) and in Go []byte values
// of a map[Key][]byte, and measures a forced garbage collection of each,
// reporting the Go heap, the heap goal the GC sets from it, and the
// stop-the-world pause per cycle.
func BenchmarkGC(b *testing.B) {
	size := gcBenchBytes(b)
	const n = 64<<10 + blockHeader512
	count := int(size / n)
	val := make([]byte, n)
	fill(val, 3)

	b.Run("dram", func(b *testing.B) {
		d := newTestDRAM(b, DRAMOptions{Capacity: size + size/16 + 2*DefaultSlabSize})
		index := make(map[prefixhash.Key]Loc, count)
		for i := range count {
			k := testKey(uint64(i))
			loc, err := d.Put(k, val)
			if err != nil {
				b.Fatalf("value %d of %d: %v", i, count, err)
			}
			index[k] = loc
		}
		benchGC(b, d.Stats().Stored)
		runtime.KeepAlive(index)
		_ = d.Close()
	})
	debug.FreeOSMemory()

	b.Run("goheap", func(b *testing.B) {
		index := make(map[prefixhash.Key][]byte, count)
		var stored int64
		for i := range count {
			v := make([]byte, n)
			copy(v, val)
			index[testKey(uint64(i))] = v
			stored += int64(n)
		}
		benchGC(b, stored)
		runtime.KeepAlive(index)
	})
	debug.FreeOSMemory()
}

func benchGC(b *testing.B, cached int64) {
	runtime.GC()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	b.ResetTimer()
	for b.Loop() {
		runtime.GC()
	}
	b.StopTimer()
	runtime.ReadMemStats(&after)
	samples := []metrics.Sample{{Name: "/memory/classes/heap/objects:bytes"}, {Name: "/gc/heap/goal:bytes"}}
	metrics.Read(samples)
	cycles := max(1, int64(after.NumGC-before.NumGC))
	b.ReportMetric(float64(cached)/(1<<20), "cached-MiB")
	b.ReportMetric(float64(samples[0].Value.Uint64())/(1<<20), "heap-MiB")
	b.ReportMetric(float64(samples[1].Value.Uint64())/(1<<20), "goal-MiB")
	b.ReportMetric(float64(after.PauseTotalNs-before.PauseTotalNs)/float64(cycles)/1e3, "pause-us/gc")
}
