package gossiptest

import (
	"encoding/binary"
	"math"
	"time"

	"github.com/cespare/xxhash/v2"
)

// Links is a latency model of a network: every pair of nodes has a fixed
// round-trip time drawn once, deterministically from Seed and the pair's
// names, so a simulation run twice with one seed sees the same links. Most
// links draw from a log-normal distribution around MedianRTT; a fraction
// SlowFraction of them (a congested switch, a far rack) take SlowRTT. There
// is no per-message jitter: a link is as fast for every message, so the
// figures a simulation reports depend on the code under test and the seed,
// not on the machine's load.
type Links struct {
	// Seed selects the draw. Default 0 (a valid seed).
	Seed uint64
	// MedianRTT is the median round-trip time of a fast link. Default
	// 50µs (one rack, kernel TCP).
	MedianRTT time.Duration
	// Spread is the standard deviation of ln(RTT) among fast links.
	// Default 0.25 (the 99th percentile fast link is 1.8× the median);
	// negative: none, every fast link is MedianRTT.
	Spread float64
	// SlowFraction is the share of links whose round trip is SlowRTT.
	// Default 0.01; negative: none.
	SlowFraction float64
	// SlowRTT is the round-trip time of a slow link. Default 5ms.
	SlowRTT time.Duration
}

// EnsureDefaults fills zero fields with their defaults.
func (l *Links) EnsureDefaults() {
	if l.MedianRTT == 0 {
		l.MedianRTT = 50 * time.Microsecond
	}
	if l.Spread == 0 {
		l.Spread = 0.25
	}
	if l.SlowFraction == 0 {
		l.SlowFraction = 0.01
	}
	if l.SlowRTT == 0 {
		l.SlowRTT = 5 * time.Millisecond
	}
}

// RTT returns the round-trip time between nodes a and b (the same both
// ways; 0 from a node to itself). Call EnsureDefaults first.
func (l *Links) RTT(a, b string) time.Duration {
	if a == b {
		return 0
	}
	if a > b {
		a, b = b, a
	}
	var d xxhash.Digest
	d.ResetWithSeed(l.Seed)
	d.WriteString(a)
	d.Write([]byte{0})
	d.WriteString(b)
	h1 := d.Sum64()
	var seed [8]byte
	binary.LittleEndian.PutUint64(seed[:], h1)
	h2 := xxhash.Sum64(seed[:])
	if l.SlowFraction > 0 && unit(h1) < l.SlowFraction {
		return l.SlowRTT
	}
	if l.Spread <= 0 {
		return l.MedianRTT
	}
	// Box-Muller: a standard normal from two uniforms.
	z := math.Sqrt(-2*math.Log(unit(h2))) * math.Cos(2*math.Pi*unit(h2<<32|h2>>32))
	return time.Duration(float64(l.MedianRTT) * math.Exp(l.Spread*z))
}

// unit maps a hash to (0,1).
func unit(h uint64) float64 { return (float64(h>>11) + 0.5) / (1 << 53) }
