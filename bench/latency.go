package bench

import (
	"math"
	"math/bits"
	"sync"
	"time"
)

// Latency records durations in log-linear buckets (32 per power of two, so a
// quantile is within about 3% of the true value) in fixed memory, however
// many samples it sees. It is safe for concurrent use.
type Latency struct {
	mu struct {
		sync.Mutex
		counts [latencyBuckets]uint64
		n      uint64
		max    time.Duration
	}
}

const (
	latencySubBits = 5
	latencySub     = 1 << latencySubBits
	latencyBuckets = (64-latencySubBits)*latencySub + 2*latencySub
)

// latencyBucket maps v ≥ 0 nanoseconds to its bucket: values below 64 have
// their own bucket; above, a bucket is (shift, top 6 bits).
func latencyBucket(v uint64) int {
	if v < 2*latencySub {
		return int(v)
	}
	shift := bits.Len64(v) - (latencySubBits + 1)
	return shift*latencySub + int(v>>shift)
}

// latencyValue returns the middle of bucket i in nanoseconds.
func latencyValue(i int) float64 {
	if i < 2*latencySub {
		return float64(i)
	}
	shift := i/latencySub - 1
	top := uint64(i - shift*latencySub)
	return float64(top<<shift) + float64(uint64(1)<<shift)/2
}

// Record adds one sample; a negative duration counts as zero.
func (l *Latency) Record(d time.Duration) {
	v := uint64(max(d, 0))
	l.mu.Lock()
	l.mu.counts[latencyBucket(v)]++
	l.mu.n++
	l.mu.max = max(l.mu.max, d)
	l.mu.Unlock()
}

// Count returns the number of samples.
func (l *Latency) Count() uint64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.mu.n
}

// Quantile returns the q-quantile (0 < q ≤ 1) in milliseconds, or 0 with no
// samples.
func (l *Latency) Quantile(q float64) float64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.mu.n == 0 {
		return 0
	}
	if q >= 1 {
		return float64(l.mu.max) / 1e6
	}
	rank := uint64(math.Ceil(q * float64(l.mu.n)))
	rank = max(rank, 1)
	var seen uint64
	for i, c := range l.mu.counts {
		seen += c
		if seen >= rank {
			return min(latencyValue(i), float64(l.mu.max)) / 1e6
		}
	}
	return float64(l.mu.max) / 1e6
}
