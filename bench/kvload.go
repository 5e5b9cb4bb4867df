package bench

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"
)

// KVTarget is a key-value service a GET/SET load runs against: Redis here,
// kvmesh's store (network or shared-memory path) in the store suite. Both
// run the same load loop, so their figures compare.
type KVTarget interface {
	// Name names the target in reports ("redis", "kvmesh-tcp", ...).
	Name() string
	// Dial opens one client connection, used by one goroutine at a time.
	Dial(ctx context.Context) (KVConn, error)
}

// KVResetter is implemented by a KVTarget that can drop every key earlier
// loads wrote. KVLoad calls it first, so that one load's data set does not
// fill the memory the next one is measured in.
type KVResetter interface {
	Reset(ctx context.Context) error
}

// KVViewer is a KVConn that can read a value in place, without copying it
// into the caller's buffer (kvmesh's same-host path reads the node's
// memory under a lease). View calls fn with the value of key, valid only
// during the call; fn's error is View's. KVLoadPhases measures it as a
// phase of its own ("view"), apart from GETs, which copy.
type KVViewer interface {
	View(ctx context.Context, key int, fn func(v []byte) error) error
}

// KVConn is one connection of a KVTarget. Keys are small integers the
// target maps to its own key space.
type KVConn interface {
	// Set stores value under key. value is owned by the caller and valid
	// only during the call.
	Set(ctx context.Context, key int, value []byte) error
	// Get appends the value of key to dst[:0] and returns it (a missing
	// key is an error).
	Get(ctx context.Context, key int, dst []byte) ([]byte, error)
	Close() error
}

// KVLoadOptions configures a GET/SET load.
type KVLoadOptions struct {
	// ValueBytes is the size of every value. Required, at least 8.
	ValueBytes int
	// Concurrency is the number of connections, each with one request in
	// flight. Default 4.
	Concurrency int
	// Keys is the number of distinct keys. Default: enough for 256 MiB of
	// values, at least 2 × Concurrency. Keys × ValueBytes is at most 4 GiB.
	Keys int
	// Duration is how long each phase (GET, then SET) runs. Default 2s.
	Duration time.Duration
	// MaxOps bounds the operations of each phase. Default 1<<22.
	MaxOps int64
	// MaxSetBytes bounds the value bytes the SET phase writes: every SET
	// writes a key never written before (a cache that keys blocks by their
	// contents answers a SET of a block it holds without storing it, so
	// overwriting the fill's keys would flatter it), and the data set grows
	// by what the phase writes. Default 1 GiB.
	MaxSetBytes int64
	// Seed seeds the key order. Default 1.
	Seed uint64
}

// EnsureDefaults fills zero fields with their defaults.
func (o *KVLoadOptions) EnsureDefaults() {
	if o.Concurrency == 0 {
		o.Concurrency = 4
	}
	if o.Keys == 0 && o.ValueBytes > 0 {
		o.Keys = max(2*o.Concurrency, (256<<20)/o.ValueBytes)
	}
	if o.Duration == 0 {
		o.Duration = 2 * time.Second
	}
	if o.MaxOps == 0 {
		o.MaxOps = 1 << 22
	}
	if o.MaxSetBytes == 0 {
		o.MaxSetBytes = 1 << 30
	}
	if o.Seed == 0 {
		o.Seed = 1
	}
}

// Validate names the first field that is out of range.
func (o *KVLoadOptions) Validate() error {
	switch {
	case o.ValueBytes < 8 || o.ValueBytes > 1<<30:
		return fmt.Errorf("bench: kv load: value_bytes %d is outside 8..1GiB", o.ValueBytes)
	case o.Concurrency < 1 || o.Concurrency > 1024:
		return fmt.Errorf("bench: kv load: concurrency %d is outside 1..1024", o.Concurrency)
	case o.Keys < 1 || int64(o.Keys)*int64(o.ValueBytes) > 4<<30:
		return fmt.Errorf("bench: kv load: keys %d × value_bytes %d is outside 1..4GiB", o.Keys, o.ValueBytes)
	case o.Duration <= 0:
		return fmt.Errorf("bench: kv load: duration %v must be positive", o.Duration)
	case o.MaxOps < 1:
		return fmt.Errorf("bench: kv load: max_ops %d must be positive", o.MaxOps)
	case o.MaxSetBytes < int64(o.ValueBytes):
		return fmt.Errorf("bench: kv load: max_set_bytes %d is less than one value (%d)", o.MaxSetBytes, o.ValueBytes)
	}
	return nil
}

// KVResult is one phase of a GET/SET load. GB/s are 10^9 value bytes per
// second (keys and protocol bytes not counted).
type KVResult struct {
	Target      string  `json:"target"`
	Op          string  `json:"op"`
	ValueBytes  int     `json:"value_bytes"`
	Concurrency int     `json:"concurrency"`
	Ops         int64   `json:"ops" table:"wide"`
	OpsPerS     float64 `json:"ops_per_s" table:"wide"`
	GBps        float64 `json:"gbps"`
	P50MS       float64 `json:"p50_ms"`
	P99MS       float64 `json:"p99_ms"`
	Errors      int64   `json:"errors" table:"nonzero"`
	// FirstError is the first failed operation's error, when Errors > 0.
	FirstError string `json:"first_error,omitempty" table:"nonzero"`
	// RatioVsRawTCP is GBps over the raw TCP stream measured in the same
	// run (nil when that was not measured).
	RatioVsRawTCP *float64 `json:"ratio_vs_raw_tcp,omitempty"`
	// RatioVsRedis is GBps over Redis at the same op, value size and
	// concurrency in the same run (nil for Redis itself, or without Redis).
	RatioVsRedis *float64 `json:"ratio_vs_redis,omitempty"`
	// RatioVsMemcpy is GBps over memcpy of the same block size from DRAM
	// measured in the same run: the limit of a path that copies each value
	// once (the shared-memory path).
	RatioVsMemcpy *float64 `json:"ratio_vs_memcpy,omitempty"`
	// PathShare, for kvmesh over its data plane, is the share of the
	// load's value bytes (fill, GETs and SETs) that the node's data plane
	// moved over the transport the row names (its
	// kvmesh_transfer_bytes_total; headers make it slightly above 1): a
	// client that fell back to another transport shows less.
	PathShare *float64 `json:"path_share,omitempty" table:"wide"`
}

// Ratio returns a/b, or nil when b is not positive: a figure with nothing
// to compare against is left out, never reported as 0 or infinity.
func Ratio(a, b float64) *float64 {
	if !(b > 0) {
		return nil
	}
	r := a / b
	return &r
}

// FindKV returns the row of rows for op, value size and concurrency.
func FindKV(rows []KVResult, op string, valueBytes, concurrency int) (KVResult, bool) {
	for _, r := range rows {
		if r.Op == op && r.ValueBytes == valueBytes && r.Concurrency == concurrency {
			return r, true
		}
	}
	return KVResult{}, false
}

// errKVMismatch means a GET returned a value that is not the one SET.
var errKVMismatch = errors.New("bench: kv load: GET returned a wrong value")

// KVLoad fills o.Keys keys (untimed), then runs a GET phase and a SET phase
// of o.Duration each with o.Concurrency connections, each doing one
// operation at a time. GETs read random keys of the fill into the caller's
// buffer and check the value's size and the key stamped in its first
// bytes; SETs write keys o.Keys, o.Keys+1, ..., never written before, at
// most o.MaxSetBytes of them. A failed operation is counted in Errors;
// KVLoad fails only when it cannot connect or fill the keys. The target
// keeps what the load wrote.
func KVLoad(ctx context.Context, t KVTarget, o KVLoadOptions) (set, get KVResult, err error) {
	rs, err := KVLoadPhases(ctx, t, o)
	if len(rs) > 0 {
		get, set = rs[0], rs[len(rs)-1]
	}
	return set, get, err
}

// KVLoadPhases is KVLoad, with a VIEW phase between GET and SET when the
// target's connections can read in place (KVViewer): the same random reads,
// each value checked where it lies and copied nowhere (op "view"). It
// returns the phases in order: get, view (when run), set.
func KVLoadPhases(ctx context.Context, t KVTarget, o KVLoadOptions) ([]KVResult, error) {
	o.EnsureDefaults()
	if err := o.Validate(); err != nil {
		return nil, err
	}
	if r, ok := t.(KVResetter); ok {
		if err := r.Reset(ctx); err != nil {
			return nil, fmt.Errorf("bench: kv load: reset %s: %w", t.Name(), err)
		}
	}
	conns := make([]KVConn, 0, o.Concurrency)
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	for range o.Concurrency {
		c, err := t.Dial(ctx)
		if err != nil {
			return nil, fmt.Errorf("bench: kv load: dial %s: %w", t.Name(), err)
		}
		conns = append(conns, c)
	}
	// Fill: connection w sets keys w, w+C, ...
	if err := kvParallel(conns, func(w int, c KVConn) error {
		v := make([]byte, o.ValueBytes)
		for k := w; k < o.Keys; k += len(conns) {
			binary.LittleEndian.PutUint64(v, uint64(k))
			if err := c.Set(ctx, k, v); err != nil {
				return fmt.Errorf("bench: kv load: fill %s key %d: %w", t.Name(), k, err)
			}
		}
		return nil
	}); err != nil {
		return nil, err
	}
	rs := []KVResult{kvPhase(ctx, t, conns, "get", o)}
	if _, ok := conns[0].(KVViewer); ok {
		rs = append(rs, kvPhase(ctx, t, conns, "view", o))
	}
	rs = append(rs, kvPhase(ctx, t, conns, "set", o))
	return rs, ctx.Err()
}

func kvParallel(conns []KVConn, f func(w int, c KVConn) error) error {
	errs := make([]error, len(conns))
	var wg sync.WaitGroup
	for w, c := range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[w] = f(w, c)
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

func kvPhase(ctx context.Context, t KVTarget, conns []KVConn, op string, o KVLoadOptions) KVResult {
	var (
		ops, errs atomic.Int64
		lat       Latency
		firstErr  atomic.Pointer[error]
	)
	maxOps := o.MaxOps
	if op == "set" {
		maxOps = min(maxOps, o.MaxSetBytes/int64(o.ValueBytes))
	}
	start := time.Now()
	deadline := start.Add(o.Duration)
	_ = kvParallel(conns, func(w int, c KVConn) error {
		rng := rand.New(rand.NewPCG(o.Seed, uint64(w)))
		buf := make([]byte, o.ValueBytes)
		for ctx.Err() == nil && time.Now().Before(deadline) {
			n := ops.Add(1)
			if n > maxOps {
				break
			}
			k := rng.IntN(o.Keys)
			t0 := time.Now()
			var err error
			switch op {
			case "set":
				k = o.Keys + int(n) - 1
				binary.LittleEndian.PutUint64(buf, uint64(k))
				err = c.Set(ctx, k, buf)
			case "view":
				err = c.(KVViewer).View(ctx, k, func(v []byte) error { return checkKV(v, k, o.ValueBytes) })
			default:
				buf, err = c.Get(ctx, k, buf)
				if err == nil {
					err = checkKV(buf, k, o.ValueBytes)
				}
			}
			lat.Record(time.Since(t0))
			if err != nil {
				errs.Add(1)
				firstErr.CompareAndSwap(nil, &err)
			}
		}
		return nil
	})
	sec := time.Since(start).Seconds()
	n := min(ops.Load(), maxOps) // ops counts the attempts that found the limit
	done := n - errs.Load()
	return KVResult{Target: t.Name(), Op: op, ValueBytes: o.ValueBytes, Concurrency: o.Concurrency,
		Ops: done, OpsPerS: float64(done) / sec, GBps: float64(done) * float64(o.ValueBytes) / sec / 1e9,
		P50MS: lat.Quantile(0.5), P99MS: lat.Quantile(0.99), Errors: errs.Load(), FirstError: errorText(firstErr.Load())}
}

// checkKV checks that v is key k's value of n bytes (KVLoad stamps k in
// its first 8 bytes).
func checkKV(v []byte, k, n int) error {
	if len(v) != n || binary.LittleEndian.Uint64(v) != uint64(k) {
		return errKVMismatch
	}
	return nil
}

// errorText is *err's text, "" for nil.
func errorText(err *error) string {
	if err == nil {
		return ""
	}
	return (*err).Error()
}
